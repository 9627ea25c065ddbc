"""FlatAdam: torch's Adam / AdamW step on flat buffers, bit for bit, and when it stands aside.

End to end, tests/test_parity.py compares parameters and Adam state after learn() with SB3's PPO (whose CPU Adam
takes the per-parameter step); tests/test_checkpoint.py resumes through it.
"""

from __future__ import annotations

import pytest
import torch as th

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core.update import flat_adam
from sb3_ppo_scale.core.update.flat_adam import FlatAdam, flat_blocker, flat_step_is_exact

SHAPES = [(64, 11), (64,), (64, 64), (3, 64), (3,), (1, 64), (1,)]


def _twins(optimizer_class: type, **kwargs) -> tuple[list[th.nn.Parameter], th.optim.Optimizer, list[th.nn.Parameter],
                                                      th.optim.Optimizer]:
    generator = th.Generator().manual_seed(0)
    reference = [th.nn.Parameter(th.randn(shape, generator=generator)) for shape in SHAPES]
    flat = [th.nn.Parameter(p.detach().clone()) for p in reference]
    return reference, optimizer_class(reference, **kwargs), flat, optimizer_class(flat, **kwargs)


def _state(parameters: list[th.nn.Parameter], optimizer: th.optim.Optimizer) -> list[th.Tensor]:
    return [tensor for p in parameters for tensor in optimizer.state[p].values()]


def _assert_equal(a: list[th.Tensor], b: list[th.Tensor]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert th.equal(x, y)


@pytest.mark.parametrize(("optimizer_class", "kwargs"), [
    (th.optim.Adam, dict(lr=3e-4, eps=1e-5)),  # SB3's PPO optimizer
    (th.optim.Adam, dict(lr=1e-3, weight_decay=0.1)),
    (th.optim.AdamW, dict(lr=1e-3)),  # decoupled weight decay 0.01
])
@pytest.mark.parametrize("foreach", [None, True])
def test_flat_steps_equal_the_optimizers_own(optimizer_class: type, kwargs: dict, foreach: bool | None) -> None:
    reference, reference_optimizer, flat, optimizer = _twins(optimizer_class, foreach=foreach, **kwargs)
    assert flat_blocker(optimizer, flat) is None
    stepper = FlatAdam(optimizer)
    generator = th.Generator().manual_seed(1)
    for step in range(30):
        if step == 20:
            reference_optimizer.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"] = 5e-4  # a schedule's change
        for p, q in zip(reference, flat):
            p.grad = th.randn(p.shape, generator=generator)
            q.grad = p.grad.clone()
        reference_optimizer.step()
        stepper.step()
        _assert_equal(reference + _state(reference, reference_optimizer), flat + _state(flat, optimizer))
    assert stepper.moments  # the flat buffers were used (from the second step: the first one creates the state)
    stepper.close()
    moments = [optimizer.state[p][name] for p in flat for name in ("exp_avg", "exp_avg_sq")]
    assert len({m.untyped_storage().data_ptr() for m in moments}) == len(moments)  # tensors of their own again
    _assert_equal(reference + _state(reference, reference_optimizer), flat + _state(flat, optimizer))


def test_a_missing_gradient_hands_the_rest_of_the_call_to_the_optimizer() -> None:
    reference, reference_optimizer, flat, optimizer = _twins(th.optim.Adam, lr=1e-3)
    stepper = FlatAdam(optimizer)
    generator = th.Generator().manual_seed(1)
    for step in range(6):
        for i, (p, q) in enumerate(zip(reference, flat)):
            p.grad = None if (step == 3 and i == 2) else th.randn(p.shape, generator=generator)
            q.grad = None if p.grad is None else p.grad.clone()
        reference_optimizer.step()
        stepper.step()
        _assert_equal(reference + _state(reference, reference_optimizer), flat + _state(flat, optimizer))
    assert not stepper.active and not stepper.moments


def test_blockers_name_what_is_not_reproduced() -> None:
    parameters = [th.nn.Parameter(th.zeros(3)), th.nn.Parameter(th.zeros(2))]
    assert "RMSprop" in flat_blocker(th.optim.RMSprop(parameters), parameters)
    assert "amsgrad" in flat_blocker(th.optim.Adam(parameters, amsgrad=True), parameters)
    assert "foreach=False" in flat_blocker(th.optim.Adam(parameters, foreach=False), parameters)
    assert "group" in flat_blocker(th.optim.Adam([{"params": parameters[:1]}, {"params": parameters[1:]}]), parameters)
    others = [th.nn.Parameter(th.zeros(3)), th.nn.Parameter(th.zeros(2))]
    assert "other parameters" in flat_blocker(th.optim.Adam(others), parameters)
    hooked = th.optim.Adam(parameters)
    hooked.register_step_post_hook(lambda *args: None)
    assert "hooks" in flat_blocker(hooked, parameters)
    large = [th.nn.Parameter(th.zeros(flat_adam.MAX_FLAT_ELEMENTS + 1))]
    assert "more than" in flat_blocker(th.optim.Adam(large), large)
    doubles = [th.nn.Parameter(th.zeros(3, dtype=th.float64))]
    assert "float32" in flat_blocker(th.optim.Adam(doubles), doubles)


def test_the_self_check_catches_a_step_that_is_not_torchs(monkeypatch) -> None:
    """A flat step that differs in the last bit (here: the second moment scaled by 1 + 1e-7) is refused."""
    def wrong_step(self: FlatAdam) -> None:
        with th.no_grad():
            self.moments["exp_avg_sq"].mul_(1.0 + 1e-7)
        original(self)

    original = FlatAdam._flat_step
    monkeypatch.setattr(FlatAdam, "_flat_step", wrong_step)
    flat_step_is_exact.cache_clear()
    try:
        assert not flat_step_is_exact()
        parameters = [th.nn.Parameter(th.zeros(3))]
        assert "bit for bit" in flat_blocker(th.optim.Adam(parameters), parameters)
    finally:
        flat_step_is_exact.cache_clear()


def test_train_leaves_the_optimizer_state_as_torch_would() -> None:
    """After learn(): every moment is a tensor of its own (no flat storage is saved with the model)."""
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, n_epochs=2, seed=0, device="cpu")
    model.learn(128)
    state = model.policy.optimizer.state
    moments = [state[p][name] for p in model.policy.parameters() for name in flat_adam.MOMENTS]
    assert len({m.untyped_storage().data_ptr() for m in moments}) == len(moments)
    assert all(m.untyped_storage().nbytes() == m.numel() * 4 for m in moments)
