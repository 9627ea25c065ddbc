"""What ``cuda_graphs=True`` captures, checked on the CPU: the gradients of a full minibatch, and collection's policy
step, read nothing on the host.

A CUDA graph records kernels; an operation that waits for a tensor's value on the host (``.item()``, ``bool(t)``,
boolean indexing, ``nonzero``) makes the capture fail. ``tests/test_cuda.py`` captures on a GPU; this module runs the
same ``UpdateStep.gradients`` (and the gradient clip), and the body of collection's ``GraphedStep``, on the CPU under
a dispatch mode that records every such operation, so a change that would break capture fails here too, on any
machine. The optimizer step is not covered: PyTorch's capturable Adam runs on CUDA only. The update's envs have Box
observations: SB3 one-hot encodes a Discrete observation with ``F.one_hot``, which checks the class range on the host
on a CPU, not on CUDA.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch as th
from gymnasium.wrappers import FlattenObservation
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv
from torch.utils._python_dispatch import TorchDispatchMode

from sb3_ppo_scale import PrioritizedRolloutBuffer, ScalableMaskablePPO, ScalablePPO, ScalableRecurrentPPO
from sb3_ppo_scale.core.update.gradient_ops import clip_grad_norm
from sb3_ppo_scale.core.policy.inference import FusedActorCritic
from sb3_ppo_scale.core.collect.graphed_step import GraphedStep
from sb3_ppo_scale.core.update.guard import NonFiniteGuard
from sb3_ppo_scale.core.update.step import StepSettings, UpdateStep, distribution_validation
from tests.helpers import seeded_dict_env
from tests.test_lean_collect import CASES, model_and_obs

aten = th.ops.aten
#: operations that read a tensor's value on the host (or size their output by it)
HOST_READS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
              aten.is_nonzero.default, aten.equal.default, aten._unique2.default, aten.unique_consecutive.default}


#: tensor methods that copy the values to the host without an operator the dispatch mode sees on a CPU tensor
COPIES_TO_HOST = ("tolist", "numpy", "__array__")


class HostReads(TorchDispatchMode):
    """Records the host-reading operations run inside it (``seen``, by name), and calls of :data:`COPIES_TO_HOST`."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self._methods = {name: getattr(th.Tensor, name) for name in COPIES_TO_HOST}

    def __enter__(self) -> "HostReads":
        for name, method in self._methods.items():
            setattr(th.Tensor, name, self._recording(name, method))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for name, method in self._methods.items():
            setattr(th.Tensor, name, method)

    def _recording(self, name: str, method: Any) -> Any:
        def record(tensor: th.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.seen.append(f"Tensor.{name}")
            return method(tensor, *args, **kwargs)
        return record

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        indices = args[1] if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) else ()
        if func in HOST_READS or any(i is not None and i.dtype == th.bool for i in indices):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_detector_sees_host_reads() -> None:
    x = th.arange(4.0, requires_grad=True)
    with HostReads() as reads:
        x[x > 1].sum().backward()
        float(x.detach().sum())
        x.detach().tolist()
        x.sum().mean()
    # boolean indexing forward and backward, the float(), the tolist()
    assert reads.seen == ["aten.index.Tensor", "aten.index_put.default", "aten._local_scalar_dense.default",
                          "Tensor.tolist"]
    assert th.Tensor.tolist is th._C.TensorBase.tolist  # put back


def _learned(model: Any) -> Any:
    return model.learn(model.n_steps * model.n_envs)  # one rollout and one ordinary update


def _host_reads_of_a_graphed_update(model: Any) -> list[str]:
    """What CudaGraphStep captures for the first full minibatch of the last rollout (the gradients, with the on-device
    non-finite guard graph mode uses, and the gradient clip), run under :class:`HostReads`."""
    settings = model._loss_settings()
    with distribution_validation(False):
        rollout = model._prepare_rollout(settings)
        batch = next(iter(model._make_loader(rollout, model.batch_size)))
        assert len(batch) == model.batch_size
        guard = NonFiniteGuard(model.nonfinite, model.device, on_device=True)
        step = UpdateStep(model.policy, model._loss, settings, StepSettings(0.5, True, None), guard)
        with HostReads() as reads:
            step.gradients(batch)
            clip_grad_norm(step.parameters, 0.5)
        step.close()
    return reads.seen


SMALL = dict(n_steps=64, batch_size=32, n_epochs=1, seed=0, device="cpu")


@pytest.mark.parametrize(("env_id", "kwargs"), [
    ("Pendulum-v1", {}),
    ("CartPole-v1", {}),
    ("Pendulum-v1", dict(grad_accum_steps=3)),
    ("Pendulum-v1", dict(objective="kl_penalty")),
    ("Pendulum-v1", dict(objective="clip_kl_penalty", clip_range_vf=0.2)),
    ("Pendulum-v1", dict(rollout_buffer_class=PrioritizedRolloutBuffer,
                         rollout_buffer_kwargs=dict(priority="abs_advantage"))),
    ("Pendulum-v1", dict(use_sde=True)),
], ids=["gaussian", "categorical", "accumulation", "kl_penalty", "clip_kl_penalty", "prioritized", "gsde"])
def test_scalable_ppo_update_reads_nothing_on_the_host(env_id: str, kwargs: dict) -> None:
    """The configurations tests/test_cuda.py captures on a GPU."""
    model = ScalablePPO("MlpPolicy", make_vec_env(env_id, n_envs=2, seed=0), **{**SMALL, **kwargs})
    assert _host_reads_of_a_graphed_update(_learned(model)) == []


def test_dict_observation_update_reads_nothing_on_the_host() -> None:
    model = ScalablePPO("MultiInputPolicy", make_vec_env(seeded_dict_env, n_envs=2, seed=0), **SMALL)
    assert _host_reads_of_a_graphed_update(_learned(model)) == []


def test_image_policy_update_reads_nothing_on_the_host() -> None:
    env = make_vec_env(lambda: FakeImageEnv(screen_height=36, screen_width=36, n_channels=1), n_envs=2, seed=0)
    model = ScalablePPO("CnnPolicy", env, policy_kwargs=dict(features_extractor_kwargs=dict(features_dim=16)), **SMALL)
    assert _host_reads_of_a_graphed_update(_learned(model)) == []


def test_masked_update_reads_nothing_on_the_host() -> None:
    env = make_vec_env(lambda: FlattenObservation(InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10)), n_envs=2,
                       seed=0)
    assert _host_reads_of_a_graphed_update(_learned(ScalableMaskablePPO("MlpPolicy", env, **SMALL))) == []


@pytest.mark.parametrize("lstms", [dict(), dict(shared_lstm=True, enable_critic_lstm=False)])
def test_recurrent_chunks_in_graph_mode_read_nothing_on_the_host(lstms: dict) -> None:
    """With ``cuda_graphs`` (set here on a CPU model, which the constructor refuses) the chunks go through contrib's
    loop at every step; the eager chunk evaluators read where the resets are, which a graph cannot."""
    model = _learned(ScalableRecurrentPPO("MlpLstmPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0),
                                          sequence_length=8, policy_kwargs=dict(lstm_hidden_size=16, net_arch=[16],
                                                                                **lstms), **SMALL))
    assert "Tensor.tolist" in _host_reads_of_a_graphed_update(model)  # per_step_sequence reads where resets are
    model.cuda_graphs = True  # what graph mode evaluates with, run without a capture
    assert _host_reads_of_a_graphed_update(model) == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_collection_steps_captured_part_reads_nothing_on_the_host(case: str) -> None:
    """Collection's graphed policy step (``cuda_graphs=True``): the part a graph captures (``GraphedStep._body``: the
    network, and for a Gaussian policy the scale and scoring of the noise) for every action and observation space the
    lean loop covers."""
    model, obs = model_and_obs(case, rows=4)
    step = GraphedStep(FusedActorCritic(model.policy), obs, capture=False)
    with th.inference_mode(), HostReads() as reads:
        step._body()
    assert reads.seen == []
