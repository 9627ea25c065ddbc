"""``cuda_graphs=True``: full-size minibatch updates replayed from CUDA graphs.

:class:`CudaGraphStep` wraps an :class:`~sb3_ppo_scale.core.update.step.UpdateStep`. It runs one full-size minibatch
eagerly on a side stream (the warm-up; it is a real update), then captures the step's ``gradients`` and ``apply``
as two CUDA graphs and replays them for every later full-size minibatch: the same kernels on the same data, with
the host cost of two graph launches instead of hundreds of kernel launches. A shorter last minibatch runs
eagerly. The graphs live in a :class:`GraphCache` kept by the model between ``train()`` calls and are replayed
only while everything they baked in (a :class:`GraphKey`: loss settings, learning rates, gradient-clip norm,
minibatch shape, and the storage of the rollout, the parameters and the optimizer state) is unchanged; otherwise
they are captured again. A learning-rate schedule therefore costs one capture per ``train()`` call.

While a graph update is active the optimizer runs in its ``capturable`` mode, its step counters and its learning
rates in persistent device tensors owned by the cache (a new learning rate is written into the same tensor, so a
schedule or ``learning_rate="kl_adaptive"`` does not capture again); on exit it is put back exactly as PyTorch
keeps it otherwise, so saving, loading and CPU training see an ordinary optimizer.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch as th

from sb3_ppo_scale.core.policy.inference import PolicyParts
from sb3_ppo_scale.core.update.objectives import LossSettings
from sb3_ppo_scale.core.update.sampling import LogicalBatch
from sb3_ppo_scale.core.update.step import StepSettings, UpdateStep

#: ``(data_ptr, shape, dtype)`` of a tensor a graph reads or writes (None for an absent optional field)
Storage = tuple[int, tuple[int, ...], th.dtype] | None


@dataclass(frozen=True)
class GraphKey:
    """Everything captured graphs bake in; graphs are replayed only while it is unchanged."""

    loss_settings: LossSettings
    step_settings: StepSettings
    optimizer_id: int
    optimizer_hyperparameters: tuple[tuple[tuple[str, str], ...], ...]
    batch_size: int
    n_micro: int
    data: tuple[Storage, ...]
    parameters: tuple[int, ...]
    optimizer_state: tuple[int, ...]
    policy_parts: PolicyParts  #: the modules the forward runs (one replaced without a new optimizer changes only this)


@dataclass
class GraphCache:
    """CUDA graphs of one update, kept by the model between ``train()`` calls (never saved with it).

    Holding the graphs keeps their memory pool (activations and gradients of one logical minibatch) allocated,
    besides the cuBLAS workspaces of the warm-up and capture streams.
    """

    key: GraphKey | None = None  #: what the graphs were captured for
    seen_key: GraphKey | None = None  #: the key at the previous call's first full minibatch
    graphs: tuple[th.cuda.CUDAGraph, th.cuda.CUDAGraph] | None = None
    static_indices: th.Tensor | None = None
    static_stats: th.Tensor | None = None
    #: id(parameter) -> the device tensor that holds its optimizer step counter during graph updates
    steps: dict[int, th.Tensor] = field(default_factory=dict)
    #: the warm-up's stream, created once: cuBLAS keeps a workspace (32 MiB on Hopper) for every stream it has used
    side_stream: th.cuda.Stream | None = None
    #: how many times graphs were captured (a test counts reuse and recapture with it)
    captures: int = 0
    #: param-group index -> the 0-d device tensor that holds its learning rate during graph updates
    learning_rates: dict[int, th.Tensor] = field(default_factory=dict)


class CudaGraphStep:
    """Replays full-size minibatch updates of ``step`` from two CUDA graphs (see the module docstring).

    A graph is captured only where it will be replayed: when this call has more than one full-size minibatch,
    or when nothing has changed since the previous call.

    :param step: the eager update (its guard must decide on the device: ``NonFiniteGuard(on_device=True)``).
    :param batch_size: the logical minibatch size the graphs are captured for.
    :param full_batches: how many full-size minibatches this ``train()`` call will run at most.
    :param cache: the model's :class:`GraphCache`.
    """

    def __init__(self, step: UpdateStep, batch_size: int, full_batches: int, cache: GraphCache) -> None:
        self._step, self._optimizer, self._cache = step, step.optimizer, cache
        self._batch_size = batch_size
        self._full_batches = full_batches
        self._checked = False
        self._previous_capturable = _make_capturable(self._optimizer, cache.steps)
        self._previous_lr = _learning_rates_as_tensors(self._optimizer, cache.learning_rates)

    def __call__(self, batch: LogicalBatch) -> tuple[th.Tensor, bool]:
        if len(batch) != self._batch_size:
            return self._step(batch)
        if not self._checked:  # first full-size minibatch of this call: are the cached graphs still valid?
            self._checked = True
            key = self.key(batch)
            if key != self._cache.key:
                self._cache.graphs = None
                worth = self._full_batches > 1 or key == self._cache.seen_key
                self._cache.seen_key = key
                return self._warm_up_and_capture(batch) if worth else self._step(batch)
        if self._cache.graphs is None:
            return self._step(batch)
        return self._replay(batch)

    def key(self, batch: LogicalBatch) -> GraphKey:
        """What the graphs bake in, for ``batch`` (see :class:`GraphKey`)."""
        optimizer = self._optimizer
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = [value for p in params for name, value in sorted(optimizer.state.get(p, {}).items())
                 if isinstance(value, th.Tensor) and name != "step"]
        return GraphKey(
            loss_settings=self._step.loss_settings,
            step_settings=self._step.settings,
            optimizer_id=id(optimizer),
            optimizer_hyperparameters=tuple(_group_hyperparameters(group) for group in optimizer.param_groups),
            batch_size=len(batch),
            n_micro=batch.n_micro,
            data=tuple(None if t is None else (t.data_ptr(), tuple(t.shape), t.dtype) for t in batch.rollout.tensors()),
            parameters=tuple(p.data_ptr() for p in params),
            optimizer_state=tuple(t.data_ptr() for t in state),
            policy_parts=PolicyParts(self._step.policy),
        )

    def _replay(self, batch: LogicalBatch) -> tuple[th.Tensor, bool]:
        cache = self._cache
        assert cache.graphs is not None and cache.static_indices is not None and cache.static_stats is not None
        cache.static_indices.copy_(batch.indices)
        gradients_graph, apply_graph = cache.graphs
        gradients_graph.replay()
        stats = cache.static_stats.clone()
        if self._step.exceeds_target_kl(stats):
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
            stats, stepped = self._step(batch)
        th.cuda.current_stream().wait_stream(side_stream)
        if stepped:
            self._release_autograd_graph()
            self._capture(batch)
        return stats, stepped

    def _release_autograd_graph(self) -> None:
        """Drop the last forward's autograd graph that SB3's action distribution keeps (``distribution``), so the
        parameters' gradient accumulators are recreated on the stream that uses them next."""
        action_dist = getattr(self._step.policy, "action_dist", None)
        if action_dist is not None and hasattr(action_dist, "distribution"):
            action_dist.distribution = None

    def _capture(self, like: LogicalBatch) -> None:
        cache = self._cache
        _adopt_step_counters(self._optimizer, cache.steps)  # counters the warm-up created become persistent
        cache.static_indices = th.empty_like(like.indices)
        # the same kind of minibatch (a LogicalBatch, or a subclass: a recurrent policy's ChunkBatch), static indices
        static_batch = dataclasses.replace(like, indices=cache.static_indices)
        self._optimizer.zero_grad(set_to_none=True)  # backward allocates .grad inside the graph's memory pool
        gradients_graph, apply_graph = th.cuda.CUDAGraph(), th.cuda.CUDAGraph()
        try:
            with th.cuda.graph(gradients_graph):
                cache.static_stats = self._step.gradients(static_batch)
            with th.cuda.graph(apply_graph, pool=gradients_graph.pool()):
                self._step.apply(cache.static_stats)
        except RuntimeError as error:
            raise RuntimeError(
                "cuda_graphs=True: capturing the PPO update as a CUDA graph failed (some operation of this policy "
                "synchronises with the host or changes shape). Train with cuda_graphs=False."
            ) from error
        cache.graphs = (gradients_graph, apply_graph)
        cache.captures += 1
        cache.key = self.key(like)

    def close(self) -> None:
        """Give the optimizer back its ordinary (non-capturable, float learning rate) form; the graphs stay."""
        for group, lr in zip(self._optimizer.param_groups, self._previous_lr):
            group["lr"] = lr
        _restore_non_capturable(self._optimizer, self._previous_capturable)


def _group_hyperparameters(group: dict[str, Any]) -> tuple:
    """A param group's settings as a comparable tuple (lr, betas, eps, weight_decay, ...; not the parameters). A
    tensor setting counts by its storage (graphs read its current value)."""
    return tuple(sorted(
        (name, f"tensor@{value.data_ptr()}" if isinstance(value, th.Tensor) else repr(value))
        for name, value in group.items() if name != "params"
    ))


def _learning_rates_as_tensors(optimizer: th.optim.Optimizer, persistent: dict[int, th.Tensor]) -> list[Any]:
    """Put each param group's learning rate into its persistent 0-d device tensor (created on first use, on the
    group's device, float32); returns the previous values for :meth:`CudaGraphStep.close`."""
    previous = []
    for index, group in enumerate(optimizer.param_groups):
        previous.append(group["lr"])
        tensor = persistent.get(index)
        device = group["params"][0].device
        if tensor is None or tensor.device != device:
            tensor = persistent[index] = th.zeros((), dtype=th.float32, device=device)
        tensor.fill_(float(group["lr"]))
        group["lr"] = tensor
    return previous


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
