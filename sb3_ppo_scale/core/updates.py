"""How one logical-minibatch update runs: eagerly (the default) or replayed from CUDA graphs (``cuda_graphs=True``).

An update is ``gradients(batch) -> stats`` (zero the gradients, backward every micro-batch), then SB3's
``target_kl`` check on the stats, then ``apply()`` (gradient clip and optimizer step). :class:`EagerUpdate` runs
those Python functions as they are.

:class:`CudaGraphUpdate` runs one full-size minibatch eagerly on a side stream (the warm-up; it is a real update),
then captures ``gradients`` and ``apply`` as two CUDA graphs and replays them for every later full-size minibatch:
the same kernels on the same data, with the host cost of two graph launches instead of hundreds of kernel
launches. A shorter last minibatch runs eagerly. The graphs live in a :class:`GraphCache` kept by the model
between ``train()`` calls and are replayed only while everything they baked in is unchanged (see
:meth:`CudaGraphUpdate.key`: loss settings, learning rates, gradient-clip norm, minibatch shape, and the storage
of the rollout, the parameters and the optimizer state); otherwise they are captured again. A learning-rate
schedule therefore costs one capture per ``train()`` call.

While a graph update is active the optimizer runs in its ``capturable`` mode, its step counters in persistent
device tensors owned by the cache; on exit it is put back exactly as PyTorch keeps it otherwise, so saving, loading
and CPU training see an ordinary optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch as th
from torch.distributions import Distribution

from sb3_ppo_scale.core.sampling import LogicalBatch

Gradients = Callable[[LogicalBatch], th.Tensor]
StopCheck = Callable[[th.Tensor], bool]


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


class EagerUpdate:
    """Runs each minibatch update as ordinary PyTorch code.

    :param gradients: ``batch -> stats``: zeroes the gradients, backpropagates every micro-batch, returns the
        logical minibatch's statistics vector (on the device).
    :param apply: clips the gradient and steps the optimizer.
    :param should_stop: SB3's ``target_kl`` rule on the stats vector (True: skip the step, stop training).
    """

    def __init__(self, gradients: Gradients, apply: Callable[[], None], should_stop: StopCheck) -> None:
        self._gradients, self._apply, self._should_stop = gradients, apply, should_stop

    def __call__(self, batch: LogicalBatch) -> tuple[th.Tensor, bool]:
        """Update on ``batch``; returns ``(stats, stepped)``; ``stepped`` is False when ``target_kl`` stopped it."""
        stats = self._gradients(batch)
        if self._should_stop(stats):
            return stats, False
        self._apply()
        return stats, True

    def close(self) -> None:
        """Nothing to release."""


@dataclass
class GraphCache:
    """CUDA graphs of one update, kept by the model between ``train()`` calls (never saved with it).

    Holding the graphs keeps their memory pool (activations and gradients of one logical minibatch) allocated,
    besides the cuBLAS workspaces of the warm-up and capture streams.
    """

    key: tuple | None = None  #: what the graphs were captured for
    seen_key: tuple | None = None  #: the key at the previous call's first full minibatch
    graphs: tuple[th.cuda.CUDAGraph, th.cuda.CUDAGraph] | None = None
    static_indices: th.Tensor | None = None
    static_stats: th.Tensor | None = None
    #: id(parameter) -> the device tensor that holds its optimizer step counter during graph updates
    steps: dict[int, th.Tensor] = field(default_factory=dict)
    #: the warm-up's stream, created once: cuBLAS keeps a workspace (32 MiB on Hopper) for every stream it has used
    side_stream: th.cuda.Stream | None = None


class CudaGraphUpdate(EagerUpdate):
    """Replays full-size minibatch updates from two CUDA graphs (see the module docstring).

    A graph is captured only where it will be replayed: when this call has more than one full-size minibatch,
    or when nothing has changed since the previous call.

    :param optimizer: the policy's optimizer; it must support ``capturable`` (Adam, AdamW, RMSprop, ...).
    :param batch_size: the logical minibatch size the graphs are captured for.
    :param full_batches: how many full-size minibatches this ``train()`` call will run at most.
    :param cache: the model's :class:`GraphCache`.
    :param config: everything else the update bakes in as Python numbers (loss settings, gradient-clip norm, ...).
    :param policy: the SB3 policy, whose action distribution keeps the last forward's autograd graph alive
        (released before the warm-up and before the capture).
    """

    def __init__(
        self,
        gradients: Gradients,
        apply: Callable[[], None],
        should_stop: StopCheck,
        optimizer: th.optim.Optimizer,
        batch_size: int,
        full_batches: int,
        cache: GraphCache,
        config: tuple,
        policy: Any = None,
    ) -> None:
        super().__init__(gradients, apply, should_stop)
        self._optimizer, self._policy, self._cache, self._config = optimizer, policy, cache, config
        self._batch_size = batch_size
        self._full_batches = full_batches
        self._checked = False
        self._previous_capturable = _make_capturable(optimizer, cache.steps)

    def __call__(self, batch: LogicalBatch) -> tuple[th.Tensor, bool]:
        if len(batch) != self._batch_size:
            return super().__call__(batch)
        if not self._checked:  # first full-size minibatch of this call: are the cached graphs still valid?
            self._checked = True
            key = self.key(batch)
            if key != self._cache.key:
                self._cache.graphs = None
                worth = self._full_batches > 1 or key == self._cache.seen_key
                self._cache.seen_key = key
                return self._warm_up_and_capture(batch) if worth else super().__call__(batch)
        if self._cache.graphs is None:
            return super().__call__(batch)
        return self._replay(batch)

    def key(self, batch: LogicalBatch) -> tuple:
        """What the graphs bake in: config, optimizer hyperparameters (lr, betas, eps, ...), minibatch shape, and
        the storage they read and write."""
        rollout = batch.rollout
        observations = rollout.observations
        obs = list(observations.values()) if isinstance(observations, dict) else [observations]
        data = [*obs, rollout.actions, rollout.old_values, rollout.old_log_prob, rollout.advantages, rollout.returns,
                rollout.weights, rollout.old_dist]
        params = [p for group in self._optimizer.param_groups for p in group["params"]]
        state = [value for p in params for name, value in sorted(self._optimizer.state.get(p, {}).items())
                 if isinstance(value, th.Tensor) and name != "step"]
        return (
            self._config,
            id(self._optimizer),
            tuple(_group_hyperparameters(group) for group in self._optimizer.param_groups),
            len(batch),
            batch.n_micro,
            tuple(None if t is None else (t.data_ptr(), tuple(t.shape), t.dtype) for t in data),
            tuple(p.data_ptr() for p in params),
            tuple(t.data_ptr() for t in state),
        )

    def _replay(self, batch: LogicalBatch) -> tuple[th.Tensor, bool]:
        cache = self._cache
        assert cache.graphs is not None and cache.static_indices is not None and cache.static_stats is not None
        cache.static_indices.copy_(batch.indices)
        gradients_graph, apply_graph = cache.graphs
        gradients_graph.replay()
        stats = cache.static_stats.clone()
        if self._should_stop(stats):
            return stats, False
        apply_graph.replay()
        return stats, True

    def _warm_up_and_capture(self, batch: LogicalBatch) -> tuple[th.Tensor, bool]:
        """A real eager update on a side stream (PyTorch's required warm-up), then the capture of both graphs."""
        self._release_autograd_graph()
        if self._cache.side_stream is None:
            self._cache.side_stream = th.cuda.Stream()
        side_stream = self._cache.side_stream
        side_stream.wait_stream(th.cuda.current_stream())
        with th.cuda.stream(side_stream), warnings.catch_warnings():
            # a parameter's gradient accumulator created by an earlier eager step on the default stream may still
            # be alive; autograd then syncs the two streams once and warns: expected here, harmless
            warnings.filterwarnings("ignore", message="The AccumulateGrad node's stream does not match")
            stats, stepped = super().__call__(batch)
        th.cuda.current_stream().wait_stream(side_stream)
        if stepped:
            self._release_autograd_graph()
            self._capture(batch)
        return stats, stepped

    def _release_autograd_graph(self) -> None:
        """Drop the last forward's autograd graph that SB3's action distribution keeps (``distribution``), so the
        parameters' gradient accumulators are recreated on the stream that uses them next."""
        if self._policy is not None and hasattr(self._policy.action_dist, "distribution"):
            self._policy.action_dist.distribution = None

    def _capture(self, like: LogicalBatch) -> None:
        cache = self._cache
        _adopt_step_counters(self._optimizer, cache.steps)  # counters the warm-up created become persistent
        cache.static_indices = th.empty_like(like.indices)
        static_batch = LogicalBatch(like.rollout, cache.static_indices, like.n_micro, like.target_device)
        self._optimizer.zero_grad(set_to_none=True)  # backward allocates .grad inside the graph's memory pool
        gradients_graph, apply_graph = th.cuda.CUDAGraph(), th.cuda.CUDAGraph()
        try:
            with th.cuda.graph(gradients_graph):
                cache.static_stats = self._gradients(static_batch)
            with th.cuda.graph(apply_graph, pool=gradients_graph.pool()):
                self._apply()
        except RuntimeError as error:
            raise RuntimeError(
                "cuda_graphs=True: capturing the PPO update as a CUDA graph failed (some operation of this policy "
                "synchronises with the host or changes shape). Train with cuda_graphs=False."
            ) from error
        cache.graphs = (gradients_graph, apply_graph)
        cache.key = self.key(like)

    def close(self) -> None:
        """Give the optimizer back its ordinary (non-capturable) form; the graphs stay in the cache."""
        _restore_non_capturable(self._optimizer, self._previous_capturable)


def _group_hyperparameters(group: dict[str, Any]) -> tuple:
    """A param group's settings as a comparable tuple (lr, betas, eps, weight_decay, ...; not the parameters)."""
    return tuple(sorted((name, repr(value)) for name, value in group.items() if name != "params"))


def _step_counters(optimizer: th.optim.Optimizer, groups: list[dict[str, Any]] | None = None):
    """``(param, step)`` for every parameter (of ``groups``, default all) whose state has a tensor step counter."""
    for group in optimizer.param_groups if groups is None else groups:
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if isinstance(step, th.Tensor):
                yield param, step


def _make_capturable(optimizer: th.optim.Optimizer, steps: dict[int, th.Tensor]) -> list[bool]:
    """Switch ``optimizer`` to capturable mode: each step counter's value moves into its persistent device
    tensor in ``steps`` (the storage captured graphs increment).

    :return: each param group's previous ``capturable`` flag, for :func:`_restore_non_capturable`.
    """
    previous = [bool(group.get("capturable", False)) for group in optimizer.param_groups]
    # the eager warm-up and short last minibatches are expected to step uncaptured: no PyTorch warning about it
    optimizer._warned_capturable_if_run_uncaptured = True  # type: ignore[attr-defined]
    for group in optimizer.param_groups:
        group["capturable"] = True
    for param, step in _step_counters(optimizer):
        persistent = steps.get(id(param))
        if persistent is None or persistent.device != param.device:
            persistent = steps[id(param)] = th.zeros((), dtype=th.float32, device=param.device)
        if step is not persistent:
            persistent.copy_(step)
        optimizer.state[param]["step"] = persistent
    return previous


def _adopt_step_counters(optimizer: th.optim.Optimizer, steps: dict[int, th.Tensor]) -> None:
    """Record step counters created on the device (by a first, capturable step) as the persistent ones."""
    for param, step in _step_counters(optimizer):
        if step.device == param.device:
            steps[id(param)] = step


def _restore_non_capturable(optimizer: th.optim.Optimizer, previous: list[bool]) -> None:
    """Undo :func:`_make_capturable`: the previous flags, and step counters back on the CPU (new tensors) where
    PyTorch keeps them for a non-capturable, non-fused optimizer."""
    for group, capturable in zip(optimizer.param_groups, previous):
        group["capturable"] = capturable
    plain = [g for g, capturable in zip(optimizer.param_groups, previous) if not capturable and not g.get("fused")]
    for param, step in _step_counters(optimizer, plain):
        if step.device.type != "cpu":
            optimizer.state[param]["step"] = step.detach().to("cpu")
