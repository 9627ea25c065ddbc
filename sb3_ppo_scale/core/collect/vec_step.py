"""``env.step`` for SB3's own VecEnv stack, with the same results at less Python cost per step.

At 1 env on MuJoCo, SB3's ``DummyVecEnv`` and ``VecNormalize`` cost about as much per step as the physics they
wrap (benchmarks/results/end_to_end/profile.md). Most of it is generic machinery around a handful of numbers:

- ``DummyVecEnv.step_wait`` deep-copies its observation dict and its list of info dicts every step;
- ``VecNormalize.step_wait`` updates two running moments with ``np.mean`` and ``np.var`` (Python-level functions
  around four ufunc calls each) and deep-copies the observation it then replaces.

:func:`vec_env_step` returns a function that steps such a stack as ``env.step`` does, statement for statement, with
these changes, which leave every value, dtype and side effect as they were:

- :func:`batch_moments` makes NumPy's own ufunc calls of ``np.mean(a, axis=0)`` and ``np.var(a, axis=0)``, in its
  order; for a batch of one row (one env), the row itself as the mean and ``(row - row) ** 2`` as the variance (a
  sum over one row divided by 1 is exact); checked against NumPy once per process and dtype
  (:func:`batch_moments_are_numpys`);
- ``np.clip`` of a float array between two bounds is the ``clip`` ufunc NumPy's ``_clip`` calls (:func:`clip`);
- the observation is copied with ``ndarray.copy(order="K")``, which is what ``deepcopy`` of the one-array dict
  ``DummyVecEnv`` keeps does; info dicts whose values are all immutable scalars are copied with ``dict()`` (a deep
  copy of an immutable value is the value), the others with ``deepcopy`` and one memo for the whole list, as
  ``deepcopy(list)`` shares it;
- ``VecNormalize`` skips the ``deepcopy`` of an observation array it normalises (the copy is dropped unread).

The installed SB3's stepping code must be the verified one (:mod:`sb3_ppo_scale.core.exact.upstream`; else ``env.step``,
with a warning). Only the exact classes ``DummyVecEnv`` (array observations) and ``VecNormalize`` (array observations, plain
``RunningMeanStd`` statistics; over any VecEnv, which it steps with that env's ``step_async`` and ``step_wait``
as SB3 does) take this path, and only without step methods replaced on the instance. Any other VecEnv, wrapper or
subclass is stepped by its own ``step``. tests/test_lean_step.py compares every returned array and
the wrappers' state with SB3's stepping, through resets, truncations and terminal observations.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecNormalize
from stable_baselines3.common.vec_env.base_vec_env import VecEnvStepReturn

from sb3_ppo_scale.core.exact.upstream import VEC_ENV_STEP, changed_upstream, resolve

try:  # the ufunc np.clip ends in on NumPy 2 (numpy/_core/_methods.py: _clip)
    from numpy._core.umath import clip as _clip_ufunc
except ImportError:  # pragma: no cover - NumPy 1.x: np.clip itself
    _clip_ufunc = None

VecStep = Callable[[np.ndarray], VecEnvStepReturn]
#: Info value types copied by reference (exact types: a subclass may carry mutable state): a deep copy of one of
#: these is the value itself, or an equal new scalar.
IMMUTABLE_SCALARS = frozenset({bool, int, float, str, type(None), *(np.dtype(code).type for code in "?bBhHiIlLqQefdg")})
#: Observation dtypes :func:`batch_moments` handles (others go through ``RunningMeanStd.update``).
MOMENT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: Methods the lean step replaces: an instance with any of them set on itself is stepped by its own ``step``.
_REPLACED_METHODS = ("step", "step_async", "step_wait", "_normalize_obs", "normalize_reward")


def vec_env_step(env: VecEnv) -> VecStep:
    """The function that steps ``env`` exactly as ``env.step(actions)`` does: a lean one for ``DummyVecEnv`` and
    ``VecNormalize`` with array observations, ``env.step`` itself for anything else."""
    lean = _lean_step(env)
    if lean is None:
        return env.step
    changed = changed_upstream(resolve(VEC_ENV_STEP))
    if changed is not None:
        warnings.warn(f"SB3's VecEnv stepping runs as it is, not the lean step: {changed}", stacklevel=3)
        return env.step
    return lean


def _lean_step(env: VecEnv) -> VecStep | None:
    if _is_exact(env, VecNormalize) and isinstance(env.observation_space, spaces.Box) \
            and (not env.norm_obs or type(vars(env).get("obs_rms")) is RunningMeanStd) \
            and type(vars(env).get("ret_rms")) is RunningMeanStd:
        inner = _lean_step(env.venv) or functools.partial(_async_then_wait, env.venv)
        return functools.partial(_vec_normalize_step, env, inner)
    if _is_exact(env, DummyVecEnv) and isinstance(env.observation_space, spaces.Box) and env.keys == [None]:
        return functools.partial(_dummy_vec_env_step, env)
    return None


def _async_then_wait(env: VecEnv, actions: np.ndarray) -> VecEnvStepReturn:
    """What ``VecNormalize`` does with the env it wraps (not that env's ``step``, which a subclass may override)."""
    env.step_async(actions)
    return env.step_wait()


def _is_exact(env: VecEnv, cls: type) -> bool:
    """``env`` is an instance of ``cls`` itself (not a subclass) whose step and normalising methods are the class's."""
    return type(env) is cls and not any(name in vars(env) for name in _REPLACED_METHODS)


def _dummy_vec_env_step(env: DummyVecEnv, actions: np.ndarray) -> VecEnvStepReturn:
    """``DummyVecEnv.step_async`` then ``step_wait`` (SB3's statements), the copies made leaner."""
    env.actions = actions
    for env_idx in range(env.num_envs):
        obs, env.buf_rews[env_idx], terminated, truncated, env.buf_infos[env_idx] = env.envs[env_idx].step(
            env.actions[env_idx]
        )
        env.buf_dones[env_idx] = terminated or truncated
        env.buf_infos[env_idx]["TimeLimit.truncated"] = truncated and not terminated
        if env.buf_dones[env_idx]:
            env.buf_infos[env_idx]["terminal_observation"] = obs
            obs, env.reset_infos[env_idx] = env.envs[env_idx].reset()
        env._save_obs(env_idx, obs)
    return env.buf_obs[None].copy(order="K"), np.copy(env.buf_rews), np.copy(env.buf_dones), copy_infos(env.buf_infos)


def copy_infos(infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``deepcopy(infos)``: a new list of new dicts, each value deep-copied (one memo for the whole list) unless it is
    an immutable scalar, which a deep copy would not change."""
    memo: dict[int, Any] = {}
    return [dict(info) if type(info) is dict and all(type(v) in IMMUTABLE_SCALARS for v in info.values())
            else deepcopy(info, memo) for info in infos]


def _vec_normalize_step(env: VecNormalize, inner: VecStep, actions: np.ndarray) -> VecEnvStepReturn:
    """``VecNormalize.step`` (SB3's statements) over the lean step of the env it wraps."""
    obs, rewards, dones, infos = inner(actions)
    env.old_obs = obs
    env.old_reward = rewards
    if env.training and env.norm_obs:
        update_running_moments(env.obs_rms, obs)
    if env.norm_obs:  # normalize_obs without its deepcopy of the array it then replaces
        rms = env.obs_rms
        normalized = clip((obs - rms.mean) / np.sqrt(rms.var + env.epsilon), -env.clip_obs, env.clip_obs)  # type: ignore[union-attr]
        normalized = normalized.astype(np.float32)
    else:
        normalized = env.normalize_obs(obs)
    if env.training:
        env.returns = env.returns * env.gamma + rewards
        update_running_moments(env.ret_rms, env.returns)
    if env.norm_reward:  # normalize_reward
        rewards = clip(rewards / np.sqrt(env.ret_rms.var + env.epsilon), -env.clip_reward, env.clip_reward)
    rewards = rewards.astype(np.float32)
    if dones.dtype != np.bool_ or np.count_nonzero(dones):  # no episode ended: the statements below change nothing
        for idx in dones.nonzero()[0]:
            if "terminal_observation" in infos[idx]:
                infos[idx]["terminal_observation"] = env.normalize_obs(infos[idx]["terminal_observation"])
        env.returns[dones] = 0
    return normalized, rewards, dones, infos


def clip(values: np.ndarray, low: Any, high: Any) -> np.ndarray:
    """``np.clip(values, low, high)``: for a float ndarray and two bounds that are not None, the ufunc call NumPy's
    ``_clip`` makes; ``np.clip`` itself otherwise."""
    if _clip_ufunc is not None and type(values) is np.ndarray and values.dtype.kind == "f" \
            and low is not None and high is not None:
        return _clip_ufunc(values, low, high)
    return np.clip(values, low, high)


def update_running_moments(rms: RunningMeanStd, batch: np.ndarray) -> None:
    """``rms.update(batch)``, its batch mean and variance from :func:`batch_moments` where that is NumPy's."""
    if batch.dtype in MOMENT_DTYPES and batch_moments_are_numpys(batch.dtype):
        mean, var = batch_moments(batch)
        rms.update_from_moments(mean, var, batch.shape[0])
    else:
        rms.update(batch)


def batch_moments(batch: np.ndarray) -> tuple[np.ndarray | np.generic, np.ndarray | np.generic]:
    """``(np.mean(batch, axis=0), np.var(batch, axis=0))`` for a float32 or float64 array: the ufunc calls NumPy's
    ``_mean`` and ``_var`` make (numpy/_core/_methods.py), without the argument handling around them."""
    if batch.shape[0] == 1:  # mean: the row (divided by 1); var: (row - row / 1) ** 2 summed over one row, / 1
        row = np.add.reduce(batch, 0)
        return row, np.square(np.subtract(row, row))
    count = np.intp(batch.shape[0])
    mean = _divide(np.add.reduce(batch, 0), count)
    centre = np.add.reduce(batch, 0, keepdims=True)
    centre = np.true_divide(centre, count, out=centre, casting="unsafe")
    deviations = np.subtract(batch, centre)
    np.square(deviations, out=deviations)
    var = _divide(np.add.reduce(deviations, 0), np.maximum(count - 0, 0))  # NumPy's max(count - ddof, 0), ddof 0
    return mean, var


def _divide(total: np.ndarray | np.generic, count: np.intp) -> np.ndarray | np.generic:
    """NumPy's division of a reduction by its item count: in place for an array, by the scalar's own type else."""
    if isinstance(total, np.ndarray):
        return np.true_divide(total, count, out=total, casting="unsafe")
    return total.dtype.type(total / count)


@functools.lru_cache(maxsize=None)
def batch_moments_are_numpys(dtype: np.dtype) -> bool:
    """Whether :func:`batch_moments` equals ``np.mean`` / ``np.var`` (values, dtypes, types) on this NumPy for
    ``dtype``: checked once per process on batches of 1, 2, 5 and 16 rows, 1-d to 3-d, wide value ranges."""
    rng = np.random.default_rng(0)
    for shape in ((1,), (2,), (16,), (1, 11), (5, 17), (16, 3), (2, 3, 4)):
        for scale in (1e-3, 1.0, 1e4):
            batch = (rng.standard_normal(shape) * scale + scale).astype(dtype)
            ours, numpys = batch_moments(batch), (np.mean(batch, axis=0), np.var(batch, axis=0))
            if any(type(a) is not type(b) or a.dtype != b.dtype or not np.array_equal(a, b)
                   for a, b in zip(ours, numpys)):
                return False
    return True
