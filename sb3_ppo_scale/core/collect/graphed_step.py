"""``cuda_graphs=True`` in collection: each env step's policy call replayed from a CUDA graph.

With a small policy and few envs, a GPU collection step is dozens of tiny kernels, each costing a launch (several
microseconds of host time) for almost no work. :class:`GraphedStep` captures the deterministic part of
:class:`~sb3_ppo_scale.core.policy.inference.FusedActorCritic`'s step once, on fixed input buffers, and replays it each
step: one launch instead of dozens, the same kernels on the same data.

The random draws stay outside the graph, so the torch RNG is consumed exactly as by the eager step and nothing
about graph-safe generators matters:

- a Gaussian policy: the standard-normal draws are made eagerly into a fixed buffer
  (``noise.normal_(0, 1)``, the draw the eager step makes on a fresh tensor of the same shape), then one graph runs
  the network, the scale and the scoring (``noise * scale + mean`` and the log-prob), as the eager step does;
- any other distribution: the graph runs the network (features, actor and critic nets, heads) and the sampler runs
  eagerly on its outputs, as in :class:`FusedActorCritic`.

The network draws no random numbers (the policy is in eval mode during collection), so the draws happen in the
order the eager step makes them. The outputs are copied out of the graph's buffers, so a callback that keeps a
step's tensors sees them unchanged by the next replay.

A capture bakes in the policy's modules, the storage of its parameters and buffers and the observation batch's
shapes and dtypes (:class:`~sb3_ppo_scale.core.policy.inference.PolicyParts`, :func:`storages`, :func:`_layout`): the graph
is reused across rollouts while those stay the same (an optimizer updates parameters in place) and captured again
otherwise. A capture that fails (an op that cannot be captured) is reported
once and the model goes on with the eager step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch as th

from sb3_ppo_scale.core.policy.inference import FusedActorCritic, GaussianSampler

Observation = th.Tensor | dict[str, th.Tensor]
Outputs = tuple[th.Tensor, th.Tensor, th.Tensor]
#: eager warm-up runs on a side stream before a capture (CUDA's lazy initialisation, cuBLAS workspaces)
WARMUP_RUNS = 2


def _layout(obs: Observation) -> tuple:
    """Shapes, dtypes and devices of an observation batch (a dict's per key, in key order)."""
    if isinstance(obs, dict):
        return tuple((key, *_layout(value)) for key, value in obs.items())
    return (tuple(obs.shape), obs.dtype, obs.device)


def obs_device(obs: Observation) -> th.device:
    """The device of an observation batch (a dict's first value's)."""
    return next(iter(obs.values())).device if isinstance(obs, dict) else obs.device


def storages(policy: th.nn.Module) -> tuple[int, ...]:
    """Where every parameter and buffer of ``policy`` lives: a captured step reads them there."""
    return tuple(tensor.data_ptr() for tensor in (*policy.parameters(), *policy.buffers()))


def _copy_into(target: Observation, source: Observation) -> None:
    """Copy an observation batch into the fixed buffers of the same layout."""
    if isinstance(target, dict):
        for key, value in target.items():
            value.copy_(source[key])  # type: ignore[index]
    else:
        target.copy_(source)  # type: ignore[arg-type]


def _clone(obs: Observation) -> Observation:
    return {key: value.clone() for key, value in obs.items()} if isinstance(obs, dict) else obs.clone()


class GraphedStep:
    """:class:`FusedActorCritic`'s step for one observation layout, its deterministic part run on fixed buffers and,
    with ``capture``, replayed from a CUDA graph (see the module docstring). Same outputs and RNG draws as ``fused``.

    :param fused: the eager step (its parameters are read by reference, so the capture serves later rollouts while
        the storages and the layout are unchanged).
    :param obs: an observation batch of the layout to serve (copied; its values do not matter).
    :param capture: capture a CUDA graph (the policy on CUDA); False runs the same body eagerly on the same buffers,
        which is how the CPU tests check everything but the capture.
    """

    def __init__(self, fused: FusedActorCritic, obs: Observation, capture: bool = True) -> None:
        self.fused = fused
        # a sampler of its own: its scale tensors are computed inside the body, so they live in the graph
        self.gaussian = GaussianSampler(fused.sampler.log_std) if type(fused.sampler) is GaussianSampler else None
        self.static_obs = _clone(obs)
        self.noise: th.Tensor | None = None
        self.outputs: Outputs = self._warm_up(obs, capture)
        self.graph: th.cuda.CUDAGraph | None = None
        if capture:
            self.graph = th.cuda.CUDAGraph()
            with th.cuda.graph(self.graph):
                self.outputs = self._body()

    def _warm_up(self, obs: Observation, on_side_stream: bool) -> Outputs:
        """Run the body eagerly (on a side stream before a capture, as CUDA graphs need); allocates the noise buffer."""
        self.noise = th.zeros_like(self.fused.network(self.static_obs)[0]) if self.gaussian is not None else None
        if not on_side_stream:
            return self._body()
        side, current = th.cuda.Stream(obs_device(obs)), th.cuda.current_stream(obs_device(obs))
        side.wait_stream(current)
        with th.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                outputs = self._body()
        current.wait_stream(side)
        return outputs

    def _body(self) -> Outputs:
        """The deterministic part: the network, and for a Gaussian policy the scale and the scoring of the noise.
        Returns (actions, values, log_prob) for a Gaussian policy, else (action net output, actor latent, values)."""
        mean_actions, latent_pi, values = self.fused.network(self.static_obs)
        if self.gaussian is None:
            return mean_actions, latent_pi, values
        assert self.noise is not None
        self.gaussian._prepare(mean_actions)
        actions, log_prob = self.gaussian.from_noise(self.noise, mean_actions)
        return actions, values, log_prob

    def __call__(self, obs: Observation, action_masks: Any = None) -> Outputs:
        """(actions, values, log_prob) as ``fused(obs, action_masks)``."""
        _copy_into(self.static_obs, obs)
        if self.noise is not None:
            self.noise.normal_(0, 1)  # the eager step's draw: th.empty_like(mean_actions).normal_(0, 1)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.outputs = self._body()
        if self.gaussian is not None:
            actions, values, log_prob = self.outputs
            return actions.reshape((-1, *self.fused.action_shape)).clone(), values.clone(), log_prob.clone()
        mean_actions, latent_pi, values = self.outputs
        actions, log_prob = self.fused.sample(mean_actions, latent_pi, action_masks)
        return actions, values.clone(), log_prob


@dataclass
class InferenceGraphs:
    """The model's captured collection step, kept between rollouts (never saved).

    :param capture: capture CUDA graphs (False: the same buffers run eagerly, for tests on the CPU).
    """

    capture: bool = True
    step: GraphedStep | None = None
    key: tuple | None = None
    captures: int = 0  #: how many times a step was captured (tests count reuse and recapture)
    failure: str | None = None  #: why capturing failed, after which the eager step is used

    def wrap(self, fused: FusedActorCritic) -> Callable[..., Outputs]:
        """This rollout's step: ``fused`` replayed from the graph (captured at the first call if needed)."""
        if self.failure is not None:
            return fused
        policy_storages = storages(fused.policy)

        def act(obs: Observation, action_masks: Any = None) -> Outputs:
            step = self._step_for(fused, (fused.parts, policy_storages, _layout(obs)), obs)
            return fused(obs, action_masks) if step is None else step(obs, action_masks)

        return act

    def _step_for(self, fused: FusedActorCritic, key: tuple, obs: Observation) -> GraphedStep | None:
        """The captured step for ``key`` (the policy's module and parameter objects, their :func:`storages`, the
        observation layout): the kept one, or a new capture; None after a failure."""
        if self.failure is not None:
            return None
        if key == self.key:
            return self.step
        self.step, self.key = None, None
        try:
            self.step = GraphedStep(fused, obs, capture=self.capture)
        except RuntimeError as error:  # an op that cannot be captured: report it once, go on eagerly
            self.failure = f"{type(error).__name__}: {error}".splitlines()[0]
            warnings.warn(f"cuda_graphs: collection's policy step could not be captured, running it eagerly "
                          f"({self.failure})", stacklevel=4)
            return None
        self.key = key
        self.captures += 1
        return self.step


def collection_step(model: Any) -> Callable[..., Outputs]:
    """This rollout's policy step for the lean loop: :class:`FusedActorCritic` of ``model.policy``, replayed from the
    model's :class:`InferenceGraphs` where it has them (``cuda_graphs=True``) and the policy collects on CUDA."""
    fused = FusedActorCritic(model.policy)
    graphs: InferenceGraphs | None = getattr(model, "_inference_graphs", None)
    if graphs is None or (graphs.capture and model.policy.device.type != "cuda"):
        return fused
    return graphs.wrap(fused)
