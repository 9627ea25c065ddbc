"""A CPU Adam step on flat buffers: torch's Adam arithmetic in a dozen tensor operations, not ~10 per parameter.

On the CPU, torch's multi-tensor (``foreach``) Adam step loops over the parameters in C++ and pays the op dispatch for
each: for SB3's default policy (13 parameter tensors, a step per minibatch of 64) that dispatch is most of the step.
Small policies only (:data:`MAX_FLAT_ELEMENTS`): for large ones the extra copies cost more than the dispatch.
:class:`FlatAdam` keeps each moment of a ``train()`` call in one contiguous buffer, with the optimizer's per-parameter
state rebound to views of it, and runs the step of ``torch.optim.Adam`` / ``AdamW`` (``foreach``, non-capturable) on
the whole buffer:

- the same element-wise operations with the same scalars (``lerp_``, ``mul_``, ``addcmul_``, ``sqrt``, ``div_``,
  ``add_``, ``addcdiv_``; the bias corrections from the step count as Python floats, as torch computes them);
- gradients gathered with one ``cat``; parameters updated on a flat copy and copied back (exact copies).

Element-wise results do not depend on where an element sits in a tensor, so the numbers are the per-parameter
step's; :func:`flat_step_is_exact` checks that on this machine once per process (odd sizes that put elements into
the kernels' vectorised body and scalar tail differently) and the step falls back to the optimizer's own when it
fails. tests/test_flat_adam.py and tests/test_parity.py compare parameters and optimizer state with SB3's PPO.

:meth:`FlatAdam.close` gives every state tensor back as a tensor of its own, so ``optimizer.state_dict()`` after
``train()`` is what the optimizer would hold.
"""

from __future__ import annotations

import functools

import torch as th
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

#: Optimizers whose step :class:`FlatAdam` reproduces (exact classes: a subclass may change the step).
FLAT_OPTIMIZERS = (th.optim.Adam, th.optim.AdamW)
#: State entries kept in flat buffers.
MOMENTS = ("exp_avg", "exp_avg_sq")
#: Largest policy (parameter elements) stepped flat. The flat step copies gradients and parameters once more per step,
#: which pays only while per-tensor dispatch dominates: on a 2-core x86 box, 1 thread, it measured 1.8x the
#: multi-tensor step at 11k elements (SB3's default MLP, 2.0x in another run), 1.1-1.2x at 143k, 0.9-1.2x at 312k,
#: 0.7-0.8x at 547k and 0.37x at Atari's CNN (1.7M): benchmarks/results/flat_adam_cpu.md.
MAX_FLAT_ELEMENTS = 2**18


def flat_blocker(optimizer: th.optim.Optimizer, parameters: list[th.nn.Parameter]) -> str | None:
    """Why ``optimizer``'s step cannot run on flat buffers exactly, or None when it can."""
    if type(optimizer) not in FLAT_OPTIMIZERS:
        return f"optimizer {type(optimizer).__name__} is not Adam or AdamW"
    group_parameters = optimizer.param_groups[0]["params"]
    if len(optimizer.param_groups) != 1 or len(group_parameters) != len(parameters) \
            or any(p is not q for p, q in zip(group_parameters, parameters)):
        return "the optimizer has more than one parameter group, or other parameters than the policy's"
    group = optimizer.param_groups[0]
    for option in ("amsgrad", "maximize", "capturable", "differentiable", "fused"):
        if group.get(option):
            return f"{option}=True"
    if group.get("foreach") is False:
        return "foreach=False (the user's choice of the per-parameter loop is kept)"
    if any(isinstance(group[name], th.Tensor) for name in ("lr", "betas", "weight_decay")):
        return "a tensor learning rate, betas or weight decay"
    if optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks:
        return "the optimizer has step hooks"
    if _global_optimizer_pre_hooks or _global_optimizer_post_hooks:
        return "global optimizer step hooks are registered"
    if any(p.device.type != "cpu" or p.dtype != th.float32 or p.is_sparse for p in parameters):
        return "parameters that are not dense float32 CPU tensors"
    n_elements = sum(p.numel() for p in parameters)
    if n_elements > MAX_FLAT_ELEMENTS:
        return f"{n_elements} parameter elements, more than {MAX_FLAT_ELEMENTS} (the multi-tensor step is faster there)"
    if not flat_step_is_exact():
        return "the flat step does not reproduce torch's Adam bit for bit on this machine"
    return None


class FlatAdam:
    """The steps of one ``train()`` call (see the module docstring); :meth:`close` when the call ends.

    Adam's state is created by the optimizer's own first step; the flat buffers are built at the first step that
    finds it. A step where a parameter has no gradient (torch's Adam then leaves that parameter's state alone, so
    step counts would diverge) goes back to the optimizer's own step for the rest of the call.

    :param optimizer: a CPU ``torch.optim.Adam`` or ``AdamW`` for which :func:`flat_blocker` is None.
    """

    def __init__(self, optimizer: th.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.parameters: list[th.nn.Parameter] = list(optimizer.param_groups[0]["params"])
        self.sizes = [p.numel() for p in self.parameters]
        self.moments: dict[str, th.Tensor] = {}
        self.active = True

    def step(self) -> None:
        """One optimizer step, exactly ``optimizer.step()``."""
        if not (self.active and all(p.grad is not None for p in self.parameters)):
            self.close()
            self.optimizer.step()
            return
        if not self.moments and not self._flatten_state():
            self.optimizer.step()
            return
        self._flat_step()

    def close(self) -> None:
        """Give every moment back as a tensor of its own (the flat buffers are dropped); later steps are the
        optimizer's own."""
        self.active = False
        if not self.moments:
            return
        for p in self.parameters:
            state = self.optimizer.state[p]
            for name in MOMENTS:
                state[name] = state[name].clone()
        self.moments = {}

    def _flatten_state(self) -> bool:
        """Copy the moments into flat buffers and rebind the state to views; False when there is no state yet or
        the step counts differ."""
        states = [self.optimizer.state.get(p) for p in self.parameters]
        if not all(states) or len({float(state["step"]) for state in states}) != 1:
            return False
        self.steps = [state["step"] for state in states]
        for name in MOMENTS:
            flat = th.cat([state[name].reshape(-1) for state in states])
            for state, view, p in zip(states, flat.split(self.sizes), self.parameters):
                state[name] = view.view_as(p)
            self.moments[name] = flat
        return True

    @th.no_grad()
    def _flat_step(self) -> None:
        """``torch.optim.adam._multi_tensor_adam`` (non-capturable, no amsgrad, no maximize) on the flat buffers."""
        group = self.optimizer.param_groups[0]
        lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        exp_avg, exp_avg_sq = self.moments["exp_avg"], self.moments["exp_avg_sq"]
        grads = th.cat([p.grad.reshape(-1) for p in self.parameters])  # type: ignore[union-attr]
        params = th.cat([p.reshape(-1) for p in self.parameters])
        th._foreach_add_(self.steps, th.tensor(1.0), alpha=1.0)
        if weight_decay != 0:
            if group.get("decoupled_weight_decay", type(self.optimizer) is th.optim.AdamW):
                params.mul_(1 - lr * weight_decay)
            else:
                grads = grads.add(params, alpha=weight_decay)
        exp_avg.lerp_(grads, 1 - beta1)
        exp_avg_sq.mul_(beta2)
        exp_avg_sq.addcmul_(grads, grads, value=1 - beta2)
        step = self.steps[0].item()
        bias_correction1, bias_correction2 = 1 - beta1**step, 1 - beta2**step
        denominator = exp_avg_sq.sqrt()
        denominator.div_(bias_correction2**0.5)
        denominator.add_(eps)
        params.addcdiv_(exp_avg, denominator, value=(lr / bias_correction1) * -1)
        updated = [view.view_as(p) for view, p in zip(params.split(self.sizes), self.parameters)]
        th._foreach_copy_(self.parameters, updated)


@functools.lru_cache(maxsize=1)
def flat_step_is_exact() -> bool:
    """Whether :class:`FlatAdam` reproduces torch's Adam and AdamW (with and without weight decay) bit for bit on
    this machine: a few steps on parameters of odd sizes (computed once per process, a few milliseconds)."""
    sizes = [(1,), (3,), (7, 5), (67,), (33, 3), (2,), (129,)]
    for optimizer_class, weight_decay in ((th.optim.Adam, 0.0), (th.optim.Adam, 0.1), (th.optim.AdamW, 0.01)):
        generator = th.Generator().manual_seed(0)
        reference = [th.nn.Parameter(th.randn(size, generator=generator)) for size in sizes]
        flat = [th.nn.Parameter(p.detach().clone()) for p in reference]
        optimizers = [optimizer_class(ps, lr=1e-3, eps=1e-5, weight_decay=weight_decay, foreach=True)
                      for ps in (reference, flat)]
        flat_adam = FlatAdam(optimizers[1])
        for _ in range(4):
            for p, q in zip(reference, flat):
                p.grad = th.randn(p.shape, generator=generator)
                q.grad = p.grad.clone()
            optimizers[0].step()
            flat_adam.step()
        flat_adam.close()
        states = [[t for p in ps for t in opt.state[p].values()] for ps, opt in zip((reference, flat), optimizers)]
        if not all(th.equal(a, b) for a, b in zip(reference + states[0], flat + states[1])):
            return False
    return True
