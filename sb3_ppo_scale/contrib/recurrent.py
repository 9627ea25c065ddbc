"""ScalableRecurrentPPO: sb3-contrib's ``RecurrentPPO`` with the scale layer, and an opt-in batched LSTM update.

Identical by default: policies, ``predict`` and save format are RecurrentPPO's, and its rollouts are collected by
RecurrentPPO's loop run lean (:mod:`sb3_ppo_scale.contrib.recurrent_collect`: the same rollout and LSTM states, bit
for bit); ``train()`` is the shared update (:class:`~sb3_ppo_scale.core.algorithm.ScalableOnPolicyMixin`) over contrib's minibatches of padded sequences
(:mod:`sb3_ppo_scale.contrib.sequences`), with RecurrentPPO's masked means and its per-step LSTM loop
(``RecurrentActorCriticPolicy._process_sequence``), run lean where that is exact (:mod:`sb3_ppo_scale.contrib.lstm`:
the same values and gradients, without the module call per time step).

``batched_sequences=True`` runs each micro-batch's sequences through each ``nn.LSTM`` as one call instead
(:func:`batched_sequence`): the episode-start reset is applied to the initial states (every episode start is the
first step of its sequence), so there is no Python loop over time steps. The forward values are the loop's; the
gradients are summed in another order (one input-projection GEMM over all steps instead of one per step), so the
parameters differ from the loop's by float rounding only (measured in tests/test_contrib_recurrent.py and
docs/contrib.md). It is therefore opt-in, as ``compile_loss`` is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib import RecurrentPPO
from sb3_contrib.common.recurrent.buffers import RecurrentDictRolloutBuffer, RecurrentRolloutBuffer
from sb3_contrib.common.recurrent.type_aliases import RNNStates
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_ppo_scale.contrib.lstm import every_step_sequence, per_step_sequence
from sb3_ppo_scale.contrib.recurrent_collect import collect_rollouts_recurrent_lean, recurrent_lean_blocker
from sb3_ppo_scale.contrib.sequences import STATE_FIELDS, ChunkLoader, SequenceLoader, sequence_starts
from sb3_ppo_scale.core.algorithm import ScalableOnPolicyMixin
from sb3_ppo_scale.core.collect.device import resolve_collect_device
from sb3_ppo_scale.core.checks import is_int
from sb3_ppo_scale.core.config import ScaleConfig
from sb3_ppo_scale.core.policy.evaluation import Evaluation, Evaluator
from sb3_ppo_scale.core.update.rollout import DeviceRollout, flat_field
from sb3_ppo_scale.core.update.sampling import Loader


def batched_sequence(features: th.Tensor, lstm_states: tuple[th.Tensor, th.Tensor], episode_starts: th.Tensor,
                     lstm: th.nn.LSTM) -> th.Tensor:
    """The LSTM output of padded sequences in one ``nn.LSTM`` call, shape ``(n_seq * max_len, hidden)``.

    ``features`` is ``(n_seq * max_len, input)`` in contrib's padded layout, ``lstm_states`` the initial
    ``(hidden, cell)`` of each sequence, ``episode_starts`` ``(n_seq * max_len,)``. Only a sequence's first step may
    be an episode start (:mod:`sb3_ppo_scale.contrib.sequences` cuts them so); its reset multiplies the initial
    states by ``1 - start``, exactly the operation contrib's loop applies at that step.
    """
    n_seq = lstm_states[0].shape[1]
    sequence = features.reshape((n_seq, -1, lstm.input_size)).swapaxes(0, 1)
    keep = (1.0 - episode_starts.reshape((n_seq, -1))[:, 0]).view(1, n_seq, 1)
    output, _ = lstm(sequence, (keep * lstm_states[0], keep * lstm_states[1]))
    return th.flatten(output.transpose(0, 1), start_dim=0, end_dim=1)


def _per_step(policy: Any) -> Any:
    return lambda features, states, starts, lstm: policy._process_sequence(features, states, starts, lstm)[0]


def _evaluate(policy: Any, data: Any, actions: th.Tensor, process: Any) -> Evaluation:
    """``RecurrentActorCriticPolicy.evaluate_actions``'s operations, with ``process`` running each LSTM, returning the
    distribution too."""
    features = policy.extract_features(data.observations)
    pi_features, vf_features = (features, features) if policy.share_features_extractor else features
    latent_pi = process(pi_features, data.lstm_states.pi, data.episode_starts, policy.lstm_actor)
    if policy.lstm_critic is not None:
        latent_vf = process(vf_features, data.lstm_states.vf, data.episode_starts, policy.lstm_critic)
    elif policy.shared_lstm:
        latent_vf = latent_pi.detach()
    else:
        latent_vf = policy.critic(vf_features)
    latent_pi = policy.mlp_extractor.forward_actor(latent_pi)
    latent_vf = policy.mlp_extractor.forward_critic(latent_vf)
    distribution = policy._get_action_dist_from_latent(latent_pi)
    log_prob = distribution.log_prob(actions)
    values = policy.value_net(latent_vf)
    return values, log_prob, distribution.entropy(), distribution


def evaluate_recurrent(policy: ActorCriticPolicy, micro: Any, actions: th.Tensor, with_distribution: bool) -> Evaluation:
    """RecurrentPPO's evaluation: ``policy.evaluate_actions(obs, actions, lstm_states, episode_starts)`` (contrib's
    per-step loop), or the same operations returning the distribution."""
    data = micro.samples
    if with_distribution:
        return _evaluate(policy, data, actions, _per_step(policy))
    values, log_prob, entropy = policy.evaluate_actions(  # type: ignore[call-arg]
        data.observations, actions, data.lstm_states, data.episode_starts
    )
    return values, log_prob, entropy, None


def evaluate_recurrent_lean(policy: ActorCriticPolicy, micro: Any, actions: th.Tensor,
                            with_distribution: bool) -> Evaluation:
    """:func:`evaluate_recurrent`'s values, log-probs, entropies and gradients, bit for bit, with contrib's per-step
    LSTM loop run by :func:`~sb3_ppo_scale.contrib.lstm.per_step_sequence` (no module call per step; the reset
    multiplied in only at steps that hold an episode start). For a policy whose ``recurrent_lean_blocker`` (with
    ``evaluate_actions``) is None."""
    values, log_prob, entropy, distribution = _evaluate(policy, micro.samples, actions, per_step_sequence)
    return values, log_prob, entropy, distribution if with_distribution else None


def evaluate_batched(policy: ActorCriticPolicy, micro: Any, actions: th.Tensor, with_distribution: bool) -> Evaluation:
    """RecurrentPPO's evaluation with every LSTM run as one batched call per micro-batch (:func:`batched_sequence`)."""
    return _evaluate(policy, micro.samples, actions, batched_sequence)


def _batched_or(per_step: Any, policy: ActorCriticPolicy, micro: Any, actions: th.Tensor) -> Evaluation:
    """:func:`evaluate_batched` for a micro-batch whose episode starts are all at its sequences' first steps; the
    ``per_step`` loop otherwise (fixed-length chunks, ``sequence_length``, may hold a reset after their first step).
    One host read of the episode starts per micro-batch."""
    data = micro.samples
    n_seq = data.lstm_states.pi[0].shape[1]
    if bool(data.episode_starts.reshape((n_seq, -1))[:, 1:].any()):
        return _evaluate(policy, data, actions, per_step)
    return _evaluate(policy, data, actions, batched_sequence)


def evaluate_batched_or_loop(policy: ActorCriticPolicy, micro: Any, actions: th.Tensor,
                             with_distribution: bool) -> Evaluation:
    """One LSTM call per micro-batch, or contrib's per-step loop where a chunk holds a reset (:func:`_batched_or`)."""
    return _batched_or(_per_step(policy), policy, micro, actions)


def evaluate_batched_or_lean_loop(policy: ActorCriticPolicy, micro: Any, actions: th.Tensor,
                                  with_distribution: bool) -> Evaluation:
    """:func:`evaluate_batched_or_loop` with contrib's loop run lean (:func:`per_step_sequence`, the same numbers), for
    a policy whose ``recurrent_lean_blocker`` (with ``evaluate_actions``) is None."""
    return _batched_or(per_step_sequence, policy, micro, actions)


def evaluate_every_step(policy: ActorCriticPolicy, micro: Any, actions: th.Tensor,
                        with_distribution: bool) -> Evaluation:
    """Contrib's per-step LSTM loop at every time step (:func:`~sb3_ppo_scale.contrib.lstm.every_step_sequence`):
    nothing read on the host, so ``cuda_graphs=True`` captures it; fixed-length chunks (``sequence_length``) only."""
    values, log_prob, entropy, distribution = _evaluate(policy, micro.samples, actions, every_step_sequence)
    return values, log_prob, entropy, distribution if with_distribution else None


def _host_array(value: Any) -> np.ndarray:
    """``value`` (an array, a list, a tensor on any device) as a NumPy array, for the checks below."""
    return value.detach().cpu().numpy() if isinstance(value, th.Tensor) else np.asarray(value)


def check_predict_state(state: Any, episode_start: Any, n_obs: int, state_shape: tuple[int, ...]) -> None:
    """ValueError naming ``state`` or ``episode_start`` unless RecurrentPPO's ``predict`` can read them for ``n_obs``
    observations: ``state`` None or the (hidden, cell) pair ``predict`` returns, two finite arrays of shape
    ``(n_layers, n_seq, hidden)`` (``state_shape`` with ``n_seq = 1``), where ``n_seq`` divides ``n_obs`` (one
    state per env; contrib reads ``n_obs / n_seq`` observations per env as consecutive steps); ``episode_start`` None
    or ``n_obs`` flags, each 0 / 1 (True / False). Else contrib fails inside torch (a reshape, the LSTM's size check, a
    distribution's nan check) or, for a third state entry, ignores it."""
    layers, _, hidden = state_shape
    if state is not None:
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise ValueError(f"state must be None or the (hidden, cell) pair predict returned (2 arrays of shape "
                             f"({layers}, {n_obs}, {hidden}) for {n_obs} observation(s)), got "
                             f"{type(state).__name__} of {len(state) if isinstance(state, (tuple, list)) else 1}")
        for index, part in enumerate(state):
            array = _host_array(part)
            shape = array.shape
            if len(shape) != 3 or shape[0] != layers or shape[2] != hidden or shape[1] < 1 or n_obs % shape[1]:
                raise ValueError(f"state[{index}] must have shape (n_lstm_layers, n_envs, lstm_hidden_size) = "
                                 f"({layers}, {n_obs}, {hidden}) for {n_obs} observation(s), got {shape}")
            if array.dtype.kind not in "biuf" or not np.isfinite(array).all():
                raise ValueError(f"state[{index}] must hold finite numbers (the LSTM states predict returned), got "
                                 f"dtype {array.dtype}{'' if array.dtype.kind not in 'biuf' else ' with nan or inf'}")
        if _host_array(state[0]).shape != _host_array(state[1]).shape:
            raise ValueError(f"state's hidden and cell arrays must have one shape, got {_host_array(state[0]).shape} "
                             f"and {_host_array(state[1]).shape}")
    if episode_start is not None:
        starts = _host_array(episode_start)
        if starts.size != n_obs:
            raise ValueError(f"episode_start must hold one flag per observation ({n_obs}), got shape {starts.shape}")
        if starts.dtype.kind not in "biuf" or not np.isin(starts, (0, 1)).all():
            raise ValueError(f"episode_start must hold booleans (or 0 / 1), got {starts.ravel()[:8].tolist()!r}")


#: PPO's buffer arguments, which RecurrentPPO does not take (its buffer is built from the policy's LSTM shapes).
BUFFER_ARGUMENTS = frozenset({"rollout_buffer_class", "rollout_buffer_kwargs"})


class ScalableRecurrentPPO(ScalableOnPolicyMixin, RecurrentPPO):
    """PPO with LSTM policies: ``sb3_contrib.RecurrentPPO`` with ScalablePPO's additions.

    Takes every argument of :class:`sb3_contrib.RecurrentPPO` (same names, positions and defaults) and trains
    identically with the defaults; plus ScalablePPO's arguments (``grad_accum_steps``, ``buffer_device``,
    ``objective``, ``kl_coef`` ..., ``learning_rate="kl_adaptive"``, ``compile_loss``, ``nonfinite``), documented on
    :class:`~sb3_ppo_scale.ScalablePPO`, and:

    :param batched_sequences: run each micro-batch's sequences through the LSTM as one ``nn.LSTM`` call per LSTM,
        the episode-start resets applied to the initial states (default False: contrib's per-step loop, bit-identical
        to RecurrentPPO). Equal to the loop up to float rounding of the gradient sums; see the module docstring.
    :param sequence_length: None (default: contrib's minibatches, below) or L: minibatches of exactly ``batch_size``
        samples and rows, no padding: ``batch_size / L`` chunks of L consecutive steps of one env, drawn by one
        permutation of the chunks per epoch, each starting from the LSTM states stored at its first step; an episode
        start inside a chunk resets the states at that step (contrib's per-step loop; with ``batched_sequences`` a
        micro-batch goes through the loop only when it holds such a reset). Gradients flow within a chunk only
        (truncated back-propagation through time at L steps). L must divide ``n_steps`` and ``batch_size`` (per
        process under torchrun). Not RecurrentPPO's sampling: opt-in. See :class:`~sb3_ppo_scale.contrib.sequences.ChunkLoader`.
        With ``cuda_graphs=True`` (which needs it, and ``batched_sequences=False``) every full minibatch's update is
        replayed from CUDA graphs, each chunk run through contrib's loop at every step.

    Minibatches are contrib's (``batch_size`` real samples, cut into zero-padded sequences: the padded size varies)
    unless ``sequence_length`` is set. ``grad_accum_steps`` splits each into micro-batches of whole sequences,
    weighted by their share of the real samples, so it needs ``batch_size > (grad_accum_steps - 1) * n_steps``
    (every minibatch then holds ``grad_accum_steps`` sequences), or ``batch_size / sequence_length >=
    grad_accum_steps`` with ``sequence_length``.
    Not supported, with a clear error: ``rollout_buffer_class`` / ``rollout_buffer_kwargs`` (a ``TypeError``, as
    RecurrentPPO's, saying so), ``cuda_graphs`` without ``sequence_length`` (padded shapes change with every
    minibatch) or with ``batched_sequences``, and a ``collect_device`` other than the
    policy's (collection carries LSTM states on the policy's device).
    """

    batched_sequences: bool = False  # class default: models saved before the argument existed load with it off
    sequence_length: int | None = None  # as above: contrib's minibatches

    def __init__(self, policy: Any, env: Any, *args: Any, batched_sequences: bool = False,
                 sequence_length: int | None = None, **kwargs: Any) -> None:
        passed = sorted(BUFFER_ARGUMENTS & kwargs.keys())
        if passed:
            raise TypeError(f"ScalableRecurrentPPO got an unexpected keyword argument {passed[0]!r}: like "
                            "sb3_contrib.RecurrentPPO it builds its own RecurrentRolloutBuffer of sequences, and a "
                            "prioritized buffer for sequences is not built (docs/contrib.md, Limits)")
        # read in _setup_model, which the base constructor runs
        self.batched_sequences, self.sequence_length = batched_sequences, sequence_length
        self._sequence_starts: np.ndarray | None = None
        super().__init__(policy, env, *args, **kwargs)

    def _check_supported(self, config: ScaleConfig) -> None:
        for key in ("lstm_hidden_size", "n_lstm_layers"):  # torch's errors for these name neither
            value = (self.policy_kwargs or {}).get(key)
            if value is not None and (not is_int(value) or value < 1):
                raise ValueError(f"policy_kwargs['{key}'] must be an int >= 1, got {value!r}")
            if value is not None and not isinstance(value, int):  # nn.LSTM: "hidden_size should be of type int"
                raise ValueError(f"policy_kwargs['{key}'] must be a Python int (torch's nn.LSTM takes no NumPy "
                                 f"integer), got {value!r}; pass int({value!r})")
        if not isinstance(self.batched_sequences, bool):
            raise ValueError(f"batched_sequences must be True or False, got {self.batched_sequences!r}")
        if config.cuda_graphs and (self.sequence_length is None or self.batched_sequences):
            why = ("contrib's padded minibatch shapes change with every minibatch; pass sequence_length=L for "
                   "minibatches of one shape" if self.sequence_length is None else
                   "a graph replays one LSTM loop, and batched_sequences chooses between its batched call and the loop "
                   "per micro-batch on the host; pass batched_sequences=False")
            raise ValueError(f"cuda_graphs=True is not supported by ScalableRecurrentPPO here ({why}), or pass "
                             "cuda_graphs=False")
        if resolve_collect_device(config.collect_device, self.device) != self.device:
            raise ValueError(f"collect_device must be 'auto' (the policy's device, {self.device}) for "
                             f"ScalableRecurrentPPO: collection keeps the LSTM states there, got {config.collect_device!r}")
        steps, accum = self.n_steps, config.grad_accum_steps
        if self.sequence_length is not None:
            self._check_sequence_length(accum)
        elif accum > 1 and self.batch_size <= (accum - 1) * steps:
            raise ValueError(
                f"batch_size={self.batch_size} cannot hold grad_accum_steps={accum} whole sequences: a sequence may be "
                f"n_steps={steps} samples long, so batch_size must be > (grad_accum_steps - 1) * n_steps = "
                f"{(accum - 1) * steps}; raise batch_size or lower grad_accum_steps"
            )

    def _check_sequence_length(self, accum: int) -> None:
        """ValueError naming ``sequence_length`` unless it is an int >= 1 dividing ``n_steps`` and ``batch_size``
        with at least ``grad_accum_steps`` chunks per minibatch."""
        length = self.sequence_length
        if not is_int(length) or length < 1:
            raise ValueError(f"sequence_length must be None or an int >= 1, got {length!r}")
        if self.n_steps % length or self.batch_size % length:
            raise ValueError(f"sequence_length={length} must divide n_steps={self.n_steps} and "
                             f"batch_size={self.batch_size} (minibatches of whole chunks of one env's steps)")
        if self.batch_size // length < accum:
            raise ValueError(f"batch_size={self.batch_size} holds {self.batch_size // length} chunks of "
                             f"sequence_length={length}, fewer than grad_accum_steps={accum}")

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_sequence_starts"]

    def _boundary_state(self) -> dict[str, Any]:
        """The LSTM states collection carries into the next rollout (``_last_lstm_states``, which ``save()`` leaves
        out), copied to the CPU."""
        states = self._last_lstm_states
        return {"last_lstm_states": None if states is None else RNNStates(
            *(tuple(t.detach().cpu().clone() for t in pair) for pair in states))}

    def _restore_boundary_state(self, state: dict[str, Any]) -> None:
        states = state.get("last_lstm_states")
        if states is not None:
            self._last_lstm_states = RNNStates(*(tuple(t.to(self.device).clone() for t in pair) for pair in states))

    def _build_rollout_buffer(self) -> Any:
        lstm = self.policy.lstm_actor
        shape = (self.n_steps, lstm.num_layers, self.n_envs, lstm.hidden_size)
        buffer_cls = RecurrentDictRolloutBuffer if isinstance(self.observation_space, spaces.Dict) else RecurrentRolloutBuffer
        return buffer_cls(self.n_steps, self.observation_space, self.action_space, shape, self.device,
                          gamma=self.gamma, gae_lambda=self.gae_lambda, n_envs=self.n_envs)

    def _rollout_extras(self, buffer: Any) -> dict[str, np.ndarray]:
        """Episode starts (N,) and the four LSTM state arrays (N, n_layers, hidden), in env-major order."""
        extras = {"episode_starts": flat_field(buffer, buffer.episode_starts).reshape(-1)}
        for name in STATE_FIELDS:  # stored (n_steps, n_layers, n_envs, hidden); get() swaps to (n_steps, n_envs, ...)
            array = getattr(buffer, name)
            extras[name] = array if buffer.generator_ready else flat_field(buffer, array.swapaxes(1, 2))
        return extras

    def _stage_rollout(self) -> DeviceRollout:
        rollout = super()._stage_rollout()
        starts = flat_field(self.rollout_buffer, self.rollout_buffer.episode_starts)
        self._sequence_starts = sequence_starts(starts, self.n_steps)
        return rollout

    def _make_loader(self, rollout: DeviceRollout, batch_size: int, shuffle: bool = True) -> Loader:
        assert self._sequence_starts is not None and len(self._sequence_starts) == len(rollout)
        if self.sequence_length is not None:
            return ChunkLoader(rollout, self.n_steps, self.sequence_length, batch_size,
                               self.grad_accum_steps if shuffle else 1, self.device, shuffle=shuffle)
        return SequenceLoader(rollout, self._sequence_starts, batch_size, self.grad_accum_steps if shuffle else 1,
                              self.device, shuffle=shuffle)

    _lean_reproduces = RecurrentPPO

    def predict(  # type: ignore[override]
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """RecurrentPPO's ``predict``, after checking ``state`` and ``episode_start`` (:func:`check_predict_state`)."""
        if state is not None or episode_start is not None:
            check_predict_state(state, episode_start, self._n_observations(observation),
                                self.policy.lstm_hidden_state_shape)
        return super().predict(observation, state, episode_start, deterministic)

    def _lean_blocker(self) -> str | None:
        return recurrent_lean_blocker(self.policy)

    def _collect_lean(self, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int) -> bool:
        """RecurrentPPO's loop, lean (:func:`~sb3_ppo_scale.contrib.recurrent_collect.collect_rollouts_recurrent_lean`)."""
        return collect_rollouts_recurrent_lean(self, env, callback, rollout_buffer, n_rollout_steps)

    @property
    def _evaluator(self) -> Evaluator:
        """Contrib's per-step LSTM loop, lean where that is exact (not under ``compile_loss``, which traces contrib's
        own ``evaluate_actions``); with ``batched_sequences``, one LSTM call per micro-batch (and with
        ``sequence_length``, that loop for the chunks that hold a reset); with ``cuda_graphs``, the loop at every
        step of the chunks (:func:`evaluate_every_step`, nothing read on the host)."""
        exact_lean = not self.compile_loss and recurrent_lean_blocker(self.policy, ("evaluate_actions",)) is None
        if self.cuda_graphs:  # fixed-length chunks (_check_supported); a policy of its own keeps its loop
            return evaluate_every_step if exact_lean else evaluate_recurrent
        if not self.batched_sequences:
            return evaluate_recurrent_lean if exact_lean else evaluate_recurrent
        if self.sequence_length is None:
            return evaluate_batched
        return evaluate_batched_or_lean_loop if exact_lean else evaluate_batched_or_loop
