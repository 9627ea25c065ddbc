"""The lean vector-env step (sb3_ppo_scale.core.lean_vec_env) returns what SB3's ``DummyVecEnv.step`` /
``VecNormalize.step`` return and leaves the env in the same state, bit for bit.

Two identical env stacks (same seeds) are stepped with the same actions, one by ``env.step`` and one by
:func:`lean_vec_step`; every step's observations, rewards, dones and infos must be equal (arrays by their bytes and
dtypes), and so must VecNormalize's running statistics, discounted returns and unnormalised observation and reward,
and DummyVecEnv's buffers. The collection loops that use it are compared with SB3's in tests/test_lean_collect.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import SimpleMultiObsEnv
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecFrameStack, VecNormalize

from sb3_ppo_scale.contrib.masks import MaskCheckingVecEnv
from sb3_ppo_scale.core import lean_vec_env
from sb3_ppo_scale.core.lean_vec_env import batch_moments, copy_infos, lean_vec_step
from tests.helpers import assert_same_state


def _pendulum(n_envs: int, **normalize: Any) -> VecEnv:
    """Pendulum truncated after 9 steps (so episodes end, with terminal observations), ``VecNormalize`` with
    ``normalize``'s arguments unless it holds ``raw=True``."""
    env = make_vec_env(lambda: gym.make("Pendulum-v1", max_episode_steps=9), n_envs=n_envs, seed=3)
    return env if normalize.pop("raw", False) else VecNormalize(env, **normalize)


def _multi_obs(n_envs: int) -> VecEnv:
    np.random.seed(0)  # SimpleMultiObsEnv draws its observations from numpy's global RNG

    def make() -> gym.Env:
        return gym.wrappers.TimeLimit(SimpleMultiObsEnv(random_start=False), max_episode_steps=9)

    return VecNormalize(make_vec_env(make, n_envs=n_envs, seed=3))


#: name -> env factory
STACKS: dict[str, Callable[[], VecEnv]] = {
    "vecnormalize_one_env": lambda: _pendulum(1),
    "vecnormalize_three_envs": lambda: _pendulum(3),
    "vecnormalize_obs_only": lambda: _pendulum(2, norm_reward=False),
    "vecnormalize_reward_only": lambda: _pendulum(2, norm_obs=False, clip_reward=0.5),
    "vecnormalize_float32_gamma": lambda: _pendulum(2, gamma=0.9, clip_obs=1.5),
    "dummy_only": lambda: _pendulum(3, raw=True),
    "dict_observations": lambda: _multi_obs(2),
    "cartpole_discrete": lambda: VecNormalize(make_vec_env("CartPole-v1", n_envs=2, seed=3)),
}


def _actions(env: VecEnv, n_steps: int) -> list[np.ndarray]:
    space = env.action_space
    space.seed(7)
    return [np.stack([space.sample() for _ in range(env.num_envs)]) for _ in range(n_steps)]


def _assert_bitwise(a: Any, b: Any, path: str) -> None:
    """Equal as :func:`assert_same_state` says, and arrays equal byte for byte (NaN, -0.0)."""
    assert_same_state(a, b, path)
    if isinstance(a, np.ndarray):
        assert a.tobytes() == b.tobytes() and a.flags.c_contiguous == b.flags.c_contiguous, path
    elif isinstance(a, dict):
        for key in a.keys() - ({"t"} if {"r", "l", "t"} <= a.keys() else set()):  # Monitor's wall-clock "t"
            _assert_bitwise(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        for index, (x, y) in enumerate(zip(a, b)):
            _assert_bitwise(x, y, f"{path}/{index}")


def _env_state(env: VecEnv) -> dict[str, Any]:
    """What stepping changes in a VecNormalize / DummyVecEnv stack."""
    state: dict[str, Any] = {}
    if isinstance(env, VecNormalize):
        stats = {} if not env.norm_obs else env.obs_rms if isinstance(env.obs_rms, dict) else {"obs": env.obs_rms}
        for key, rms in {**stats, "ret": env.ret_rms}.items():
            state[f"{key}_rms"] = (np.asarray(rms.mean), np.asarray(rms.var), rms.count)
        state.update(returns=env.returns, old_obs=env.old_obs, old_reward=env.old_reward)
        env = env.venv
    state.update(buf_obs=dict(env.buf_obs), buf_rews=env.buf_rews, buf_dones=env.buf_dones,
                 buf_infos=env.buf_infos, actions=env.actions)
    return state


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_lean_step_equals_env_step(stack: str) -> None:
    sb3, lean = STACKS[stack](), STACKS[stack]()
    assert lean_vec_step(lean) != lean.step
    _assert_bitwise(sb3.reset(), lean.reset(), "reset")
    step = lean_vec_step(lean)
    ended = 0
    for index, actions in enumerate(_actions(sb3, 40)):
        expected, got = sb3.step(actions), step(actions)
        _assert_bitwise(list(expected), list(got), f"step {index}")
        assert all(type(x) is type(y) for x, y in zip(expected[3], got[3]))
        _assert_bitwise(_env_state(sb3), _env_state(lean), f"state after step {index}")
        ended += int(expected[2].sum())
    assert ended > 0, "no episode ended: the terminal-observation path was not exercised"


def test_outputs_do_not_alias_the_env_buffers() -> None:
    """Like SB3's deepcopy, the returned observations and infos are copies: changing them changes nothing in the env,
    and the next step does not overwrite them."""
    env = _pendulum(2, raw=True)
    env.reset()
    step = lean_vec_step(env)
    obs, _, _, infos = step(_actions(env, 1)[0])
    kept_obs, kept_infos = obs.copy(), copy.deepcopy(infos)
    step(_actions(env, 1)[0])
    _assert_bitwise(obs, kept_obs, "obs")
    assert infos == kept_infos
    obs[:] = 99.0
    infos[0]["TimeLimit.truncated"] = "changed"
    assert not (env.buf_obs[None] == 99.0).any() and env.buf_infos[0]["TimeLimit.truncated"] != "changed"


def test_training_off_leaves_statistics_alone() -> None:
    sb3, lean = _pendulum(2), _pendulum(2)
    for env in (sb3, lean):
        env.training = False
    sb3.reset(), lean.reset()
    step = lean_vec_step(lean)
    for actions in _actions(sb3, 12):
        _assert_bitwise(list(sb3.step(actions)), list(step(actions)), "step")
    _assert_bitwise(_env_state(sb3), _env_state(lean), "state")
    assert lean.obs_rms.count == RunningMeanStd().count


class CountingDummyVecEnv(DummyVecEnv):
    """A subclass: its own step_wait might do anything."""


@pytest.mark.parametrize("make", [
    lambda: CountingDummyVecEnv([lambda: gym.make("Pendulum-v1")]),
    lambda: VecFrameStack(DummyVecEnv([lambda: gym.make("Pendulum-v1")]), 2),
], ids=["subclass", "other_wrapper"])
def test_other_vec_envs_keep_their_own_step(make: Callable[[], VecEnv]) -> None:
    env = make()
    assert lean_vec_step(env) == env.step


def test_an_instance_level_override_keeps_the_envs_own_step() -> None:
    env = _pendulum(1)
    env.step_wait = lambda: None  # type: ignore[method-assign]
    assert lean_vec_step(env) == env.step


def test_pass_through_wrapper_steps_its_wrapped_env_leanly() -> None:
    """MaskCheckingVecEnv declares that its step is its wrapped env's; an undeclared subclass does not inherit that."""
    sb3 = MaskCheckingVecEnv(_pendulum(2), gym.spaces.Discrete(2))
    lean = MaskCheckingVecEnv(_pendulum(2), gym.spaces.Discrete(2))
    sb3.reset(), lean.reset()
    step = lean_vec_step(lean)
    assert step != lean.step
    for actions in _actions(sb3, 12):
        _assert_bitwise(list(sb3.step(actions)), list(step(actions)), "step")
    _assert_bitwise(_env_state(sb3.venv), _env_state(lean.venv), "state")

    class Undeclared(MaskCheckingVecEnv):
        pass

    other = Undeclared(_pendulum(1), gym.spaces.Discrete(2))
    assert lean_vec_step(other) == other.step


def test_copy_infos_equals_deepcopy() -> None:
    shared = {"a": 1.0}
    nested = {"episode": {"r": 1.0, "l": 3}, "terminal_observation": np.arange(3.0), "x": np.float64(2.0)}

    class Info(dict):
        pass

    infos = [{"x": np.float32(1.5), "ok": True, "name": "n", "none": None}, shared, nested, shared,
             Info(y=[1, 2]), {1: 2.0}]
    copies = copy_infos(infos)
    assert_same_state(copies, copy.deepcopy(infos), "infos")
    assert [type(c) for c in copies] == [type(i) for i in infos]
    assert all(c is not i for c, i in zip(copies, infos))
    assert copies[1] is copies[3], "an info listed twice is copied once, as deepcopy does"
    assert copies[2]["episode"] is not nested["episode"]
    assert copies[2]["terminal_observation"] is not nested["terminal_observation"]
    assert copies[4]["y"] is not infos[4]["y"]


@pytest.mark.parametrize("batch", [
    np.random.default_rng(0).normal(size=(1, 11)),
    np.random.default_rng(1).normal(size=(8, 17)).astype(np.float32),
    np.random.default_rng(2).normal(size=(5,)),
    np.array([1e308, 1e308, -0.0]),
    np.arange(12, dtype=np.int64).reshape(4, 3),
    np.ones((3, 2), dtype=np.float16),
], ids=["one_row", "float32", "returns", "overflow", "int", "float16"])
def test_batch_moments_equal_numpy(batch: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        mean, var = batch_moments(batch)
        expected = (np.mean(batch, axis=0), np.var(batch, axis=0))
    for got, want in zip((mean, var), expected):
        assert type(got) is type(want) and got.dtype == want.dtype
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def test_batch_moments_fall_back_to_numpy_when_the_check_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lean_vec_env, "_EXACT", [False])
    monkeypatch.setattr(lean_vec_env, "_direct_moments", lambda batch: pytest.fail("direct moments used"))
    batch = np.random.default_rng(0).normal(size=(4, 3))
    mean, var = batch_moments(batch)
    assert np.array_equal(mean, np.mean(batch, axis=0)) and np.array_equal(var, np.var(batch, axis=0))


def test_the_direct_moments_pass_their_check_on_this_numpy() -> None:
    """If this fails, a new numpy computes mean/var differently: VecNormalize still works (through np.mean/np.var),
    only slower; update _direct_moments to the new numpy's _methods."""
    assert lean_vec_env._check_direct_moments()
