"""Lean collection: SB3's ``OnPolicyAlgorithm.collect_rollouts``, step for step, at a fraction of its per-step cost.

The loop below is SB3's (same statements, same order, same random draws), with these changes that leave every
number as it was:

- the policy call is :class:`~sb3_ppo_scale.core.policy.inference.FusedActorCritic` (same tensor operations and RNG calls
  as ``policy(obs)``, without module dispatch or Distribution objects), under ``torch.inference_mode``;
- a plain ``RolloutBuffer`` is written in place (what ``RolloutBuffer.add`` stores, without its per-call
  conversions); any other buffer class gets its own ``add``;
- the time-limit bootstrap visits only the envs whose episode ended (``np.flatnonzero(dones)``), not every env;
- SB3's ``DummyVecEnv`` and ``VecNormalize`` are stepped by :func:`~sb3_ppo_scale.core.collect.vec_step.vec_env_step`
  (their statements, leaner copies and moments; any other VecEnv by its own ``step``);
- an observation array on the CPU becomes a tensor by ``torch.from_numpy`` (what ``obs_as_tensor``'s
  ``torch.as_tensor`` returns there: a tensor sharing the array's memory), and actions are clipped by the ufunc
  ``np.clip`` calls (:func:`~sb3_ppo_scale.core.collect.vec_step.clip`);
- on CUDA, the step's actions, values and log-probs reach the host with one wait for the GPU, not three
  (:func:`to_host`); callbacks still see the device tensors SB3's loop has; with ``cuda_graphs=True`` the policy
  call is replayed from a CUDA graph (:mod:`sb3_ppo_scale.core.collect.graphed_step`);
- torch's argument validation of the action distribution is not run at every step: a step whose Box actions hold
  a NaN, or whose sampling fails, builds SB3's distribution for that step, which raises SB3's ``ValueError``
  (:func:`stop_as_sb3_would`);
- the ``locals`` handed to callbacks are those of this function: ``self`` (the model), ``env``, ``callback``,
  ``rollout_buffer``, ``n_rollout_steps``, ``n_steps``, ``obs_tensor``, ``actions``, ``values``, ``log_probs``,
  ``clipped_actions``, ``action_masks``, ``new_obs``, ``rewards``, ``dones``, ``infos``: the names and values SB3's
  loop has, its tensors normal ones (not inference tensors: a callback may use them with autograd,
  :func:`normal_tensor`).

With ``action_masks_of`` it is sb3-contrib's ``MaskablePPO.collect_rollouts`` instead: each step's masks are read
from the env before the policy call, the policy samples from the masked distribution and the buffer stores the masks
(``MaskableRolloutBuffer.add``); without it, MaskablePPO's ``use_masking=False``.

:func:`lean_blocker` says when the lean loop cannot promise SB3's numbers (a custom policy class or forward, module
hooks); the model then runs SB3's loop and logs why once. The step is built from the policy's modules after
``on_rollout_start``; parameter values changed in place during a rollout are read at every step, a module or parameter
object replaced by a callback during a rollout is not (a warning says so at the rollout's end).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from collections.abc import Callable

from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_scale.core.policy.inference import PolicyParts, fusion_blocker
from sb3_ppo_scale.core.collect.graphed_step import collection_step
from sb3_ppo_scale.core.collect.vec_step import clip, vec_env_step


def lean_blocker(model: OnPolicyAlgorithm) -> str | None:
    """Why ``model``'s rollouts cannot be collected by :func:`collect_rollouts_lean` exactly, or None."""
    return fusion_blocker(model.policy)


def _writes_in_place(buffer: RolloutBuffer) -> bool:
    """A buffer whose ``add`` is ``RolloutBuffer.add`` (or ``MaskableRolloutBuffer.add``) with a flat (non-dict)
    observation array."""
    return type(buffer).add in (RolloutBuffer.add, MaskableRolloutBuffer.add) \
        and isinstance(buffer.observations, np.ndarray)


def to_host(*tensors: th.Tensor) -> tuple[th.Tensor, ...]:
    """``tensors`` on the CPU, with one synchronisation: CUDA tensors are copied without blocking (into pinned
    memory) and the stream is waited for once, where one ``.cpu()`` each would wait each time; CPU tensors are
    returned as they are. Same values and dtypes either way."""
    if not tensors or tensors[0].device.type != "cuda":
        return tensors
    host = tuple(t.to("cpu", non_blocking=True) for t in tensors)
    th.cuda.current_stream(tensors[0].device).synchronize()
    return host


def normal_tensor(tensor: th.Tensor) -> th.Tensor:
    """``tensor``, made under ``torch.inference_mode``, as a normal tensor (which autograd may save and in-place
    writes may change outside inference mode), as the ``no_grad`` tensors SB3's loop hands callbacks in ``locals``
    are; the same values. On the CPU it shares ``tensor``'s memory (the buffer stores that memory after the
    callbacks, so a callback's in-place write reaches it, as in SB3's loop); elsewhere it is a copy."""
    if tensor.device.type == "cpu":
        return th.from_numpy(tensor.numpy())
    return tensor.clone()


def observation_tensor(obs: np.ndarray | dict[str, np.ndarray], device: th.device) -> th.Tensor | dict[str, th.Tensor]:
    """``obs_as_tensor(obs, device)``: for an array and a CPU device, ``torch.from_numpy`` (the tensor sharing the
    array's memory that ``torch.as_tensor`` returns there), at a third of its cost."""
    if type(obs) is np.ndarray and device.type == "cpu":
        return th.from_numpy(obs)
    return obs_as_tensor(obs, device)


def _store(buffer: RolloutBuffer, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
           episode_starts: np.ndarray, values: th.Tensor, log_probs: th.Tensor,
           action_masks: np.ndarray | None = None) -> None:
    """What ``RolloutBuffer.add`` (``MaskableRolloutBuffer.add`` with ``action_masks``) stores, written straight into
    its arrays (values cast on assignment, as there)."""
    pos = buffer.pos
    if action_masks is not None:
        buffer.action_masks[pos] = action_masks.reshape((buffer.n_envs, buffer.mask_dims))  # type: ignore[attr-defined]
    if isinstance(buffer.observation_space, spaces.Discrete):
        obs = obs.reshape((buffer.n_envs, *buffer.obs_shape))
    buffer.observations[pos] = obs
    buffer.actions[pos] = actions.reshape((buffer.n_envs, buffer.action_dim))
    buffer.rewards[pos] = rewards
    buffer.episode_starts[pos] = episode_starts
    buffer.values[pos] = values.numpy().reshape(-1)  # host tensors (to_host): SB3's .cpu() would return them as they are
    buffer.log_probs[pos] = log_probs.numpy()
    buffer.pos += 1
    if buffer.pos == buffer.buffer_size:
        buffer.full = True


def warn_if_parts_replaced(model: OnPolicyAlgorithm, parts: PolicyParts) -> None:
    """Warn when the policy's modules or parameters are no longer the objects ``parts`` holds, those the lean loop
    built its step from at the rollout's start: a callback replaced one during the rollout."""
    if PolicyParts(model.policy) != parts:
        warnings.warn(f"{type(model).__name__}: a callback replaced a module or parameter of the policy during a "
                      "rollout; the lean loop collected that rollout with the ones it started with, where SB3's loop "
                      "uses the new ones from the next step. Replace them in on_rollout_start or between learn() "
                      "calls (values changed in place are always seen)", stacklevel=3)


def stop_as_sb3_would(sb3_distribution: Callable[[], Any], error: Exception | None = None) -> None:
    """Raise what SB3's policy call raises at a step where the fused step's outputs are not numbers.

    SB3 builds a torch ``Distribution`` with argument validation (torch's default), which refuses NaN means or
    logits (a NaN observation, diverged weights) with a ``ValueError`` before anything is sampled; the fused step
    validates nothing, so a Gaussian policy would send NaN actions to the envs and a categorical one fail later
    in ``torch.multinomial``. The lean loops call this when a step's actions hold NaN or its sampling failed:
    ``sb3_distribution()`` builds the step's distribution as SB3 does (no random draws: the RNG stays SB3's) and
    its ``ValueError`` is raised; where it raises none (validation switched off), ``error``, if given, is raised again.
    """
    try:
        with th.inference_mode():  # as the step ran (SB3 builds it under no_grad: the same values, no graph)
            sb3_distribution()
    except ValueError as refused:
        raise refused from None
    if error is not None:
        raise error


def sb3_distribution(policy: Any, obs: Any, action_masks: np.ndarray | None) -> Any:
    """The action distribution SB3's (sb3-contrib's maskable) policy call builds for ``obs``: no random draws."""
    if action_masks is None:
        return policy.get_distribution(obs)
    return policy.get_distribution(obs, action_masks=action_masks)


def has_nan(actions: np.ndarray) -> bool:
    """Whether a float action array holds a NaN (``np.isnan(actions).any()`` at half its cost)."""
    return bool(np.count_nonzero(actions != actions))


def bootstrap_time_limits(model: OnPolicyAlgorithm, rewards: np.ndarray, dones: np.ndarray, infos: list) -> None:
    """SB3's timeout handling: add ``gamma * V(terminal observation)`` to a truncated episode's last reward, one env
    at a time as SB3 does, visiting only the envs whose episode ended (SB3 tests ``done`` first)."""
    for idx in np.flatnonzero(dones):
        info = infos[idx]
        if info.get("terminal_observation") is not None and info.get("TimeLimit.truncated", False):
            terminal_obs = model.policy.obs_to_tensor(info["terminal_observation"])[0]
            with th.no_grad():
                terminal_value = model.policy.predict_values(terminal_obs)[0]  # type: ignore[arg-type]
            rewards[idx] += model.gamma * terminal_value


def collect_rollouts_lean(self: OnPolicyAlgorithm, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer,
                          n_rollout_steps: int,
                          action_masks_of: Callable[[VecEnv], np.ndarray] | None = None) -> bool:
    """SB3's ``collect_rollouts`` (same arguments, same return, same buffer contents and RNG draws) for a model
    for which :func:`lean_blocker` is None. ``self`` is the model, so callbacks find it under the name SB3 uses.

    :param action_masks_of: for a maskable policy, the function that reads the envs' masks before each step
        (sb3-contrib's ``get_action_masks``); None collects without masks."""
    assert self._last_obs is not None, "No previous observation was provided"
    self.policy.set_training_mode(False)

    n_steps = 0
    rollout_buffer.reset()
    if self.use_sde:
        self.policy.reset_noise(env.num_envs)

    callback.on_rollout_start()
    act = collection_step(self)  # after on_rollout_start: a callback may have changed the parameters
    parts = PolicyParts(self.policy)
    step = vec_env_step(env)
    in_place = _writes_in_place(rollout_buffer)
    box = isinstance(self.action_space, spaces.Box)
    squash = box and self.policy.squash_output
    low, high = (self.action_space.low, self.action_space.high) if box else (None, None)
    action_masks = None
    no_autograd = th.inference_mode()  # one context manager object, entered once per step

    while n_steps < n_rollout_steps:
        if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
            self.policy.reset_noise(env.num_envs)

        # made outside inference mode: a callback may use it with autograd, as SB3's loop's (see normal_tensor)
        obs_tensor = observation_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
        with no_autograd:
            if action_masks_of is not None:
                action_masks = action_masks_of(env)
            try:
                actions, values, log_probs = act(obs_tensor, action_masks)
            except RuntimeError as error:  # NaN probabilities: SB3's distribution refuses NaN logits first
                stop_as_sb3_would(lambda: sb3_distribution(self.policy, obs_tensor, action_masks), error)
                raise
            host_actions, host_values, host_log_probs = to_host(actions, values, log_probs)
        values, log_probs = normal_tensor(values), normal_tensor(log_probs)  # what callbacks find in locals
        actions = host_actions.numpy()
        if box and has_nan(actions):
            stop_as_sb3_would(lambda: sb3_distribution(self.policy, obs_tensor, action_masks))

        clipped_actions = actions
        if box:
            clipped_actions = self.policy.unscale_action(clipped_actions) if squash else clip(actions, low, high)

        new_obs, rewards, dones, infos = step(clipped_actions)

        self.num_timesteps += env.num_envs

        callback.update_locals(locals())
        if not callback.on_step():
            return False

        self._update_info_buffer(infos, dones)
        n_steps += 1

        if isinstance(self.action_space, spaces.Discrete):
            actions = actions.reshape(-1, 1)

        if np.count_nonzero(dones):  # dones.any(), at a fifth of its cost
            bootstrap_time_limits(self, rewards, dones, infos)

        if in_place:
            _store(rollout_buffer, self._last_obs, actions, rewards, self._last_episode_starts, host_values,  # type: ignore[arg-type]
                   host_log_probs, action_masks)
        elif action_masks is not None:
            rollout_buffer.add(self._last_obs, actions, rewards, self._last_episode_starts, values, log_probs,  # type: ignore[arg-type]
                               action_masks=action_masks)  # type: ignore[call-arg]
        else:
            rollout_buffer.add(self._last_obs, actions, rewards, self._last_episode_starts, values, log_probs)  # type: ignore[arg-type]
        self._last_obs = new_obs  # type: ignore[assignment]
        self._last_episode_starts = dones

    warn_if_parts_replaced(self, parts)
    with th.no_grad():
        values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))  # type: ignore[arg-type]

    rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)

    callback.update_locals(locals())

    callback.on_rollout_end()

    return True
