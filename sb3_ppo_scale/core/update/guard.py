"""The non-finite guard: an optimizer step whose loss or gradient norm is NaN or infinite is not taken.

``ScalablePPO(nonfinite="skip")`` (the default) skips such a step: the parameters and the optimizer state stay as
they were, the step is counted in ``train/nonfinite_steps`` and a warning names the minibatch statistics. After
:data:`MAX_CONSECUTIVE` skips in a row training stops with :class:`NonFiniteError`. ``nonfinite="raise"`` stops at
the first one. With all values finite the step is exactly the unguarded one.

Cost: eagerly, one host sync per logical minibatch (reading one flag). Inside a CUDA graph nothing is read: the
step runs and is undone on the device where the flag is false (parameters and optimizer state are restored
from a copy taken before the step), the counters stay on the device, and ``train()`` reads them with its
statistics in its one sync; so a CUDA-graph run raises at the end of the ``train()`` call.
"""

from __future__ import annotations

import warnings

import torch as th

from sb3_ppo_scale.core.update.flat_adam import FlatAdam
from sb3_ppo_scale.core.update.objectives import STAT_NAMES

#: consecutive skipped steps after which training stops (a run that cannot produce a finite step is broken)
MAX_CONSECUTIVE = 10


def _state_tensors(optimizer: th.optim.Optimizer, parameters: list[th.nn.Parameter]) -> list[th.Tensor]:
    """Every tensor of the optimizer's state for ``parameters`` (Adam: step, exp_avg, exp_avg_sq)."""
    return [t for p in parameters for t in optimizer.state.get(p, {}).values() if isinstance(t, th.Tensor)]


class NonFiniteError(RuntimeError):
    """Training produced non-finite losses or gradients (see the message for the minibatch statistics)."""


def _describe(stats: th.Tensor, grad_norm: th.Tensor) -> str:
    values = dict(zip(STAT_NAMES, stats.detach().cpu().tolist()))
    return ", ".join(f"{name}={value:.4g}" for name, value in values.items()) + f", grad_norm={float(grad_norm):.4g}"


class NonFiniteGuard:
    """Skips (or raises on) optimizer steps with a non-finite loss statistic or gradient norm.

    :param mode: "skip" (default) or "raise".
    :param device: where the on-device counters live.
    :param on_device: decide without reading the flag on the host (CUDA-graph capture); default False.
    """

    def __init__(self, mode: str, device: th.device, on_device: bool = False) -> None:
        self.mode, self.on_device = mode, on_device
        self.skipped = th.zeros((), dtype=th.int64, device=device)  #: steps skipped in this train() call
        #: skipped in a row up to now, kept on the device in the on-device mode (the host counts otherwise)
        self.consecutive = th.zeros((), dtype=th.int64, device=device)
        self._consecutive_host = 0

    def step(self, optimizer: th.optim.Optimizer | FlatAdam, parameters: list[th.nn.Parameter], grad_norm: th.Tensor,
             stats: th.Tensor) -> None:
        """``optimizer.step()`` when ``grad_norm`` and every statistic are finite; otherwise skip and count.
        ``optimizer`` is the optimizer itself in the on-device mode (its state is restored), else anything that
        takes its step (:class:`~sb3_ppo_scale.core.update.flat_adam.FlatAdam`)."""
        finite = th.isfinite(grad_norm) & th.isfinite(stats).all()
        if self.on_device:
            self._step_or_undo(optimizer, parameters, finite)
            return
        if bool(finite):
            optimizer.step()
            self._consecutive_host = 0
            return
        self._skip(stats, grad_norm)

    def begin(self) -> None:
        """Start a ``train()`` call: :attr:`skipped` counts from 0 (:attr:`consecutive` carries on)."""
        self.skipped.zero_()

    def _skip(self, stats: th.Tensor, grad_norm: th.Tensor) -> None:
        self.skipped += 1
        self._consecutive_host += 1
        described = _describe(stats, grad_norm)
        if self.mode == "raise" or self._consecutive_host >= MAX_CONSECUTIVE:
            raise NonFiniteError(
                f"non-finite loss or gradient in a PPO update ({described}); {self._consecutive_host} optimizer "
                f"step(s) in a row skipped (nonfinite={self.mode!r}, limit {MAX_CONSECUTIVE}). Check the rewards and "
                "observations for NaN/inf (VecCheckNan), the learning rate and the reward scale"
            )
        warnings.warn(f"skipped an optimizer step with non-finite values ({described})", RuntimeWarning, stacklevel=3)

    def _step_or_undo(self, optimizer: th.optim.Optimizer, parameters: list[th.nn.Parameter],
                      finite: th.Tensor) -> None:
        """The step, then every parameter and optimizer-state tensor put back where ``finite`` is false. State that
        this very step created (the optimizer's first step) is zeroed instead: Adam's fresh state (zero moments, step
        0) behaves exactly like none."""
        state = _state_tensors(optimizer, parameters)
        existing = {id(t) for t in state}
        tensors = [p.data for p in parameters] + state
        before = [t.clone() for t in tensors]
        optimizer.step()
        for tensor, old in zip(tensors, before):
            tensor.copy_(th.where(finite, tensor, old))
        for tensor in (t for t in _state_tensors(optimizer, parameters) if id(t) not in existing):
            tensor.copy_(th.where(finite, tensor, th.zeros_like(tensor)))
        self.skipped += (~finite).long()
        self.consecutive.copy_(th.where(finite, th.zeros_like(self.consecutive), self.consecutive + 1))

    def check_after_train(self, skipped: int, consecutive: int) -> None:
        """For the on-device mode: raise as :meth:`step` would have, from the counters read after ``train()``."""
        if skipped and (self.mode == "raise" or consecutive >= MAX_CONSECUTIVE):
            raise NonFiniteError(
                f"non-finite loss or gradient in {skipped} PPO update(s) of the last train() call, {consecutive} in a "
                f"row at its end (nonfinite={self.mode!r}, limit {MAX_CONSECUTIVE}); those steps were undone"
            )
