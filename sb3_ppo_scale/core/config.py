"""The arguments ScalablePPO adds to SB3's PPO, as one frozen object validated in one place.

:meth:`ScaleConfig.validate` runs in ``ScalablePPO._setup_model``, the point of SB3's lifecycle that both
construction and ``ScalablePPO.load(path, **kwargs)`` pass through, so a bad value given either way gets the same
error naming the argument and what is allowed. (Construction also runs the batching check before SB3's own
``batch_size > 1`` assertion, so that error reads like the others.) What depends on the machine (CUDA, a C++
compiler) is checked by :meth:`ScaleConfig.check_runtime` at construction and before learning, not at load: a
model trained on a GPU loads anywhere for evaluation.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch as th

from sb3_ppo_scale.core.checks import (
    check_batching,
    check_compile_loss,
    check_compile_toolchain,
    check_cuda_graphs,
    is_int,
    is_number,
    resolve_buffer_device,
)
from sb3_ppo_scale.core.update.kl import KL_COEF_BOUNDS, AdaptiveKLCoefficient, KLCoefficient
from sb3_ppo_scale.core.update.objectives import OBJECTIVES, Objective, make_objective

#: what ``nonfinite`` may be: skip a non-finite optimizer step (and count it), or raise at once
NONFINITE_MODES = ("skip", "raise")


@dataclass(frozen=True)
class ScaleConfig:
    """ScalablePPO's own arguments (see :class:`~sb3_ppo_scale.ScalablePPO` for their meaning and defaults)."""

    grad_accum_steps: int = 1
    buffer_device: str | th.device = "auto"
    objective: str = "clip"
    kl_coef: float = 1.0
    kl_penalty_target: float | None = 0.01
    kl_adapt_factor: float = 2.0
    kl_adapt_tolerance: float = 1.5
    cuda_graphs: bool = False
    compile_loss: bool = False
    nonfinite: str = "skip"
    collect_device: str | th.device = "auto"
    overlap_collection: bool = False
    update_threads: int | None = None
    normalize_value: bool = False
    mean_bound_coef: float = 0.0

    @classmethod
    def of(cls, model: Any) -> "ScaleConfig":
        """The config held by ``model``'s attributes (a saved model keeps them; missing ones take the defaults)."""
        defaults = cls()
        return cls(**{f.name: getattr(model, f.name, getattr(defaults, f.name)) for f in dataclasses.fields(cls)})

    def validate(self, batch_size: int, normalize_advantage: bool, policy_device: th.device) -> th.device:
        """Raise ValueError naming the first bad argument; returns the resolved rollout device."""
        check_batching(batch_size, self.grad_accum_steps, normalize_advantage)
        self._check_objective()
        for name in ("cuda_graphs", "overlap_collection", "normalize_value"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        check_compile_loss(self.compile_loss, self.cuda_graphs)
        if self.update_threads is not None and (not is_int(self.update_threads) or self.update_threads < 1):
            raise ValueError(f"update_threads must be None (torch's thread setting as it is) or an int >= 1, "
                             f"got {self.update_threads!r}")
        if not is_number(self.mean_bound_coef) or not 0 <= self.mean_bound_coef < math.inf:
            raise ValueError(f"mean_bound_coef must be a finite number >= 0 (0: no bound on the Gaussian mean), "
                             f"got {self.mean_bound_coef!r}")
        if self.nonfinite not in NONFINITE_MODES:
            raise ValueError(f"nonfinite must be one of {', '.join(map(repr, NONFINITE_MODES))}, got {self.nonfinite!r}")
        return resolve_buffer_device(self.buffer_device, policy_device)

    def check_runtime(self, model: Any, buffer_device: th.device) -> None:
        """What needs the machine: CUDA for graphs, a compiler for ``compile_loss``. A ``batch_size`` above the
        rollout is one whole-rollout minibatch, as in SB3's PPO (which warns at construction); under torchrun
        :func:`~sb3_ppo_scale.distributed.check_data_parallel` refuses a rank's share above its rollout."""
        check_cuda_graphs(self.cuda_graphs, model.device, buffer_device, model.policy.optimizer)
        check_compile_toolchain(self.compile_loss, model.device)

    def make_objective(self) -> Objective:
        """The objective object; a KL one starts at ``kl_coef`` with the adaptive rule of these arguments."""
        rule = AdaptiveKLCoefficient(self.kl_penalty_target, self.kl_adapt_factor, self.kl_adapt_tolerance)
        return make_objective(self.objective, KLCoefficient(self.kl_coef, rule))

    def _check_objective(self) -> None:
        """A known objective, beta >= 0 within bounds, a finite target > 0, a finite factor > 1, a finite tolerance >= 1."""
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(map(repr, OBJECTIVES))}, got {self.objective!r}")
        low, high = KL_COEF_BOUNDS
        if not is_number(self.kl_coef) or not (self.kl_coef == 0 or low <= self.kl_coef <= high):
            raise ValueError(f"kl_coef must be 0 or a number in [{low:g}, {high:g}], got {self.kl_coef!r}")
        target = self.kl_penalty_target
        if target is not None:
            # nan or inf would pass a plain `> 0`: nan never adapts beta, inf shrinks it every update
            if not is_number(target) or not 0 < target < math.inf:
                raise ValueError(f"kl_penalty_target must be a finite number > 0, or None for a fixed kl_coef, "
                                 f"got {target!r}")
            if self.kl_coef == 0 and make_objective(self.objective).penalises_kl:
                raise ValueError(
                    "kl_coef must be > 0 when kl_penalty_target is set (an adaptive beta of 0 can never grow); "
                    "pass kl_penalty_target=None to keep beta fixed at 0"
                )
        # nan would pass `<= 1` / `< 1`: a nan factor makes beta nan (a nan loss), a nan tolerance never adapts
        if not is_number(self.kl_adapt_factor) or not 1 < self.kl_adapt_factor < math.inf:
            raise ValueError(f"kl_adapt_factor must be a finite number > 1, got {self.kl_adapt_factor!r}")
        if not is_number(self.kl_adapt_tolerance) or not 1 <= self.kl_adapt_tolerance < math.inf:
            raise ValueError(f"kl_adapt_tolerance must be a finite number >= 1 (kl_penalty_target=None keeps beta "
                             f"fixed), got {self.kl_adapt_tolerance!r}")
