"""How one logical-minibatch update runs: eagerly (the default) or replayed from CUDA graphs (``cuda_graphs=True``).

An update is ``gradients(batch) -> stats`` (zero the gradients, backward every micro-batch), then SB3's
``target_kl`` check on the stats, then ``apply()`` (gradient clip and optimizer step). :class:`EagerUpdate` runs
those Python functions as they are. :class:`CudaGraphUpdate` runs the first full-size minibatch of a ``train()``
call eagerly on a side stream (the warm-up; it is a real update), then captures ``gradients`` and ``apply`` as two
CUDA graphs and replays them for every later full-size minibatch of the call: the same kernels on the same data,
with the host cost of two graph launches instead of hundreds of kernel launches. A shorter last minibatch runs
eagerly. The graphs are discarded at the end of the call, so schedules (learning rate, clip range) and a changed
optimizer state are always picked up.

While a graph update is active the optimizer runs in its ``capturable`` mode (step counters on the device); on
exit it is put back exactly as PyTorch keeps it otherwise, so saving, loading and CPU training see an ordinary
optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
import warnings
from contextlib import contextmanager

import torch as th
from torch.distributions import Distribution

from sb3_ppo_scale.sampling import LogicalBatch

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


class CudaGraphUpdate(EagerUpdate):
    """Replays full-size minibatch updates from two CUDA graphs (see the module docstring).

    :param optimizer: the policy's optimizer; it must support ``capturable`` (Adam, AdamW, RMSprop, ...).
    :param batch_size: the logical minibatch size the graphs are captured for.
    :param full_batches: how many full-size minibatches this ``train()`` call will run at most; no graph is
        captured unless at least ``min_replays`` of them are left after the warm-up (default 2).
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
        policy: th.nn.Module | None = None,
        min_replays: int = 2,
    ) -> None:
        super().__init__(gradients, apply, should_stop)
        self._optimizer = optimizer
        self._policy = policy
        self._batch_size = batch_size
        self._worth_capturing = full_batches - 1 >= min_replays
        self._side_stream = th.cuda.Stream()
        self._graphs: tuple[th.cuda.CUDAGraph, th.cuda.CUDAGraph] | None = None
        self._static_batch: LogicalBatch | None = None
        self._static_stats: th.Tensor | None = None
        self._previous_capturable = _make_capturable(optimizer)

    def __call__(self, batch: LogicalBatch) -> tuple[th.Tensor, bool]:
        if len(batch) != self._batch_size or not self._worth_capturing:
            return super().__call__(batch)
        if self._graphs is None:
            return self._warm_up_and_capture(batch)
        assert self._static_batch is not None and self._static_stats is not None
        self._static_batch.indices.copy_(batch.indices)
        gradients_graph, apply_graph = self._graphs
        gradients_graph.replay()
        stats = self._static_stats.clone()
        if self._should_stop(stats):
            return stats, False
        apply_graph.replay()
        return stats, True

    def _warm_up_and_capture(self, batch: LogicalBatch) -> tuple[th.Tensor, bool]:
        """A real eager update on a side stream (PyTorch's required warm-up), then the capture of both graphs."""
        self._release_autograd_graph()
        self._side_stream.wait_stream(th.cuda.current_stream())
        with th.cuda.stream(self._side_stream), warnings.catch_warnings():
            # a parameter's gradient accumulator created by an earlier eager step on the default stream may still
            # be alive; autograd then syncs the two streams once and warns: expected here, harmless
            warnings.filterwarnings("ignore", message="The AccumulateGrad node's stream does not match")
            stats, stepped = super().__call__(batch)
        th.cuda.current_stream().wait_stream(self._side_stream)
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
        static_indices = th.empty_like(like.indices)
        self._static_batch = LogicalBatch(like.rollout, static_indices, like.n_micro, like.target_device)
        self._optimizer.zero_grad(set_to_none=True)  # backward allocates .grad inside the graph's memory pool
        gradients_graph, apply_graph = th.cuda.CUDAGraph(), th.cuda.CUDAGraph()
        try:
            with th.cuda.graph(gradients_graph):
                self._static_stats = self._gradients(self._static_batch)
            with th.cuda.graph(apply_graph, pool=gradients_graph.pool()):
                self._apply()
        except RuntimeError as error:
            raise RuntimeError(
                "cuda_graphs=True: capturing the PPO update as a CUDA graph failed (some operation of this policy "
                "synchronises with the host or changes shape). Train with cuda_graphs=False."
            ) from error
        self._graphs = (gradients_graph, apply_graph)

    def close(self) -> None:
        """Discard the graphs and give the optimizer back its ordinary (non-capturable) form."""
        th.cuda.current_stream().synchronize()
        self._graphs = self._static_batch = self._static_stats = None
        _restore_non_capturable(self._optimizer, self._previous_capturable)


def _make_capturable(optimizer: th.optim.Optimizer) -> list[bool]:
    """Switch ``optimizer`` to capturable mode (step counters on their parameter's device).

    :return: each param group's previous ``capturable`` flag, for :func:`_restore_non_capturable`.
    """
    previous = [bool(group.get("capturable", False)) for group in optimizer.param_groups]
    # the eager warm-up and short last minibatches are expected to step uncaptured: no PyTorch warning about it
    optimizer._warned_capturable_if_run_uncaptured = True  # type: ignore[attr-defined]
    for group in optimizer.param_groups:
        group["capturable"] = True
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if isinstance(step, th.Tensor) and step.device != param.device:
                optimizer.state[param]["step"] = step.to(device=param.device, dtype=th.float32)
    return previous


def _restore_non_capturable(optimizer: th.optim.Optimizer, previous: list[bool]) -> None:
    """Undo :func:`_make_capturable`: the previous flags, and step counters back on the CPU where PyTorch keeps
    them for a non-capturable, non-fused optimizer."""
    for group, capturable in zip(optimizer.param_groups, previous):
        group["capturable"] = capturable
        if capturable or group.get("fused"):
            continue
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if isinstance(step, th.Tensor) and step.device.type != "cpu":
                optimizer.state[param]["step"] = step.detach().to("cpu")
