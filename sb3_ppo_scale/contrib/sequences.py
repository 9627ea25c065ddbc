"""Minibatches of whole sequences for recurrent policies, cut exactly as sb3-contrib's ``RecurrentRolloutBuffer``.

sb3-contrib's sampling, per epoch: one ``np.random.randint(N)`` split point rotates the env-major sample order
(``[split:] + [:split]``), which is sliced into minibatches of ``batch_size`` samples. Inside a minibatch a new
sequence starts at its first sample, at every episode start and at every env's first step; each sequence is padded
with zeros to the minibatch's longest one and laid out as ``(n_seq, max_len)`` rows, with the LSTM states stored at
each sequence's first step as its initial state. :class:`SequenceLoader` reproduces that order and layout on the
rollout's device (the layout is computed with NumPy on small index arrays; the data never leaves the device).

Every episode start is the first step of a sequence, so a sequence never contains a reset after its first step:
the reset can be applied to the initial states once, and the whole sequence run as one ``nn.LSTM`` call
(:func:`sb3_ppo_scale.contrib.recurrent.batched_sequence`).

:class:`ChunkLoader` is the opt-in alternative (``ScalableRecurrentPPO(sequence_length=L)``) for minibatches of an
exact size: contrib's hold ``batch_size`` real samples but a padded tensor of ``n_seq * max_len`` rows that varies
from minibatch to minibatch (sb3-contrib issue #113). The rollout is cut into chunks of ``L`` consecutive steps of one
env (``L`` divides ``n_steps``), each starting from the LSTM states stored at its first step; an epoch is one
``np.random.permutation`` of the chunks, ``batch_size / L`` chunks per minibatch: exactly ``batch_size`` samples and
as many rows, no padding. An episode start inside a chunk resets the states at that step, as contrib's per-step loop
does (:func:`sb3_ppo_scale.contrib.recurrent.evaluate_batched_or_loop` sends such micro-batches to the loop). Its
minibatches (:class:`ChunkBatch`) are index tensors on the rollout's device, so ``cuda_graphs=True`` can capture them.

Gradient accumulation splits a logical minibatch into micro-batches of *whole sequences* (each padded to its own
longest sequence), balanced by sample count; each micro-batch's loss is weighted by its share of the logical
minibatch's real (unpadded) samples, so the accumulated gradient is the big batch's. A logical minibatch with fewer
sequences than ``grad_accum_steps`` runs in as many micro-batches as it has sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from sb3_contrib.common.recurrent.type_aliases import (
    RecurrentDictRolloutBufferSamples,
    RecurrentRolloutBufferSamples,
    RNNStates,
)

from sb3_ppo_scale.core.update.rollout import DeviceRollout
from sb3_ppo_scale.core.update.sampling import LogicalBatch, MicroBatch

#: the rollout extras a recurrent rollout carries (see ScalableRecurrentPPO._rollout_extras)
STATE_FIELDS = ("hidden_states_pi", "cell_states_pi", "hidden_states_vf", "cell_states_vf")
_PADDED_FIELDS = ("actions", "old_values", "old_log_prob", "advantages", "returns")


def sequence_starts(episode_starts: np.ndarray, n_steps: int) -> np.ndarray:
    """Which samples (env-major order, ``n_envs * n_steps`` of them) begin a sequence: episode starts and every env's
    first step (bool array)."""
    starts = np.asarray(episode_starts, dtype=bool).reshape(-1).copy()
    starts[::n_steps] = True
    return starts


@dataclass(frozen=True)
class PaddedLayout:
    """Where a run of whole sequences goes in the padded ``(n_seq, max_len)`` layout (host index arrays).

    :param rows: rollout indices of the real samples, in sequence order.
    :param padded_rows: one rollout index per padded slot (padding slots repeat ``rows[0]`` and are zeroed).
    :param mask: which padded slots hold real samples.
    :param start_rows: rollout index of each sequence's first sample (its initial LSTM state).
    """

    rows: np.ndarray
    padded_rows: np.ndarray
    mask: np.ndarray
    start_rows: np.ndarray

    @classmethod
    def of(cls, rows: np.ndarray, local_starts: np.ndarray) -> "PaddedLayout":
        """The layout of ``rows`` whose sequences begin at positions ``local_starts`` (the first is 0)."""
        lengths = np.diff(np.append(local_starts, len(rows)))
        n_seq, max_len = len(lengths), int(lengths.max())
        seq_id = np.repeat(np.arange(n_seq), lengths)
        slot = seq_id * max_len + (np.arange(len(rows)) - np.repeat(local_starts, lengths))
        padded_rows = np.full(n_seq * max_len, rows[0], dtype=np.int64)
        padded_rows[slot] = rows
        mask = np.zeros(n_seq * max_len, dtype=bool)
        mask[slot] = True
        return cls(rows, padded_rows, mask, rows[local_starts])


class SequenceBatch:
    """A logical minibatch of ``len(indices)`` samples cut into sequences (see the module docstring).

    :param rollout: the staged rollout (with the recurrent extras).
    :param indices: the minibatch's rollout indices, in sampling order (host int64).
    :param starts: which of them begin a sequence (host bool; the first always does).
    :param n_micro: micro-batches wanted (``grad_accum_steps``; at most one per sequence).
    :param target_device: where micro-batches are gathered to.
    """

    def __init__(self, rollout: DeviceRollout, indices: np.ndarray, starts: np.ndarray, n_micro: int,
                 target_device: th.device) -> None:
        self.rollout, self.indices, self.target_device = rollout, indices, target_device
        self.seq_starts = np.flatnonzero(starts)
        self.n_micro = min(n_micro, len(self.seq_starts))

    def __len__(self) -> int:
        return len(self.indices)

    def advantages(self) -> th.Tensor:
        """The real samples' raw advantages, in sequence order (``advantages[mask]`` of contrib's padded batch)."""
        return self.rollout.advantages.index_select(0, th.from_numpy(self.indices).to(self.rollout.device))

    def layouts(self) -> list[PaddedLayout]:
        """One padded layout per micro-batch: whole sequences, split near equal sample counts."""
        bounds = [0]
        if self.n_micro > 1:
            targets = np.arange(1, self.n_micro) * len(self) / self.n_micro
            cuts = np.searchsorted(self.seq_starts, targets)  # the first sequence starting at or after each target
            bounds += sorted({int(c) for c in cuts if 0 < c < len(self.seq_starts)})
        bounds.append(len(self.seq_starts))
        layouts = []
        for first, last in zip(bounds[:-1], bounds[1:]):
            begin = self.seq_starts[first]
            end = self.seq_starts[last] if last < len(self.seq_starts) else len(self)
            layouts.append(PaddedLayout.of(self.indices[begin:end], self.seq_starts[first:last] - begin))
        return layouts

    def micro_batches(self, n_logical: int | None = None) -> Iterator[MicroBatch]:
        """Gather each micro-batch in contrib's padded layout, weighted by its share of the real samples."""
        n_logical = len(self) if n_logical is None else n_logical
        for layout in self.layouts():
            yield gather_sequences(self.rollout, layout, self.target_device, len(layout.rows) / n_logical)


def gather_sequences(rollout: DeviceRollout, layout: PaddedLayout, device: th.device, share: float) -> MicroBatch:
    """A micro-batch in the padded layout: every sample field zero-padded (as contrib's ``pad``), initial LSTM states
    ``(n_layers, n_seq, hidden)``, ``episode_starts`` and the mask; ``weights``/``old_dist`` padded with a real row
    (never read at padding, but finite there, so no NaN reaches a gradient)."""
    source = rollout.device
    padded = th.from_numpy(layout.padded_rows).to(source, non_blocking=True)
    mask = th.from_numpy(layout.mask).to(source, non_blocking=True)
    starts = th.from_numpy(layout.start_rows).to(source, non_blocking=True)

    def pad(tensor: th.Tensor) -> th.Tensor:
        gathered = tensor.index_select(0, padded)
        fill = ~mask.view(-1, *([1] * (gathered.dim() - 1)))
        return gathered.masked_fill(fill, 0).to(device, non_blocking=True)

    def take(tensor: th.Tensor | None) -> th.Tensor | None:
        return None if tensor is None else tensor.index_select(0, padded).to(device, non_blocking=True)

    mask_on_device = mask.to(device, non_blocking=True)
    samples = _sequence_samples(rollout, pad, starts, device, mask_on_device.float())
    rows = th.from_numpy(layout.rows).to(device, non_blocking=True)
    return MicroBatch(samples, share, weights=take(rollout.weights), old_dist=take(rollout.old_dist),
                      mask=mask_on_device, rows=rows)


def _sequence_samples(rollout: DeviceRollout, gather: Callable[[th.Tensor], th.Tensor], start_rows: th.Tensor,
                      device: th.device, mask: th.Tensor) -> Any:
    """contrib's ``Recurrent(Dict)RolloutBufferSamples`` of a micro-batch: observations, the sample fields and
    ``episode_starts`` each through ``gather`` (rollout rows -> the layout's rows on ``device``), the LSTM states stored
    at ``start_rows`` as ``(n_layers, n_seq, hidden)``, and contrib's float ``mask``."""

    def state(name: str) -> th.Tensor:  # (n_seq, n_layers, hidden) -> (n_layers, n_seq, hidden)
        return rollout.extras[name].index_select(0, start_rows).transpose(0, 1).contiguous().to(device,
                                                                                                non_blocking=True)

    obs = rollout.observations
    observations = {k: gather(v) for k, v in obs.items()} if isinstance(obs, dict) else gather(obs)
    fields = [gather(getattr(rollout, name)) for name in _PADDED_FIELDS]
    states = RNNStates((state("hidden_states_pi"), state("cell_states_pi")),
                       (state("hidden_states_vf"), state("cell_states_vf")))
    samples_cls = RecurrentDictRolloutBufferSamples if isinstance(obs, dict) else RecurrentRolloutBufferSamples
    return samples_cls(observations, *fields, states, gather(rollout.extras["episode_starts"]), mask)


class SequenceLoader:
    """Iterate a recurrent rollout in contrib's minibatches of sequences (see the module docstring).

    :param rollout: the staged rollout (with the recurrent extras).
    :param starts: :func:`sequence_starts` of the rollout (host bool array, one per sample).
    :param batch_size: samples per logical minibatch.
    :param grad_accum_steps: micro-batches of whole sequences per logical minibatch.
    :param target_device: where micro-batches are gathered to.
    :param shuffle: draw contrib's random split point each epoch (default True); False keeps rollout order.
    """

    def __init__(self, rollout: DeviceRollout, starts: np.ndarray, batch_size: int, grad_accum_steps: int,
                 target_device: th.device, shuffle: bool = True) -> None:
        self.rollout, self.starts, self.batch_size = rollout, starts, batch_size
        self.grad_accum_steps, self.target_device, self.shuffle = grad_accum_steps, target_device, shuffle

    def __len__(self) -> int:
        return -(-len(self.rollout) // self.batch_size)

    def __iter__(self) -> Iterator[SequenceBatch]:
        n_samples = len(self.rollout)
        split = np.random.randint(n_samples) if self.shuffle else 0  # contrib's one draw per epoch
        order = np.concatenate((np.arange(split, n_samples), np.arange(split)))
        for begin in range(0, n_samples, self.batch_size):
            indices = order[begin : begin + self.batch_size]
            starts = self.starts[indices]
            starts[0] = True
            yield SequenceBatch(self.rollout, indices, starts, self.grad_accum_steps, self.target_device)


@dataclass
class ChunkBatch(LogicalBatch):
    """A logical minibatch of whole chunks of ``chunk`` consecutive steps of one env (``sequence_length``): a
    :class:`~sb3_ppo_scale.core.update.sampling.LogicalBatch` whose ``indices`` (on the rollout's device) list the chunks'
    rows chunk after chunk, cut into micro-batches of whole chunks. No padding, and nothing read from the host, so
    that a CUDA graph can capture its update (``cuda_graphs=True``) and replay it with other ``indices`` of the same
    shape.

    :param chunk: steps per chunk (``n_micro``: micro-batches of whole chunks, at most one per chunk).
    """

    chunk: int = 1

    def chunk_counts(self) -> list[int]:
        """Chunks per micro-batch, cut where :meth:`SequenceBatch.layouts` cuts whole sequences: the first chunk
        starting at or after each ``k / n_micro`` of the samples."""
        n_chunks = len(self) // self.chunk
        cuts = [0, *(-(-k * n_chunks // self.n_micro) for k in range(1, self.n_micro)), n_chunks]
        return [end - begin for begin, end in zip(cuts[:-1], cuts[1:])]

    def micro_batches(self, n_logical: int | None = None) -> Iterator[MicroBatch]:
        """Gather each micro-batch of whole chunks, weighted by its share of ``n_logical`` samples (default: all)."""
        n_logical = len(self) if n_logical is None else n_logical
        for rows in th.split(self.indices, [count * self.chunk for count in self.chunk_counts()]):
            yield gather_chunks(self.rollout, rows, self.chunk, self.target_device, rows.shape[0] / n_logical)


def gather_chunks(rollout: DeviceRollout, rows: th.Tensor, chunk: int, device: th.device, share: float) -> MicroBatch:
    """A micro-batch of whole chunks in contrib's sequence-major layout (``n_seq = len(rows) / chunk`` sequences of
    ``chunk`` steps): every sample field, the LSTM states stored at each chunk's first step ``(n_layers, n_seq,
    hidden)`` and ``episode_starts``; no padding, so ``mask`` is None (every row is a sample)."""

    def take(tensor: th.Tensor | None) -> th.Tensor | None:
        return None if tensor is None else tensor.index_select(0, rows).to(device, non_blocking=True)

    every_row = th.ones(rows.shape[0], device=device)  # contrib's float mask field: no padding slot
    samples = _sequence_samples(rollout, take, rows[::chunk], device, every_row)  # type: ignore[arg-type]
    return MicroBatch(samples, share, weights=take(rollout.weights), old_dist=take(rollout.old_dist),
                      rows=rows.to(device, non_blocking=True))


class ChunkLoader:
    """Iterate a recurrent rollout in minibatches of whole chunks of ``chunk`` consecutive steps of one env (see the
    module docstring): exactly ``batch_size`` samples each (the last may be shorter), no padding.

    :param rollout: the staged rollout (with the recurrent extras), env-major.
    :param n_steps: steps per env in the rollout (``chunk`` divides it).
    :param chunk: steps per chunk (``sequence_length``).
    :param batch_size: samples per logical minibatch; a multiple of ``chunk`` when shuffling (in-order passes take
        ``max(1, batch_size // chunk)`` chunks).
    :param grad_accum_steps: micro-batches of whole chunks per logical minibatch.
    :param target_device: where micro-batches are gathered to.
    :param shuffle: one ``np.random.permutation`` of the chunks per epoch (default True); False keeps rollout order.
    """

    def __init__(self, rollout: DeviceRollout, n_steps: int, chunk: int, batch_size: int, grad_accum_steps: int,
                 target_device: th.device, shuffle: bool = True) -> None:
        if n_steps % chunk or (shuffle and batch_size % chunk):
            raise ValueError(f"sequence_length={chunk} must divide n_steps={n_steps} and the batch_size per process "
                             f"({batch_size})")
        self.rollout, self.chunk, self.shuffle = rollout, chunk, shuffle
        self.chunks_per_batch = max(1, batch_size // chunk)
        self.grad_accum_steps, self.target_device = grad_accum_steps, target_device

    @property
    def n_chunks(self) -> int:
        return len(self.rollout) // self.chunk

    def __len__(self) -> int:
        return -(-self.n_chunks // self.chunks_per_batch)

    def __iter__(self) -> Iterator[ChunkBatch]:
        order = np.random.permutation(self.n_chunks) if self.shuffle else np.arange(self.n_chunks)
        rows = (order[:, None] * self.chunk + np.arange(self.chunk)).reshape(-1)
        rows_on_device = th.from_numpy(rows).to(self.rollout.device)  # the epoch's order, copied once
        per_batch = self.chunks_per_batch * self.chunk
        for begin in range(0, len(rows), per_batch):
            indices = rows_on_device[begin : begin + per_batch]
            n_micro = min(self.grad_accum_steps, indices.shape[0] // self.chunk)
            yield ChunkBatch(self.rollout, indices, n_micro, self.target_device, self.chunk)
