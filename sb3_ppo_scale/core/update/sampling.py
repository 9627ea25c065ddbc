"""DataLoader-like iteration over a device-resident rollout: logical minibatches split into micro-batches.

The sample order is SB3's: one ``np.random.permutation(N)`` per epoch, sliced into logical minibatches of
``batch_size`` (the last one shorter when ``batch_size`` does not divide N). Each logical minibatch is split
into ``grad_accum_steps`` micro-batches whose sizes differ by at most one. Indices live on the rollout's
device, so gathering a micro-batch never leaves it.

A rollout buffer class with a sampling of its own (a ``get`` or ``_get_samples`` that is not SB3's or sb3-contrib's,
see :func:`~sb3_ppo_scale.core.update.rollout.samples_itself`) is iterated as the algorithm's ``train()`` iterates it:
:class:`BufferLoader` yields the minibatches its ``get(batch_size)`` yields, split the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch as th
from stable_baselines3.common.type_aliases import DictRolloutBufferSamples, RolloutBufferSamples

from sb3_ppo_scale.core.update.rollout import UNIFORM_HOOKS, DeviceRollout

Samples = RolloutBufferSamples | DictRolloutBufferSamples
#: ``n -> int64 indices`` of one epoch (a permutation of ``range(n)``, or draws that may repeat)
EpochOrder = Callable[[int], th.Tensor]
uniform_order: EpochOrder = UNIFORM_HOOKS.epoch_order


@dataclass
class MicroBatch:
    """One micro-batch: its samples, its share of the logical batch, and optional per-sample extras:
    loss ``weights`` and the rollout policy's distribution parameters ``old_dist``.

    ``mask`` (bool, one entry per row of ``samples``) marks the real samples of a padded layout (sequences of a
    recurrent policy); None means every row is a sample. ``rows`` are the rollout indices of the real samples, in
    the order ``samples[mask]`` lists them (used to place per-sample results back into rollout order).
    """

    samples: Samples
    share: float
    weights: th.Tensor | None = None
    old_dist: th.Tensor | None = None
    mask: th.Tensor | None = None
    rows: th.Tensor | None = None


class Batch(Protocol):
    """What an update step needs of a logical minibatch (:class:`LogicalBatch` for samples; an algorithm may cut
    minibatches otherwise, e.g. into whole sequences)."""

    n_micro: int

    def __len__(self) -> int:
        """The number of real samples (what shares and advantage statistics count)."""
        ...

    def advantages(self) -> th.Tensor:
        """The real samples' raw advantages (normalisation statistics)."""
        ...

    def micro_batches(self, n_logical: int | None = None) -> Iterator[MicroBatch]:
        """The micro-batches, each with its share of ``n_logical`` real samples (default: ``len(self)``)."""
        ...


#: what a training loop iterates once per epoch
Loader = Iterable[Batch]


@dataclass
class LogicalBatch:
    """A logical minibatch: ``indices`` into the rollout, split into ``n_micro`` micro-batches on demand."""

    rollout: DeviceRollout
    indices: th.Tensor
    n_micro: int
    target_device: th.device

    def __len__(self) -> int:
        return self.indices.shape[0]

    def advantages(self) -> th.Tensor:
        """The logical minibatch's raw advantages (used for normalisation statistics)."""
        return self.rollout.advantages.index_select(0, self.indices)

    def micro_batches(self, n_logical: int | None = None) -> Iterator[MicroBatch]:
        """Gather micro-batches one at a time, so only one micro-batch is materialised at once.

        :param n_logical: the size of the logical minibatch each share is relative to (default: ``len(self)``;
            data-parallel ranks pass the global size, so shares sum to 1 over all ranks).
        """
        n_logical = len(self) if n_logical is None else n_logical
        parts = (self.indices,) if self.n_micro == 1 else th.tensor_split(self.indices, self.n_micro)
        for part in parts:
            yield MicroBatch(
                self.rollout.gather(part, self.target_device),
                part.shape[0] / n_logical,
                weights=self._take(self.rollout.weights, part),
                old_dist=self._take(self.rollout.old_dist, part),
                rows=part,
            )

    def _take(self, per_sample: th.Tensor | None, part: th.Tensor) -> th.Tensor | None:
        if per_sample is None:
            return None
        return per_sample.index_select(0, part).to(self.target_device, non_blocking=True)


class MinibatchLoader:
    """Iterate a :class:`DeviceRollout` like a ``torch.utils.data.DataLoader`` over whole minibatches.

    :param rollout: the data, already on its device.
    :param batch_size: samples per logical minibatch (one optimizer step each), 1..len(rollout).
    :param grad_accum_steps: micro-batches per logical minibatch (default 1: no accumulation).
    :param shuffle: draw a new order each epoch with ``order`` (default True); False keeps rollout order.
    :param drop_last: skip a last logical minibatch shorter than ``batch_size`` (default False, as SB3).
    :param target_device: where gathered micro-batches are sent (default: the rollout's device).
    :param order: ``n -> permutation of range(n)`` used when shuffling (default :func:`uniform_order`);
        a prioritized sampler passes its own (it may repeat indices).
    """

    def __init__(
        self,
        rollout: DeviceRollout,
        batch_size: int,
        grad_accum_steps: int = 1,
        shuffle: bool = True,
        drop_last: bool = False,
        target_device: th.device | None = None,
        order: EpochOrder = uniform_order,
    ) -> None:
        self.rollout = rollout
        self.batch_size = batch_size
        self.grad_accum_steps = grad_accum_steps
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.target_device = rollout.device if target_device is None else target_device
        self.order = order

    def __len__(self) -> int:
        full, rest = divmod(len(self.rollout), self.batch_size)
        return full + (rest > 0 and not self.drop_last)

    def __iter__(self) -> Iterator[LogicalBatch]:
        n_samples = len(self.rollout)
        order = self.order(n_samples) if self.shuffle else th.arange(n_samples)
        order_t = order.to(self.rollout.device, th.long, non_blocking=True)
        for start in range(0, len(order), self.batch_size):
            size = min(self.batch_size, len(order) - start)
            if self.drop_last and size < self.batch_size:
                return
            indices = order_t[start : start + size]
            yield LogicalBatch(self.rollout, indices, min(self.grad_accum_steps, size), self.target_device)


@dataclass
class SamplesBatch:
    """A logical minibatch that a rollout buffer's own ``get()`` drew: its samples as the buffer returned them (SB3's
    samples tuple, or an algorithm's with extra fields), split into ``n_micro`` micro-batches on demand as
    :class:`LogicalBatch` splits its indices."""

    samples: Samples
    n_micro: int

    def __len__(self) -> int:
        return self.samples.advantages.shape[0]

    def advantages(self) -> th.Tensor:
        """The minibatch's raw advantages (used for normalisation statistics)."""
        return self.samples.advantages

    def micro_batches(self, n_logical: int | None = None) -> Iterator[MicroBatch]:
        """The micro-batches, each with its share of ``n_logical`` samples (default: ``len(self)``)."""
        n_logical = len(self) if n_logical is None else n_logical
        if self.n_micro == 1:
            yield MicroBatch(self.samples, len(self) / n_logical)
            return
        rows = th.arange(len(self), device=self.samples.advantages.device)
        for part in th.tensor_split(rows, self.n_micro):
            yield MicroBatch(_select_rows(self.samples, part), part.shape[0] / n_logical)


def _select_rows(samples: Any, rows: th.Tensor) -> Any:
    """The ``rows`` of every tensor field of a samples tuple (dict observations key by key)."""
    fields = [{key: value.index_select(0, rows) for key, value in field.items()} if isinstance(field, dict)
              else field.index_select(0, rows) for field in samples]
    return type(samples)(*fields)


class BufferLoader:
    """Each epoch, the minibatches ``buffer.get(batch_size)`` yields, in its order and with its random draws (what the
    algorithm's ``train()`` iterates), as :class:`SamplesBatch` objects of ``grad_accum_steps`` micro-batches: for a
    rollout buffer class with a sampling of its own (:func:`~sb3_ppo_scale.core.update.rollout.samples_itself`).

    :param buffer: the model's rollout buffer, full.
    :param batch_size: what the algorithm passes to ``get``.
    :param grad_accum_steps: micro-batches per minibatch (fewer when a minibatch holds fewer samples).
    """

    def __init__(self, buffer: Any, batch_size: int, grad_accum_steps: int = 1) -> None:
        self.buffer = buffer
        self.batch_size = batch_size
        self.grad_accum_steps = grad_accum_steps

    def __iter__(self) -> Iterator[SamplesBatch]:
        for samples in self.buffer.get(self.batch_size):
            yield SamplesBatch(samples, min(self.grad_accum_steps, samples.advantages.shape[0]))
