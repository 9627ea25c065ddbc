"""The update step's CPU-testable parts: the target_kl stop, the reducer arithmetic data-parallel training relies on,
distribution validation, the optimizer's capturable round trip and the CUDA-graph key (the graph path itself is
covered by tests/test_cuda.py on a GPU)."""

from __future__ import annotations

import copy

import numpy as np
import torch as th
from torch.distributions import Distribution

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core.update.graphs import (
    CudaGraphStep,
    GraphCache,
    _adopt_step_counters,
    _make_capturable,
    _restore_non_capturable,
)
from sb3_ppo_scale.core.update.guard import NonFiniteGuard
from sb3_ppo_scale.core.update.objectives import AdvantageNormalizer
from sb3_ppo_scale.core.update.sampling import MinibatchLoader
from sb3_ppo_scale.core.update.step import StepSettings, UpdateStep, distribution_validation


def _model_with_rollout(**kwargs) -> ScalablePPO:
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, n_epochs=1, device="cpu", seed=0, **kwargs)
    model.learn(64)
    return model


def _step(model: ScalablePPO, target_kl: float | None = None, reducer=None) -> UpdateStep:
    settings = StepSettings(model.max_grad_norm, model.normalize_advantage, target_kl)
    guard = NonFiniteGuard("skip", model.device)
    extra = {} if reducer is None else dict(reducer=reducer)
    return UpdateStep(model.policy, model._loss, model._loss_settings(), settings, guard, **extra)


def _params(model: ScalablePPO) -> list[th.Tensor]:
    return [p.detach().clone() for p in model.policy.parameters()]


def test_step_stops_before_the_optimizer_step_when_kl_exceeds_the_target() -> None:
    model = _model_with_rollout()
    batch = next(iter(MinibatchLoader(model._stage_rollout(), 32, shuffle=False)))
    with th.no_grad():  # move the policy away from the rollout policy: approx KL > 0
        for p in model.policy.parameters():
            p.add_(0.05 * th.randn_like(p))
    before, steps_before = _params(model), len(model.policy.optimizer.state)
    stats, stepped = _step(model, target_kl=1e-9)(batch)
    assert not stepped and float(stats[4]) > 1.5e-9
    assert all(th.equal(a, b) for a, b in zip(before, _params(model)))  # no optimizer step
    stats, stepped = _step(model, target_kl=None)(batch)
    assert stepped and not all(th.equal(a, b) for a, b in zip(before, _params(model)))
    assert len(model.policy.optimizer.state) == len(before) >= steps_before  # Adam state for every parameter


class TwinRanks:
    """Two data-parallel ranks that hold the same data, simulated in one process: a sum over ranks doubles."""

    world_size = 2

    def sum_(self, tensor: th.Tensor) -> th.Tensor:
        return tensor.mul_(2)

    def sum_gradients(self, parameters) -> None:
        for p in parameters:
            p.grad.mul_(2)


def test_reducer_shares_make_the_union_update_equal_the_local_one() -> None:
    """Shares are relative to the global minibatch (2N): summed over two ranks that hold the same N samples, the
    gradient and the stats are those of one process training on the union (the N samples twice), with
    advantages normalised by the union's mean and unbiased std from all-reduced moments."""
    single, twin = _model_with_rollout(), _model_with_rollout()
    twin_batch = next(iter(MinibatchLoader(twin._stage_rollout(), 32, shuffle=False)))
    batch = next(iter(MinibatchLoader(single._stage_rollout(), 32, shuffle=False)))
    batch.indices = th.cat([batch.indices, batch.indices])  # the union of both ranks' minibatches
    single_stats = _step(single).gradients(batch)
    twin_stats = _step(twin, reducer=TwinRanks()).gradients(twin_batch)
    # float64 moments vs float32 torch.mean/std, and another summation order: float32 rounding only
    th.testing.assert_close(twin_stats, single_stats, rtol=1e-5, atol=1e-6)
    for a, b in zip(single.policy.parameters(), twin.policy.parameters()):
        th.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
        assert a.grad.abs().max() > 0


def test_advantage_moments_equal_torch_mean_and_unbiased_std() -> None:
    advantages = th.randn(1000, generator=th.Generator().manual_seed(0)) * 3 + 1
    fitted = AdvantageNormalizer.fit(advantages, True)
    a64 = advantages.double()
    merged = AdvantageNormalizer.from_moments(float(a64.sum()), float((a64 * a64).sum()), 1000, True, advantages)
    th.testing.assert_close(merged(advantages), fitted(advantages), rtol=0, atol=1e-6)
    assert AdvantageNormalizer.from_moments(1.0, 1.0, 1, True, advantages).mean is None  # one sample: no normalising
    assert np.isclose(float(merged.std), float(advantages.std()), rtol=1e-6)


def test_distribution_validation_is_off_in_train_and_restored_after() -> None:
    before = Distribution._validate_args
    seen: list[bool] = []
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, n_epochs=1, device="cpu", seed=0)
    evaluate = model.policy.evaluate_actions

    def recording(*args, **kwargs):
        seen.append(Distribution._validate_args)
        return evaluate(*args, **kwargs)

    model.policy.evaluate_actions = recording  # type: ignore[method-assign]
    model.learn(128)
    assert seen and not any(seen)
    assert Distribution._validate_args == before
    with distribution_validation(False):
        assert Distribution._validate_args is False
    assert Distribution._validate_args == before


def _stepped_adam() -> th.optim.Adam:
    params = [th.nn.Parameter(th.randn(3)), th.nn.Parameter(th.randn(2, 2))]
    optimizer = th.optim.Adam(params, lr=1e-3)
    for _ in range(3):
        optimizer.zero_grad()
        sum((p**2).sum() for p in params).backward()
        optimizer.step()
    return optimizer


def test_capturable_round_trip_keeps_step_values_and_persistent_counters() -> None:
    optimizer = _stepped_adam()
    persistent: dict[int, th.Tensor] = {}
    previous = _make_capturable(optimizer, persistent)
    assert previous == [False] and optimizer.param_groups[0]["capturable"] is True
    counters = {id(p): optimizer.state[p]["step"] for p in optimizer.param_groups[0]["params"]}
    assert all(counters[key] is persistent[key] for key in counters)  # the storage graphs would increment
    assert all(float(c) == 3.0 for c in counters.values())
    _restore_non_capturable(optimizer, previous)
    assert optimizer.param_groups[0]["capturable"] is False
    for param in optimizer.param_groups[0]["params"]:
        step = optimizer.state[param]["step"]
        assert step.device.type == "cpu" and float(step) == 3.0
    again = _make_capturable(optimizer, persistent)  # the same persistent tensors are reused, values copied in
    assert all(optimizer.state[p]["step"] is persistent[id(p)] for p in optimizer.param_groups[0]["params"])
    _restore_non_capturable(optimizer, again)


def test_adopt_step_counters_records_device_counters() -> None:
    optimizer = _stepped_adam()
    persistent: dict[int, th.Tensor] = {}
    _adopt_step_counters(optimizer, persistent)  # CPU parameters: their counters live on the same device
    assert set(persistent) == {id(p) for p in optimizer.param_groups[0]["params"]}


def test_graph_key_changes_exactly_when_something_baked_in_changes() -> None:
    """The cache key (pure Python, checked here on the CPU) must change with the loss settings and the optimizer
    state's storage, and stay equal when nothing changed. A new learning rate is written into the cache's
    persistent lr tensor, so it keeps the key (no recapture for schedules or the KL-adaptive lr)."""
    model = _model_with_rollout()
    batch = next(iter(MinibatchLoader(model._stage_rollout(), 32)))
    optimizer = model.policy.optimizer
    cache = GraphCache()

    def key(target_kl: float | None = None):
        graphed = CudaGraphStep(_step(model, target_kl), 32, 2, cache)
        value = graphed.key(batch)
        assert float(optimizer.param_groups[0]["lr"]) == float(cache.learning_rates[0])  # graphs read this tensor
        graphed.close()
        assert isinstance(optimizer.param_groups[0]["lr"], float)  # close() gave the float back
        return value

    first = key()
    assert key() == first
    assert key(0.5) != first
    optimizer.param_groups[0]["lr"] = 1e-3
    assert key() == first and float(cache.learning_rates[0]) == np.float32(1e-3)
    optimizer.load_state_dict(optimizer.state_dict())  # the same tensors: the graphs stay valid
    assert key() == first
    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # same values, new storage: recapture
    assert key() != first
    assert optimizer.param_groups[0]["capturable"] is False  # close() gave the optimizer back


def test_cpu_adam_takes_its_multi_tensor_step_during_train_only(monkeypatch) -> None:
    """train() steps a CPU Adam with foreach=True (same numbers: tests/test_parity.py) and gives foreach=None back."""
    from sb3_ppo_scale.core.update import step as step_module

    model = ScalablePPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")
    seen = []
    original = step_module.NonFiniteGuard.step
    monkeypatch.setattr(step_module.NonFiniteGuard, "step", lambda self, stepper, *args: (
        seen.append((type(stepper).__name__, stepper.optimizer.param_groups[0]["foreach"])), original(self, stepper, *args))[1])
    model.learn(32)
    assert seen == [("FlatAdam", True)]  # the flat step; its fallback is the multi-tensor step
    assert model.policy.optimizer.param_groups[0]["foreach"] is None
    rmsprop = th.optim.RMSprop(model.policy.parameters())
    assert step_module.multi_tensor_steps(rmsprop, list(model.policy.parameters())) == []  # not proven equal: untouched
    model.policy.optimizer.param_groups[0]["foreach"] = False  # a user's explicit choice is kept
    assert step_module.multi_tensor_steps(model.policy.optimizer, list(model.policy.parameters())) == []


def test_logged_means_are_sb3s_numpy_means() -> None:
    """``TrainStats.summary`` logs what SB3's ``train()`` logs from the same per-minibatch statistics: ``np.mean``
    over the ``.item()`` values (np.float64) and, for ``approx_kl``, over the last epoch's float32 arrays (np.float32,
    summed in float32: a float64 mean of the same values differs in the last digits for about a third of these)."""
    from sb3_ppo_scale.core.update.objectives import KL_INDEX, LOSS_INDEX, STAT_NAMES, TrainStats

    rng = np.random.default_rng(0)
    for _ in range(20):
        epochs = [epoch for epoch in range(3) for _ in range(40)]
        rows = [th.from_numpy((rng.random(len(STAT_NAMES)) * 1e-2).astype(np.float32)) for _ in epochs]
        stats = TrainStats()
        for row, epoch in zip(rows, epochs):
            stats.add(row, epoch)
        summary = stats.summary()
        for index, name in enumerate(STAT_NAMES):  # SB3: lists of .item() values, np.mean at the end
            if index not in (KL_INDEX, LOSS_INDEX):
                expected = np.mean([row[index].item() for row in rows])
                assert type(summary[name]) is type(expected) and summary[name] == expected, name
        last_kls = [row[KL_INDEX].numpy() for row, epoch in zip(rows, epochs) if epoch == epochs[-1]]
        expected_kl = np.mean(last_kls)  # SB3: approx_kl_divs holds .cpu().numpy() float32 arrays of one epoch
        assert type(summary["approx_kl"]) is np.float32 and summary["approx_kl"] == expected_kl
        assert summary["loss"] == rows[-1][LOSS_INDEX].item()
