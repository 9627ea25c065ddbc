"""gradient_ops: the CPU gradient clip and zeroing equal torch's, and stand aside where they cannot promise that.

End to end, tests/test_parity.py compares parameters and Adam state after learn() with SB3's PPO, whose update calls
torch's ``zero_grad`` and ``clip_grad_norm_``.
"""

from __future__ import annotations

import pytest
import torch as th

from sb3_ppo_scale.core.update import gradient_ops
from sb3_ppo_scale.core.update.gradient_ops import clip_grad_norm, clip_is_torchs, gradient_clearer

SHAPES = [(64, 11), (64,), (64, 64), (3, 64), (3,), (1, 64), (1,)]


def _twins(scale: float, dtype: th.dtype = th.float32) -> tuple[list[th.nn.Parameter], list[th.nn.Parameter]]:
    generator = th.Generator().manual_seed(0)
    ours = [th.nn.Parameter(th.zeros(shape, dtype=dtype)) for shape in SHAPES]
    torchs = [th.nn.Parameter(th.zeros(shape, dtype=dtype)) for shape in SHAPES]
    for a, b in zip(ours, torchs):
        a.grad = (th.randn(a.shape, generator=generator) * scale).to(dtype)
        b.grad = a.grad.clone()
    return ours, torchs


@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e4])  # the clip inactive and active
@pytest.mark.parametrize("max_norm", [0.5, 10.0])
def test_clip_equals_torchs(scale: float, max_norm: float) -> None:
    assert clip_is_torchs()
    ours, torchs = _twins(scale)
    assert th.equal(clip_grad_norm(ours, max_norm), th.nn.utils.clip_grad_norm_(torchs, max_norm))
    for a, b in zip(ours, torchs):
        assert th.equal(a.grad, b.grad)


def test_clip_with_a_nan_gradient_and_missing_gradients_is_torchs() -> None:
    ours, torchs = _twins(1.0)
    for parameters in (ours, torchs):
        parameters[2].grad[3, 4] = float("nan")
        parameters[4].grad = None  # skipped by both
    norm, torch_norm = clip_grad_norm(ours, 0.5), th.nn.utils.clip_grad_norm_(torchs, 0.5)
    assert norm.isnan() and torch_norm.isnan()
    for a, b in zip(ours, torchs):
        assert (a.grad is None and b.grad is None) or th.equal(a.grad.isnan(), b.grad.isnan())


def test_mixed_dtypes_and_failed_checks_go_through_torchs_clip(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    torch_clip = th.nn.utils.clip_grad_norm_
    monkeypatch.setattr(th.nn.utils, "clip_grad_norm_", lambda ps, n: calls.append(1) or torch_clip(ps, n))
    ours, _ = _twins(1.0)
    double = th.nn.Parameter(th.zeros(3, dtype=th.float64))
    double.grad = th.ones(3, dtype=th.float64)
    clip_grad_norm([*ours, double], 0.5)
    assert calls == [1]
    monkeypatch.setattr(gradient_ops, "clip_is_torchs", lambda: False)
    clip_grad_norm(_twins(1.0)[0], 0.5)
    assert calls == [1, 1]


def test_clearer_sets_every_gradient_to_none_as_zero_grad_does() -> None:
    ours, torchs = _twins(1.0)
    clear = gradient_clearer(th.optim.Adam(ours))
    assert clear.__name__ == "clear"  # the direct path
    clear()
    th.optim.Adam(torchs).zero_grad()
    assert all(p.grad is None for p in ours + torchs)


def test_clearer_keeps_an_overridden_or_replaced_zero_grad() -> None:
    class Zeroing(th.optim.Adam):
        def zero_grad(self, set_to_none: bool = True) -> None:
            super().zero_grad(set_to_none=False)

    ours, _ = _twins(1.0)
    optimizer = Zeroing(ours)
    gradient_clearer(optimizer)()
    assert all(p.grad is not None and not p.grad.any() for p in ours)  # zeroed in place, the subclass's choice
    plain = th.optim.Adam(ours)
    plain.zero_grad = lambda set_to_none=True: None  # replaced on the instance: kept
    assert gradient_clearer(plain) == plain.zero_grad
