"""The non-finite guard (sb3_ppo_scale.core.update.guard): a NaN in one minibatch skips that optimizer step (parameters and
Adam state untouched), counts it in ``train/nonfinite_steps`` and warns; ``nonfinite="raise"`` stops at once with
the minibatch statistics; MAX_CONSECUTIVE skips in a row stop training; finite steps are PPO's exactly."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import KVWriter, Logger

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core.update.guard import MAX_CONSECUTIVE, NonFiniteError, NonFiniteGuard
from tests.helpers import assert_same_state

N_STEPS, N_ENVS = 32, 2
ROLLOUT = N_STEPS * N_ENVS


class Recorder(KVWriter):
    """Keeps every dumped ``train/nonfinite_steps`` value with its step."""

    def __init__(self) -> None:
        self.nonfinite: list[tuple[int, Any]] = []

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        if "train/nonfinite_steps" in key_values:
            self.nonfinite.append((step, key_values["train/nonfinite_steps"]))


class PoisonRollouts(BaseCallback):
    """At the end of the rollouts numbered in ``poisoned`` (1-based), writes NaN into observations of the rollout
    buffer (``rows``: which flattened samples; None: all) and records the policy and optimizer state that train()
    starts from."""

    def __init__(self, poisoned: set[int], rows: list[int] | None = None) -> None:
        super().__init__()
        self.poisoned, self.rows, self.rollouts = poisoned, rows, 0
        self.before_train: dict[int, tuple[dict, dict]] = {}

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.rollouts += 1
        if self.rollouts in self.poisoned:
            observations = self.model.rollout_buffer.observations  # (n_steps, n_envs, obs_dim)
            if self.rows is None:
                observations[:] = np.nan
            else:
                for row in self.rows:
                    observations[row % N_STEPS, row // N_STEPS, 0] = np.nan
        self.before_train[self.rollouts] = (copy.deepcopy(self.model.policy.state_dict()),
                                            copy.deepcopy(self.model.policy.optimizer.state_dict()))


def make_model(batch_size: int, nonfinite: str = "skip", n_epochs: int = 2) -> tuple[ScalablePPO, Recorder]:
    model = ScalablePPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0), n_steps=N_STEPS,
                        batch_size=batch_size, n_epochs=n_epochs, seed=0, device="cpu", nonfinite=nonfinite,
                        policy_kwargs={"net_arch": [16]})
    recorder = Recorder()
    model.set_logger(Logger(folder=None, output_formats=[recorder]))
    return model, recorder


def adam_steps(model: ScalablePPO) -> int:
    """Optimizer steps actually taken (Adam's step counter; ``_n_grad_steps`` counts skipped minibatches too)."""
    return int(next(iter(model.policy.optimizer.state.values()))["step"])


def finite(model: ScalablePPO) -> bool:
    return all(bool(th.isfinite(p).all()) for p in model.policy.parameters())


def test_nan_in_one_minibatch_skips_that_step_and_counts_it() -> None:
    """One NaN observation in rollout 2: in each of its 2 epochs exactly the minibatch holding it is skipped."""
    model, recorder = make_model(batch_size=16)  # 4 minibatches per epoch
    poison = PoisonRollouts({2}, rows=[5])
    with pytest.warns(RuntimeWarning, match="skipped an optimizer step with non-finite values"):
        model.learn(4 * ROLLOUT, callback=poison)
    assert finite(model)
    assert model._n_nonfinite_steps == 2
    assert adam_steps(model) == 4 * 4 * 2 - 2  # every other minibatch stepped
    # logged from the first skipped step on: train() of rollout 2 is dumped at the next log step, the count stays
    assert recorder.nonfinite == [(3 * ROLLOUT, 2), (4 * ROLLOUT, 2)]
    assert model.logger.name_to_value["train/nonfinite_steps"] == 2


def test_a_skipped_step_leaves_parameters_and_adam_state_untouched() -> None:
    """Rollout 2 is all NaN, one minibatch per epoch: its train() changes nothing, the next one trains again."""
    model, _ = make_model(batch_size=ROLLOUT)
    poison = PoisonRollouts({2})
    with pytest.warns(RuntimeWarning):
        model.learn(3 * ROLLOUT, callback=poison)
    policy_1, optimizer_1 = poison.before_train[2]  # the state after rollout 1's update, before rollout 2's
    policy_2, optimizer_2 = poison.before_train[3]  # ... after rollout 2's (skipped) update
    assert_same_state(policy_1, policy_2)
    assert_same_state(optimizer_1, optimizer_2)
    assert not th.equal(policy_2["action_net.weight"], model.policy.state_dict()["action_net.weight"])
    assert model._n_nonfinite_steps == 2 and finite(model)


def test_raise_stops_at_the_first_non_finite_step_with_the_statistics() -> None:
    model, _ = make_model(batch_size=16, nonfinite="raise")
    with pytest.raises(NonFiniteError) as error:
        model.learn(3 * ROLLOUT, callback=PoisonRollouts({2}, rows=[5]))
    message = str(error.value)
    assert message.startswith("non-finite loss or gradient in a PPO update (")
    assert "loss=nan" in message and "grad_norm=nan" in message
    assert "1 optimizer step(s) in a row skipped (nonfinite='raise', limit 10)" in message
    assert "VecCheckNan" in message
    assert finite(model)


def test_max_consecutive_skips_stop_training_and_a_finite_step_resets_the_count() -> None:
    """2 skips per poisoned rollout: rollouts 1-4 (8 in a row), a clean rollout 5 resets the count, then rollouts
    6-10 reach MAX_CONSECUTIVE = 10 in a row at rollout 10."""
    assert MAX_CONSECUTIVE == 10
    model, _ = make_model(batch_size=ROLLOUT)
    poison = PoisonRollouts({1, 2, 3, 4, 6, 7, 8, 9, 10, 11})
    with pytest.warns(RuntimeWarning), pytest.raises(NonFiniteError, match=r"10 optimizer step\(s\) in a row skipped "
                                                                            r"\(nonfinite='skip', limit 10\)"):
        model.learn(12 * ROLLOUT, callback=poison)
    assert poison.rollouts == 10
    assert adam_steps(model) == 2  # rollout 5's two epochs
    assert finite(model)


def _backward(model: th.nn.Module, optimizer: th.optim.Optimizer, scale: float) -> None:
    optimizer.zero_grad()
    model(th.ones(2, 4)).pow(2).mul(scale).sum().backward()


@pytest.mark.parametrize(("on_device", "first_nan"), [(False, True), (True, False), (True, True)])
def test_guard_step_is_the_optimizer_step_or_nothing(on_device: bool, first_nan: bool) -> None:
    """Both decision paths on the CPU (a host read of the flag; on the device: step, then undo with th.where):
    a finite step equals ``optimizer.step()``; a step whose gradients are NaN (the very first one, which creates
    Adam's state, and a later one) or whose statistics are infinite leaves parameters and Adam state as they were."""
    th.manual_seed(0)
    net = th.nn.Linear(4, 3)
    reference = copy.deepcopy(net)
    optimizer, reference_optimizer = th.optim.Adam(net.parameters(), 1e-2), th.optim.Adam(reference.parameters(), 1e-2)
    guard = NonFiniteGuard("skip", th.device("cpu"), on_device=on_device)
    params = list(net.parameters())
    finite_stats = th.zeros(6)
    first = float("nan") if first_nan else 0.5
    for step, (scale, stats) in enumerate([(first, finite_stats), (1.0, finite_stats), (2.0, finite_stats),
                                           (3.0, th.full((6,), float("inf"))), (float("nan"), finite_stats),
                                           (4.0, finite_stats)]):
        _backward(net, optimizer, scale)
        grad_norm = th.nn.utils.clip_grad_norm_(params, 10.0)
        skipped = not (np.isfinite(scale) and bool(th.isfinite(stats).all()))
        before = (copy.deepcopy(net.state_dict()), copy.deepcopy(optimizer.state_dict()))
        if skipped and not on_device:
            with pytest.warns(RuntimeWarning, match="skipped an optimizer step"):
                guard.step(optimizer, params, grad_norm, stats)
        else:
            guard.step(optimizer, params, grad_norm, stats)
        if skipped:
            assert_same_state(before[0], net.state_dict())
            state = optimizer.state_dict()["state"]
            assert all(bool(th.isfinite(t).all()) for s in state.values() for t in s.values()), f"step {step}"
            if step > 0:
                assert_same_state(before[1], optimizer.state_dict())
            elif on_device:  # the first step created Adam's state: zeroed, which is what a fresh state is
                assert all(not t.any() for s in state.values() for t in s.values())
            continue
        _backward(reference, reference_optimizer, scale)
        th.nn.utils.clip_grad_norm_(list(reference.parameters()), 10.0)
        reference_optimizer.step()
        assert_same_state(reference.state_dict(), net.state_dict())
        assert_same_state(reference_optimizer.state_dict()["state"], optimizer.state_dict()["state"])
    assert int(guard.skipped) == 2 + first_nan
