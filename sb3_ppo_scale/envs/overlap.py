"""Double-buffered rollout collection over EnvPool: one half of the envs steps while the policy runs on the other.

:func:`collect_rollouts_overlapped` is a drop-in for SB3's ``OnPolicyAlgorithm.collect_rollouts`` when the env is an
:class:`~sb3_ppo_scale.envs.EnvPoolVecEnv` (optionally under ``VecNormalize``). The envs are split into halves A
(ids ``0 .. n/2-1``) and B (the rest). Per rollout step t::

    policy(B obs)            while EnvPool steps A(t)   (C++ threads, no GIL)
    recv A(t); send B(t)
    policy(A obs at t+1)     while EnvPool steps B(t)
    recv B(t); send A(t+1)
    store step t of all envs (SB3's bootstrapping of time-limit ends, ``rollout_buffer.add``, callbacks)
                             while EnvPool steps A(t+1)

Each env still takes its steps in order, with actions from the same policy, and its transitions land in its own
column of the rollout buffer at the same positions as with ``collect_rollouts``: PPO's data are unchanged in
distribution. What differs from SB3's loop:

- the random actions are drawn per half (two calls on the policy's RNG instead of one), so the same seed gives
  other (equally distributed) actions;
- under ``VecNormalize`` the running observation/return statistics are updated per half (Chan's combination of the
  two halves equals one full-batch update up to rounding) and half A's observations are normalised before half B's
  observations of the same step enter the statistics (SB3 normalises a step's batch after adding all of it);
- if a callback stops training mid-rollout, the half-step already in flight is received and dropped (its envs are
  one step further than ``model._last_obs`` says, as for SB3's envs after the step that stopped it);
- the pipeline drains at the end of every rollout (no step runs across a policy update), so the first half-step
  of each rollout is not overlapped.

Not supported (:func:`overlap_supported` says False, use SB3's ``collect_rollouts``): fewer than 2 envs, gSDE
(``use_sde``: its noise matrices are per full batch), Dict observations, env wrappers other than ``VecNormalize``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from sb3_ppo_scale.core.collect.lean import bootstrap_time_limits
from sb3_ppo_scale.core.extensions import Collector
from sb3_ppo_scale.envs.envpool import EnvPoolVecEnv


@dataclass
class _Act:
    """The policy's output for one half: raw actions (stored), clipped actions (sent), values, log-probs."""

    actions: np.ndarray
    clipped: np.ndarray
    values: th.Tensor
    log_probs: th.Tensor


@dataclass
class _Step:
    """One half's step results, normalised if a VecNormalize is on top."""

    obs: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    infos: list[dict[str, Any]]
    raw_obs: np.ndarray
    raw_rewards: np.ndarray


def _unwrap(env: VecEnv) -> tuple[EnvPoolVecEnv | None, VecNormalize | None]:
    if isinstance(env, VecNormalize):
        return (env.venv if isinstance(env.venv, EnvPoolVecEnv) else None), env
    return (env if isinstance(env, EnvPoolVecEnv) else None), None


def overlap_supported(model: OnPolicyAlgorithm, env: VecEnv) -> bool:
    """True when :func:`collect_rollouts_overlapped` can collect for ``model`` on ``env``."""
    return overlap_blocker(model, env) is None


def overlap_blocker(model: OnPolicyAlgorithm, env: VecEnv) -> str | None:
    """Why :func:`collect_rollouts_overlapped` cannot collect for ``model`` on ``env``, or None when it can."""
    pool_env, _ = _unwrap(env)
    if pool_env is None:
        return f"the env is a {type(env).__name__}, not an EnvPool VecEnv (make_envpool_vec_env)"
    if env.num_envs < 2:
        return "it needs at least 2 envs (two halves)"
    if model.use_sde:
        return "gSDE (use_sde=True) samples its noise for all envs at once"
    if isinstance(env.observation_space, spaces.Dict):
        return "Dict observations are not supported"
    return None


def _act(model: OnPolicyAlgorithm, obs: np.ndarray) -> _Act:
    """SB3's per-step policy call and action clipping, for one half of the envs."""
    with th.no_grad():
        actions, values, log_probs = model.policy(obs_as_tensor(obs, model.device))
    actions = actions.cpu().numpy()
    clipped = actions
    if isinstance(model.action_space, spaces.Box):
        if model.policy.squash_output:
            clipped = model.policy.unscale_action(clipped)
        else:
            clipped = np.clip(actions, model.action_space.low, model.action_space.high)
    return _Act(actions, clipped, values, log_probs)


def _receive(pool_env: EnvPoolVecEnv, normalizer: VecNormalize | None, half: slice, ids: np.ndarray) -> _Step:
    """Receive the half-step in flight; apply ``VecNormalize.step_wait``'s work to that half."""
    obs, rewards, dones, infos, got = pool_env.recv()
    assert np.array_equal(got, ids), "EnvPool returned other envs than the half sent"
    if normalizer is None:
        return _Step(obs, rewards, dones, infos, obs, rewards)
    if normalizer.training and normalizer.norm_obs:
        normalizer.obs_rms.update(obs)
    norm_obs = normalizer.normalize_obs(obs)
    if normalizer.training:
        returns = normalizer.returns[half] * normalizer.gamma + rewards
        normalizer.returns[half] = returns
        normalizer.ret_rms.update(returns)
    norm_rewards = normalizer.normalize_reward(rewards)
    for row in np.flatnonzero(dones):
        if "terminal_observation" in infos[row]:
            infos[row]["terminal_observation"] = normalizer.normalize_obs(infos[row]["terminal_observation"])
    normalizer.returns[half][dones] = 0
    return _Step(norm_obs, norm_rewards, dones, infos, obs, rewards)


def collect_rollouts_overlapped(  # noqa: C901 - one pipeline, kept in one place to read in order
    model: OnPolicyAlgorithm,
    env: VecEnv,
    callback: BaseCallback,
    rollout_buffer: RolloutBuffer,
    n_rollout_steps: int,
) -> bool:
    """Fill ``rollout_buffer`` with ``n_rollout_steps`` steps per env, overlapping env stepping with inference.

    Same signature and return value as ``OnPolicyAlgorithm.collect_rollouts`` (``model`` in place of ``self``).

    :raises ValueError: ``overlap_supported(model, env)`` is False.
    """
    if not overlap_supported(model, env):
        raise ValueError("collect_rollouts_overlapped needs an EnvPoolVecEnv (optionally under VecNormalize) with >= 2 "
                         "envs, no gSDE and no Dict observations; use collect_rollouts")
    pool_env, normalizer = _unwrap(env)
    assert pool_env is not None and model._last_obs is not None, "No previous observation was provided"
    n_envs = env.num_envs
    half_a, half_b = slice(0, n_envs // 2), slice(n_envs // 2, n_envs)
    ids_a = np.arange(n_envs // 2, dtype=np.int32)
    ids_b = np.arange(n_envs // 2, n_envs, dtype=np.int32)
    model.policy.set_training_mode(False)
    rollout_buffer.reset()
    callback.on_rollout_start()

    obs = model._last_obs
    act_a = _act(model, obs[half_a])
    pool_env.send(act_a.clipped, ids_a)
    for n_steps in range(n_rollout_steps):
        act_b = _act(model, obs[half_b])  # while A steps
        step_a = _receive(pool_env, normalizer, half_a, ids_a)
        pool_env.send(act_b.clipped, ids_b)
        last = n_steps + 1 == n_rollout_steps
        next_a = None if last else _act(model, step_a.obs)  # while B steps
        step_b = _receive(pool_env, normalizer, half_b, ids_b)
        if next_a is not None:
            pool_env.send(next_a.clipped, ids_a)  # A steps during the bookkeeping below

        new_obs = np.concatenate([step_a.obs, step_b.obs])
        rewards = np.concatenate([step_a.rewards, step_b.rewards])
        dones = np.concatenate([step_a.dones, step_b.dones])
        infos = step_a.infos + step_b.infos
        actions = np.concatenate([act_a.actions, act_b.actions])
        clipped_actions = np.concatenate([act_a.clipped, act_b.clipped])
        values = th.cat([act_a.values, act_b.values])
        log_probs = th.cat([act_a.log_probs, act_b.log_probs])
        if normalizer is not None:
            normalizer.old_obs = np.concatenate([step_a.raw_obs, step_b.raw_obs])
            normalizer.old_reward = np.concatenate([step_a.raw_rewards, step_b.raw_rewards])

        model.num_timesteps += n_envs
        callback.update_locals(locals())
        if not callback.on_step():
            if next_a is not None:
                _receive(pool_env, normalizer, half_a, ids_a)  # drop the half-step in flight
            return False
        model._update_info_buffer(infos, dones)
        if isinstance(model.action_space, spaces.Discrete):
            actions = actions.reshape(-1, 1)
        bootstrap_time_limits(model, rewards, dones, infos)
        rollout_buffer.add(model._last_obs, actions, rewards, model._last_episode_starts, values, log_probs)
        model._last_obs = obs = new_obs
        model._last_episode_starts = dones
        if next_a is not None:
            act_a = next_a

    with th.no_grad():
        values = model.policy.predict_values(obs_as_tensor(new_obs, model.device))  # type: ignore[arg-type]
    rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
    callback.update_locals(locals())
    callback.on_rollout_end()
    return True


#: The ``overlap_collection=True`` loop, installed into the core by ``sb3_ppo_scale/__init__.py``.
OVERLAPPED = Collector("overlap", overlap_blocker, collect_rollouts_overlapped)
