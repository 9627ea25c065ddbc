"""The update runners' CPU-testable parts: eager stop logic, distribution validation, the optimizer's capturable
round trip (the CUDA-graph path itself is covered by tests/test_cuda.py on a GPU)."""

from __future__ import annotations

import copy

import torch as th
from torch.distributions import Distribution

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core.updates import (
    EagerUpdate,
    _adopt_step_counters,
    _make_capturable,
    _restore_non_capturable,
    distribution_validation,
)


def test_eager_update_skips_the_step_when_told_to_stop() -> None:
    calls: list[str] = []
    stats = th.tensor([1.0])

    def gradients(batch):
        calls.append("gradients")
        return stats

    update = EagerUpdate(gradients, lambda: calls.append("apply"), should_stop=lambda s: bool(s[0] > 0.5))
    assert update(None) == (stats, False)  # type: ignore[arg-type]
    assert calls == ["gradients"]
    update = EagerUpdate(gradients, lambda: calls.append("apply"), should_stop=lambda s: False)
    assert update(None) == (stats, True)  # type: ignore[arg-type]
    assert calls == ["gradients", "gradients", "apply"]


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
    """The cache key (pure Python, checked here on the CPU) must change with the lr, the loss settings and the
    optimizer state's storage, and stay equal when nothing changed."""
    from sb3_ppo_scale.core.updates import CudaGraphUpdate, GraphCache

    model = ScalablePPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, n_epochs=1, device="cpu", seed=0)
    model.learn(64)
    batch = next(iter(model._make_loader(model._stage_rollout())))
    optimizer = model.policy.optimizer

    def key(config: tuple = ("settings", 0.5)) -> tuple:
        update = CudaGraphUpdate(lambda b: th.zeros(1), lambda: None, lambda s: False, optimizer, 32, 2,
                                 GraphCache(), config)
        value = update.key(batch)
        update.close()
        return value

    first = key()
    assert key() == first
    assert key(("settings", 0.7)) != first
    optimizer.param_groups[0]["lr"] = 1e-3
    changed_lr = key()
    assert changed_lr != first
    optimizer.load_state_dict(optimizer.state_dict())  # the same tensors: the graphs stay valid
    assert key() == changed_lr
    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # same values, new storage: recapture
    assert key() != changed_lr
    assert optimizer.param_groups[0]["capturable"] is False  # close() gave the optimizer back
