"""Exact resume: checkpoints that hold everything the next update depends on, and preemption (SIGTERM/SIGINT).

Kept as one module (over 600 lines): every field a checkpoint writes has its reader a few functions away, so a
field added on one side cannot be forgotten on the other (tests/test_checkpoint.py checks both sides together).

A checkpoint is one file (``torch.save`` of a dict, written to a temporary file in the same folder and then
``os.replace``-d over the previous one, so a crash while writing leaves the previous checkpoint intact). It holds:

- ``model_zip``: SB3's ``save()`` of the model (parameters, optimizer state, hyperparameters, ScalablePPO's
  objective state (the adapted KL beta), ``_n_grad_steps``, ``_n_nonfinite_steps`` and every other plain
  attribute, e.g. an adaptive learning rate's state);
- ``counters``: ``num_timesteps``, ``_episode_num``, ``_n_updates``, ``_total_timesteps`` (the ``learn()``
  budget) and ``_current_progress_remaining``, so schedules continue where they were;
- ``ranks``: per data-parallel rank (one entry in one process) what lives in that process only: the torch (CPU and
  CUDA), NumPy and Python RNG states, each env's ``np_random`` state (where ``get_attr`` can read it), the
  VecNormalize statistics, the prioritized buffer's retained pool (``PrioritizedRolloutBuffer.state_dict()``),
  SB3's ``_last_obs`` / ``_last_episode_starts`` / ``_last_original_obs``, the episode-info buffers, the logger's
  pending values (the last update's ``train/*`` records, written at the next log step), the episodes in progress
  (:func:`~sb3_ppo_scale.envs.episodes.capture_episodes`, where every env layer is known), the non-finite guard's
  consecutive-skip count, gSDE's exploration matrices and the algorithm's own boundary state (its
  ``_boundary_state()`` hook: RecurrentPPO's last LSTM states);
- ``logger``: the TensorBoard folder, so a resumed run writes into the same run folder.

Checkpoints are taken at rollout boundaries (after an update, before the next rollout). A preempted rollout is
abandoned: the checkpoint is the state at the start of that rollout (captured there; parameters, optimizer and
retained pool do not change during collection).

Resuming: :func:`load_checkpoint` (also ``ScalablePPO.load_checkpoint(path, env)``) rebuilds the model on a new env,
resets that env, puts back the episodes in progress where :mod:`sb3_ppo_scale.envs.episodes` captured them (else
they restart; see docs/checkpoints.md) and restores the rest;
:func:`learn_resumable` runs ``learn()`` for what is left of the saved budget, in the same TensorBoard run, with a
:class:`ResumableCheckpoint` callback that writes every ``every_steps`` env steps and on SIGTERM/SIGINT, and
raises :class:`TrainingPreempted` (a ``SystemExit`` with code :data:`PREEMPTED_EXIT_CODE`) after writing.

Checkpoints use pickle (like SB3's zip files): load only checkpoints you trust.
"""

from __future__ import annotations

import copy
import importlib
import io
import os
import random
import signal
import sys
import weakref
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.logger import (
    CSVOutputFormat,
    HumanOutputFormat,
    JSONOutputFormat,
    Logger,
    TensorBoardOutputFormat,
    configure,
)
from stable_baselines3.common.vec_env import SubprocVecEnv, VecEnv, VecEnvWrapper, VecNormalize, unwrap_vec_normalize

from sb3_ppo_scale.core.checks import is_int
from sb3_ppo_scale.envs.episodes import capture_episodes, restore_episodes, vec_layers
from sb3_ppo_scale.envs.processes import ProcessVecEnv

#: Format version of the checkpoint dict (a checkpoint of another version is refused with a clear error).
CHECKPOINT_VERSION = 1
#: Exit code of a run stopped by SIGTERM/SIGINT after writing its checkpoint: sysexits.h's EX_TEMPFAIL
#: ("temporary failure, retry"). Distinct from 143/130, which a shell reports for a process the signal killed
#: (no checkpoint written), so a job script can requeue on exactly this code.
PREEMPTED_EXIT_CODE = 75
#: Signals that stop training with a checkpoint (``ResumableCheckpoint(signals=...)``).
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: Models returned by :func:`load_checkpoint` -> what :func:`learn_resumable` and the callback still need.
_RESUMED: weakref.WeakKeyDictionary[BaseAlgorithm, dict[str, Any]] = weakref.WeakKeyDictionary()


class NonFiniteCheckpointError(ValueError):
    """Refused to write a checkpoint holding NaN or infinite parameters or optimizer state."""


class TrainingPreempted(SystemExit):
    """Training stopped on a signal after writing its checkpoint; ``code`` is :data:`PREEMPTED_EXIT_CODE`.

    Uncaught, the process exits with that code. ``path`` is the checkpoint, ``signal_name`` the signal,
    ``num_timesteps`` the env steps of the checkpoint written (None: none could be written, see :meth:`__str__`).
    """

    def __init__(self, path: Path, signal_name: str, num_timesteps: int | None) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.path, self.signal_name, self.num_timesteps = path, signal_name, num_timesteps

    def __str__(self) -> str:
        if self.num_timesteps is None:
            return (f"stopped by {self.signal_name}; no checkpoint could be written (the envs stopped after an update, "
                    f"before the state that goes with it was captured; --checkpoint-every keeps one) "
                    f"(exit code {PREEMPTED_EXIT_CODE})")
        return (f"stopped by {self.signal_name}; checkpoint {self.path} at {self.num_timesteps} env steps "
                f"(exit code {PREEMPTED_EXIT_CODE})")


# ------------------------------------------------------------------------------------------------ distributed
def _rank_and_world() -> tuple[int, int]:
    """This process's data-parallel rank and the world size (0, 1 in a single process)."""
    if th.distributed.is_available() and th.distributed.is_initialized():
        return th.distributed.get_rank(), th.distributed.get_world_size()
    # under torchrun before learn() initialises the group (e.g. while loading a checkpoint): torchrun's variables
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _gather(local: Any) -> list[Any]:
    """Every rank's ``local`` state, in rank order (a collective under torch.distributed: every rank calls it)."""
    rank, world = _rank_and_world()
    if world == 1:
        return [local]
    if not th.distributed.is_initialized():
        raise RuntimeError("a checkpoint of a data-parallel run is written inside learn() (the process group exists)")
    gathered: list[Any] = [None] * world
    th.distributed.all_gather_object(gathered, local)
    return gathered


def _any_rank(flag: bool) -> bool:
    """True if ``flag`` is true on any rank (a collective under torch.distributed, any backend)."""
    return any(_gather(flag))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ capture
def _rng_state() -> dict[str, Any]:
    cuda = th.cuda.get_rng_state_all() if th.cuda.is_available() and th.cuda.is_initialized() else None
    return {"torch": th.get_rng_state(), "cuda": cuda, "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    th.set_rng_state(state["torch"])
    if state["cuda"] is not None and th.cuda.is_available() and len(state["cuda"]) == th.cuda.device_count():
        th.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def env_rng_states(env: VecEnv) -> tuple[list[Any] | None, str]:
    """Each env's ``np_random`` bit-generator state, or None and why it cannot be read."""
    try:
        generators = env.get_attr("np_random")
    except Exception as error:  # EnvPool and custom VecEnvs may not expose it
        return None, f"{type(env).__name__}.get_attr('np_random') failed: {type(error).__name__}: {error}"
    if not all(isinstance(g, np.random.Generator) for g in generators):
        return None, "an env's np_random is not a numpy Generator"
    return [copy.deepcopy(g.bit_generator.state) for g in generators], ""


def set_env_rng_states(env: VecEnv, states: list[Any]) -> str:
    """Put each env's ``np_random`` state back; returns "" or why it could not (the env is not one that exposes it,
    e.g. an EnvPool VecEnv resuming a DummyVecEnv run)."""
    try:
        generators = env.get_attr("np_random")
    except Exception as error:
        return f"{type(env).__name__}.get_attr('np_random') failed: {type(error).__name__}: {error}"
    for index, (generator, state) in enumerate(zip(generators, states)):
        restored = np.random.Generator(type(generator.bit_generator)())
        restored.bit_generator.state = state
        env.set_attr("np_random", restored, indices=[index])
    return ""


def _sde_noise(model: BaseAlgorithm) -> dict[str, th.Tensor] | None:
    """gSDE's current exploration matrices (None without gSDE)."""
    if not getattr(model, "use_sde", False):
        return None
    dist = model.policy.action_dist
    names = ("exploration_mat", "exploration_matrices")
    return {name: getattr(dist, name).detach().clone() for name in names if getattr(dist, name, None) is not None}


def _logger_formats(model: BaseAlgorithm) -> tuple[str | None, list[str]]:
    """The logger's TensorBoard folder (None without TensorBoard) and its format names."""
    names, folder = [], None
    for output in model.logger.output_formats:
        if isinstance(output, TensorBoardOutputFormat):
            names.append("tensorboard")
            folder = output.writer.log_dir
        elif isinstance(output, HumanOutputFormat):
            names.append("stdout" if output.file is sys.stdout else "log")
        elif isinstance(output, CSVOutputFormat):
            names.append("csv")
        elif isinstance(output, JSONOutputFormat):
            names.append("json")
    return folder, names


#: VecNormalize's constructor arguments, saved so that a bare VecEnv can be wrapped as the original was
_VEC_NORMALIZE_SETTINGS = ("training", "norm_obs", "norm_reward", "clip_obs", "clip_reward", "gamma", "epsilon",
                           "norm_obs_keys")


def capture_boundary(model: BaseAlgorithm, env_side: dict[str, Any] | None = None) -> dict[str, Any]:
    """What changes while a rollout is collected, as it is now (call it at a rollout boundary).

    Parameters, optimizer state and the retained pool change only in ``train()``; they are read when the
    checkpoint is written.

    :param env_side: :func:`capture_env_side` taken earlier, when nothing has stepped the env since (default: read
        now). The env's own state does not change in ``train()``, so the one read at a rollout's end is the next
        boundary's, and stays readable after a signal ended a ``SubprocVecEnv``'s workers during the update.
    """
    vec_normalize = model.get_vec_normalize_env()
    logger = model.logger
    return {
        "counters": {name: copy.deepcopy(getattr(model, name, None)) for name in
                     ("num_timesteps", "_episode_num", "_n_updates", "_total_timesteps", "_current_progress_remaining")},
        "rng": _rng_state(),
        **(capture_env_side(model) if env_side is None else env_side),
        "vec_normalize": None if vec_normalize is None else {
            "obs_rms": copy.deepcopy(vec_normalize.obs_rms), "ret_rms": copy.deepcopy(vec_normalize.ret_rms),
            "settings": {name: copy.deepcopy(getattr(vec_normalize, name)) for name in _VEC_NORMALIZE_SETTINGS}},
        "last_obs": copy.deepcopy(model._last_obs),
        "last_episode_starts": copy.deepcopy(model._last_episode_starts),
        "ep_info_buffer": None if model.ep_info_buffer is None else list(copy.deepcopy(model.ep_info_buffer)),
        "ep_success_buffer": None if model.ep_success_buffer is None else list(model.ep_success_buffer),
        "logger_pending": {"values": dict(logger.name_to_value), "counts": dict(logger.name_to_count),
                           "excluded": dict(logger.name_to_excluded)},
        "guard_consecutive": _guard_consecutive(model),
        "sde_noise": _sde_noise(model),
        "algorithm_state": _algorithm_state(model),
    }


def capture_env_side(model: BaseAlgorithm) -> dict[str, Any]:
    """The part of a boundary read from the envs (possibly in other processes): each env's RNG state and the episodes
    in progress."""
    env = model.get_env()
    env_rng, env_rng_note = env_rng_states(env) if env is not None else (None, "no env")
    return {"env_rng": env_rng, "env_rng_note": env_rng_note, **_episodes(env)}


def _in_worker_processes(env: VecEnv | None) -> bool:
    """Whether ``env``'s envs run in worker processes (a ``SubprocVecEnv``'s or a ``ProcessVecEnv``'s), which a signal
    to the process group also ends."""
    return env is not None and isinstance(vec_layers(env)[-1], (SubprocVecEnv, ProcessVecEnv))


def _episodes(env: VecEnv | None) -> dict[str, Any]:
    """The episodes in progress (``episodes``; None where they cannot be captured, and why: ``episodes_note``)."""
    episodes, note = capture_episodes(env) if env is not None else (None, "no env")
    return {"episodes": episodes, "episodes_note": note}


def _algorithm_state(model: BaseAlgorithm) -> dict[str, Any]:
    """The algorithm's own boundary state (``_boundary_state()``, e.g. RecurrentPPO's last LSTM states); empty for
    an algorithm without that hook."""
    hook = getattr(model, "_boundary_state", None)
    return {} if hook is None else hook()


def _restore_algorithm_state(model: BaseAlgorithm, local: dict[str, Any]) -> None:
    """Give the algorithm back its boundary state (checkpoints written before the hook existed hold none)."""
    state = local.get("algorithm_state") or {}
    hook = getattr(model, "_restore_boundary_state", None)
    if state and hook is not None:
        hook(state)


def _guard_consecutive(model: BaseAlgorithm) -> int:
    guard = getattr(model, "_guard", None)
    if guard is None:
        return 0
    return int(guard.consecutive.item()) if guard.on_device else int(guard._consecutive_host)


# ------------------------------------------------------------------------------------------------ write
def check_finite(model: BaseAlgorithm) -> None:
    """NonFiniteCheckpointError naming the first parameter or optimizer-state tensor holding NaN or inf."""
    for name, parameter in model.policy.named_parameters():
        if not th.isfinite(parameter).all():
            raise NonFiniteCheckpointError(f"refusing to write a checkpoint: parameter {name!r} holds NaN or inf "
                                           "(the previous checkpoint is kept)")
    for index, state in model.policy.optimizer.state.items() if hasattr(model.policy, "optimizer") else ():
        for key, value in state.items():
            if isinstance(value, th.Tensor) and value.is_floating_point() and not th.isfinite(value).all():
                raise NonFiniteCheckpointError(f"refusing to write a checkpoint: optimizer state {key!r} holds NaN "
                                               "or inf (the previous checkpoint is kept)")


def _model_zip(model: BaseAlgorithm) -> bytes:
    buffer = io.BytesIO()
    model.save(buffer)
    return buffer.getvalue()


def _local_state(model: BaseAlgorithm, boundary: dict[str, Any]) -> dict[str, Any]:
    """The boundary state plus what only this process holds and only train() changes (the retained pool)."""
    buffer = getattr(model, "rollout_buffer", None)
    pool = buffer.state_dict() if buffer is not None and hasattr(buffer, "state_dict") else None
    return {**boundary, "rollout_buffer": pool}


def atomic_write(state: dict[str, Any], path: str | Path) -> Path:
    """``torch.save(state)`` to a temporary file next to ``path``, fsync, then ``os.replace`` it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            th.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


def save_checkpoint(model: BaseAlgorithm, path: str | Path, boundary: dict[str, Any] | None = None) -> Path | None:
    """Write a checkpoint of ``model`` to ``path`` (atomically); returns the path (None on ranks other than 0).

    :param boundary: :func:`capture_boundary` taken at the last rollout boundary (default: now; right for a model
        between ``learn()`` calls). Under torch.distributed every rank must call this (the rank-local states are
        gathered) and rank 0 writes.
    :raises NonFiniteCheckpointError: a parameter or optimizer-state tensor is not finite (nothing is written).
    """
    check_finite(model)
    local = _local_state(model, capture_boundary(model) if boundary is None else boundary)
    ranks = _gather(local)
    if _rank_and_world()[0] != 0:
        return None
    logger_dir, logger_formats = _logger_formats(model)
    state = {
        "version": CHECKPOINT_VERSION,
        "algorithm": type(model).__name__,
        "algorithm_class": f"{type(model).__module__}:{type(model).__qualname__}",
        "model_zip": _model_zip(model),
        "counters": local["counters"],
        "ranks": ranks,
        "logger": {"tensorboard_dir": logger_dir, "formats": logger_formats},
    }
    return atomic_write(state, path)


# ------------------------------------------------------------------------------------------------ read
def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint dict; FileNotFoundError / ValueError saying what is wrong with the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    try:
        state = th.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise ValueError(f"checkpoint {path} cannot be read ({type(error).__name__}: {error})") from None
    if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
        version = state.get("version") if isinstance(state, dict) else None
        raise ValueError(f"{path} is not a sb3_ppo_scale checkpoint of version {CHECKPOINT_VERSION} (found {version!r})")
    return state


#: Checkpoints written before the class was recorded were all ScalablePPO's.
_DEFAULT_ALGORITHM_CLASS = "sb3_ppo_scale.core.ppo:ScalablePPO"


def _algorithm_class(state: dict[str, Any]) -> type:
    """The class that wrote the checkpoint, imported by name (``module:qualname``)."""
    module, _, name = state.get("algorithm_class", _DEFAULT_ALGORITHM_CLASS).partition(":")
    return getattr(importlib.import_module(module), name)


def _prepare_env(env: VecEnv, local: dict[str, Any]) -> VecEnv:
    """``env`` with VecNormalize where the checkpoint has statistics: a bare VecEnv is wrapped, else required."""
    saved = local["vec_normalize"]
    if saved is None or unwrap_vec_normalize(env) is not None:
        return env
    if isinstance(env, VecEnvWrapper):
        raise ValueError("env: the checkpoint holds VecNormalize statistics but env has no VecNormalize; wrap env as "
                         "it was wrapped when the checkpoint was written")
    return VecNormalize(env, **saved["settings"])


def _restore_env(model: BaseAlgorithm, local: dict[str, Any]) -> tuple[bool, str]:
    """Reset the env without touching VecNormalize's statistics, then restore them, each env's RNG and, where the
    checkpoint holds them, the episodes in progress (then the run continues from the checkpoint's observations).
    Returns whether the episodes were put back, and why the env RNG was not ("" when it was)."""
    env, vec_normalize = model.get_env(), model.get_vec_normalize_env()
    assert env is not None
    if vec_normalize is not None:
        vec_normalize.obs_rms = copy.deepcopy(local["vec_normalize"]["obs_rms"])
        vec_normalize.ret_rms = copy.deepcopy(local["vec_normalize"]["ret_rms"])
        training, vec_normalize.training = vec_normalize.training, False
    try:
        model._last_obs = env.reset()
    finally:
        if vec_normalize is not None:
            vec_normalize.training = training
    model._last_episode_starts = np.ones((env.num_envs,), dtype=bool)
    if vec_normalize is not None:
        model._last_original_obs = vec_normalize.get_original_obs()
    # not captured (and why), or captured and put back ("") or not (why)
    rng_note = local["env_rng_note"] if local["env_rng"] is None else set_env_rng_states(env, local["env_rng"])
    episodes = local.get("episodes")  # checkpoints written before episodes were captured hold none
    if episodes is None or rng_note or not restore_episodes(env, episodes):
        return False, rng_note
    model._last_obs = _in_layout_of(model._last_obs, local["last_obs"])
    model._last_episode_starts = copy.deepcopy(local["last_episode_starts"])
    if vec_normalize is not None:
        model._last_original_obs = vec_normalize.get_original_obs()
    return True, ""


def _in_layout_of(fresh: Any, saved: Any) -> Any:
    """``saved`` (observations) in new arrays laid out in memory as ``fresh`` (the env's own observations after its
    reset) are: a checkpoint stores arrays C-ordered, while e.g. VecTransposeImage's observations are transposed views,
    and a convolution on other strides may round differently. Dicts key by key; anything else is copied as it is."""
    if isinstance(saved, dict) and isinstance(fresh, dict):
        return {key: _in_layout_of(fresh.get(key), value) for key, value in saved.items()}
    if isinstance(saved, np.ndarray) and isinstance(fresh, np.ndarray) and fresh.shape == saved.shape \
            and fresh.dtype == saved.dtype:
        laid_out = fresh.copy(order="K")
        np.copyto(laid_out, saved)
        return laid_out
    return copy.deepcopy(saved)


def _restarted_envs(model: BaseAlgorithm, local: dict[str, Any], continued: bool) -> int:
    """How many envs start from another observation than the checkpointed run would have (0: exact; also when the
    episodes in progress were ``continued``)."""
    if continued:
        return 0
    saved_obs, starts = local["last_obs"], local["last_episode_starts"]
    if saved_obs is None or starts is None or isinstance(saved_obs, dict):
        return 0 if saved_obs is None else int(np.sum(~np.asarray(starts, dtype=bool)))
    same = np.all(np.asarray(saved_obs).reshape(len(starts), -1) == np.asarray(model._last_obs).reshape(len(starts), -1), axis=1)
    return int(np.sum(~(same & np.asarray(starts, dtype=bool))))


def _restore_counters(model: BaseAlgorithm, counters: dict[str, Any]) -> None:
    for name, value in counters.items():
        if value is not None:
            setattr(model, name, value)


def _restore_local(model: BaseAlgorithm, local: dict[str, Any]) -> None:
    if local["rollout_buffer"] is not None and hasattr(model.rollout_buffer, "load_state_dict"):
        model.rollout_buffer.load_state_dict(local["rollout_buffer"])
    model.ep_info_buffer = deque(local["ep_info_buffer"] or [], maxlen=model._stats_window_size)
    model.ep_success_buffer = deque(local["ep_success_buffer"] or [], maxlen=model._stats_window_size)
    guard = getattr(model, "_guard", None)
    if guard is not None:
        guard._consecutive_host = local["guard_consecutive"]
        guard.consecutive.fill_(local["guard_consecutive"])
    _restore_sde_noise(model, local["sde_noise"])
    _restore_algorithm_state(model, local)
    _set_rng_state(local["rng"])


def _restore_sde_noise(model: BaseAlgorithm, noise: dict[str, th.Tensor] | None) -> None:
    if noise:
        for name, value in noise.items():
            setattr(model.policy.action_dist, name, value.to(model.device))


def load_checkpoint(path: str | Path, env: VecEnv, device: str | th.device = "auto", cls: type | None = None,
                    **kwargs: Any) -> BaseAlgorithm:
    """The model of a checkpoint, ready to continue training on ``env`` (see the module docstring).

    ``env`` is built as for the original run (same number of envs; VecNormalize is added to a bare VecEnv when the
    checkpoint has statistics); it is reset here. Continue with :func:`learn_resumable` (same budget, same
    TensorBoard run). Under torch.distributed each rank takes its own rank's state.

    :param cls: the algorithm class (default: the class that wrote the checkpoint); ``kwargs`` go to its ``load``.
    """
    state = read_checkpoint(path)
    written_by = _algorithm_class(state)
    if cls is None:
        cls = written_by
    elif not (issubclass(cls, written_by) or issubclass(written_by, cls)):
        raise ValueError(f"checkpoint {path} was written by {written_by.__name__}; load it with "
                         f"{written_by.__name__}.load_checkpoint (or sb3_ppo_scale.checkpoint.load_checkpoint), not "
                         f"{cls.__name__}'s")
    rank, world = _rank_and_world()
    if len(state["ranks"]) != world:
        raise ValueError(f"checkpoint {path} was written by {len(state['ranks'])} rank(s), this run has {world}")
    local = state["ranks"][rank]
    saved_envs = None if local["last_episode_starts"] is None else len(local["last_episode_starts"])
    if saved_envs is not None and env.num_envs != saved_envs:
        raise ValueError(f"env has {env.num_envs} envs, checkpoint {path} was written with {saved_envs}: build env "
                         "as for the checkpointed run")
    model = cls.load(io.BytesIO(state["model_zip"]), env=_prepare_env(env, local), device=device, **kwargs)
    _restore_counters(model, state["counters"])
    continued, rng_note = _restore_env(model, local)
    _restore_local(model, local)
    notes = []
    if rng_note:
        notes.append(f"env RNG not restored ({rng_note})")
    restarted = _restarted_envs(model, local, continued)
    if restarted:
        why = local.get("episodes_note") or "the env is not built as the checkpointed one was"
        notes.append(f"{restarted} env(s) restart their episode (mid-episode at the checkpoint, or a random reset; "
                     f"episodes in progress not restored: {why})")
    _RESUMED[model] = {"state": state, "local": local, "notes": notes, "path": Path(path), "last_obs": model._last_obs}
    return model


def resume_notes(model: BaseAlgorithm) -> list[str]:
    """What the resume of ``model`` could not restore exactly (empty: the run continues bit-identically)."""
    entry = _RESUMED.get(model)
    return [] if entry is None else list(entry["notes"])


# ------------------------------------------------------------------------------------------------ callback
class ResumableCheckpoint(BaseCallback):
    """Writes a checkpoint to ``path`` every ``every_steps`` env steps and when SIGTERM/SIGINT arrives.

    Checkpoints are taken at rollout boundaries. On a signal the current rollout is abandoned (its env steps are
    discarded; the checkpoint is the state at its start) or, when the signal arrives during an update, the
    update finishes first; then ``learn()`` returns and :attr:`preempted` is True (:func:`learn_resumable` then
    raises :class:`TrainingPreempted`). A second SIGINT interrupts at once (KeyboardInterrupt). A final
    checkpoint is written when ``learn()`` ends normally.

    Under torch.distributed every rank runs this callback: a rank that receives the signal abandons its rollout,
    ScalablePPO's data-parallel rollout end merges the stop decision so every rank stops after that rollout, and
    every rank writes the state at that rollout's start (the rank-local states are gathered, rank 0 writes).

    :param path: the checkpoint file (its folder is created).
    :param every_steps: env steps (all envs together) between checkpoints, >= 1, or None (only on signals and at
        the end; default).
    :param signals: signals that stop training with a checkpoint (default SIGTERM and SIGINT; ``()``: none).
        Handlers are installed for the duration of ``learn()`` (main thread only) and then restored.
    """

    def __init__(self, path: str | Path, every_steps: int | None = None,
                 signals: Sequence[signal.Signals] = DEFAULT_SIGNALS, verbose: int = 0) -> None:
        super().__init__(verbose)
        if every_steps is not None and (not is_int(every_steps) or every_steps < 1):
            raise ValueError(f"every_steps must be None or an int >= 1, got {every_steps!r}")
        self.path, self.every_steps, self.signals = Path(path), every_steps, tuple(signals)
        self.preempted = False  #: True once a signal stopped training (the checkpoint is written)
        self.signal_name: str | None = None
        self.written: list[int] = []  #: num_timesteps of each checkpoint written by this callback
        self._signal: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._boundary: dict[str, Any] | None = None
        self._boundary_written = False
        self._in_rollout = False
        self._updates_at_rollout_end: int | None = None
        self._env_side_at_rollout_end: tuple[int, dict[str, Any]] | None = None
        self._last_written = 0

    # -------------------------------------------------------------------------------- signals
    def _on_training_start(self) -> None:
        self._last_written = self.model.num_timesteps
        self._install_handlers()

    def _install_handlers(self) -> None:
        for signum in self.signals:
            try:
                self._previous_handlers[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: the caller handles signals
                self._previous_handlers.clear()
                return

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self._signal is not None and signum == signal.SIGINT:
            self._restore_handlers()
            raise KeyboardInterrupt
        self._signal = signum
        name = signal.Signals(signum).name
        os.write(2, f"received {name}: stopping training, writing checkpoint {self.path}\n".encode())

    @property
    def stop_requested(self) -> bool:
        """A stop signal arrived during this ``learn()``."""
        return self._signal is not None

    # -------------------------------------------------------------------------------- rollouts
    def _on_rollout_start(self) -> None:
        _reapply_resume(self.model)
        self._boundary, self._boundary_written, self._in_rollout = capture_boundary(self.model), False, True
        # periodic writes only: every rank decides alike here (the same global num_timesteps)
        if self.every_steps is not None and self.model.num_timesteps - self._last_written >= self.every_steps:
            self._write(self._boundary)

    def _on_rollout_end(self) -> None:
        self._in_rollout, self._updates_at_rollout_end = False, self.model._n_updates
        # envs in worker processes: read their state now, while they live, for write_now() after an update
        self._env_side_at_rollout_end = (self.model.num_timesteps, capture_env_side(self.model)) \
            if _in_worker_processes(self.model.get_env()) else None

    def _on_step(self) -> bool:
        return not self.stop_requested  # under torchrun the ranks' stop decisions are merged after the rollout

    def _on_training_end(self) -> None:
        self._restore_handlers()
        # the last rollout was abandoned, or collected and not trained on (learn() stopped after it, e.g. on another
        # rank's signal): the state at its start; else learn() ended after an update: that state
        untrained = self._in_rollout or self.model._n_updates == self._updates_at_rollout_end
        if untrained and self._boundary is not None:
            if not self._boundary_written:
                self._write(self._boundary)
        else:
            self._write(capture_boundary(self.model))
        if _any_rank(self.stop_requested):
            self.preempted = True
            self.signal_name = signal.Signals(self._signal).name if self._signal is not None else "a signal on another rank"

    def write_now(self) -> None:
        """Write the checkpoint of the state now when the env can no longer be read (e.g. a ``SubprocVecEnv``'s
        workers died of the same signal): the last rollout boundary's while the model has not been updated since; after
        an update, the model now with the env state read at that rollout's end (nothing steps the env in between).
        Where neither holds, nothing is written and the checkpoint written last, if any, stays the one to resume
        from."""
        if self._boundary is None:
            return
        if self.model._n_updates == self._boundary["counters"]["_n_updates"]:
            if not self._boundary_written:
                self._write(self._boundary)
            return
        if self._env_side_at_rollout_end is not None and self._env_side_at_rollout_end[0] == self.model.num_timesteps:
            self._write(capture_boundary(self.model, env_side=self._env_side_at_rollout_end[1]))

    def _write(self, boundary: dict[str, Any]) -> None:
        save_checkpoint(self.model, self.path, boundary)
        self._boundary_written = boundary is self._boundary
        self._last_written = boundary["counters"]["num_timesteps"]
        self.written.append(self._last_written)
        if self.verbose >= 1:
            print(f"checkpoint {self.path} at {self._last_written} env steps", flush=True)


def _reapply_resume(model: BaseAlgorithm) -> None:
    """At the first rollout after :func:`load_checkpoint`: the RNG states and gSDE noise as they were at the
    checkpoint's boundary, whatever ran in between (SB3 resamples gSDE noise; a data-parallel rank > 0 is reseeded
    and may reset its envs when learn() starts: then the envs are reset and restored again)."""
    entry = _RESUMED.get(model)
    if entry is None or entry.get("reapplied"):
        return
    entry["reapplied"] = True
    if model._last_obs is not entry["last_obs"]:  # learn() reset the envs after load_checkpoint
        _restore_env(model, entry["local"])
    _restore_sde_noise(model, entry["local"]["sde_noise"])
    _restore_algorithm_state(model, entry["local"])
    _set_rng_state(entry["local"]["rng"])


# ------------------------------------------------------------------------------------------------ learn
def _continue_logger(model: BaseAlgorithm, entry: dict[str, Any]) -> None:
    """The checkpointed run's logger: same TensorBoard folder (events after the checkpoint's step purged), its
    pending values restored; silent on data-parallel ranks other than 0."""
    if _rank_and_world()[0] != 0:  # data-parallel: rank 0 alone logs (a writer here would purge rank 0's events)
        model.set_logger(Logger(folder=None, output_formats=[]))
        return
    saved = entry["state"]["logger"]
    folder = saved["tensorboard_dir"]
    logger = configure(folder, [name for name in saved["formats"] if name != "log" or folder] or [""])
    step = int(entry["state"]["counters"]["num_timesteps"])
    for output in logger.output_formats:
        if isinstance(output, TensorBoardOutputFormat):  # TensorBoard drops events of a killed run after `step`
            from torch.utils.tensorboard import SummaryWriter

            output.writer.close()
            output.writer = SummaryWriter(log_dir=folder, purge_step=step + 1)
    pending = entry["local"]["logger_pending"]
    logger.name_to_value.update(pending["values"])
    logger.name_to_count.update(pending["counts"])
    logger.name_to_excluded.update(pending["excluded"])
    model.set_logger(logger)


def learn_resumable(model: BaseAlgorithm, total_timesteps: int | None, checkpoint: ResumableCheckpoint,
                    callback: Any = None, **learn_kwargs: Any) -> BaseAlgorithm:
    """``model.learn()`` until ``num_timesteps`` reaches ``total_timesteps``, checkpointing with ``checkpoint``.

    A model from :func:`load_checkpoint` continues its run: ``learn()`` gets what is left of the budget with
    ``reset_num_timesteps=False`` (schedules see the same progress), and logs into the same TensorBoard run.

    :param total_timesteps: the whole run's budget in env steps (None: the checkpoint's; required for a new model).
    :param callback: further callbacks (run after ``checkpoint``).
    :param learn_kwargs: ``log_interval``, ``tb_log_name``, ``progress_bar``.
    :raises TrainingPreempted: a signal stopped training; the checkpoint is written.
    """
    entry = _RESUMED.get(model)
    callbacks = CallbackList([checkpoint, *(callback if isinstance(callback, list) else [callback] if callback else [])])
    if entry is None:
        if total_timesteps is None:
            raise ValueError("total_timesteps must be given for a model that was not loaded from a checkpoint")
        learn = lambda: model.learn(total_timesteps, callback=callbacks, **learn_kwargs)  # noqa: E731
    else:
        budget = int(entry["state"]["counters"]["_total_timesteps"]) if total_timesteps is None else total_timesteps
        _continue_logger(model, entry)
        remaining = max(0, budget - model.num_timesteps)
        learn = lambda: model.learn(remaining, callback=callbacks, reset_num_timesteps=False, **learn_kwargs)  # noqa: E731
    try:
        learn()
    except Exception:
        if not checkpoint.stop_requested:
            raise
        checkpoint.write_now()  # e.g. a SubprocVecEnv worker died of the same signal
        raise TrainingPreempted(checkpoint.path, signal.Signals(checkpoint._signal).name,
                                checkpoint.written[-1] if checkpoint.written else None) from None
    finally:
        _RESUMED.pop(model, None)
        checkpoint._restore_handlers()  # learn() raised before _on_training_end: the process's handlers come back
    if checkpoint.preempted:
        raise TrainingPreempted(checkpoint.path, checkpoint.signal_name or "a signal",
                                checkpoint.written[-1] if checkpoint.written else model.num_timesteps)
    return model


# ------------------------------------------------------------------------------------------------ train command
#: The checkpoint's file name in a ``sb3-ppo-scale train`` run folder.
CHECKPOINT_NAME = "checkpoint.pt"


def add_train_arguments(parser: Any) -> None:
    """``--checkpoint-every N`` and ``--resume`` of ``sb3-ppo-scale train``."""
    parser.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                        help=f"write <log-dir>/{CHECKPOINT_NAME} every N env steps (at rollout boundaries; default: only "
                             f"on SIGTERM/SIGINT and at the end). SIGTERM/SIGINT write it and exit with code "
                             f"{PREEMPTED_EXIT_CODE}")
    parser.add_argument("--resume", action="store_true",
                        help=f"continue the run from <log-dir>/{CHECKPOINT_NAME} if it exists (same budget, same "
                             "TensorBoard run); start a new run otherwise")


def train_checkpoint(run_dir: Path, every_steps: int | None) -> ResumableCheckpoint:
    """The train command's checkpoint callback (ValueError naming ``--checkpoint-every`` if it is not >= 1)."""
    if every_steps is not None and every_steps < 1:
        raise ValueError(f"--checkpoint-every must be >= 1 env step, got {every_steps}")
    return ResumableCheckpoint(run_dir / CHECKPOINT_NAME, every_steps)


def checkpoint_to_resume(run_dir: Path, resume: bool) -> Path | None:
    """The run folder's checkpoint when ``--resume`` asks for it and it exists. Before the envs are built: a resumed
    run keeps the earlier Monitor CSVs (renamed ``<i>.part<k>.monitor.csv``; SB3's ``load_results`` reads them all)."""
    path = run_dir / CHECKPOINT_NAME
    if not resume or not path.is_file():
        if resume:
            print(f"--resume: no {path}; starting a new run", file=sys.stderr)
        return None
    monitor = run_dir / "monitor"
    if int(os.environ.get("RANK", "0")) != 0:  # torchrun: rank 0 alone writes Monitor files
        return path
    part = 1 + len({p.name.split(".")[1] for p in monitor.glob("*.part*.monitor.csv")})
    for csv in monitor.glob("*.monitor.csv"):
        if ".part" not in csv.name:
            csv.rename(csv.with_name(csv.name.replace(".monitor.csv", f".part{part}.monitor.csv")))
    return path


def resume_train_model(path: Path, env: VecEnv, device: str, n_timesteps: int) -> BaseAlgorithm:
    """The train command's model from its checkpoint; ValueError if ``--n-timesteps`` differs from its budget."""
    model = load_checkpoint(path, env, device=device)
    budget = int(model._total_timesteps)
    if budget != n_timesteps:
        raise ValueError(f"--n-timesteps {n_timesteps} differs from the budget of the checkpointed run ({budget}); "
                         "resume with the same budget")
    notes = "; ".join(resume_notes(model))
    rank, world = _rank_and_world()
    if rank == 0:  # under torchrun one line, and a line from another rank only where its own state was not restored
        print(f"resuming {path} at {model.num_timesteps} of {budget} env steps" + (f" ({notes})" if notes else ""),
              flush=True)
    elif notes:
        print(f"rank {rank} of {world}: {notes}", flush=True)
    return model


__all__ = [
    "CHECKPOINT_VERSION", "PREEMPTED_EXIT_CODE", "NonFiniteCheckpointError", "ResumableCheckpoint", "TrainingPreempted",
    "capture_boundary", "env_rng_states", "learn_resumable", "load_checkpoint", "read_checkpoint", "resume_notes",
    "save_checkpoint", "set_env_rng_states",
]
