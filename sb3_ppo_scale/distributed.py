"""Data-parallel ScalablePPO on ``torch.distributed`` (DD-PPO style): one process per rank, launched by ``torchrun``.

Every rank runs its own envs, collects its own rollout and computes gradients on its share of every logical
minibatch; the gradients are summed with ONE all-reduce per logical minibatch, so all ranks take the same optimizer
step and keep identical parameters. Nothing here runs in a plain single process: without a process group (and
without torchrun's ``WORLD_SIZE > 1``) :class:`~sb3_ppo_scale.ScalablePPO` keeps its single-process behaviour bit
for bit.

What is global and what is per rank (see ``docs/distributed.md``):

- ``batch_size`` is the *global* logical minibatch: each rank trains on ``batch_size / world_size`` samples of it
  (ValueError when not divisible), split into ``grad_accum_steps`` micro-batches locally. Each micro-batch's loss
  is weighted by its share of the global minibatch, so the summed gradient is that of the union of the ranks'
  minibatches; advantages are normalised with all-reduced moments, statistics (approx KL for ``target_kl``) are
  all-reduced (:class:`~sb3_ppo_scale.core.update.step.UpdateStep`), and the KL-penalty beta adapts on the all-reduced
  rollout KL.
- ``num_timesteps`` (hence ``learn(total_timesteps)``, schedules and logged fps) counts the steps of all ranks:
  after each rollout it grows by the sum of every rank's steps. During a rollout it counts this rank's steps on
  top of the global count at the rollout's start.
- seeds: rank ``r`` seeds Python, NumPy, torch and its envs with ``seed + r * n_envs`` (env ``i`` of rank ``r``
  gets ``seed + r * n_envs + i``, the seeds one process with ``world_size * n_envs`` envs would give its envs);
  rank 0 keeps ``seed``. Parameters are broadcast from rank 0 when learning starts.
- VecNormalize: running statistics are merged across ranks after every rollout (:class:`RunningStatsSync`), so
  every rank normalises the next rollout identically.
- the prioritized buffer works per rank: each rank keeps its own retained pool, priorities and importance weights
  (relative to its own pool) and draws its own epoch order; the global minibatch is the union of the ranks' draws.
  Every rank must present the same number of samples to ``train()`` (checked).
- rank 0 logs (other ranks get a logger without outputs); saving, evaluating and callbacks are the caller's
  business: callbacks run on every rank (SB3 calls them during collection), so give evaluation / checkpoint
  callbacks to rank 0 only (:func:`main_process_callback`); a callback that stops training on any rank stops all
  ranks after that rollout. A model saved by rank 0 loads in a plain single process.

Debug check (off by default): ``SB3_PPO_SCALE_CHECK_SYNC=1`` compares a checksum of all parameters across ranks
after every update (:func:`assert_parameters_in_sync`) and raises RuntimeError when they differ.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
import torch.distributed as dist

# torch.distributed.nn.functional binds ``group=group.WORLD`` as default arguments when it is first imported (torch
# imports it lazily, e.g. with torch._dynamo). Imported after the process group exists, those defaults keep the group
# alive past destroy_process_group(): gloo's worker threads then outlive the interpreter and abort the process at
# exit (SIGABRT, "terminate called without an active exception"). Imported here, before any group exists, they are None.
if dist.is_available():
    import torch.distributed.nn.functional  # noqa: F401  (see above)
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import VecNormalize

from sb3_ppo_scale.core.config import ScaleConfig
from sb3_ppo_scale.core.update.step import LOCAL, Reducer

#: environment variable that switches on the parameter checksum comparison after every update
CHECK_SYNC_ENV = "SB3_PPO_SCALE_CHECK_SYNC"

#: arguments that must be equal on every rank (compared by hash when learning starts)
_SAME_ON_ALL_RANKS = (
    "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm", "target_kl",
    "normalize_advantage", "use_sde", "sde_sample_freq", "n_envs", "policy_class", "policy_kwargs",
    "observation_space", "action_space", "rollout_buffer_class", "rollout_buffer_kwargs",
    "batched_sequences", "sequence_length",  # ScalableRecurrentPPO's (None elsewhere)
    *ScaleConfig.__dataclass_fields__,
)
#: VecNormalize's settings that must be equal on every rank (its presence too)
_VEC_NORMALIZE_SETTINGS = ("training", "norm_obs", "norm_reward", "clip_obs", "clip_reward", "gamma", "epsilon",
                           "norm_obs_keys")
#: schedules are compared by their values at these progress-remaining points
_SCHEDULE_POINTS = (1.0, 0.5, 0.0)


# ------------------------------------------------------------------------------------------------ ranks
def torchrun_world_size() -> int:
    """``WORLD_SIZE`` as torchrun sets it (1 when unset)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def world_size() -> int:
    """How many data-parallel ranks train together: the process group's size, else torchrun's ``WORLD_SIZE``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return torchrun_world_size()


def is_distributed() -> bool:
    """True when this process is one of several data-parallel ranks (a process group of size > 1 exists, or
    torchrun's environment says ``WORLD_SIZE > 1``)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() > 1
    return torchrun_world_size() > 1


def rank() -> int:
    """This process's global rank (0 without a process group and outside torchrun)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    """This process's rank on its machine (torchrun's ``LOCAL_RANK``; else the global rank)."""
    return int(os.environ.get("LOCAL_RANK", rank()))


def is_main_process() -> bool:
    """True on rank 0 (and in a plain single process): the rank that logs, evaluates and saves."""
    return rank() == 0


def main_process_callback(callback: BaseCallback | None) -> BaseCallback | None:
    """``callback`` on rank 0, None on the other ranks: for evaluation and checkpoint callbacks."""
    return callback if is_main_process() else None


def rank_seed(seed: int | None, n_envs: int, rank_: int | None = None) -> int | None:
    """The seed rank ``rank_`` (default: this process's) uses: ``seed + rank * n_envs`` (None stays None)."""
    return None if seed is None else seed + (rank() if rank_ is None else rank_) * n_envs


def rank_device(device: th.device) -> th.device:
    """The policy device of this rank: ``cuda:LOCAL_RANK`` for a CUDA device without an explicit index when
    running data-parallel (and made the current CUDA device); otherwise ``device`` unchanged."""
    if device.type != "cuda" or device.index is not None or not is_distributed():
        return device
    device = th.device("cuda", local_rank())
    th.cuda.set_device(device)
    return device


def backend_for(device: th.device) -> str:
    """The process-group backend for a policy on ``device``: NCCL for CUDA, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(device: th.device) -> None:
    """Initialise the default process group from torchrun's environment, backend by device (no-op if one exists).
    The group is destroyed when the process exits."""
    if dist.is_initialized():
        return
    if device.type == "cuda":
        th.cuda.set_device(device)
    dist.init_process_group(backend=backend_for(device))
    atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------ reducer
class ProcessGroupReducer:
    """The :class:`~sb3_ppo_scale.core.update.step.Reducer` of a torch.distributed process group: sums over ranks.

    :param device: where collectives run (CUDA for NCCL, CPU for gloo); tensors elsewhere are copied there and back.
    :param group: the process group (default: the default group).
    """

    def __init__(self, device: th.device, group: Any = None) -> None:
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.backend = dist.get_backend(group)
        self.device = device
        self.check_sync = os.environ.get(CHECK_SYNC_ENV, "0") not in ("", "0")
        self.vec_normalize_sync: RunningStatsSync | None = None
        self.seeded = False
        self._pending: list[th.Tensor] = []  # gradients waiting to travel with the next sum_

    def sum_(self, tensor: th.Tensor) -> th.Tensor:
        """All-reduce SUM ``tensor`` in place; returns it. Gradients left by :meth:`sum_gradients` travel in the same
        collective."""
        pending, self._pending = self._pending, []
        if pending and (tensor.dtype != pending[0].dtype or tensor.device != pending[0].device):
            self._reduce_flat(pending)
            pending = []
        self._reduce_flat([*pending, tensor])
        return tensor

    def sum_gradients(self, parameters: list[th.nn.Parameter]) -> None:
        """Sum every parameter's ``.grad`` over ranks with ONE all-reduce of the flattened gradients.

        :class:`~sb3_ppo_scale.core.update.step.UpdateStep` sums the minibatch's statistics right after the gradients and
        reads neither in between, so the gradients are held back and reduced in the same collective as those
        statistics (:meth:`sum_`): one all-reduce per logical minibatch carries both. Parameters without a gradient
        are skipped (the same ones on every rank: the model is the same).
        """
        self._pending = [p.grad for p in parameters if p.grad is not None]

    def _reduce_flat(self, tensors: list[th.Tensor]) -> None:
        """One all-reduce of the concatenation of ``tensors``, written back into each."""
        if len(tensors) == 1 and tensors[0].device == self.device and tensors[0].is_contiguous():
            dist.all_reduce(tensors[0], group=self.group)
            return
        flat = th.cat([t.reshape(-1) for t in tensors]).to(self.device)
        dist.all_reduce(flat, group=self.group)
        for tensor, part in zip(tensors, th.split(flat, [t.numel() for t in tensors])):
            tensor.copy_(part.view_as(tensor))

    def mean(self, value: th.Tensor, count: int) -> th.Tensor:
        """The count-weighted mean over ranks of a scalar ``value`` that is a mean over ``count`` samples."""
        pair = th.stack([value.detach().double() * count, value.new_tensor(float(count), dtype=th.float64)])
        total, n = self.sum_(pair)
        return (total / n).to(value.dtype)

    def broadcast_(self, tensors: list[th.Tensor]) -> None:
        """Overwrite ``tensors`` with rank 0's values (one broadcast of their concatenation)."""
        if not tensors:
            return
        flat = th.cat([t.detach().reshape(-1).to(self.device, th.float64) for t in tensors])
        dist.broadcast(flat, src=0, group=self.group)
        with th.no_grad():
            for tensor, part in zip(tensors, th.split(flat, [t.numel() for t in tensors])):
                tensor.copy_(part.view_as(tensor))

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered


# ------------------------------------------------------------------------------------------------ set-up
def attach(model: OnPolicyAlgorithm) -> Reducer:
    """Data-parallel set-up at the start of ``learn()``: the reducer for ``model`` (LOCAL in a single process).

    Initialises the process group from torchrun's environment when needed, checks the set-up (``batch_size``
    divisible by the world size, no ``cuda_graphs``, equal hyperparameters on every rank), seeds rank ``r > 0``
    with :func:`rank_seed` once, broadcasts rank 0's parameters and VecNormalize statistics and silences the
    logger of ranks other than 0.
    """
    if not is_distributed():
        return LOCAL
    init_process_group(model.device)
    previous = model.__dict__.get("_reducer")
    reducer = previous if isinstance(previous, ProcessGroupReducer) else ProcessGroupReducer(_collective_device(model))
    check_data_parallel(model, reducer.world_size, reducer.backend)
    check_same_hyperparameters(model, reducer)
    if not reducer.seeded:
        if reducer.rank > 0 and model.seed is not None:
            model.set_random_seed(rank_seed(model.seed, model.n_envs, reducer.rank))
        if reducer.rank > 0:
            model.set_logger(Logger(folder=None, output_formats=[]))
        reducer.seeded = True
    reducer.broadcast_(list(model.policy.state_dict().values()))
    vec_normalize = model.get_vec_normalize_env()
    if vec_normalize is not None:
        reducer.vec_normalize_sync = RunningStatsSync(vec_normalize, reducer)
    return reducer


def _collective_device(model: OnPolicyAlgorithm) -> th.device:
    return model.device if model.device.type == "cuda" else th.device("cpu")


def check_data_parallel(model: Any, world_size: int, backend: str) -> None:
    """ValueError for set-ups data-parallel training does not support (naming the argument)."""
    batch_size, accum = model.batch_size, model.grad_accum_steps
    if batch_size % world_size:
        raise ValueError(
            f"batch_size must be divisible by the world size ({world_size} processes): batch_size is the global "
            f"logical minibatch and each rank trains on batch_size / world_size samples of it; got {batch_size}"
        )
    share = batch_size // world_size
    if accum > share:
        raise ValueError(f"grad_accum_steps must be <= batch_size / world_size = {share} (each rank splits its share "
                         f"into grad_accum_steps micro-batches), got {accum}")
    if share > model.n_steps * model.n_envs:
        raise ValueError(f"batch_size / world_size = {share} must be <= n_steps * n_envs = "
                         f"{model.n_steps * model.n_envs} (each rank's rollout), got batch_size={batch_size}")
    if model.cuda_graphs:
        if backend != "nccl":
            raise ValueError(f"cuda_graphs=True needs CUDA devices and the NCCL backend; this process group uses "
                             f"{backend!r} (CPU): pass cuda_graphs=False")
        raise ValueError("cuda_graphs=True is not supported in data-parallel training (the global advantage moments "
                         "need a host read per minibatch, which a CUDA graph cannot hold): pass cuda_graphs=False; "
                         "NCCL data parallelism runs the eager update (optionally compile_loss=True)")
    if backend == "nccl" and model.device.type != "cuda":
        raise ValueError(f"the NCCL backend needs the policy on CUDA (device='cuda'), got device={model.device}")


def hyperparameters(model: Any) -> dict[str, str]:
    """What must agree across ranks, as comparable strings (schedules by their values at a few points)."""
    values: dict[str, str] = {}
    for name in _SAME_ON_ALL_RANKS:
        values[name] = _stable_repr(getattr(model, name, None))
    for name in ("lr_schedule", "clip_range", "clip_range_vf"):
        schedule = getattr(model, name, None)
        values[name] = _stable_repr([schedule(p) for p in _SCHEDULE_POINTS] if callable(schedule) else schedule)
    values["parameters"] = _stable_repr([(k, tuple(v.shape)) for k, v in model.policy.state_dict().items()])
    vec_normalize = model.get_vec_normalize_env()  # its statistics are merged after every rollout: on every rank alike
    values["VecNormalize"] = _stable_repr(None if vec_normalize is None else {
        name: getattr(vec_normalize, name, None) for name in _VEC_NORMALIZE_SETTINGS})
    return values


def _stable_repr(value: Any) -> str:
    """``repr`` without memory addresses (functions and objects print them)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def hyperparameter_hash(values: dict[str, str]) -> str:
    """SHA-256 of ``values`` (sorted)."""
    return hashlib.sha256(repr(sorted(values.items())).encode()).hexdigest()


def check_same_hyperparameters(model: Any, reducer: ProcessGroupReducer) -> None:
    """ValueError on every rank when any rank's hyperparameter hash differs from rank 0's, naming the arguments."""
    values = hyperparameters(model)
    gathered = reducer.gather_objects((hyperparameter_hash(values), values))
    reference_hash, reference = gathered[0]
    for other_rank, (digest, other) in enumerate(gathered):
        if digest != reference_hash:
            differ = sorted(k for k in reference if reference[k] != other.get(k))
            detail = "; ".join(f"{k}: rank 0 {reference[k]} vs rank {other_rank} {other.get(k)}" for k in differ)
            raise ValueError(f"hyperparameters differ across ranks (every rank must build the same model): {detail}")


# ------------------------------------------------------------------------------------------------ per rollout
def after_rollout(model: Any, start_timesteps: int, collected: bool) -> bool:
    """End of a rank's rollout: global ``num_timesteps``, one stop decision for all ranks, merged VecNormalize
    statistics and (debug) the parameter checksum. Returns whether training continues (on every rank alike)."""
    reducer: ProcessGroupReducer = model._reducer
    counts = th.tensor([float(model.num_timesteps - start_timesteps), float(not collected)], dtype=th.float64)
    steps, stopped = reducer.sum_(counts).tolist()
    model.num_timesteps = start_timesteps + int(steps)
    if reducer.vec_normalize_sync is not None:
        reducer.vec_normalize_sync.merge()
    if reducer.check_sync:
        assert_parameters_in_sync(model)
    return stopped == 0


def local_batch_size(model: Any, n_samples: int) -> int:
    """This rank's share of ``batch_size``; RuntimeError when ranks hold different numbers of samples (their
    minibatch counts would differ and the collectives would hang)."""
    reducer = model._reducer
    if reducer.world_size == 1:
        return model.batch_size
    sizes = reducer.sum_(th.tensor([float(n_samples), float(n_samples) ** 2], dtype=th.float64)).tolist()
    if sizes[1] * reducer.world_size != sizes[0] ** 2:  # equal iff every rank has the same n_samples
        raise RuntimeError(f"data-parallel ranks hold different numbers of samples to train on (this rank: "
                           f"{n_samples}); every rank needs the same n_steps * n_envs and rollout buffer settings")
    return model.batch_size // reducer.world_size


def global_mean_kl(model: Any, kl: th.Tensor, n_samples: int) -> th.Tensor:
    """The rollout-mean KL over all ranks' samples (the local one in a single process)."""
    reducer = model._reducer
    return kl if reducer.world_size == 1 else reducer.mean(kl, n_samples)


# ------------------------------------------------------------------------------------------------ checks
def parameter_checksum(model: Any) -> str:
    """SHA-256 of the bytes of every parameter and buffer of the policy (bitwise identity check)."""
    digest = hashlib.sha256()
    for tensor in model.policy.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def assert_parameters_in_sync(model: Any) -> None:
    """RuntimeError on every rank when any rank's parameters differ from rank 0's (a collective: call it on all)."""
    checksums = model._reducer.gather_objects(parameter_checksum(model))
    differ = [r for r, c in enumerate(checksums) if c != checksums[0]]
    if differ:
        raise RuntimeError(f"policy parameters differ between rank 0 and rank(s) {differ} (data-parallel ranks must "
                           "take identical optimizer steps)")


# ------------------------------------------------------------------------------------------------ VecNormalize
@dataclass
class _Snapshot:
    count: float
    mean: np.ndarray
    var: np.ndarray


def running_stats(vec_normalize: VecNormalize) -> list[RunningMeanStd]:
    """The running statistics of ``vec_normalize`` in a fixed order (observation keys sorted, then returns)."""
    obs_rms = vec_normalize.obs_rms
    stats = [obs_rms[k] for k in sorted(obs_rms)] if isinstance(obs_rms, dict) else [obs_rms]
    return [*stats, vec_normalize.ret_rms]


def _snapshot(rms: RunningMeanStd) -> _Snapshot:
    return _Snapshot(float(rms.count), np.array(rms.mean, dtype=np.float64), np.array(rms.var, dtype=np.float64))


def new_moments(rms: RunningMeanStd, base: _Snapshot) -> np.ndarray:
    """The moments of the data ``rms`` saw since ``base`` (its own earlier state), about ``base.mean``:
    ``[count, sum(x - c), sum((x - c)^2)]`` flattened; these add up over ranks."""
    count = float(rms.count)
    shift = np.asarray(rms.mean, dtype=np.float64) - base.mean
    first = count * shift
    second = count * (np.asarray(rms.var, dtype=np.float64) + shift**2) - base.count * base.var
    return np.concatenate([[count - base.count], first.ravel(), second.ravel()])


def apply_moments(rms: RunningMeanStd, base: _Snapshot, total: np.ndarray) -> None:
    """Set ``rms`` to ``base`` merged with the summed new moments ``total`` of every rank."""
    size = base.mean.size
    count = base.count + float(total[0])
    first = total[1 : 1 + size].reshape(base.mean.shape)
    second = base.count * base.var + total[1 + size :].reshape(base.mean.shape)
    shift = first / count
    rms.mean = base.mean + shift
    rms.var = second / count - shift**2
    rms.count = count


class RunningStatsSync:
    """Merges VecNormalize's running statistics across ranks after every rollout (exact parallel merge).

    All ranks start from rank 0's statistics (the base); after a rollout each rank contributes the moments of
    the observations and returns it saw since the base (about the base mean, in float64), one all-reduce sums them,
    and every rank sets base + sum: the statistics one process would have after seeing every rank's data.
    """

    def __init__(self, vec_normalize: VecNormalize, reducer: ProcessGroupReducer) -> None:
        self.vec_normalize, self.reducer = vec_normalize, reducer
        stats = running_stats(vec_normalize)
        flat = [th.as_tensor(np.asarray(v, dtype=np.float64)) for s in stats for v in (s.mean, s.var)]
        counts = th.tensor([float(s.count) for s in stats], dtype=th.float64)
        reducer.broadcast_([*flat, counts])
        for i, s in enumerate(stats):
            s.mean, s.var, s.count = flat[2 * i].numpy().copy(), flat[2 * i + 1].numpy().copy(), float(counts[i])
        self.bases = [_snapshot(s) for s in stats]

    def merge(self) -> None:
        """One all-reduce of every statistic's new moments; all ranks end with the same statistics."""
        if not self.vec_normalize.training:
            return
        stats = running_stats(self.vec_normalize)
        parts = [new_moments(s, b) for s, b in zip(stats, self.bases)]
        total = self.reducer.sum_(th.from_numpy(np.concatenate(parts))).numpy()
        offset = 0
        for s, b, part in zip(stats, self.bases, parts):
            apply_moments(s, b, total[offset : offset + part.size])
            offset += part.size
        self.bases = [_snapshot(s) for s in stats]

