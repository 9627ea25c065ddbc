"""``learning_rate="kl_adaptive"``: a learning rate that follows the measured KL divergence of each update.

The rule of legged_gym / rsl_rl and rl_games' "adaptive" schedule, applied after every ``train()``: with ``kl`` the
mean KL(pi_old || pi_new) over the rollout measured after the update,

- ``lr /= factor`` when ``kl > 2 * target_kl``;
- ``lr *= factor`` when ``kl < target_kl / 2``;
- then ``lr`` is clamped to ``[min_lr, max_lr]``.

Large-batch PPO (thousands of envs, few epochs) uses it to take steps as large as the KL budget allows.
:class:`KLAdaptiveLR` is an SB3 schedule: SB3 calls it with the progress remaining and gets the current value, so
``train/learning_rate`` logs it, and it is saved and loaded with the model as its ``learning_rate``.
"""

from __future__ import annotations

import math
from typing import Any

from sb3_ppo_scale.core.checks import is_number, plain_number, schedule_value

#: the string ``ScalablePPO(learning_rate=...)`` accepts for :class:`KLAdaptiveLR` with its defaults
KL_ADAPTIVE = "kl_adaptive"


class KLAdaptiveLR:
    """A learning rate adapted to a KL target after each update (see the module docstring).

    :param initial: the first learning rate (default 3e-4, SB3 PPO's), finite, in [min_lr, max_lr].
    :param target_kl: the desired KL per update (default 0.01), finite, > 0.
    :param factor: the multiplicative step (default 1.5), finite, > 1.
    :param min_lr: lower bound (default 1e-5), finite, > 0.
    :param max_lr: upper bound (default 1e-2), > 0 (``math.inf``: none).
    :param anneal_target: when True, the KL target decays linearly to 0 over the ``learn()`` budget (``target_kl``
        times the progress remaining), so the updates shrink toward the end of training as with ``lin_<x>``
        learning rates, while the rate still follows the measured KL (default False: a constant target).
    """

    #: class default, so that a rule pickled before the option existed (saved models, checkpoints) keeps a constant target
    anneal_target: bool = False

    def __init__(self, initial: float = 3e-4, target_kl: float = 0.01, factor: float = 1.5, min_lr: float = 1e-5,
                 max_lr: float = 1e-2, anneal_target: bool = False) -> None:
        # `not 0 < value < inf` refuses nan too: a nan factor makes the rate nan after the first update (nan
        # parameters), a nan target never adapts it
        for name, value in (("initial", initial), ("target_kl", target_kl), ("min_lr", min_lr)):
            if not is_number(value) or not 0 < value < math.inf:
                raise ValueError(f"KLAdaptiveLR {name} must be a finite number > 0, got {value!r}")
        if not is_number(max_lr) or not max_lr > 0:
            raise ValueError(f"KLAdaptiveLR max_lr must be a number > 0 (math.inf: no upper bound), got {max_lr!r}")
        if not is_number(factor) or not 1 < factor < math.inf:
            raise ValueError(f"KLAdaptiveLR factor must be a finite number > 1, got {factor!r}")
        if min_lr > max_lr:
            raise ValueError(f"KLAdaptiveLR min_lr must be <= max_lr, got min_lr={min_lr!r} and max_lr={max_lr!r}")
        if not min_lr <= initial <= max_lr:
            raise ValueError(f"KLAdaptiveLR initial must lie in [min_lr, max_lr] = [{min_lr:g}, {max_lr:g}], got {initial!r}")
        if not isinstance(anneal_target, bool):
            raise ValueError(f"KLAdaptiveLR anneal_target must be True or False, got {anneal_target!r}")
        self.value, self.target_kl, self.factor = float(initial), float(target_kl), float(factor)
        self.anneal_target = anneal_target
        self.min_lr, self.max_lr = float(min_lr), float(max_lr)

    def __call__(self, progress_remaining: float) -> float:
        """The current learning rate (SB3's schedule interface; the progress is not used)."""
        return self.value

    def target(self, progress_remaining: float = 1.0) -> float:
        """The KL target at ``progress_remaining`` (1 at the start of ``learn()``, 0 at its end): ``target_kl``, or
        ``target_kl * progress_remaining`` with ``anneal_target``."""
        return self.target_kl * progress_remaining if self.anneal_target else self.target_kl

    def adapt(self, measured_kl: float, progress_remaining: float = 1.0) -> float:
        """Apply the rule to ``measured_kl`` (the update's mean KL) against :meth:`target` at ``progress_remaining``;
        returns the new learning rate."""
        target = self.target(progress_remaining)
        if measured_kl > 2 * target:
            self.value /= self.factor
        elif measured_kl < target / 2:
            self.value *= self.factor
        self.value = min(max(self.value, self.min_lr), self.max_lr)
        return self.value

    def __repr__(self) -> str:
        annealed = ", target annealed" if self.anneal_target else ""
        return (f"KLAdaptiveLR(value={self.value:g}, target_kl={self.target_kl:g}{annealed}, factor={self.factor:g}, "
                f"bounds=[{self.min_lr:g}, {self.max_lr:g}])")


def resolve_learning_rate(learning_rate: object) -> object:
    """``"kl_adaptive"`` becomes a :class:`KLAdaptiveLR` with its defaults; numbers > 0 and callables pass unchanged
    (a NumPy number as the Python number it holds, :func:`~sb3_ppo_scale.core.checks.plain_number`); anything else is
    a ValueError naming what is allowed."""
    if isinstance(learning_rate, str) and learning_rate == KL_ADAPTIVE:
        return KLAdaptiveLR()
    learning_rate = plain_number(learning_rate)
    usable = _positive_finite_at_start(learning_rate) if callable(learning_rate) \
        else is_number(learning_rate) and 0 < learning_rate < math.inf  # type: ignore[operator]  # a str is neither
    if not usable:
        raise ValueError(f"learning_rate must be a finite number > 0, a schedule (callable of the progress remaining) "
                         f"whose value at the start (progress_remaining=1) is one, a KLAdaptiveLR or {KL_ADAPTIVE!r}, "
                         f"got {learning_rate!r}")
    return learning_rate


def _positive_finite_at_start(schedule: Any) -> bool:
    """A learning-rate schedule's value at the start of training is a finite number > 0 (SB3 calls it at 1 to build
    the optimizer; a KLAdaptiveLR gives its initial rate)."""
    value = schedule_value(schedule(1.0))
    return value is not None and 0 < value < math.inf
