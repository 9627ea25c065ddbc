"""Defaults are PPO: identical parameters after the same training, with and without target_kl early stopping.

With grad_accum_steps=k > 1 the parameters match PPO with the same batch_size (exact accumulation).
"""

from __future__ import annotations

import pytest

from tests.helpers import ACCUMULATION_ATOL, assert_identical, max_param_diff, train_pair

N_STEPS = 256
ROLLOUTS = 3


def _common(env_id: str, target_kl: float | None) -> dict:
    kwargs = dict(n_steps=N_STEPS, batch_size=64, n_epochs=4)
    if target_kl is not None:  # a large learning rate makes the KL early stop fire on these tasks
        kwargs.update(target_kl=target_kl, learning_rate=3e-3)
    return kwargs


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("target_kl", [None, 0.003])
@pytest.mark.parametrize("grad_accum_steps", [1, 3])
def test_parameters_equal_ppo(env_id: str, target_kl: float | None, grad_accum_steps: int) -> None:
    ppo, scalable = train_pair(
        env_id, ROLLOUTS * N_STEPS, scalable_kwargs=dict(grad_accum_steps=grad_accum_steps), **_common(env_id, target_kl)
    )
    if grad_accum_steps == 1:
        assert_identical(ppo, scalable)  # parameters and Adam state, bit for bit
    else:  # another float summation order of the gradients (tests/helpers.py justifies the tolerance)
        assert max_param_diff(ppo, scalable) <= ACCUMULATION_ATOL
    assert scalable._n_updates == ppo._n_updates
    full_run_steps = ROLLOUTS * 4 * (N_STEPS // 64)
    if target_kl is None:
        assert scalable._n_grad_steps == full_run_steps
    else:  # early stopping really fired
        assert scalable._n_grad_steps < full_run_steps
    if grad_accum_steps == 1:  # same operations in the same order: bit-identical
        assert max_param_diff(ppo, scalable) == 0.0


@pytest.mark.parametrize(("batch_size", "grad_accum_steps"), [(100, 7), (256, 256), (256, 16), (96, 5)])
def test_accumulation_with_uneven_and_short_batches(batch_size: int, grad_accum_steps: int) -> None:
    """Micro sizes that do not divide, a short last minibatch (256 % 100, 256 % 96) and the whole rollout."""
    ppo, scalable = train_pair(
        "Pendulum-v1",
        2 * N_STEPS,
        scalable_kwargs=dict(grad_accum_steps=grad_accum_steps),
        n_steps=N_STEPS,
        batch_size=batch_size,
        n_epochs=3,
    )
    assert max_param_diff(ppo, scalable) <= ACCUMULATION_ATOL


def test_logger_keys_and_values_match_ppo() -> None:
    ppo, scalable = train_pair("Pendulum-v1", 2 * N_STEPS, n_steps=N_STEPS, batch_size=64, n_epochs=2, clip_range_vf=0.2)
    ppo_keys = {k for k in ppo.logger.seen if k.startswith("train/")}
    ours = {k for k in scalable.logger.seen if k.startswith("train/")}
    assert ours == ppo_keys | {"train/n_grad_steps"}
    for key in ppo_keys:
        assert scalable.logger.seen[key] == ppo.logger.seen[key], key  # the same values, not just close ones
    assert scalable.logger.seen["train/n_grad_steps"] == 2 * 2 * (N_STEPS // 64)
