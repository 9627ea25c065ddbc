"""``learning_rate="kl_adaptive"``: the rule, its trajectory during training, save/load, accumulation, KL objectives."""

from __future__ import annotations

import pytest
import torch as th

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core.update.lr import KLAdaptiveLR
from tests.helpers import ACCUMULATION_ATOL, HistoryLogger, max_param_diff

SMALL = dict(n_steps=128, batch_size=32, n_epochs=3, device="cpu", seed=0)


def test_rule_steps_and_bounds() -> None:
    lr = KLAdaptiveLR(1e-3, target_kl=0.01, factor=1.5, min_lr=5e-4, max_lr=2e-3)
    trajectory = [lr.adapt(kl) for kl in (0.021, 0.02, 0.0049, 0.005, 0.001, 0.001, 0.5, 0.5, 0.5, 0.5, 0.5)]
    down = [2e-3 / 1.5, 2e-3 / 1.5**2, 2e-3 / 1.5**3, 5e-4, 5e-4]  # the last two clamped at min_lr
    assert trajectory == pytest.approx([1e-3 / 1.5, 1e-3 / 1.5, 1e-3, 1e-3, 1.5e-3, 2e-3, *down])
    assert lr(0.3) == lr(1.0) == 5e-4  # a schedule that ignores the progress


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (dict(initial=0.0), r"initial must be a finite number > 0"),
        (dict(target_kl=-1.0), r"target_kl must be a finite number > 0"),
        (dict(factor=1.0), r"factor must be a finite number > 1"),
        (dict(initial=1.0), r"initial must lie in \[min_lr, max_lr\]"),
        (dict(min_lr=1e-2, max_lr=1e-3), r"min_lr must be <= max_lr, got min_lr=0.01 and max_lr=0.001"),
        (dict(initial=float("inf"), max_lr=float("inf")), r"initial must be a finite number > 0, got inf"),
    ],
)
def test_bad_rule_arguments(kwargs, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        KLAdaptiveLR(**kwargs)


def test_bad_learning_rate_string() -> None:
    with pytest.raises(ValueError, match=r"learning_rate must be a finite number > 0, a schedule .* or 'kl_adaptive', got 'adaptive'"):
        ScalablePPO("MlpPolicy", "Pendulum-v1", learning_rate="adaptive", **SMALL)


def test_learning_rate_follows_the_measured_kl_during_training() -> None:
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", learning_rate="kl_adaptive", **SMALL)
    model.set_logger(HistoryLogger())
    model.learn(6 * 128)
    kls, lrs = model.logger.history["train/kl"], model.logger.history["train/learning_rate"]
    assert len(kls) == len(lrs) == 6 and all(kl > 0 for kl in kls)
    rule = KLAdaptiveLR()
    expected = [rule.value] + [rule.adapt(kl) for kl in kls]
    assert lrs == pytest.approx(expected[:-1], rel=1e-12)  # each update used the rate the previous KL set
    assert len(set(expected)) > 1  # the rule moved the rate
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(expected[-2])
    assert model.learning_rate.value == pytest.approx(expected[-1])
    assert "train/kl_coef" not in model.logger.history  # PPO-Clip: no beta to adapt


def test_annealed_target_decays_with_the_progress_remaining() -> None:
    rule = KLAdaptiveLR(1e-3, target_kl=0.01, anneal_target=True)
    assert rule.target(1.0) == 0.01 and rule.target(0.25) == pytest.approx(0.0025)
    assert rule.adapt(0.006, progress_remaining=1.0) == pytest.approx(1e-3)  # within [0.005, 0.02]: kept
    assert rule.adapt(0.006, progress_remaining=0.1) == pytest.approx(1e-3 / 1.5)  # above 2 x 0.001: down
    constant = KLAdaptiveLR(1e-3, target_kl=0.01)
    assert constant.adapt(0.006, progress_remaining=0.1) == pytest.approx(1e-3)  # the default ignores progress
    with pytest.raises(ValueError, match="anneal_target must be True or False, got 'yes'"):
        KLAdaptiveLR(anneal_target="yes")


def test_training_adapts_to_the_annealed_target_at_each_update() -> None:
    """The model hands the rule its progress remaining after each rollout (SB3's: 1 - steps / budget)."""
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", learning_rate=KLAdaptiveLR(anneal_target=True), **SMALL)
    model.set_logger(HistoryLogger())
    model.learn(6 * 128)
    kls, lrs = model.logger.history["train/kl"], model.logger.history["train/learning_rate"]
    rule = KLAdaptiveLR(anneal_target=True)
    expected = [rule.value] + [rule.adapt(kl, 1 - (k + 1) / 6) for k, kl in enumerate(kls)]
    assert lrs == pytest.approx(expected[:-1], rel=1e-12)
    assert model.learning_rate.value == pytest.approx(expected[-1])
    constant = KLAdaptiveLR()
    assert [constant.value] + [constant.adapt(kl) for kl in kls] != expected  # the annealing changed the rates


def test_adapted_rate_survives_save_and_load(tmp_path) -> None:
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", learning_rate=KLAdaptiveLR(1e-3, target_kl=1e-6), **SMALL)
    model.learn(2 * 128)
    assert model.learning_rate.value < 1e-3  # KL far above a tiny target: the rate went down
    model.save(tmp_path / "m")
    loaded = ScalablePPO.load(tmp_path / "m", device="cpu")
    assert isinstance(loaded.learning_rate, KLAdaptiveLR) and loaded.learning_rate.value == model.learning_rate.value
    assert loaded.lr_schedule(1.0) == model.learning_rate.value


def test_accumulation_gives_the_same_rates_and_parameters() -> None:
    models = []
    for k in (1, 4):
        model = ScalablePPO("MlpPolicy", "Pendulum-v1", learning_rate="kl_adaptive", grad_accum_steps=k, **SMALL)
        model.learn(3 * 128)
        models.append(model)
    assert max_param_diff(*models) <= ACCUMULATION_ATOL
    assert models[0].learning_rate.value == pytest.approx(models[1].learning_rate.value, rel=1e-6)


@pytest.mark.parametrize("objective", ["kl_penalty", "clip_kl_penalty"])
def test_beta_and_rate_adapt_on_the_same_kl(objective: str) -> None:
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", learning_rate="kl_adaptive", objective=objective,
                        kl_penalty_target=0.003, **SMALL)
    model.set_logger(HistoryLogger())
    model.learn(4 * 128)
    kls = model.logger.history["train/kl"]
    rate = KLAdaptiveLR()
    for kl in kls:
        rate.adapt(kl)
    assert len(kls) == 4 and model.learning_rate.value == pytest.approx(rate.value)
    assert len(model.logger.history["train/kl_coef"]) == 4
    assert th.isfinite(th.cat([p.flatten() for p in model.policy.parameters()])).all()


def test_graph_key_does_not_see_the_rate_a_cuda_graph_reads_from_its_tensor() -> None:
    """The CPU half of cuda_graphs' no-recapture property (the CUDA half: tests/test_cuda.py): while graphs run, each
    param group's rate lives in one persistent 0-d tensor, so the optimizer settings the graph key compares stay the
    same when the KL rule moves the rate, and the tensor carries the new value. A float rate would change the key."""
    from sb3_ppo_scale.core.update.graphs import _group_hyperparameters, _learning_rates_as_tensors

    optimizer = th.optim.Adam([th.nn.Parameter(th.zeros(3))], lr=1e-3)
    persistent: dict[int, th.Tensor] = {}
    keys, tensors = [], []
    for rate in (1e-3, 1e-3 / 1.5):
        optimizer.param_groups[0]["lr"] = rate  # what KLAdaptiveLR sets between train() calls
        previous = _learning_rates_as_tensors(optimizer, persistent)
        assert previous == [rate]
        keys.append(_group_hyperparameters(optimizer.param_groups[0]))
        tensors.append(optimizer.param_groups[0]["lr"])
        assert float(tensors[-1]) == pytest.approx(rate)
        optimizer.param_groups[0]["lr"] = previous[0]  # CudaGraphStep.close
    assert keys[0] == keys[1] and tensors[0] is tensors[1]
    assert _group_hyperparameters({"lr": 1e-3}) != _group_hyperparameters({"lr": 1e-3 / 1.5})
