"""compile_loss=True: the loss really runs compiled, trains like PPO, compiles once per kind of update, round-trips.

Proof of compilation, in every test that trains with ``compile_loss=True``:

- each test starts from ``torch._dynamo.reset()`` with zeroed counters, so the graphs it counts are its own;
- Dynamo's silent switch to eager after ``recompile_limit`` variants is made an error
  (``fail_on_recompile_limit_hit``), and compile errors raise (``suppress_errors=False``);
- every ``backward()`` of the compiled model's update is recorded: its autograd graph must contain the node of an
  AOT-compiled function (``CompiledFunctionBackward``), so not a single micro-batch ran the eager loss;
- Dynamo's counters must show compiled frames and graphs, and no graph break other than the known one below.

Compiled parameters are compared with PPO's where the README compares them with PPO (the clip objective); the
KL-penalty objective and prioritized weights have no PPO counterpart and are compared with eager ScalablePPO.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch as th
import torch._dynamo
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv
from stable_baselines3.common.utils import LinearSchedule
from torch._dynamo.utils import counters

from sb3_ppo_scale import PrioritizedRolloutBuffer, ScalablePPO
from tests.helpers import RecordingLogger, assert_params_close, max_param_diff, seeded_dict_env, train_one

#: Tolerance for compiled against eager parameters. Exact equality cannot hold: inductor generates its own fused
#: C++ kernels (vectorised for the host CPU's instruction set) and reorders float32 reductions, so every loss
#: and gradient differs from eager PyTorch's by rounding, and Adam carries that into the parameters. On these
#: cases (one to three rollouts, up to 120 Adam steps) the parameters end a few float32 ulps apart (ulp(0.5) =
#: 6e-8). 1e-5 leaves room for other CPUs' kernels and stays below what a real error moves parameters by:
#: test_tolerance_catches_wrong_coefficients shows that a clip-range schedule frozen at its first value, or a
#: small entropy coefficient, moves them more than 5x as far.
COMPILE_ATOL = 1e-5

#: The logged statistics (means over the last update's minibatches) compared with the same rounding argument: a
#: relative 1e-3 (abs 1e-6 for values near 0) is far below the change a wrong coefficient causes.
LOG_REL, LOG_ABS = 1e-3, 1e-6

#: SB3's image preprocessing (``is_image_space``) branches on a NumPy comparison of the observation space's
#: bounds, which Dynamo cannot trace: image policies compile as several graphs joined by that branch.
KNOWN_GRAPH_BREAK = "is_image_space"

CASES: dict[str, tuple[Any, dict[str, Any], dict[str, Any], type[PPO]]] = {
    # (env, arguments of both models, ScalablePPO-only arguments, baseline class)
    # clip-range and learning-rate schedules, uneven micro-batches and a short last minibatch (100 + 100 + 56)
    "pendulum_schedules_accumulation": (
        "Pendulum-v1",
        dict(
            n_steps=256,
            batch_size=100,
            clip_range=LinearSchedule(0.3, 0.1, 1.0),
            learning_rate=LinearSchedule(3e-4, 1e-4, 1.0),
        ),
        dict(grad_accum_steps=3),
        PPO,
    ),
    # target_kl early stopping fires (checked below through the number of epochs run)
    "cartpole_target_kl": ("CartPole-v1", dict(n_steps=256, batch_size=64, target_kl=0.002), {}, PPO),
    # PPO-Penalty (no PPO counterpart): beta is adapted after every train() call
    "pendulum_kl_penalty": ("Pendulum-v1", dict(n_steps=256, batch_size=64), dict(objective="kl_penalty"), ScalablePPO),
}




def seeded_image_env() -> FakeImageEnv:
    """SB3's fake image env samples every observation from its observation space's own (unseeded) RNG."""
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    env.observation_space.seed(0)
    return env


#: where else the loss runs: other policies, gSDE, prioritized weights. One rollout each, trained for n_epochs: a
#: second rollout would be collected by slightly different policies, and one flipped action sample (a discrete
#: action near a probability boundary) gives another trajectory, so the comparison would no longer be on equal data.
POLICIES: dict[str, tuple[Any, str, dict[str, Any], type[PPO]]] = {
    "dict_observations": (seeded_dict_env, "MultiInputPolicy", dict(n_steps=64, batch_size=32), PPO),
    "gsde": ("Pendulum-v1", "MlpPolicy", dict(n_steps=64, batch_size=32, use_sde=True, sde_sample_freq=4), PPO),
    "cnn_uint8": (
        seeded_image_env,
        "CnnPolicy",
        dict(n_steps=32, batch_size=16, n_epochs=2, policy_kwargs=dict(normalize_images=True)),
        PPO,
    ),
    "prioritized_weights": (  # PPO refuses this buffer: compared with eager ScalablePPO
        "Pendulum-v1",
        "MlpPolicy",
        dict(n_steps=64, batch_size=32, rollout_buffer_class=PrioritizedRolloutBuffer,
             rollout_buffer_kwargs=dict(priority="abs_advantage")),
        ScalablePPO,
    ),
}


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """No compiled code and zeroed counters at the start; the recompile-limit fallback to eager is an error."""
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, suppress_errors=False):
        yield
    torch._dynamo.reset()


def _has_compiled_node(grad_fn: Any) -> bool:
    """Whether an autograd graph contains the backward of an AOT-compiled (torch.compile) function."""
    seen, stack = set(), [grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "CompiledFunction" in type(node).__name__:
            return True
        stack.extend(next_node for next_node, _ in node.next_functions)
    return False


def train_recording_backward(monkeypatch: pytest.MonkeyPatch, train: Callable[[], PPO]) -> tuple[PPO, list[bool]]:
    """Run ``train()``; for every ``Tensor.backward`` call it makes, record whether the graph was compiled."""
    compiled: list[bool] = []
    real_backward = th.Tensor.backward

    def backward(self: th.Tensor, *args: Any, **kwargs: Any) -> None:
        compiled.append(_has_compiled_node(self.grad_fn))
        real_backward(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(th.Tensor, "backward", backward)
        model = train()
    return model, compiled


def assert_every_update_compiled(model: PPO, compiled: list[bool], image_policy: bool = False) -> None:
    """Every backward of the update ran through compiled code (at least one per gradient step), Dynamo compiled
    frames without failure, and the only graph breaks are SB3's image-space check (image policies)."""
    assert len(compiled) >= model._n_grad_steps > 0 and all(compiled), compiled
    assert counters["frames"]["ok"] >= 1 and counters["stats"]["unique_graphs"] >= 1
    breaks = list(counters["graph_break"])
    if image_policy:  # a graph break aborts a frame's first conversion (frames total > ok), then compiles around it
        assert all(KNOWN_GRAPH_BREAK in reason for reason in breaks), breaks
    else:  # the whole loss is one graph, compiled without any failed conversion
        assert breaks == [] and counters["stats"]["unique_graphs"] == 1
        assert counters["frames"]["ok"] == counters["frames"]["total"]


def compiled_and_baseline(
    monkeypatch: pytest.MonkeyPatch, env: Any, steps: int, policy: str, baseline_cls: type[PPO],
    common: dict[str, Any], scalable: dict[str, Any] | None = None,
) -> tuple[PPO, ScalablePPO, list[bool]]:
    """Train the baseline eagerly, then ScalablePPO(compile_loss=True) with the same seed, recording its backwards."""
    baseline_kwargs = {**common, **(scalable or {})} if baseline_cls is ScalablePPO else common
    baseline, baseline_compiled = train_recording_backward(
        monkeypatch, lambda: train_one(baseline_cls, env, steps, policy, "cpu", **baseline_kwargs)
    )
    assert not any(baseline_compiled) and counters["frames"]["total"] == 0  # the eager baseline compiled nothing
    model, compiled = train_recording_backward(
        monkeypatch,
        lambda: train_one(ScalablePPO, env, steps, policy, "cpu", compile_loss=True, **common, **(scalable or {})),
    )
    return baseline, model, compiled  # type: ignore[return-value]


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_loss_trains_like_ppo(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env, common, scalable, baseline_cls = CASES[case]
    baseline, compiled, flags = compiled_and_baseline(monkeypatch, env, 768, "MlpPolicy", baseline_cls, common, scalable)
    assert_every_update_compiled(compiled, flags)
    assert compiled._n_updates == baseline._n_updates  # the same number of epochs, early stops included
    if case == "cartpole_target_kl":
        assert compiled._n_updates < 3 * 10  # early stopping did fire (3 rollouts x 10 epochs without it)
    assert_params_close(baseline, compiled, COMPILE_ATOL)
    for key in ("train/approx_kl", "train/clip_fraction", "train/value_loss"):
        assert compiled.logger.seen[key] == pytest.approx(baseline.logger.seen[key], rel=LOG_REL, abs=LOG_ABS)


@pytest.mark.parametrize("case", list(POLICIES))
def test_compiled_loss_works_with_other_policies_and_buffers(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make_env, policy, kwargs, baseline_cls = POLICIES[case]
    baseline, compiled, flags = compiled_and_baseline(monkeypatch, make_env, kwargs["n_steps"], policy, baseline_cls, kwargs)
    assert_every_update_compiled(compiled, flags, image_policy=case in ("dict_observations", "cnn_uint8"))
    assert compiled._n_grad_steps > 1
    assert_params_close(baseline, compiled, COMPILE_ATOL)


def test_tolerance_catches_wrong_coefficients() -> None:
    """COMPILE_ATOL is tight enough: eager PPO runs that differ from the schedules case only by a clip range frozen
    at its initial value, or by ent_coef=1e-3, end further apart than it (5x)."""
    env, common, _, _ = CASES["pendulum_schedules_accumulation"]
    reference = train_one(PPO, env, 768, "MlpPolicy", "cpu", **common)
    frozen_clip = train_one(PPO, env, 768, "MlpPolicy", "cpu", **{**common, "clip_range": 0.3})
    entropy = train_one(PPO, env, 768, "MlpPolicy", "cpu", ent_coef=1e-3, **common)
    assert max_param_diff(reference, frozen_clip) > 5 * COMPILE_ATOL
    assert max_param_diff(reference, entropy) > 5 * COMPILE_ATOL


def test_schedules_and_adaptive_beta_do_not_compile_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing coefficients enter as tensors: after the first train() call nothing new is compiled."""
    model = ScalablePPO(
        "MlpPolicy",
        "Pendulum-v1",
        n_steps=128,
        batch_size=50,  # 50 + 50 + a short last minibatch of 28
        seed=0,
        compile_loss=True,
        objective="clip_kl_penalty",
        clip_range=LinearSchedule(0.3, 0.1, 1.0),
    )
    model.set_logger(RecordingLogger())
    model, flags = train_recording_backward(monkeypatch, lambda: model.learn(128))
    assert_every_update_compiled(model, flags)
    frames, graphs = counters["frames"]["total"], counters["stats"]["unique_graphs"]
    betas = [model.kl_beta]
    with torch._dynamo.config.patch(error_on_recompile=True):  # a recompile raises
        for _ in range(3):
            model, flags = train_recording_backward(monkeypatch, lambda: model.learn(128, reset_num_timesteps=False))
            assert flags and all(flags)
            betas.append(model.kl_beta)
    assert counters["frames"]["total"] == frames and counters["stats"]["unique_graphs"] == graphs == 1
    assert model.logger.seen["train/clip_range"] < 0.3 and len(set(betas)) > 1  # the coefficients did change


def test_compile_loss_round_trips(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    ScalablePPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, compile_loss=True).save(tmp_path / "model.zip")
    eager = ScalablePPO.load(tmp_path / "model.zip", env=make_vec_env("CartPole-v1", seed=0), compile_loss=False)
    eager, flags = train_recording_backward(monkeypatch, lambda: eager.learn(64))
    assert eager.compile_loss is False and flags and not any(flags) and counters["frames"]["total"] == 0
    loaded = ScalablePPO.load(tmp_path / "model.zip", env=make_vec_env("CartPole-v1", seed=0))
    assert loaded.compile_loss is True
    loaded, flags = train_recording_backward(monkeypatch, lambda: loaded.learn(64))
    assert_every_update_compiled(loaded, flags)
