"""The opt-in terms of large-batch recipes: value-target normalisation (``normalize_value``) and the bound on the
Gaussian mean (``mean_bound_coef``). Off by default (the parity tests hold PPO's update bit for bit)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch as th
import torch.nn.functional as F
from torch import nn

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core.policy.value_head import NormalizedValueHead, fold_returns
from sb3_ppo_scale.core.update.objectives import LossSettings, MeanBound, _value_loss, ppo_loss
from sb3_ppo_scale.core.update.sampling import MicroBatch


def _head(seed: int = 0) -> NormalizedValueHead:
    th.manual_seed(seed)
    return NormalizedValueHead(nn.Linear(4, 1).double())


def test_folding_returns_keeps_every_prediction_and_tracks_the_moments() -> None:
    head, latent = _head(), th.randn(32, 4, dtype=th.float64)
    before = head(latent).detach().clone()
    assert th.equal(before, head.head(latent).detach())  # mean 0, std 1 before the first update: the plain layer
    rng = np.random.default_rng(0)
    batches = [rng.normal(-300.0, 40.0, 500), rng.normal(1200.0, 300.0, 700)]
    for batch in batches:
        fold_returns(head, batch, lambda sums: sums, th.device("cpu"))
        assert th.allclose(head(latent).detach(), before, rtol=1e-9, atol=1e-9)  # PopArt: outputs preserved
    everything = np.concatenate(batches)
    mean, var, count = head.moments.tolist()
    assert count == everything.size
    assert mean == pytest.approx(everything.mean(), rel=1e-12)
    assert var == pytest.approx(everything.var(), rel=1e-9)
    assert float(head.std) == pytest.approx(np.sqrt(everything.var() + 1e-8), rel=1e-9)


def test_ranks_fold_the_moments_of_the_union() -> None:
    """With a reducer that sums over two ranks holding the same rollout, the statistics are the union's: the same
    mean and variance as one rank, twice the count."""
    alone, ranked = _head(), _head()
    returns = np.random.default_rng(1).normal(5.0, 2.0, (16, 4)).astype(np.float32)
    fold_returns(alone, returns, lambda sums: sums, th.device("cpu"))
    fold_returns(ranked, returns, lambda sums: sums.mul_(2), th.device("cpu"))
    assert ranked.moments[2] == 2 * alone.moments[2]
    assert ranked.moments[:2].tolist() == pytest.approx(alone.moments[:2].tolist(), rel=1e-12)


def _data(old_values: th.Tensor, returns: th.Tensor) -> SimpleNamespace:
    return SimpleNamespace(old_values=old_values, returns=returns)


def test_the_value_error_is_measured_in_units_of_the_return_std() -> None:
    head = _head()
    fold_returns(head, np.array([0.0, 100.0, 200.0]), lambda sums: sums, th.device("cpu"))
    std = head.std
    policy = SimpleNamespace(value_net=head)
    values, old, returns = (th.tensor(v, dtype=th.float64) for v in ([10.0, 150.0], [0.0, 100.0], [30.0, 90.0]))
    settings = LossSettings(clip_range=0.2, clip_range_vf=None, ent_coef=0.0, vf_coef=0.5, normalize_value=True)
    loss = _value_loss(policy, values, _data(old, returns), None, None, settings)
    assert th.allclose(loss, F.mse_loss(returns / std, values / std))
    plain = _value_loss(policy, values, _data(old, returns), None, None,
                        LossSettings(clip_range=0.2, clip_range_vf=None, ent_coef=0.0, vf_coef=0.5))
    assert th.equal(plain, F.mse_loss(returns, values))  # off: SB3's value loss, the same operations
    # clip_range_vf in std units: the prediction may move 0.5 std (40.8) from the rollout's value
    clipped = _value_loss(policy, values, _data(old, returns), None, None,
                          LossSettings(clip_range=0.2, clip_range_vf=0.5, ent_coef=0.0, vf_coef=0.5, normalize_value=True))
    moved = old + th.clamp(values - old, -0.5 * std, 0.5 * std)
    assert moved[1] < values[1] and moved[0] == values[0]
    assert th.allclose(clipped, F.mse_loss(returns / std, moved / std))


def test_mean_bound_penalises_only_the_mean_beyond_the_soft_bound() -> None:
    bound = MeanBound(1.0, np.array([-0.4, 0.0]), np.array([0.4, 2.0]), th.device("cpu"))
    # half-widths 0.4 and 1; centres 0 and 1; free within 1.1 half-widths: [-0.44, 0.44] and [-0.1, 2.1]
    inside = th.tensor([[0.43, 2.09], [-0.43, -0.09]])
    assert th.equal(bound(inside), th.zeros(2))
    outside = th.tensor([[0.84, 1.0], [0.0, 3.1]])  # 2.1 and 1.0 half-widths out, minus the 1.1 that is free
    assert th.allclose(bound(outside), th.tensor([1.0**2, 1.0**2]))


def _model(**kwargs) -> ScalablePPO:
    return ScalablePPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, n_epochs=1, seed=0, device="cpu",
                       policy_kwargs={"net_arch": [8]}, **kwargs)


def test_the_mean_bound_adds_its_term_to_the_loss() -> None:
    model = _model(mean_bound_coef=0.5)
    with th.no_grad():
        model.policy.action_net.bias.fill_(5.0)  # Pendulum's box is [-2, 2]: every mean 2.5 half-widths out
    model.learn(64)  # fills the rollout buffer
    rollout = model._prepare_rollout(model._loss_settings())
    micro = next(model._rollout_chunks(rollout))
    settings = model._loss_settings()
    with th.no_grad():
        bounded, stats = ppo_loss(model.policy, micro, lambda a: a, settings)
        unbounded, _ = ppo_loss(model.policy, micro, lambda a: a, LossSettings(**{**vars(settings), "mean_bound": None}))
        mean = model.policy.get_distribution(micro.samples.observations).distribution.loc
    # the loss is ~9e3 (Pendulum's raw returns) in float32: its difference is good to ~1e-3
    assert float(bounded - unbounded) == pytest.approx(0.5 * float(settings.mean_bound(mean).mean()), abs=2e-3)
    assert float(stats[-1]) == pytest.approx(float(bounded))


def test_the_mean_bound_pulls_a_runaway_mean_back() -> None:
    """A mean far outside the box gets no pull back from the clipped actions' returns; the bound pulls it in."""
    biases = {}
    for coef in (0.0, 1.0):
        model = _model(mean_bound_coef=coef, learning_rate=0.05)
        with th.no_grad():
            model.policy.action_net.bias.fill_(5.0)
        model.learn(64 * 8)
        biases[coef] = float(model.policy.action_net.bias)
    assert biases[1.0] < 4.5 and biases[1.0] < biases[0.0] - 0.3, biases


def test_normalize_value_trains_saves_and_loads(tmp_path) -> None:
    model = _model(normalize_value=True, clip_range_vf=0.2)
    model.learn(128)
    head = model.policy.value_net
    assert isinstance(head, NormalizedValueHead)
    assert float(head.moments[2]) == 128 and float(head.std) > 1  # Pendulum's returns are in the hundreds
    model.save(tmp_path / "model.zip")
    loaded = ScalablePPO.load(tmp_path / "model.zip", device="cpu")
    assert th.equal(loaded.policy.value_net.moments, head.moments)
    obs = th.randn(6, 3)
    assert th.equal(loaded.policy.predict_values(obs), model.policy.predict_values(obs))


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"normalize_value": "yes"}, "normalize_value must be True or False"),
    ({"mean_bound_coef": -1.0}, "mean_bound_coef must be a finite number >= 0"),
    ({"mean_bound_coef": float("nan")}, "mean_bound_coef must be a finite number >= 0"),
])
def test_bad_values_are_named(kwargs, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        _model(**kwargs)


def test_mean_bound_needs_a_gaussian_in_a_box() -> None:
    with pytest.raises(ValueError, match="mean_bound_coef > 0 needs a Box action space"):
        ScalablePPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, mean_bound_coef=0.1, device="cpu")
