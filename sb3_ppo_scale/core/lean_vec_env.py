"""``VecEnv.step`` for SB3's own ``DummyVecEnv`` and ``VecNormalize``, with the same results and the same env state,
without their per-step copying overhead.

At 1 env on MuJoCo a third of a lean collection step is SB3's vector-env machinery around the user's env, and most of
that is bookkeeping rather than arithmetic: ``deepcopy`` of the observation buffer and of the infos every step, a
``deepcopy`` of the observation before it is normalised (and thrown away), and ``np.mean`` / ``np.var``'s argument
handling around two reductions. :func:`lean_vec_step` returns a function that does what ``env.step`` does, with:

- the observation buffer copied array by array (``ndarray.copy(order="K")``, which is what ``deepcopy`` does to a
  numeric array) instead of through ``deepcopy``'s generic dispatch;
- each info dict whose keys are strings and whose values are immutable scalars (Python's atomic types and numpy
  numbers / bools) copied with ``dict(info)``; any other info (a terminal observation, Monitor's episode dict, a
  dict subclass) goes through ``deepcopy`` with the memo shared across the list, as ``deepcopy(infos)`` does;
- ``VecNormalize.normalize_obs``'s discarded ``deepcopy`` of an array observation skipped (its own
  ``_normalize_obs`` still computes the result);
- ``RunningMeanStd.update``'s batch moments computed by :func:`batch_moments`: numpy's own ``_mean`` / ``_var``
  reductions for the one case used here (axis 0 of a float array), called directly. It is compared with
  ``np.mean`` / ``np.var`` bit for bit on test arrays the first time it is needed; if the installed numpy computes
  anything differently, ``np.mean`` / ``np.var`` are used instead.

Every other statement is SB3's, in SB3's order, and SB3's own methods are called where they do the arithmetic
(``_normalize_obs``, ``normalize_reward``, ``update_from_moments``). Only the exact classes are recognised, without
instance-level overrides; any other ``VecEnv`` (a subclass, SubprocVecEnv, VecFrameStack, ...) is stepped by its own
``step``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from copy import deepcopy
from typing import Any

import numpy as np
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecNormalize
from stable_baselines3.common.vec_env.base_vec_env import VecEnvStepReturn
from stable_baselines3.common.vec_env.util import dict_to_obs

StepFn = Callable[[np.ndarray], VecEnvStepReturn]

#: a ``VecEnvWrapper`` class that sets this class attribute to True declares that its ``step`` is its wrapped env's
#: ``step`` (it passes ``step_async`` and ``step_wait`` through unchanged); subclasses do not inherit the promise
PASSES_STEPS_THROUGH = "lean_step_passes_through"

_DUMMY_METHODS = ("step", "step_async", "step_wait", "_save_obs", "_obs_from_buf")
_NORMALIZE_METHODS = ("step", "step_async", "step_wait", "normalize_obs", "_normalize_obs", "normalize_reward",
                      "_update_reward")
_ATOMIC = (type(None), bool, int, float, complex, str, bytes)
_IMMUTABLE_NUMPY = (np.number, np.bool_)


def lean_vec_step(env: VecEnv) -> StepFn:
    """A function with ``env.step``'s signature, results and effects on ``env``: the lean one for an exact
    ``DummyVecEnv`` or ``VecNormalize(DummyVecEnv | other VecEnv)``, or for a wrapper declaring
    :data:`PASSES_STEPS_THROUGH` around one of them; else ``env.step`` itself."""
    if _is_exactly(env, DummyVecEnv, _DUMMY_METHODS):
        return lambda actions: _dummy_step(env, actions)  # type: ignore[arg-type]
    if _is_exactly(env, VecNormalize, _NORMALIZE_METHODS):
        inner = lean_vec_step(env.venv)  # type: ignore[attr-defined]
        return lambda actions: _normalize_step(env, inner, actions)  # type: ignore[arg-type]
    if type(env).__dict__.get(PASSES_STEPS_THROUGH) and not any(name in vars(env) for name in _DUMMY_METHODS[:3]):
        return lean_vec_step(env.venv)  # type: ignore[attr-defined]
    return env.step


def _is_exactly(env: VecEnv, cls: type, methods: tuple[str, ...]) -> bool:
    """``env`` is an instance of ``cls`` itself, with none of ``methods`` replaced on the instance."""
    return type(env) is cls and not any(name in vars(env) for name in methods)


def _dummy_step(env: DummyVecEnv, actions: np.ndarray) -> VecEnvStepReturn:
    """``DummyVecEnv.step(actions)``: its ``step_wait`` loop as written, returning copies made without ``deepcopy``'s
    dispatch."""
    env.step_async(actions)
    for env_idx in range(env.num_envs):
        obs, env.buf_rews[env_idx], terminated, truncated, env.buf_infos[env_idx] = env.envs[env_idx].step(  # type: ignore[assignment]
            env.actions[env_idx]
        )
        env.buf_dones[env_idx] = terminated or truncated
        env.buf_infos[env_idx]["TimeLimit.truncated"] = truncated and not terminated
        if env.buf_dones[env_idx]:
            env.buf_infos[env_idx]["terminal_observation"] = obs
            obs, env.reset_infos[env_idx] = env.envs[env_idx].reset()
        env._save_obs(env_idx, obs)
    observations = dict_to_obs(env.observation_space, OrderedDict(
        (key, copy_array(array)) for key, array in env.buf_obs.items()))
    return observations, np.copy(env.buf_rews), np.copy(env.buf_dones), copy_infos(env.buf_infos)


def copy_array(array: np.ndarray) -> np.ndarray:
    """``deepcopy(array)``: a copy in the same memory order; an object array's elements are deep-copied too."""
    return deepcopy(array) if array.dtype.hasobject else array.copy(order="K")


def copy_infos(infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``deepcopy(infos)``, equal value for value: a plain dict of immutable scalars is copied with ``dict``, anything
    else through ``deepcopy`` sharing one memo over the list (so an info object listed twice is copied once)."""
    memo: dict[int, Any] = {}
    copies = []
    for info in infos:
        copied = memo.get(id(info))
        if copied is None:
            copied = dict(info) if _flat_scalars(info) else deepcopy(info, memo)
            memo[id(info)] = copied
        copies.append(copied)
    return copies


def _flat_scalars(info: Any) -> bool:
    """``info`` is a plain dict with string keys and immutable scalar values, so ``dict(info)`` equals its
    ``deepcopy``."""
    return type(info) is dict and all(
        type(key) is str and (type(value) in _ATOMIC or isinstance(value, _IMMUTABLE_NUMPY))
        for key, value in info.items())


def _normalize_step(env: VecNormalize, inner_step: StepFn, actions: np.ndarray) -> VecEnvStepReturn:
    """``VecNormalize.step(actions)``: ``VecNormalize.step_wait`` as written, on the wrapped env's lean step."""
    obs, rewards, dones, infos = inner_step(actions)
    assert isinstance(obs, (np.ndarray, dict))
    env.old_obs = obs
    env.old_reward = rewards

    if env.training and env.norm_obs:
        if isinstance(obs, dict) and isinstance(env.obs_rms, dict):
            for key in env.obs_rms.keys():
                update_running_stats(env.obs_rms[key], obs[key])
        else:
            update_running_stats(env.obs_rms, obs)  # type: ignore[arg-type]

    obs = _normalized(env, obs)

    if env.training:
        env.returns = env.returns * env.gamma + rewards
        update_running_stats(env.ret_rms, env.returns)
    rewards = env.normalize_reward(rewards)

    for idx in np.flatnonzero(dones):
        if "terminal_observation" in infos[idx]:
            infos[idx]["terminal_observation"] = _normalized(env, infos[idx]["terminal_observation"])

    env.returns[dones] = 0
    return obs, rewards, dones, infos


def _normalized(env: VecNormalize, obs: np.ndarray | dict[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
    """``env.normalize_obs(obs)``; for an array normalised with one ``RunningMeanStd`` the result is computed by
    ``env._normalize_obs`` without first deep-copying ``obs`` (a copy that method discards)."""
    if env.norm_obs and isinstance(obs, np.ndarray) and isinstance(env.obs_rms, RunningMeanStd):
        return env._normalize_obs(obs, env.obs_rms).astype(np.float32)
    return env.normalize_obs(obs)


def update_running_stats(stats: RunningMeanStd, batch: np.ndarray) -> None:
    """``stats.update(batch)``, with the batch moments from :func:`batch_moments`."""
    if type(stats) is not RunningMeanStd:
        stats.update(batch)
        return
    mean, var = batch_moments(batch)
    stats.update_from_moments(mean, var, batch.shape[0])


def batch_moments(batch: np.ndarray) -> tuple[Any, Any]:
    """``(np.mean(batch, axis=0), np.var(batch, axis=0))``, bit for bit, for a float32/float64 array with at least one
    row. Any other array, or a numpy whose results differ from these reductions, gets ``np.mean`` / ``np.var``."""
    if batch.dtype in _FLOATS and batch.ndim >= 1 and batch.shape[0] > 0 and _direct_moments_are_exact():
        return _direct_moments(batch)
    return np.mean(batch, axis=0), np.var(batch, axis=0)


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_EXACT: list[bool] = []


def _direct_moments(batch: np.ndarray) -> tuple[Any, Any]:
    """numpy 2's ``_methods._mean`` and ``_var`` (axis 0, no dtype, ``where=True``, ``ddof=0``), their reductions
    called without their argument handling."""
    count = np.intp(batch.shape[0])
    mean = np.add.reduce(batch, 0, None, None, False, where=True)
    if isinstance(mean, np.ndarray):
        mean = np.true_divide(mean, count, out=mean, casting="unsafe", subok=False)
    else:
        mean = mean.dtype.type(mean / count)
    centre = np.add.reduce(batch, 0, None, keepdims=True, where=True)
    centre = np.true_divide(centre, count, out=centre, casting="unsafe", subok=False)
    squares = np.subtract(batch, centre, out=...)
    squares = np.square(squares, out=squares)
    var = np.add.reduce(squares, 0, None, None, False, where=True)
    divisor = np.maximum(count - 0, 0)
    if isinstance(var, np.ndarray):
        var = np.true_divide(var, divisor, out=var, casting="unsafe", subok=False)
    else:
        var = var.dtype.type(var / divisor)
    return mean, var


def _direct_moments_are_exact() -> bool:
    """Whether :func:`_direct_moments` equals ``np.mean`` / ``np.var`` (values, bits, dtypes and types) on arrays of
    the shapes and values VecNormalize feeds it, with this numpy. Checked once."""
    if not _EXACT:
        _EXACT.append(_check_direct_moments())
    return _EXACT[0]


def _check_direct_moments() -> bool:
    rng = np.random.default_rng(0)
    samples = [(rng.normal(size=shape) * 10.0 ** rng.integers(-3, 4)).astype(dtype)
               for shape in [(1,), (7,), (1, 11), (8, 17), (3, 4, 5), (64, 3)]
               for dtype in _FLOATS]
    samples.append(np.array([[np.inf, -0.0, np.nan, 1e308], [1.0, 0.0, 2.0, 1e308]]))
    try:
        with np.errstate(all="ignore"):
            return all(_same(mine, theirs) for sample in samples
                       for mine, theirs in zip(_direct_moments(sample),
                                               (np.mean(sample, axis=0), np.var(sample, axis=0))))
    except Exception:  # a numpy without these signatures: use np.mean / np.var
        return False


def _same(a: Any, b: Any) -> bool:
    """Same type, dtype, shape and bytes."""
    return type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b) \
        and np.asarray(a).tobytes() == np.asarray(b).tobytes()
