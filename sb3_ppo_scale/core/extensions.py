"""What the layers above the core plug into it. The core defines these hooks and never imports their providers.

``sb3_ppo_scale/__init__.py`` installs the package's own providers when the package is imported (so every public
class has them, whichever module a user imports first):

- :class:`DataParallel`: how a model trains as one of several ranks (:mod:`sb3_ppo_scale.distributed`). Without a
  provider, or in a single process, :data:`SINGLE_PROCESS`.
- :data:`CheckpointLoader`: ``ScalablePPO.load_checkpoint`` (:func:`sb3_ppo_scale.checkpoint.load_checkpoint`).

A test double or another backend can :func:`install` its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch as th

from sb3_ppo_scale.core.update.step import LOCAL, Reducer


class DataParallel(Protocol):
    """The data-parallel side of a model's life; each call gets the model (``model._reducer`` is what
    :meth:`attach` returned)."""

    def rank_device(self, device: th.device) -> th.device:
        """The policy device of this rank (at set-up, before :meth:`attach`)."""
        ...

    def attach(self, model: Any) -> Reducer:
        """Set-up at the start of ``learn()``: the reducer that sums over ranks (:data:`LOCAL` in one process)."""
        ...

    def after_rollout(self, model: Any, start_timesteps: int, collected: bool) -> bool:
        """End of a rank's rollout (only called with more than one rank): whether training goes on, on every rank."""
        ...

    def local_batch_size(self, model: Any, n_samples: int) -> int:
        """This rank's share of ``batch_size`` when the rank holds ``n_samples`` samples to train on."""
        ...

    def global_mean_kl(self, model: Any, kl: th.Tensor, n_samples: int) -> th.Tensor:
        """The rollout-mean KL over every rank's samples, from this rank's mean ``kl`` over ``n_samples``."""
        ...


class SingleProcess:
    """One process: the model's own device, batch size and KL; nothing to combine."""

    def rank_device(self, device: th.device) -> th.device:
        return device

    def attach(self, model: Any) -> Reducer:
        return LOCAL

    def after_rollout(self, model: Any, start_timesteps: int, collected: bool) -> bool:
        return collected

    def local_batch_size(self, model: Any, n_samples: int) -> int:
        return int(model.batch_size)

    def global_mean_kl(self, model: Any, kl: th.Tensor, n_samples: int) -> th.Tensor:
        return kl


SINGLE_PROCESS = SingleProcess()

#: ``(path, env, device, cls, **kwargs) -> model``: the model of an exact-resume checkpoint, ready to continue.
CheckpointLoader = Callable[..., Any]


@dataclass
class Extensions:
    """The providers in force (see the module docstring)."""

    data_parallel: DataParallel = SINGLE_PROCESS
    checkpoint_loader: CheckpointLoader | None = None


EXTENSIONS = Extensions()


def install(data_parallel: DataParallel | None = None, checkpoint_loader: CheckpointLoader | None = None) -> None:
    """Install providers (each argument given replaces the one in force)."""
    if data_parallel is not None:
        EXTENSIONS.data_parallel = data_parallel
    if checkpoint_loader is not None:
        EXTENSIONS.checkpoint_loader = checkpoint_loader


def load_checkpoint(path: Any, env: Any, device: Any, cls: type, **kwargs: Any) -> Any:
    """The installed :data:`CheckpointLoader`'s model; RuntimeError when none is installed."""
    if EXTENSIONS.checkpoint_loader is None:
        raise RuntimeError("no checkpoint loader is installed: import sb3_ppo_scale (its __init__ installs "
                           "sb3_ppo_scale.checkpoint.load_checkpoint)")
    return EXTENSIONS.checkpoint_loader(path, env, device=device, cls=cls, **kwargs)
