"""One logical-minibatch update: zero the gradients, backward every micro-batch, decide ``target_kl``, clip, step.

:class:`UpdateStep` owns the whole update of one logical minibatch and is built from the policy (and its
optimizer), the loss function, the loss settings of this ``train()`` call and the :class:`StepSettings`:

1. :meth:`UpdateStep.gradients`: ``zero_grad``; advantages normalised over the logical minibatch; each
   micro-batch's loss weighted by its share of the logical minibatch and backpropagated (gradients accumulate);
   then the :class:`Reducer` combines gradients and statistics across data-parallel ranks (nothing to do in one
   process);
2. :meth:`UpdateStep.exceeds_target_kl`: SB3's early stop on the logical minibatch's approx KL;
3. :meth:`UpdateStep.apply`: one gradient clip (torch's, with the CPU's per-tensor calls batched:
   :mod:`~sb3_ppo_scale.core.update.gradient_ops`) and one optimizer step (a CPU Adam's on flat buffers, exactly:
   :class:`~sb3_ppo_scale.core.update.flat_adam.FlatAdam`), guarded against non-finite values by a
   :class:`~sb3_ppo_scale.core.update.guard.NonFiniteGuard`.

The CUDA-graph variant (:class:`~sb3_ppo_scale.core.update.graphs.CudaGraphStep`) wraps an ``UpdateStep`` and captures
its ``gradients`` and ``apply``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch as th
from torch.distributions import Distribution

from sb3_ppo_scale.core.update.flat_adam import FlatAdam, flat_blocker
from sb3_ppo_scale.core.update.gradient_ops import clip_grad_norm, gradient_clearer
from sb3_ppo_scale.core.update.guard import NonFiniteGuard
from sb3_ppo_scale.core.update.objectives import KL_INDEX, AdvantageNormalizer, LossSettings, MicroBatch
from sb3_ppo_scale.core.update.sampling import Batch

#: ``(policy, micro-batch, advantage normaliser, settings) -> (loss, stats vector)``: the eager or compiled PPO loss
Loss = Callable[[th.nn.Module, MicroBatch, AdvantageNormalizer, LossSettings], tuple[th.Tensor, th.Tensor]]


@contextmanager
def distribution_validation(enabled: bool) -> Iterator[None]:
    """Temporarily set torch.distributions' default argument validation.

    Validation checks every distribution's parameters and every scored action on the host: three host syncs per
    minibatch for a Gaussian policy. ``train()`` switches it off; collection keeps it, so a policy whose
    parameters became NaN still raises SB3's ValueError at the next rollout.
    """
    previous = Distribution._validate_args
    Distribution.set_default_validate_args(enabled)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(previous)


@contextmanager
def torch_threads(n_threads: int | None) -> Iterator[None]:
    """Temporarily run torch's CPU ops on ``n_threads`` threads (None: leave torch's setting as it is).

    ``update_threads``: collection steps a batch of envs with one small policy call per step, where extra torch
    threads only contend with the env threads; the update's large minibatches use every core while the envs wait.
    """
    previous = th.get_num_threads()
    if n_threads is not None and n_threads != previous:
        th.set_num_threads(n_threads)
    try:
        yield
    finally:
        if th.get_num_threads() != previous:
            th.set_num_threads(previous)


@dataclass(frozen=True)
class StepSettings:
    """What one optimizer step needs besides the loss.

    :param max_grad_norm: SB3's gradient-clip norm.
    :param normalize_advantage: normalise advantages over each logical minibatch (SB3's rule).
    :param target_kl: stop training when a logical minibatch's approx KL exceeds ``1.5 * target_kl`` (None: never).
    """

    max_grad_norm: float
    normalize_advantage: bool
    target_kl: float | None = None


class Reducer(Protocol):
    """How gradients and statistics of a logical minibatch combine across data-parallel ranks.

    A reduction sums over ranks; each rank weights its micro-batch losses by their share of the *global*
    logical minibatch, so the summed gradient is the gradient of the union.
    """

    world_size: int

    def sum_(self, tensor: th.Tensor) -> th.Tensor:
        """Sum ``tensor`` over ranks, in place; returns it."""
        ...

    def sum_gradients(self, parameters: list[th.nn.Parameter]) -> None:
        """Sum every parameter's ``.grad`` over ranks, in place (one collective)."""
        ...


class LocalReducer:
    """One process: nothing to combine."""

    world_size = 1

    def sum_(self, tensor: th.Tensor) -> th.Tensor:
        return tensor

    def sum_gradients(self, parameters: list[th.nn.Parameter]) -> None:
        """Nothing to do."""


LOCAL = LocalReducer()


#: Optimizers whose multi-tensor (``foreach``) step computes what their per-parameter loop computes, bit for bit, on
#: the CPU (tests/test_parity.py compares parameters and optimizer state with SB3's PPO after learn()).
FOREACH_EXACT = (th.optim.Adam, th.optim.AdamW)


def multi_tensor_steps(optimizer: th.optim.Optimizer, parameters: list[th.nn.Parameter]) -> list[dict]:
    """Switch a CPU Adam/AdamW left at ``foreach=None`` to its multi-tensor step for this ``train()`` call.

    torch picks the per-parameter loop on the CPU when ``foreach`` is None; the multi-tensor step runs the same
    arithmetic in a few batched calls, which matters for small policies (a dozen parameter tensors, a step per
    minibatch of 64). Returns the param groups switched, for :meth:`UpdateStep.close` to switch back, so that the
    optimizer's saved state stays what SB3's would be.
    """
    if type(optimizer) not in FOREACH_EXACT or any(p.device.type != "cpu" for p in parameters):
        return []
    switched = [group for group in optimizer.param_groups if group.get("foreach") is None
                and not group.get("fused") and not group.get("capturable") and not group.get("differentiable")]
    for group in switched:
        group["foreach"] = True
    return switched


class UpdateStep:
    """Runs the update of one logical minibatch (see the module docstring).

    :param policy: the SB3 policy; its ``optimizer`` is stepped.
    :param loss: the PPO loss of one micro-batch (:func:`~sb3_ppo_scale.core.update.objectives.ppo_loss` or compiled).
    :param loss_settings: the loss constants of this ``train()`` call.
    :param settings: gradient clip, advantage normalisation and ``target_kl``.
    :param guard: what happens to a non-finite step (skip or raise, counted).
    :param reducer: combines gradients and statistics across ranks (default: one process).
    """

    def __init__(
        self,
        policy: th.nn.Module,
        loss: Loss,
        loss_settings: LossSettings,
        settings: StepSettings,
        guard: NonFiniteGuard,
        reducer: Reducer = LOCAL,
    ) -> None:
        self.policy, self.optimizer = policy, policy.optimizer  # type: ignore[union-attr]
        self.parameters = list(policy.parameters())
        self.loss, self.loss_settings, self.settings = loss, loss_settings, settings
        self.guard, self.reducer = guard, reducer
        self._foreach_groups = multi_tensor_steps(self.optimizer, self.parameters)
        flat = not guard.on_device and flat_blocker(self.optimizer, self.parameters) is None
        #: what takes the optimizer step: a CPU Adam's step on flat buffers where that is exact, else the optimizer
        self.stepper: th.optim.Optimizer | FlatAdam = FlatAdam(self.optimizer) if flat else self.optimizer
        self.zero_grad = gradient_clearer(self.optimizer)  #: ``optimizer.zero_grad()``, direct where that is exact

    def __call__(self, batch: Batch) -> tuple[th.Tensor, bool]:
        """Update on ``batch``; returns ``(stats, stepped)``; ``stepped`` is False when ``target_kl`` stopped it."""
        stats = self.gradients(batch)
        if self.exceeds_target_kl(stats):
            return stats, False
        self.apply(stats)
        return stats, True

    def gradients(self, batch: Batch) -> th.Tensor:
        """Zero the gradients and backward every micro-batch of ``batch``; returns its stats vector (device)."""
        self.zero_grad()
        normalize, n_logical = self._normalizer(batch)
        total: th.Tensor | None = None
        for micro in batch.micro_batches(n_logical):
            loss, stats = self.loss(self.policy, micro, normalize, self.loss_settings)
            if micro.share != 1.0:
                loss, stats = loss * micro.share, stats * micro.share
            loss.backward()
            total = stats if total is None else total + stats
        assert total is not None
        if self.reducer.world_size > 1:
            self.reducer.sum_gradients(self.parameters)
            total = self.reducer.sum_(total)
        return total

    def exceeds_target_kl(self, stats: th.Tensor) -> bool:
        """SB3's early stop: approx KL of the minibatch > 1.5 * target_kl (one host sync, only with target_kl)."""
        if self.settings.target_kl is None:
            return False
        return bool(np.float32(stats[KL_INDEX].item()) > np.float32(1.5 * self.settings.target_kl))

    def apply(self, stats: th.Tensor) -> None:
        """One gradient clip (SB3's ``max_grad_norm``) and one optimizer step, unless a value is non-finite."""
        grad_norm = clip_grad_norm(self.parameters, self.settings.max_grad_norm)
        self.guard.step(self.stepper, self.parameters, grad_norm, stats)

    def close(self) -> None:
        """Give the optimizer back its own ``foreach`` setting (see :func:`multi_tensor_steps`) and its state as
        tensors of their own (see :class:`~sb3_ppo_scale.core.update.flat_adam.FlatAdam`)."""
        if isinstance(self.stepper, FlatAdam):
            self.stepper.close()
        for group in self._foreach_groups:
            group["foreach"] = None

    def _normalizer(self, batch: Batch) -> tuple[AdvantageNormalizer, int | None]:
        """The logical minibatch's advantage normaliser and its global size (None: the local size)."""
        advantages = batch.advantages()
        if self.reducer.world_size == 1:
            return AdvantageNormalizer.fit(advantages, self.settings.normalize_advantage), None
        local = advantages.double()
        moments = th.stack([local.sum(), (local * local).sum(), local.new_tensor(float(len(local)))])
        total, total_sq, count = self.reducer.sum_(moments).tolist()
        normalize = AdvantageNormalizer.from_moments(
            total, total_sq, int(count), self.settings.normalize_advantage, advantages
        )
        return normalize, int(count)
