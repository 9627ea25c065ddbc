"""Checks of single arguments, used by :class:`~sb3_ppo_scale.core.config.ScaleConfig` (and of PPO's own numeric
arguments, :func:`check_ppo_arguments`): clear errors naming the argument and what is allowed."""

from __future__ import annotations

import inspect
import math
import numbers
import os
import shutil
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch as th


def is_int(value: object) -> bool:
    """An integer (a Python int or a NumPy integer scalar, as PPO takes them) that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_number(value: object) -> bool:
    """A real number (int, float, or a NumPy scalar of either) that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def plain_number(value: object) -> object:
    """A NumPy number as the Python int or float it holds; anything else unchanged. SB3's schedules
    (``learning_rate``, ``clip_range``, ``clip_range_vf``) take a constant only as a Python ``int`` or ``float``: a
    ``np.float32(3e-4)`` was an AssertionError from inside SB3 about "the learning rate schedule", even for
    ``clip_range``."""
    return value.item() if isinstance(value, np.generic) and is_number(value) else value


def check_batching(batch_size: object, grad_accum_steps: object, normalize_advantage: bool) -> None:
    """``batch_size`` and ``grad_accum_steps`` are positive ints, accumulation no finer than one sample."""
    if not is_int(batch_size) or batch_size < 1:  # type: ignore[operator]
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if normalize_advantage and batch_size < 2:  # type: ignore[operator]
        raise ValueError(
            f"batch_size must be >= 2 when normalize_advantage=True (advantages are normalised per minibatch), "
            f"got {batch_size!r}; pass normalize_advantage=False to train on single samples"
        )
    if not is_int(grad_accum_steps) or grad_accum_steps < 1:  # type: ignore[operator]
        raise ValueError(f"grad_accum_steps must be an int >= 1, got {grad_accum_steps!r}")
    if grad_accum_steps > batch_size:  # type: ignore[operator]
        raise ValueError(
            f"grad_accum_steps must be between 1 and batch_size={batch_size} (each micro-batch needs a sample), "
            f"got {grad_accum_steps!r}"
        )


def schedule_value(value: object) -> float | None:
    """What a schedule returned, as the float SB3 trains with (its ``FloatSchedule`` casts every value with
    ``float()``: a Python or NumPy number, a 0-d array, a one-element tensor); None for what is no number (a bool, a
    str, though ``float()`` reads "3e-4") or what ``float()`` refuses."""
    if isinstance(value, (bool, np.bool_, str, bytes)):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def check_scheduled_value(name: str, value: float, progress_remaining: float, finite: bool = False) -> float:
    """``value``, what ``name``'s schedule gave for this update, unless it is nan (or, with ``finite``, +-inf):
    then a ValueError naming it. SB3 trains on with a nan ``clip_range`` (a nan loss whose policy gradient is zero:
    only the value function learns) or a nan / inf ``learning_rate`` (nan parameters, and a torch distribution error
    in the next rollout); ScalablePPO would skip the update's optimizer steps as non-finite until ``NonFiniteError``.
    Other values (0, negative: SB3's progress overshoots below 0 in a last rollout past the budget) train as in PPO."""
    if value != value or (finite and abs(value) == math.inf):
        allowed = "finite numbers" if finite else "numbers (not nan)"
        raise ValueError(f"{name}'s schedule gave {value!r} at progress_remaining={progress_remaining:.6g}; it must "
                         f"give {allowed} for every update")
    return value


def _positive_at_start(schedule: object) -> bool:
    """A schedule's value at the start of training (``progress_remaining=1``) is a number > 0."""
    value = schedule_value(schedule(1.0))  # type: ignore[operator]  # SB3 calls its lr schedule at 1 when it builds too
    return value is not None and value > 0


#: PPO's own numeric arguments that SB3 takes without a check, although some values silently stop or reverse
#: learning (``n_epochs=0`` never updates, ``max_grad_norm=-1`` turns every step into gradient ascent, a negative
#: ``target_kl`` stops every epoch at its first minibatch, ``clip_range <= 0`` clips every ratio to at most 1):
#: name -> (what is allowed, the test). ``clip_range_vf``'s sign SB3 checks itself, ``learning_rate``
#: :func:`~sb3_ppo_scale.core.update.lr.resolve_learning_rate`.
PPO_ARGUMENTS = {
    "n_steps": ("an int >= 1", lambda v: is_int(v) and v >= 1),
    "n_epochs": ("an int >= 1", lambda v: is_int(v) and v >= 1),
    "gamma": ("a number in [0, 1]", lambda v: is_number(v) and 0 <= v <= 1),
    "gae_lambda": ("a number in [0, 1]", lambda v: is_number(v) and 0 <= v <= 1),
    "clip_range": ("a number > 0 or a schedule whose value at the start (progress_remaining=1) is > 0",
                   lambda v: _positive_at_start(v) if callable(v) else is_number(v) and v > 0),
    "vf_coef": ("a finite number >= 0", lambda v: is_number(v) and 0 <= v < math.inf),  # inf: an inf loss
    "ent_coef": ("a finite number", lambda v: is_number(v) and math.isfinite(v)),
    "max_grad_norm": ("a number > 0 (math.inf: no clipping)", lambda v: is_number(v) and v > 0),
    "target_kl": ("None or a number > 0", lambda v: v is None or (is_number(v) and v > 0)),
    # only the type: SB3 asserts a number's sign itself (its tests expect that AssertionError), but reports anything
    # else as "The learning rate schedule must be a float or a callable"
    "clip_range_vf": ("None, a number > 0 or a schedule", lambda v: v is None or callable(v) or is_number(v)),
}


def check_ppo_arguments(values: Mapping[str, object]) -> None:
    """ValueError naming the first of PPO's own arguments (:data:`PPO_ARGUMENTS`) whose value in ``values`` (the
    constructor's arguments, or a model's ``vars()``) no PPO run can mean; arguments missing from ``values`` are
    skipped."""
    for name, (allowed, ok) in PPO_ARGUMENTS.items():
        if name in values and not ok(values[name]):
            raise ValueError(f"{name} must be {allowed}, got {values[name]!r}")


def check_net_arch(policy_kwargs: Mapping[str, Any] | None, policy_class: type | None = None) -> None:
    """Every integer layer size in ``policy_kwargs["net_arch"]`` (a list, ``dict(pi=[...], vf=[...])``, or SB3's
    older ``[dict(...)]``) is >= 1: SB3 builds a zero-width layer and trains a policy that ignores its
    observations. When ``policy_class`` builds SB3's ``MlpExtractor`` from it (its ``_build_mlp_extractor`` is SB3's
    or sb3-contrib's), every entry must be an int: a float, bool, str or None there is a TypeError from inside
    ``torch.nn.Linear`` that names no argument. Anything else in ``net_arch`` (a custom policy's own layout) is left
    to the policy."""
    net_arch = (policy_kwargs or {}).get("net_arch")
    if isinstance(net_arch, list) and net_arch and isinstance(net_arch[0], dict):
        net_arch = net_arch[0]
    parts = net_arch.values() if isinstance(net_arch, dict) else [net_arch]
    sizes = [size for part in parts if isinstance(part, (list, tuple)) for size in part]
    build = getattr(policy_class, "_build_mlp_extractor", None)
    only_ints = build is not None and build.__module__.split(".")[0] in ("stable_baselines3", "sb3_contrib")
    if any(size < 1 if is_int(size) else only_ints for size in sizes):
        raise ValueError(f"policy_kwargs['net_arch'] layer sizes must be ints >= 1 (an empty list: no hidden layer), "
                         f"got {(policy_kwargs or {})['net_arch']!r}")


def check_learn_arguments(total_timesteps: object, callback: object, log_interval: object) -> None:
    """``learn()``'s arguments where SB3 fails late and without naming them (``log_interval=0``: a
    ZeroDivisionError after the first rollout and update; a str ``callback``: "'str' object is not callable" at the
    first step), or silently trains nothing (``total_timesteps=nan``). What PPO trains with is taken: a float budget
    (rounded up to whole rollouts), 0 or less (nothing to do), ``math.inf``, a negative ``log_interval``."""
    from stable_baselines3.common.callbacks import BaseCallback

    if not is_number(total_timesteps):
        raise TypeError(f"learn(): total_timesteps must be a number of env steps, got {total_timesteps!r}")
    if total_timesteps != total_timesteps:
        raise ValueError("learn(): total_timesteps must be a number of env steps, got nan")
    if log_interval is not None and not (is_number(log_interval) and log_interval != 0 and math.isfinite(log_interval)):
        raise ValueError(f"learn(): log_interval must be None (no logs) or a non-zero number of iterations between "
                         f"logs, got {log_interval!r}")
    if isinstance(callback, list):  # SB3 makes a CallbackList of it, which takes BaseCallbacks only
        usable = all(isinstance(item, BaseCallback) for item in callback)
    else:  # SB3 wraps a function in a ConvertCallback and calls it at every step
        usable = callback is None or isinstance(callback, BaseCallback) or (
            callable(callback) and not isinstance(callback, type))
    if not usable:
        raise TypeError(f"learn(): callback must be None, a BaseCallback, a list of BaseCallbacks or a function "
                        f"(locals, globals) -> bool, got {callback!r}")


def resolve_device(value: object, argument: str, policy_device: th.device, types: tuple[str, ...] = ("cpu", "cuda", "mps")) -> th.device:
    """Turn a device argument ("auto" = ``policy_device``, "cpu", "cuda", "cuda:1", "mps", a torch.device) into a device
    of one of ``types`` that exists here; the error names ``argument``."""
    if isinstance(value, str) and value == "auto":
        return policy_device
    allowed = f"'auto', {', '.join(repr(t) for t in types)}, 'cuda:<index>' or a torch.device of those types"
    try:
        device = th.device(value)  # type: ignore[arg-type]
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{argument} must be {allowed}, got {value!r}") from error
    if device.type not in types:
        raise ValueError(f"{argument} must be {allowed}, got {value!r}")
    if device.type == "cuda":
        if not th.cuda.is_available():
            raise ValueError(f"{argument}={value!r} but CUDA is not available here; use 'auto' or 'cpu'")
        index = device.index or 0
        if index >= th.cuda.device_count():
            raise ValueError(
                f"{argument}={value!r} does not exist: this machine has {th.cuda.device_count()} CUDA "
                f"device(s) (cuda:0..cuda:{th.cuda.device_count() - 1})"
            )
    elif device.type == "mps" and not th.backends.mps.is_available():
        raise ValueError(f"{argument}={value!r} but MPS is not available here; use 'auto' or 'cpu'")
    return device


def resolve_buffer_device(buffer_device: object, policy_device: th.device) -> th.device:
    """``buffer_device`` as a device (see :func:`resolve_device`)."""
    return resolve_device(buffer_device, "buffer_device", policy_device)


def check_cuda_graphs(cuda_graphs: object, policy_device: th.device, buffer_device: th.device, optimizer: object) -> None:
    """``cuda_graphs=True`` needs the policy and the rollout on one CUDA device ("cuda" and "cuda:0" are one) and a
    capturable optimizer."""
    if not isinstance(cuda_graphs, bool):
        raise ValueError(f"cuda_graphs must be True or False, got {cuda_graphs!r}")
    if not cuda_graphs:
        return
    if policy_device.type != "cuda":
        raise ValueError(f"cuda_graphs=True needs the policy on a CUDA device (device='cuda'), but it is on {policy_device}")
    if buffer_device.type != policy_device.type or (buffer_device.index or 0) != (policy_device.index or 0):
        raise ValueError(
            f"cuda_graphs=True needs buffer_device to be the policy's device ({policy_device}) or 'auto', got {buffer_device}"
        )
    defaults = getattr(optimizer, "defaults", {})
    if "capturable" not in defaults:
        raise ValueError(
            f"cuda_graphs=True needs an optimizer that supports capturable=True (Adam, AdamW, RMSprop, ...); "
            f"policy optimizer_class is {type(optimizer).__name__}"
        )


def check_compile_loss(compile_loss: object, cuda_graphs: bool) -> None:
    """``compile_loss`` is a bool and is not combined with ``cuda_graphs`` (capturing compiled kernels is untested)."""
    if not isinstance(compile_loss, bool):
        raise ValueError(f"compile_loss must be True or False, got {compile_loss!r}")
    if compile_loss and cuda_graphs:
        raise ValueError(
            "compile_loss=True cannot be combined with cuda_graphs=True: choose one (cuda_graphs for small models on "
            "a GPU, compile_loss for large minibatches on a CPU)"
        )


def cxx_compiler() -> str | None:
    """The C++ compiler torch.compile's inductor would build CPU kernels with (``$CXX``, g++, clang++ or c++, the
    first on PATH), or None."""
    for name in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        if name and shutil.which(name):
            return name
    return None


def check_compile_toolchain(compile_loss: bool, device: th.device) -> None:
    """``compile_loss=True`` needs what torch.compile's inductor builds kernels with: a C++ compiler for the CPU
    (``$CXX``, g++, clang++ or c++), Triton for CUDA. Checked before learning, so the error is not a compiler
    traceback in the middle of the first ``train()``."""
    if not compile_loss:
        return
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise ValueError("compile_loss=True on CUDA needs Triton (pip install triton); or pass compile_loss=False")
        return
    if cxx_compiler() is None:
        raise ValueError(
            "compile_loss=True on the CPU needs a C++ compiler for torch.compile (g++, clang++ or $CXX), and none "
            "was found on PATH; install one (e.g. apt install g++) or pass compile_loss=False"
        )


#: rollout-buffer constructor arguments that the algorithm fills in itself
_BUFFER_ARGS_SET_BY_ALGORITHM = {"self", "buffer_size", "observation_space", "action_space", "device", "gae_lambda",
                                 "gamma", "n_envs"}


def check_rollout_buffer_kwargs(buffer_class: type | None, kwargs: dict | None) -> None:
    """Every key of ``rollout_buffer_kwargs`` is an argument of ``rollout_buffer_class`` (a typo would otherwise be a
    bare TypeError deep inside SB3)."""
    if buffer_class is None or not kwargs:
        return
    parameters = inspect.signature(buffer_class.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    allowed = sorted(set(parameters) - _BUFFER_ARGS_SET_BY_ALGORITHM)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(
            f"rollout_buffer_kwargs has {', '.join(map(repr, unknown))}, which {buffer_class.__name__} does not take; "
            f"allowed: {', '.join(map(repr, allowed)) or 'none'}"
        )
