"""Device-resident copy of an SB3 rollout buffer.

SB3 keeps the rollout in NumPy and copies six fields host-to-device for every minibatch of every epoch.
:class:`RolloutStager` instead moves the whole (flattened) rollout to the training device once per
rollout and :class:`DeviceRollout` gathers minibatches there with ``index_select``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch as th
from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer, MaskableRolloutBuffer
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.type_aliases import DictRolloutBufferSamples, RolloutBufferSamples

Observations = th.Tensor | dict[str, th.Tensor]


class SampleTypes(NamedTuple):
    """The samples type a gather returns, for array and for dict observations: SB3's ``RolloutBufferSamples`` pair,
    or an algorithm's own pair whose fields after ``returns`` are its :attr:`DeviceRollout.extras`, in order (e.g.
    sb3-contrib's ``MaskableRolloutBufferSamples`` with ``action_masks``)."""

    array: type
    dict: type


#: SB3's samples: the six PPO fields, nothing extra
PPO_SAMPLES = SampleTypes(RolloutBufferSamples, DictRolloutBufferSamples)


def _gather_obs(obs: Observations, idx: th.Tensor, device: th.device) -> Observations:
    if isinstance(obs, dict):
        return {key: value.index_select(0, idx).to(device, non_blocking=True) for key, value in obs.items()}
    return obs.index_select(0, idx).to(device, non_blocking=True)


@dataclass
class DeviceRollout:
    """A flattened rollout (env-major sample order, exactly as ``RolloutBuffer.get`` orders it) on one device.

    Every tensor has ``len(self)`` rows. Actions are float32 as SB3 hands them to the policy; observations
    keep their dtype (Atari uint8 frames stay uint8 until the policy preprocesses them).
    ``weights`` holds optional per-sample loss weights (importance correction); None means all ones.
    ``old_dist`` holds optional per-sample parameters of the rollout policy's action distribution (for an
    analytic KL penalty, see :mod:`sb3_ppo_scale.core.update.kl`).
    ``extras`` holds the per-sample fields an algorithm adds (name -> tensor with ``len(self)`` rows: action masks,
    LSTM states, episode starts), staged with the rest; ``sample_types`` says what :meth:`gather` returns (its
    fields after ``returns`` must be the extras that :meth:`gather` appends, in ``sample_extras`` order).
    """

    observations: Observations
    actions: th.Tensor
    old_values: th.Tensor
    old_log_prob: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    weights: th.Tensor | None = None
    old_dist: th.Tensor | None = None
    extras: dict[str, th.Tensor] = field(default_factory=dict)
    sample_types: SampleTypes = PPO_SAMPLES
    sample_extras: tuple[str, ...] = ()

    #: The sample fields (the only list of them) -> the SB3 ``RolloutBuffer`` attribute each one is staged from.
    SOURCES: ClassVar[dict[str, str]] = {
        "observations": "observations",
        "actions": "actions",
        "old_values": "values",
        "old_log_prob": "log_probs",
        "advantages": "advantages",
        "returns": "returns",
    }
    #: The sample fields, in :class:`RolloutBufferSamples` order.
    SAMPLE_FIELDS: ClassVar[tuple[str, ...]] = tuple(SOURCES)

    def __len__(self) -> int:
        return self.actions.shape[0]

    @property
    def device(self) -> th.device:
        return self.actions.device

    def gather(self, idx: th.Tensor, device: th.device | None = None) -> RolloutBufferSamples | DictRolloutBufferSamples:
        """Rows ``idx`` (an index tensor on ``self.device``) as SB3 samples on ``device`` (default: here)."""
        device = self.device if device is None else device
        fields = [*self._flat_fields(), *(self.extras[name] for name in self.sample_extras)]
        tensors = [t.index_select(0, idx).to(device, non_blocking=True) for t in fields]
        observations = _gather_obs(self.observations, idx, device)
        samples_cls = self.sample_types.dict if isinstance(observations, dict) else self.sample_types.array
        return samples_cls(observations, *tensors)  # type: ignore[arg-type]

    def _flat_fields(self) -> list[th.Tensor]:
        return [getattr(self, name) for name in self.SAMPLE_FIELDS[1:]]

    def tensors(self) -> list[th.Tensor | None]:
        """Every tensor the update reads, observations first, then the sample fields, ``weights``, ``old_dist`` and the
        extras (by name)."""
        observations = self.observations
        obs = list(observations.values()) if isinstance(observations, dict) else [observations]
        return [*obs, *self._flat_fields(), self.weights, self.old_dist, *(self.extras[k] for k in sorted(self.extras))]


def flat_field(buffer: RolloutBuffer, array: np.ndarray) -> np.ndarray:
    """A buffer field (n_steps, n_envs, ...) as (n_steps * n_envs, ...) in SB3's env-major sample order, without
    touching ``buffer`` (the array itself once ``get()`` has flattened the buffer in place)."""
    return _flatten(buffer, array)


def _flatten(buffer: RolloutBuffer, array: np.ndarray) -> np.ndarray:
    """(n_steps, n_envs, ...) -> (n_steps * n_envs, ...) in SB3's env-major order, without touching ``buffer``."""
    if buffer.generator_ready:  # someone already called get(), which flattens in place
        return array
    return buffer.swap_and_flatten(array)


def rollout_arrays(buffer: RolloutBuffer) -> dict[str, np.ndarray | dict[str, np.ndarray]]:
    """The fields PPO trains on, flattened, as NumPy arrays (actions cast to float32 as SB3 does)."""
    if isinstance(buffer, DictRolloutBuffer):
        observations: np.ndarray | dict[str, np.ndarray] = {
            key: _flatten(buffer, value) for key, value in buffer.observations.items()
        }
    else:
        observations = _flatten(buffer, buffer.observations)
    arrays: dict[str, np.ndarray | dict[str, np.ndarray]] = {"observations": observations}
    for name, source in list(DeviceRollout.SOURCES.items())[1:]:
        array = _flatten(buffer, getattr(buffer, source))
        arrays[name] = array.astype(np.float32, copy=False) if name == "actions" else array.reshape(-1)
    return arrays


def _env_major(buffer: RolloutBuffer, array: np.ndarray) -> th.Tensor:
    """A zero-copy torch view of a buffer field in SB3's env-major sample order: shape (n_envs, n_steps, ...)
    while the buffer holds (n_steps, n_envs, ...), or the array itself once ``get()`` has flattened it."""
    tensor = th.from_numpy(array)
    return tensor if buffer.generator_ready else tensor.transpose(0, 1)


class RolloutStager:
    """Moves a rollout buffer's contents to ``device`` once per rollout.

    On the CPU the tensors share memory with the flattened NumPy arrays (no copy beyond SB3's own flatten). On a
    GPU the buffer is not flattened in NumPy at all; the device storage is
    allocated on the first call and reused afterwards: each field is copied, in one multi-threaded strided pass
    that also reorders it to SB3's env-major sample order, into a pinned host tensor and sent with one
    non-blocking copy. Nothing is allocated until :meth:`stage` is first called, so a model loaded for inference
    holds no device rollout.

    :param device: where the rollout lives during the update.
    """

    def __init__(self, device: th.device) -> None:
        self.device = device
        self._host: dict[str, th.Tensor] = {}
        self._device: dict[str, th.Tensor] = {}

    def stage(self, buffer: RolloutBuffer, extras: dict[str, np.ndarray] | None = None) -> DeviceRollout:
        """The buffer's PPO fields on the device, plus ``extras``: an algorithm's own per-sample fields, already
        flattened to SB3's env-major sample order (see :func:`flat_field`); on a GPU they are copied into persistent
        device storage like the rest."""
        if self.device.type == "cpu":
            moved = {name: _as_tensors(value) for name, value in rollout_arrays(buffer).items()}
            staged = {name: _as_tensors(array) for name, array in (extras or {}).items()}
        else:
            moved = {name: self._stage_field(buffer, name) for name in DeviceRollout.SAMPLE_FIELDS}
            staged = {name: self._to_device(f"extra.{name}", th.from_numpy(np.ascontiguousarray(array)), True)
                      for name, array in (extras or {}).items()}
        return DeviceRollout(**moved, extras=staged)  # type: ignore[arg-type]

    def _stage_field(self, buffer: RolloutBuffer, name: str) -> Observations:
        value = getattr(buffer, DeviceRollout.SOURCES[name])
        flat = buffer.generator_ready
        if isinstance(value, dict):
            return {key: self._to_device(f"{name}.{key}", _env_major(buffer, array), flat) for key, array in value.items()}
        dtype = th.float32 if name == "actions" else None  # SB3 hands actions to the policy as float32
        tensor = self._to_device(name, _env_major(buffer, value), flat, dtype)
        return tensor if name in ("observations", "actions") else tensor.reshape(-1)

    def _to_device(self, name: str, source: th.Tensor, flat: bool, dtype: th.dtype | None = None) -> th.Tensor:
        """``source`` (n_envs, n_steps, ...), or (N, ...) when ``flat`` -> a persistent device tensor (N, ...)."""
        rows_shape = source.shape if flat else (source.shape[0] * source.shape[1], *source.shape[2:])
        dtype = source.dtype if dtype is None else dtype
        host = self._host.get(name)
        if host is None or host.shape != source.shape or host.dtype != dtype:
            host = self._host[name] = th.empty(source.shape, dtype=dtype, pin_memory=self.device.type == "cuda")
            self._device[name] = th.empty(rows_shape, dtype=dtype, device=self.device)
        host.copy_(source)  # one strided, multi-threaded pass: env-major order, straight into pinned memory
        target = self._device[name]
        target.copy_(host.view(rows_shape), non_blocking=True)
        return target


def _as_tensors(value: np.ndarray | dict[str, np.ndarray]) -> Observations:
    if isinstance(value, dict):
        return {key: th.from_numpy(np.ascontiguousarray(array)) for key, array in value.items()}
    return th.from_numpy(np.ascontiguousarray(value))


@runtime_checkable
class RolloutHooks(Protocol):
    """What a rollout buffer may add to the update phase (:class:`~sb3_ppo_scale.PrioritizedRolloutBuffer` does).

    A buffer that has all three methods is used as its own hooks; any other buffer gets :data:`UNIFORM_HOOKS`.
    """

    def prepare_rollout(self, rollout: DeviceRollout) -> DeviceRollout:
        """The staged rollout as the update should see it (e.g. retained samples added, importance weights set)."""
        ...

    def epoch_order(self, n: int) -> th.Tensor:
        """One epoch's sample order over the ``n`` prepared samples (int64 indices; may repeat)."""
        ...

    def train_log(self) -> dict[str, float]:
        """Extra ``train/...`` scalars to log after the update (host floats)."""
        ...


class UniformHooks:
    """The default hooks: the rollout as staged, SB3's uniform permutation each epoch, nothing extra to log."""

    def prepare_rollout(self, rollout: DeviceRollout) -> DeviceRollout:
        return rollout

    def epoch_order(self, n: int) -> th.Tensor:
        """SB3's epoch order: ``np.random.permutation(n)`` from NumPy's global RNG."""
        return th.from_numpy(np.random.permutation(n))

    def train_log(self) -> dict[str, float]:
        return {}


UNIFORM_HOOKS = UniformHooks()


def rollout_hooks(buffer: object) -> RolloutHooks:
    """``buffer`` itself when it implements :class:`RolloutHooks`, else :data:`UNIFORM_HOOKS`."""
    return buffer if isinstance(buffer, RolloutHooks) else UNIFORM_HOOKS


#: The buffer classes whose minibatches (``get`` and ``_get_samples``) the update's loaders reproduce.
REPRODUCED_SAMPLING = (RolloutBuffer, DictRolloutBuffer, MaskableRolloutBuffer, MaskableDictRolloutBuffer)


def samples_itself(buffer_class: type) -> bool:
    """Whether a rollout buffer class draws its minibatches its own way: its ``get`` or ``_get_samples`` is not that
    of a class in :data:`REPRODUCED_SAMPLING` (a user's subclass that reorders, filters or transforms samples), and
    it does not say how the update should sample through :class:`RolloutHooks` (the prioritized buffer does). The
    update then iterates its ``get(batch_size)`` as the algorithm's ``train()`` does
    (:class:`~sb3_ppo_scale.core.update.sampling.BufferLoader`)."""
    if issubclass(buffer_class, RolloutHooks):
        return False
    return not any(buffer_class.get is base.get and buffer_class._get_samples is base._get_samples
                   for base in REPRODUCED_SAMPLING)
