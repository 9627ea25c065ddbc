"""Zeroing and clipping gradients on the CPU with less per-call overhead, torch's results exactly.

At SB3's default policy (13 parameter tensors, a minibatch of 64) an update is a few hundred small torch calls, and
two of them cost more in Python than in arithmetic:

- ``optimizer.zero_grad()`` opens a profiler range (``record_function``) on every call before it sets each ``.grad``
  to None; :func:`gradient_clearer` sets them to None directly when the optimizer's ``zero_grad`` is torch's own;
- ``torch.nn.utils.clip_grad_norm_`` has no multi-tensor path on the CPU, so it makes one Python call per parameter
  for the norms and again for the products; :func:`clip_grad_norm` makes the same per-tensor calls through
  ``torch._foreach_norm`` / ``torch._foreach_mul_``, whose CPU kernels run ``linalg_vector_norm`` and ``mul_`` on each
  tensor in one C++ loop. :func:`clip_is_torchs` checks the results against torch's function once per process.

Without them the update took 1.05x as long at SB3's Hopper defaults, 1.10x at the demo's config and 1.09x at 16 envs
(benchmarks/studies/update_trims.py, 2-core box, one thread; benchmarks/results/update_trims.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch as th


def gradient_clearer(optimizer: th.optim.Optimizer) -> Callable[[], None]:
    """A function doing ``optimizer.zero_grad()`` (``set_to_none=True``, torch's default): every gradient of the
    optimizer's parameters set to None, without the profiler range torch opens around it, when ``zero_grad`` is
    torch's own (not overridden by the class or replaced on the instance); else ``optimizer.zero_grad``."""
    if type(optimizer).zero_grad is not th.optim.Optimizer.zero_grad or "zero_grad" in vars(optimizer):
        return optimizer.zero_grad
    groups = optimizer.param_groups

    def clear() -> None:
        for group in groups:
            for parameter in group["params"]:
                parameter.grad = None

    return clear


def clip_grad_norm(parameters: list[th.nn.Parameter], max_norm: float) -> th.Tensor:
    """``torch.nn.utils.clip_grad_norm_(parameters, max_norm)`` (2-norm, no error on non-finite norms): the total
    norm of the gradients, which are scaled in place by ``min(1, max_norm / (norm + 1e-6))``. Dense CPU gradients of
    one dtype go through the multi-tensor calls (see the module docstring); anything else through torch's function."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not _one_cpu_group(grads) or not clip_is_torchs():
        return th.nn.utils.clip_grad_norm_(parameters, max_norm)
    return _clip_multi_tensor(grads, max_norm)


@th.no_grad()
def _clip_multi_tensor(grads: list[th.Tensor], max_norm: float) -> th.Tensor:
    """torch's clip on one group of gradients (``_get_total_norm``, ``_clip_grads_with_norm_``), multi-tensor calls."""
    total_norm = th.linalg.vector_norm(th.stack(th._foreach_norm(grads, 2.0)), 2.0)
    th._foreach_mul_(grads, th.clamp(float(max_norm) / (total_norm + 1e-6), max=1.0))
    return total_norm


def _one_cpu_group(grads: list[th.Tensor]) -> bool:
    """Gradients torch's function would treat as one group: dense (strided) CPU tensors of one dtype, at least one."""
    return bool(grads) and all(g.device.type == "cpu" and g.layout == th.strided and g.dtype == grads[0].dtype
                               for g in grads)


def _same(a: th.Tensor, b: th.Tensor) -> bool:
    """Equal values, NaN where the other has NaN."""
    return bool((a.isnan() == b.isnan()).all()) and th.equal(a.nan_to_num(), b.nan_to_num())


@functools.lru_cache(maxsize=1)
def clip_is_torchs() -> bool:
    """Whether :func:`clip_grad_norm` gives torch's norm and gradients bit for bit on this machine: odd-sized float32
    gradients, clipped and not, and with an infinite and a NaN element (computed once per process)."""
    generator = th.Generator().manual_seed(0)
    sizes = [(1,), (3,), (7, 5), (67,), (33, 3), (2,), (129,), (64, 64)]
    for scale, poison in ((1e-3, None), (1.0, None), (1e3, None), (1.0, float("inf")), (1.0, float("nan"))):
        grads = [th.randn(size, generator=generator) * scale for size in sizes]
        if poison is not None:
            grads[3][5] = poison
        ours = [g.clone() for g in grads]
        torchs = [th.nn.Parameter(th.zeros(size)) for size in sizes]
        for parameter, g in zip(torchs, grads):
            parameter.grad = g.clone()
        pairs = [(_clip_multi_tensor(ours, 0.5), th.nn.utils.clip_grad_norm_(torchs, 0.5)),
                 *((a, b.grad) for a, b in zip(ours, torchs))]
        if not all(_same(a, b) for a, b in pairs):
            return False
    return True
