"""Lean collection for ScalableRecurrentPPO: sb3-contrib's ``RecurrentPPO.collect_rollouts``, step for step, with the
policy call fused.

The loop below is RecurrentPPO's (same statements, same order, same random draws, the same ``locals`` for
callbacks), with the changes :mod:`sb3_ppo_scale.core.collect.lean` makes to SB3's, none of which moves a number:

- the policy call is :class:`FusedRecurrentActorCritic`: ``RecurrentActorCriticPolicy.forward``'s operations without
  module dispatch or Distribution objects. Each ``nn.LSTM`` runs through the same ``torch._VF.lstm`` kernel its
  ``forward`` calls, on its own flat weights; ``_process_sequence``'s two branches (no episode start in the batch:
  the states as they are; otherwise each state multiplied by ``1 - episode_start``) are kept, the branch chosen from
  the episode starts the loop already holds as a numpy array (:class:`~sb3_ppo_scale.contrib.lstm.LstmStep`);
- the time-limit bootstrap visits only the envs whose episode ended;
- SB3's ``DummyVecEnv`` and ``VecNormalize`` are stepped by :func:`~sb3_ppo_scale.core.collect.vec_step.vec_env_step`.

The loop is written out rather than shared with :func:`~sb3_ppo_scale.core.collect.lean.collect_rollouts_lean`,
whose middle it repeats: callbacks read the loop's own ``locals()``, so the step cannot move into a helper.

:func:`recurrent_lean_blocker` says when the policy cannot be fused exactly (a policy class overriding a replaced
method, an LSTM that is not ``nn.LSTM``, module hooks); the model then runs RecurrentPPO's loop and says why once.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from sb3_contrib.common.recurrent.type_aliases import RNNStates
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_scale.contrib.lstm import LstmStep
from sb3_ppo_scale.core.policy.inference import REPLACED_METHODS, FusedActorCritic, PolicyParts, direct, fusion_blocker
from sb3_ppo_scale.core.collect.lean import has_nan, stop_as_sb3_would, to_host, warn_if_parts_replaced
from sb3_ppo_scale.core.collect.vec_step import vec_env_step


def recurrent_lean_blocker(policy: th.nn.Module, also_replaced: tuple[str, ...] = ()) -> str | None:
    """Why ``policy(obs, lstm_states, episode_starts)`` cannot be replaced by :class:`FusedRecurrentActorCritic`
    exactly, or None when it can.

    :param also_replaced: further methods of ``RecurrentActorCriticPolicy`` the caller replaces (training's
        ``evaluate_actions``); a policy class overriding one is refused too."""
    replaced = (*REPLACED_METHODS, "_process_sequence", *also_replaced)
    blocker = fusion_blocker(policy, (RecurrentActorCriticPolicy,), replaced)
    if blocker is not None:
        return blocker
    lstms = [policy.lstm_actor, policy.lstm_critic] if policy.lstm_critic is not None else [policy.lstm_actor]
    odd = [type(lstm).__name__ for lstm in lstms if type(lstm) is not th.nn.LSTM]
    return f"LSTM class {odd[0]} is not torch's nn.LSTM" if odd else None


class FusedRecurrentActorCritic:
    """``policy(obs, lstm_states, episode_starts)`` of a ``RecurrentActorCriticPolicy`` (actions, values, log-probs,
    new states), computed from the policy's own modules without module dispatch or Distribution objects.

    :param policy: a policy for which :func:`recurrent_lean_blocker` is None; build one per rollout.
    """

    def __init__(self, policy: RecurrentActorCriticPolicy) -> None:
        self.fused = FusedActorCritic(policy)
        self.actor_lstm = LstmStep(policy.lstm_actor)
        self.critic_lstm = LstmStep(policy.lstm_critic) if policy.lstm_critic is not None else None
        self.shared_lstm = policy.shared_lstm
        self.critic_linear = direct(policy.critic) if policy.critic is not None else None

    def __call__(self, obs: Any, lstm_states: RNNStates, episode_starts: th.Tensor,
                 any_start: bool) -> tuple[th.Tensor, th.Tensor, th.Tensor, RNNStates]:
        pi_features, vf_features = self.fused.features(obs)
        latent_pi, states_pi = self.actor_lstm(pi_features, lstm_states.pi, episode_starts, (any_start,))
        if self.critic_lstm is not None:
            latent_vf, states_vf = self.critic_lstm(vf_features, lstm_states.vf, episode_starts, (any_start,))
        elif self.shared_lstm:
            latent_vf, states_vf = latent_pi.detach(), (states_pi[0].detach(), states_pi[1].detach())
        else:
            latent_vf, states_vf = self.critic_linear(vf_features), states_pi  # type: ignore[misc]
        actions, values, log_prob = self.fused.heads(latent_pi, latent_vf)
        return actions, values, log_prob, RNNStates(states_pi, states_vf)


def _bootstrap_time_limits(model: Any, rewards: np.ndarray, dones: np.ndarray, infos: list,
                           lstm_states: RNNStates) -> None:
    """RecurrentPPO's timeout handling: ``gamma * V(terminal observation)`` with that env's critic state, added to a
    truncated episode's last reward, visiting only the envs whose episode ended."""
    for idx in np.flatnonzero(dones):
        info = infos[idx]
        if info.get("terminal_observation") is not None and info.get("TimeLimit.truncated", False):
            terminal_obs = model.policy.obs_to_tensor(info["terminal_observation"])[0]
            with th.no_grad():
                terminal_lstm_state = (lstm_states.vf[0][:, idx: idx + 1, :].contiguous(),
                                       lstm_states.vf[1][:, idx: idx + 1, :].contiguous())
                episode_starts = th.tensor([False], dtype=th.float32, device=model.device)
                terminal_value = model.policy.predict_values(terminal_obs, terminal_lstm_state, episode_starts)[0]
            rewards[idx] += model.gamma * terminal_value


def collect_rollouts_recurrent_lean(self: OnPolicyAlgorithm, env: VecEnv, callback: BaseCallback,
                                    rollout_buffer: RolloutBuffer, n_rollout_steps: int) -> bool:
    """RecurrentPPO's ``collect_rollouts`` (same arguments, return, buffer contents, LSTM states and RNG draws) for a
    model whose policy passes :func:`recurrent_lean_blocker`. ``self`` is the model, as in RecurrentPPO's loop."""
    assert self._last_obs is not None, "No previous observation was provided"
    self.policy.set_training_mode(False)

    n_steps = 0
    rollout_buffer.reset()
    if self.use_sde:
        self.policy.reset_noise(env.num_envs)

    callback.on_rollout_start()
    act = FusedRecurrentActorCritic(self.policy)  # type: ignore[arg-type]  # after on_rollout_start, as the lean loop
    parts = PolicyParts(self.policy)

    step = vec_env_step(env)
    lstm_states = deepcopy(self._last_lstm_states)  # type: ignore[attr-defined]
    box = isinstance(self.action_space, spaces.Box)

    while n_steps < n_rollout_steps:
        if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
            self.policy.reset_noise(env.num_envs)

        with th.no_grad():
            obs_tensor = obs_as_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
            episode_starts = th.tensor(self._last_episode_starts, dtype=th.float32, device=self.device)
            states_before = lstm_states  # the step's distribution: get_distribution(obs, states_before.pi, ...)
            try:
                actions, values, log_probs, lstm_states = act(obs_tensor, lstm_states, episode_starts,
                                                              bool(self._last_episode_starts.any()))  # type: ignore[union-attr]
            except RuntimeError as error:  # NaN probabilities: contrib's distribution refuses NaN logits first
                stop_as_sb3_would(lambda: self.policy.get_distribution(obs_tensor, states_before.pi, episode_starts),
                                  error)
                raise
            host_actions, host_values, host_log_probs = to_host(actions, values, log_probs)
        actions = host_actions.numpy()
        if box and has_nan(actions):
            stop_as_sb3_would(lambda: self.policy.get_distribution(obs_tensor, states_before.pi, episode_starts))

        clipped_actions = actions
        if box:
            clipped_actions = np.clip(actions, self.action_space.low, self.action_space.high)  # type: ignore[union-attr]

        new_obs, rewards, dones, infos = step(clipped_actions)

        self.num_timesteps += env.num_envs

        callback.update_locals(locals())
        if not callback.on_step():
            return False

        self._update_info_buffer(infos, dones)
        n_steps += 1

        if isinstance(self.action_space, spaces.Discrete):
            actions = actions.reshape(-1, 1)

        if dones.any():
            _bootstrap_time_limits(self, rewards, dones, infos, lstm_states)

        rollout_buffer.add(self._last_obs, actions, rewards, self._last_episode_starts, host_values,  # type: ignore[arg-type]
                           host_log_probs, lstm_states=self._last_lstm_states)  # type: ignore[attr-defined]

        self._last_obs = new_obs  # type: ignore[assignment]
        self._last_episode_starts = dones
        self._last_lstm_states = lstm_states

    warn_if_parts_replaced(self, parts)
    with th.no_grad():
        episode_starts = th.tensor(dones, dtype=th.float32, device=self.device)
        values = self.policy.predict_values(obs_as_tensor(new_obs, self.device), lstm_states.vf, episode_starts)  # type: ignore[arg-type, call-arg]

    rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)

    callback.on_rollout_end()

    return True
