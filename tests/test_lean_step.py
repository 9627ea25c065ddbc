"""SB3's VecEnvs stepped by sb3_ppo_scale.core.collect.vec_step equal ``env.step``: every returned array (values, dtypes),
every info, and the wrappers' state afterwards, through terminations, truncations and resets. Two identical stacks
(same seeds) take the same random actions, one through ``env.step``, one through ``vec_env_step(env)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecEnvWrapper, VecMonitor, VecNormalize

from sb3_ppo_scale.core.collect.vec_step import (
    batch_moments,
    batch_moments_are_numpys,
    copy_infos,
    update_running_moments,
    vec_env_step,
)
from tests.helpers import assert_same_state

STEPS = 120


def _dummy(env_id: str, n_envs: int, **make_kwargs: Any) -> DummyVecEnv:
    return make_vec_env(lambda: gym.make(env_id, **make_kwargs), n_envs=n_envs, seed=0)


def _unmonitored(env_id: str, n_envs: int, **make_kwargs: Any) -> DummyVecEnv:
    """Without make_vec_env's Monitor (for VecMonitor, which warns over one)."""
    env = DummyVecEnv([lambda: gym.make(env_id, **make_kwargs)] * n_envs)
    env.seed(0)
    return env


class IntegerDones(VecEnvWrapper):
    """A user's VecEnv that reports ``dones`` as integers (VecNormalize then indexes ``returns`` with them)."""

    def reset(self) -> Any:
        return self.venv.reset()

    def step_wait(self) -> Any:
        obs, rewards, dones, infos = self.venv.step_wait()
        return obs, rewards, dones.astype(np.int64), infos


#: name -> a factory of the VecEnv stack (float64 Hopper, float32 Pendulum; episodes that end by termination and
#: by truncation)
STACKS: dict[str, Callable[[], VecEnv]] = {
    "dummy_hopper": lambda: _dummy("Hopper-v5", 2),
    "vecnormalize_hopper_1_env": lambda: VecNormalize(_dummy("Hopper-v5", 1)),
    "vecnormalize_pendulum_truncated": lambda: VecNormalize(_dummy("Pendulum-v1", 3, max_episode_steps=25)),
    "vecnormalize_obs_only": lambda: VecNormalize(_dummy("Pendulum-v1", 2, max_episode_steps=25), norm_reward=False),
    "vecnormalize_reward_only": lambda: VecNormalize(_dummy("Hopper-v5", 2), norm_obs=False),
    "vecnormalize_not_training": lambda: VecNormalize(_dummy("Hopper-v5", 2), training=False),
    "vecnormalize_over_integer_dones": lambda: VecNormalize(IntegerDones(_dummy("Pendulum-v1", 2,
                                                                            max_episode_steps=25))),
    "vecnormalize_over_vecmonitor": lambda: VecNormalize(VecMonitor(_unmonitored("Pendulum-v1", 2,
                                                                                   max_episode_steps=25))),
}


def _state(env: VecEnv) -> list[Any]:
    """What stepping changes in a stack: VecNormalize's statistics and last raw step, the envs' buffers."""
    state: list[Any] = []
    while True:
        if isinstance(env, VecNormalize):
            for rms in (vars(env).get("obs_rms"), env.ret_rms):  # no obs_rms with norm_obs=False
                if rms is None:
                    continue
                state += [rms.mean, rms.var, rms.count, type(rms.mean), type(rms.var), type(rms.count)]
            state += [env.returns, env.old_obs, env.old_reward]
        if isinstance(env, DummyVecEnv):
            return state + [env.buf_obs, env.buf_rews, env.buf_dones, env.buf_infos, env.actions]
        env = env.venv


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_lean_step_equals_env_step(stack: str) -> None:
    reference, lean = STACKS[stack](), STACKS[stack]()
    step = vec_env_step(lean)
    assert step != lean.step  # the lean path is taken for every stack here
    assert_same_state(reference.reset(), lean.reset(), "reset")
    actions = np.random.default_rng(0).uniform(-1, 1, (STEPS, reference.num_envs, *reference.action_space.shape))
    ended = 0
    for t in range(STEPS):
        expected, got = reference.step(actions[t].astype(np.float32)), step(actions[t].astype(np.float32))
        for name, a, b in zip(("obs", "rewards", "dones", "infos"), expected, got):
            assert type(a) is type(b), f"step {t} {name}: {type(a)} != {type(b)}"
            assert_same_state(a, b, f"step {t} {name}")
        ended += int(expected[2].sum())
    assert ended >= 2, "no episode ended: resets and terminal observations untested"
    assert_same_state(_state(reference), _state(lean), "state")


def test_returned_infos_and_observations_are_copies() -> None:
    env = _dummy("Pendulum-v1", 2, max_episode_steps=3)
    env.reset()
    step = vec_env_step(env)
    for _ in range(3):
        obs, _, _, infos = step(np.zeros((2, 1), np.float32))
    assert "terminal_observation" in infos[0]
    infos[0]["terminal_observation"][:] = 99.0
    infos[1]["extra"] = 1
    obs[:] = 99.0
    assert not np.any(env.buf_infos[0]["terminal_observation"] == 99.0) and "extra" not in env.buf_infos[1]
    assert not np.any(env.buf_obs[None] == 99.0)


def test_copy_infos_is_deepcopy() -> None:
    shared = [1, 2]
    infos = [{"a": 1.0, "b": np.float64(2.0), "ok": True}, {"shared": shared}, {"shared": shared, "s": "x"}]
    copied = copy_infos(infos)
    assert copied == infos and all(c is not i for c, i in zip(copied, infos))
    assert copied[1]["shared"] is not shared and copied[1]["shared"] is copied[2]["shared"]  # one memo, as deepcopy

    class Tagged(float):  # a float subclass can hold mutable state: deep-copied, not shared
        pass

    tagged = Tagged(1.0)
    tagged.notes = []  # type: ignore[attr-defined]
    assert copy_infos([{"x": tagged}])[0]["x"] is not tagged


class StepCountingVecEnv(DummyVecEnv):
    """A subclass (its step may differ from DummyVecEnv's): stepped by its own ``step``."""


@pytest.mark.parametrize("make", [
    lambda: StepCountingVecEnv([lambda: gym.make("Pendulum-v1")]),
    lambda: VecMonitor(_unmonitored("Pendulum-v1", 1)),
    lambda: make_vec_env("FrozenLake-v1", n_envs=1),  # Discrete observations: no array to normalise
], ids=["subclass", "other_wrapper", "discrete_obs"])
def test_other_vec_envs_step_themselves(make: Callable[[], VecEnv]) -> None:
    env = make()
    assert vec_env_step(env) == env.step


def test_replaced_step_wait_steps_itself() -> None:
    env = VecNormalize(_dummy("Pendulum-v1", 1))
    env.step_wait = env.step_wait  # type: ignore[method-assign]  # an instance attribute now: respected
    assert vec_env_step(env) == env.step


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1,), (4,), (1, 11), (8, 17), (3, 2, 5)])
def test_batch_moments_are_numpys(dtype: type, shape: tuple[int, ...]) -> None:
    assert batch_moments_are_numpys(np.dtype(dtype))
    batch = (np.random.default_rng(1).standard_normal(shape) * 300 + 7).astype(dtype)
    mean, var = batch_moments(batch)
    assert_same_state([mean, var, type(mean), type(var)],
                      [np.mean(batch, axis=0), np.var(batch, axis=0), type(np.mean(batch, axis=0)),
                       type(np.var(batch, axis=0))])


def test_other_dtypes_update_through_running_mean_std() -> None:
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    ours, reference = RunningMeanStd(shape=(3,)), RunningMeanStd(shape=(3,))
    batch = np.arange(6, dtype=np.int64).reshape(2, 3)
    update_running_moments(ours, batch)
    reference.update(batch)
    assert_same_state([ours.mean, ours.var, ours.count], [reference.mean, reference.var, reference.count])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("row", [[np.inf], [np.nan], [[np.inf, -np.inf, np.nan, -0.0]]])
def test_one_row_moments_with_non_finite_values(dtype: type, row: list) -> None:
    """One env: the shortcut (row, (row - row) ** 2) is NumPy's mean and var for inf, nan and -0.0 too."""
    batch = np.array(row, dtype=dtype)
    with np.errstate(invalid="ignore"):
        mean, var = batch_moments(batch)
        expected = np.mean(batch, axis=0), np.var(batch, axis=0)
    for ours, reference in zip((mean, var), expected):
        _assert_same_bits(ours, reference)


def _assert_same_bits(ours: Any, reference: Any) -> None:
    """Same type, dtype, shape and bytes (nan, inf and the sign of zero included)."""
    assert type(ours) is type(reference) and ours.dtype == reference.dtype and ours.shape == reference.shape
    assert np.asarray(ours).tobytes() == np.asarray(reference).tobytes()


@pytest.mark.parametrize("values, low, high", [
    (np.array([[-3.0, 0.5, 7.0]], dtype=np.float32), np.full(3, -1, np.float32), np.full(3, 1, np.float32)),
    (np.array([-3.0, 0.5, np.nan, np.inf]), -1.0, 1.0),
    (np.array([[-3.0, 0.5]], dtype=np.float32), -10.0, 10.0),
    (np.array([-3, 5, 9]), 0, 4),  # integers: np.clip itself
    (np.array([-3.0, 5.0]), None, 4.0),  # one bound: np.clip itself
])
def test_clip_is_np_clip(values: np.ndarray, low: Any, high: Any) -> None:
    from sb3_ppo_scale.core.collect.vec_step import clip

    _assert_same_bits(clip(values, low, high), np.clip(values, low, high))


def test_replaced_normalize_obs_steps_itself() -> None:
    env = VecNormalize(_dummy("Pendulum-v1", 1))
    env._normalize_obs = env._normalize_obs  # type: ignore[method-assign]
    assert vec_env_step(env) == env.step
