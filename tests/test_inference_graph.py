"""Collection's graphed policy step (sb3_ppo_scale.core.collect.graphed_step), everything but the capture itself.

``InferenceGraphs(capture=False)`` runs the step exactly as the captured one does (fixed input buffers, the Gaussian
draws made eagerly into a fixed noise buffer, the body on those buffers, the outputs copied out) without a CUDA
graph, so the CPU checks that it writes SB3's rollout bit for bit; tests/test_cuda.py runs the same cases captured.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core.collect import graphed_step as inference_graph
from sb3_ppo_scale.core.policy.inference import FusedActorCritic
from sb3_ppo_scale.core.collect.graphed_step import GraphedStep, InferenceGraphs, collection_step
from sb3_ppo_scale.core.collect.lean import collect_rollouts_lean
from tests.helpers import assert_same_state
from tests.test_lean_collect import CASES, N_STEPS, _collect, assert_same_rollouts, model_and_obs


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixed_buffer_step_writes_sb3s_rollout(case: str) -> None:
    """Every buffer field, the callbacks' locals and the RNG state equal SB3's loop; one capture serves both
    rollouts (the parameters stay where they are)."""
    graphs = InferenceGraphs(capture=False)
    assert_same_rollouts(case, graphs=graphs)
    assert graphs.captures == 1 and graphs.failure is None


@pytest.mark.parametrize("case", ["box_pendulum_vecnormalize", "discrete_cartpole", "multibinary", "gsde_sample_freq",
                                  "multi_input"])
def test_outputs_are_not_overwritten_by_the_next_step(case: str) -> None:
    """A callback that keeps a step's tensors finds them as they were after later steps (the fixed buffers are
    copied out), and three steps in a row equal the eager step's."""
    model, obs = model_and_obs(case, rows=4)
    fused = FusedActorCritic(model.policy)
    step = GraphedStep(fused, obs, capture=False)
    th.manual_seed(5)
    with th.inference_mode():
        expected = [[t.clone() for t in fused(obs)] for _ in range(3)]
    th.manual_seed(5)
    with th.inference_mode():
        kept = [step(obs) for _ in range(3)]
    assert_same_state(expected, [list(outputs) for outputs in kept], "steps")


def test_recaptured_when_the_parameters_or_the_batch_change() -> None:
    model, obs = model_and_obs("box_pendulum_vecnormalize", rows=3)
    graphs = InferenceGraphs(capture=False)
    with th.inference_mode():
        act = graphs.wrap(FusedActorCritic(model.policy))
        act(obs)
        act(obs)
        assert graphs.captures == 1
        act(obs[:2])  # another number of envs
        assert graphs.captures == 2
    model.policy.log_std = th.nn.Parameter(model.policy.log_std.detach().clone())  # moved: the capture is stale
    th.manual_seed(0)
    with th.inference_mode():
        got = graphs.wrap(FusedActorCritic(model.policy))(obs)
    assert graphs.captures == 3
    th.manual_seed(0)
    with th.inference_mode():
        assert_same_state(list(FusedActorCritic(model.policy)(obs)), list(got), "after recapture")


def test_a_failed_capture_is_reported_once_and_collection_goes_on_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(inference_graph, "GraphedStep", fail)
    graphs = InferenceGraphs(capture=False)
    with pytest.warns(UserWarning, match="could not be captured, running it eagerly") as caught:
        assert_same_rollouts("box_pendulum_vecnormalize", graphs=graphs)
    assert len([w for w in caught if "could not be captured" in str(w.message)]) == 1
    assert graphs.failure == "RuntimeError: operation not permitted when stream is capturing"
    assert graphs.captures == 0


def test_no_graph_for_a_policy_collecting_on_the_cpu() -> None:
    """``collect_device="cpu"`` with ``cuda_graphs=True``: the CPU copy runs the plain fused step."""
    model, _ = model_and_obs("discrete_cartpole", rows=1)
    model._inference_graphs = InferenceGraphs()  # type: ignore[attr-defined]  # capture=True, policy on the CPU
    assert type(collection_step(model)) is FusedActorCritic
    model._inference_graphs = None  # type: ignore[attr-defined]
    assert type(collection_step(model)) is FusedActorCritic


def test_scalable_ppo_keeps_graphs_only_with_cuda_graphs() -> None:
    model = ScalablePPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, device="cpu")
    assert model._inference_graphs is None
    assert "_inference_graphs" in model._excluded_save_params()


class KeepsTensors(BaseCallback):
    """Keeps the device tensors of every step's locals (by reference) and a copy of them."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[tuple[th.Tensor, ...]] = []
        self.copies: list[tuple[th.Tensor, ...]] = []

    def _on_step(self) -> bool:
        tensors = tuple(self.locals[key] for key in ("actions", "values", "log_probs"))
        self.kept.append(tensors)
        self.copies.append(tuple(t.clone() if isinstance(t, th.Tensor) else np.copy(t) for t in tensors))
        return True


def test_kept_locals_survive_a_whole_rollout() -> None:
    model, _ = _collect(collect_rollouts_lean, "box_pendulum_vecnormalize", n_rollouts=0,
                        graphs=InferenceGraphs(capture=False))
    keeper = KeepsTensors()
    _, callback = model._setup_learn(10**6, keeper)
    assert collect_rollouts_lean(model, model.env, callback, model.rollout_buffer, N_STEPS)
    assert_same_state(keeper.copies, keeper.kept, "kept locals")
