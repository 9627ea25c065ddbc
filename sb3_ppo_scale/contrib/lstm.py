"""sb3-contrib's ``RecurrentActorCriticPolicy._process_sequence`` without ``nn.LSTM``'s module call, same numbers.

Contrib's function runs a padded batch of sequences through an ``nn.LSTM``: one call over the whole sequence when
no sequence holds an episode start, else a Python loop over time steps, each step's states multiplied by
``1 - episode_start`` before the step's call. :class:`LstmStep` does exactly that, with two trims that change no
value and no gradient:

- each call goes straight to the kernel ``nn.LSTM.forward`` calls (``torch._VF.lstm``, on the module's flat weights
  and flags), without the module's Python around it;
- the reset is multiplied in only at the time steps where some sequence starts an episode. At the others every
  factor is ``1.0 - 0.0 == 1.0``, and ``x * 1.0`` is ``x`` bit for bit (signed zeros and NaN included), as is the
  gradient it passes back.

:func:`every_step_sequence` is that loop with the reset at every step (no host read, for CUDA graphs).

Collection calls it once per env step (:mod:`sb3_ppo_scale.contrib.recurrent_collect`); training calls
:func:`per_step_sequence` once per LSTM and micro-batch (:mod:`sb3_ppo_scale.contrib.recurrent`). At the zoo's
PendulumNoVel-v1 and CartPoleNoVel-v1 entries, where contrib's loop is most of ``train()``, the default
ScalableRecurrentPPO's ``train()`` measured about 1.25x RecurrentPPO's with it (``benchmarks/contrib_train.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch as th
from torch import _VF

States = tuple[th.Tensor, th.Tensor]


class LstmStep:
    """``RecurrentActorCriticPolicy._process_sequence(features, states, episode_starts, lstm)`` through the kernel
    ``nn.LSTM.forward`` calls.

    :param lstm: the policy's ``nn.LSTM``, in the mode it runs in (its ``training`` flag is read here: build one per
        use, as collection does per rollout and training per micro-batch).
    """

    def __init__(self, lstm: th.nn.LSTM) -> None:
        lstm._update_flat_weights()  # what forward does first (a no-op unless the parameters were replaced)
        self.input_size = lstm.input_size
        self.flags = (lstm._flat_weights, lstm.bias, lstm.num_layers, lstm.dropout, lstm.training, lstm.bidirectional,
                      lstm.batch_first)

    def _lstm(self, sequence: th.Tensor, states: States) -> tuple[th.Tensor, States]:
        output, hidden, cell = _VF.lstm(sequence, states, *self.flags)
        return output, (hidden, cell)

    def __call__(self, features: th.Tensor, states: States, episode_starts: th.Tensor,
                 starts_at: Sequence[bool]) -> tuple[th.Tensor, States]:
        """The LSTM output ``(n_seq * steps, hidden)`` and the last states.

        :param features: ``(n_seq * steps, input)``, contrib's padded layout (sequence-major).
        :param states: the initial ``(hidden, cell)``, each ``(num_layers, n_seq, hidden)``.
        :param episode_starts: ``(n_seq * steps,)``, 1.0 where an episode starts.
        :param starts_at: per time step, whether any sequence starts an episode there (host values).
        """
        n_seq = states[0].shape[1]
        sequence = features.reshape((n_seq, -1, self.input_size)).swapaxes(0, 1)
        if not any(starts_at):
            output, states = self._lstm(sequence, states)
            return th.flatten(output.transpose(0, 1), start_dim=0, end_dim=1), states
        keep = 1.0 - episode_starts.reshape((n_seq, -1)).swapaxes(0, 1)  # contrib's factor, every step at once
        outputs = []
        for step, (step_features, reset) in enumerate(zip(sequence, starts_at, strict=True)):
            if reset:
                factor = keep[step].view(1, n_seq, 1)
                states = (factor * states[0], factor * states[1])
            hidden, states = self._lstm(step_features.unsqueeze(dim=0), states)
            outputs.append(hidden)
        return th.flatten(th.cat(outputs).transpose(0, 1), start_dim=0, end_dim=1), states


def per_step_sequence(features: th.Tensor, lstm_states: States, episode_starts: th.Tensor,
                      lstm: th.nn.LSTM) -> th.Tensor:
    """``RecurrentActorCriticPolicy._process_sequence(...)[0]`` (the output; the same values and gradients) through
    :class:`LstmStep`, with one host read of which time steps hold an episode start (contrib reads one flag)."""
    n_seq = lstm_states[0].shape[1]
    starts_at = episode_starts.reshape((n_seq, -1)).any(dim=0).tolist()
    return LstmStep(lstm)(features, lstm_states, episode_starts, starts_at)[0]


def every_step_sequence(features: th.Tensor, lstm_states: States, episode_starts: th.Tensor,
                        lstm: th.nn.LSTM) -> th.Tensor:
    """Contrib's per-step loop over every time step, each step's states multiplied by ``1 - episode_start`` (the
    branch ``_process_sequence`` takes when a sequence holds an episode start: the same values and gradients), without
    reading anything on the host: the loop is fixed by the shapes, so a CUDA graph can capture it (``cuda_graphs``
    with ``sequence_length``)."""
    steps = features.shape[0] // lstm_states[0].shape[1]
    return LstmStep(lstm)(features, lstm_states, episode_starts, [True] * steps)[0]
