"""PPO objectives as small objects, the loss of one micro-batch, and the per-train() statistics on the device.

Three objectives, each an :class:`Objective` that says which terms it has and what they need:

- :class:`ClipObjective` (``"clip"``): SB3 PPO's clipped surrogate, ``-min(r * A, clip(r, 1 - eps, 1 + eps) * A)``;
- :class:`KLPenaltyObjective` (``"kl_penalty"``): PPO-Penalty, ``-(r * A) + beta * KL(pi_old || pi)``, no
  clipping; it owns beta (a :class:`~sb3_ppo_scale.core.update.kl.KLCoefficient`: the adaptive rule, its state, save
  and load);
- :class:`ClipKLPenaltyObjective` (``"clip_kl_penalty"``): both terms, as RLlib does.

Two opt-in terms that large-batch recipes (rl_games) add, both off by default: a :class:`MeanBound` penalty on a
Gaussian policy's mean beyond the action box, and the value error measured in units of the return std when the
policy's value head normalises its targets (:mod:`sb3_ppo_scale.core.policy.value_head`).

:func:`make_objective` is the one place that maps the user's string to an object. Every per-sample term
(surrogate, value, entropy, KL penalty) is averaged with optional per-sample ``weights`` (importance correction
of a prioritized sampler); with ``weights=None`` the terms are exactly SB3 PPO's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch as th
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.distributions import DiagGaussianDistribution
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_ppo_scale.core.policy.evaluation import Evaluator, evaluate_actions
from sb3_ppo_scale.core.update.kl import ANALYTIC, KLCoefficient, analytic_kl, k3_kl
from sb3_ppo_scale.core.update.sampling import MicroBatch

#: Order of the statistics in a stats vector (one device tensor per logical minibatch).
STAT_NAMES = ("policy_gradient_loss", "value_loss", "entropy_loss", "clip_fraction", "approx_kl", "loss")
KL_INDEX = STAT_NAMES.index("approx_kl")
LOSS_INDEX = STAT_NAMES.index("loss")


class Objective:
    """What the policy term of the PPO loss is made of (subclasses below; instances live on the model).

    :cvar name: the user's string for it (``ScalablePPO(objective=...)``).
    :cvar clips_ratio: the surrogate is clipped (PPO-Clip).
    :cvar penalises_kl: the loss has a ``beta * KL(pi_old || pi)`` term; such an objective has a ``beta``.
    """

    name: ClassVar[str]
    clips_ratio: ClassVar[bool]
    penalises_kl: ClassVar[bool] = False

    def surrogate(self, ratio: th.Tensor, advantages: th.Tensor, clip_range: float) -> th.Tensor:
        """Per-sample surrogate to maximise: ``r * A``, clipped as PPO-Clip when :attr:`clips_ratio`."""
        surrogate = advantages * ratio
        if self.clips_ratio:
            surrogate = th.min(surrogate, advantages * th.clamp(ratio, 1 - clip_range, 1 + clip_range))
        return surrogate

    def needs_old_dist(self, estimator: str) -> bool:
        """Whether the loss needs the rollout policy's distribution parameters (an analytic KL penalty does)."""
        return self.penalises_kl and estimator == ANALYTIC

    def state_dict(self) -> dict[str, Any]:
        """What must be saved with the model to continue training (nothing for PPO-Clip)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class ClipObjective(Objective):
    """SB3 PPO's clipped surrogate (the default)."""

    name, clips_ratio = "clip", True


class KLPenaltyObjective(Objective):
    """PPO-Penalty: the unclipped surrogate minus ``beta * KL(pi_old || pi)``; beta adapts after each update.

    :param beta: the coefficient and its adaptive rule.
    """

    name, clips_ratio, penalises_kl = "kl_penalty", False, True

    def __init__(self, beta: KLCoefficient) -> None:
        self.beta = beta

    def state_dict(self) -> dict[str, Any]:
        return {"kl_beta": self.beta.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "kl_beta" in state:
            self.beta.value = float(state["kl_beta"])


class ClipKLPenaltyObjective(KLPenaltyObjective):
    """The clipped surrogate *and* the KL penalty (RLlib's PPO)."""

    name, clips_ratio = "clip_kl_penalty", True


#: the user's string -> the objective class (the only place objective names are looked up)
OBJECTIVE_CLASSES: dict[str, type[Objective]] = {cls.name: cls for cls in (ClipObjective, KLPenaltyObjective, ClipKLPenaltyObjective)}
OBJECTIVES = tuple(OBJECTIVE_CLASSES)


def make_objective(name: str, beta: KLCoefficient | None = None) -> Objective:
    """The objective called ``name`` (one of :data:`OBJECTIVES`); a KL one gets ``beta`` (default: fixed 1.0)."""
    if name not in OBJECTIVE_CLASSES:
        raise ValueError(f"objective must be one of {', '.join(map(repr, OBJECTIVES))}, got {name!r}")
    cls = OBJECTIVE_CLASSES[name]
    if issubclass(cls, KLPenaltyObjective):
        return cls(KLCoefficient(1.0) if beta is None else beta)
    return cls()


class MeanBound:
    """rl_games' bound loss ("regularisation"): a penalty on a diagonal-Gaussian policy's mean where it leaves the
    action box by more than 10%. Per sample: ``sum over action dims of relu(|mu - centre| / half_width - 1.1) ** 2``,
    with the box's centre and half-width per dimension (so the penalty is in units of the box whatever its size).
    SB3 clips the sampled actions to the box, so a mean drifting outside it gets no gradient back from the returns.

    :param coef: the term's weight in the loss (> 0).
    :param low: the action space's lower bounds.
    :param high: the action space's upper bounds.
    :param device: where the policy's mean is computed.
    """

    #: how far beyond the box (in half-widths) the mean is free: rl_games' soft bound 1.1
    SOFT_BOUND = 1.1

    def __init__(self, coef: float, low: np.ndarray, high: np.ndarray, device: th.device) -> None:
        self.coef = float(coef)
        self.centre = th.as_tensor((high + low) / 2, dtype=th.float32, device=device)
        self.half_width = th.as_tensor((high - low) / 2, dtype=th.float32, device=device)

    def __call__(self, mean: th.Tensor) -> th.Tensor:
        """The per-sample penalty (shape ``(batch,)``) of the means ``mean`` (shape ``(batch, action dims)``)."""
        excess = th.relu((mean - self.centre).abs() / self.half_width - self.SOFT_BOUND)
        return (excess**2).sum(dim=1)


def make_mean_bound(coef: float, policy: ActorCriticPolicy) -> MeanBound | None:
    """The :class:`MeanBound` term of ``mean_bound_coef=coef`` for ``policy`` (None for 0); a ValueError naming
    ``mean_bound_coef`` where the policy has no Gaussian mean in a bounded box."""
    if coef == 0:
        return None
    space = policy.action_space
    if not isinstance(policy.action_dist, DiagGaussianDistribution) or not isinstance(space, spaces.Box):
        raise ValueError(f"mean_bound_coef > 0 needs a Box action space and a diagonal-Gaussian policy (no gSDE, no "
                         f"squashing), got {space!r} with {type(policy.action_dist).__name__}")
    if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high)) and np.all(space.high > space.low)):
        raise ValueError(f"mean_bound_coef > 0 needs finite action bounds with high > low, got low={space.low} "
                         f"high={space.high}")
    return MeanBound(coef, space.low.astype(np.float64), space.high.astype(np.float64), policy.device)


@dataclass(frozen=True)
class LossSettings:
    """Constants of one ``train()`` call.

    :param clip_range: PPO's epsilon for the ratio clip.
    :param clip_range_vf: value clipping range, or None for no value clipping.
    :param ent_coef: entropy coefficient.
    :param vf_coef: value-loss coefficient.
    :param discrete_actions: True for a ``Discrete`` action space (actions are cast to long, as SB3 does).
    :param objective: an :class:`Objective`, or its name (default "clip").
    :param kl_coef: beta, the KL-penalty coefficient of this call (ignored by "clip").
    :param kl_estimator: "analytic" (needs ``MicroBatch.old_dist``) or "k3".
    :param evaluator: how the policy evaluates a micro-batch (default: SB3 PPO's ``policy.evaluate_actions``;
        see :mod:`sb3_ppo_scale.core.policy.evaluation`).
    :param normalize_value: the policy's ``value_net`` is a
        :class:`~sb3_ppo_scale.core.policy.value_head.NormalizedValueHead`: the value error (and ``clip_range_vf``)
        is in units of its return std (default False: return units, as SB3).
    :param mean_bound: the :class:`MeanBound` term, or None (default) for none.
    """

    clip_range: float
    clip_range_vf: float | None
    ent_coef: float
    vf_coef: float
    discrete_actions: bool = False
    objective: Objective | str = "clip"
    kl_coef: float = 0.0
    kl_estimator: str = ANALYTIC
    evaluator: Evaluator = evaluate_actions
    normalize_value: bool = False
    mean_bound: MeanBound | None = None

    def __post_init__(self) -> None:
        if isinstance(self.objective, str):
            object.__setattr__(self, "objective", make_objective(self.objective))

    @property
    def terms(self) -> Objective:
        """The objective as an object (``objective`` after ``__post_init__``)."""
        assert isinstance(self.objective, Objective)
        return self.objective

    @property
    def penalises_kl(self) -> bool:
        return self.terms.penalises_kl


@dataclass
class AdvantageNormalizer:
    """Normalises advantages with the *logical* minibatch's mean and unbiased std (SB3's rule, + 1e-8).

    Disabled (identity) when ``enabled`` is False or the logical batch has a single sample.
    """

    mean: th.Tensor | None = None
    std: th.Tensor | None = None

    @classmethod
    def fit(cls, advantages: th.Tensor, enabled: bool) -> "AdvantageNormalizer":
        if not enabled or advantages.shape[0] <= 1:
            return cls()
        return cls(advantages.mean(), advantages.std())

    @classmethod
    def from_moments(
        cls, total: float, total_sq: float, count: int, enabled: bool, like: th.Tensor
    ) -> "AdvantageNormalizer":
        """The same rule from the sum, sum of squares and count of a logical minibatch split over ranks (float64
        sums; mean and unbiased std returned with ``like``'s dtype and device)."""
        if not enabled or count <= 1:
            return cls()
        mean = total / count
        variance = max(total_sq - count * mean * mean, 0.0) / (count - 1)
        return cls(like.new_tensor(mean), like.new_tensor(variance**0.5))

    def __call__(self, advantages: th.Tensor) -> th.Tensor:
        if self.mean is None:
            return advantages
        return (advantages - self.mean) / (self.std + 1e-8)


def _mean(values: th.Tensor, weights: th.Tensor | None, mask: th.Tensor | None = None) -> th.Tensor:
    """The (weighted) mean over the micro-batch's real samples: every row, or the rows ``mask`` selects (a padded
    sequence layout, averaged as sb3-contrib's RecurrentPPO does: ``mean(x[mask])``)."""
    if weights is not None:
        values = weights * values
    return values.mean() if mask is None else values[mask].mean()


def kl_penalty(micro: MicroBatch, distribution, log_prob: th.Tensor, settings: LossSettings) -> th.Tensor:
    """``beta * mean(KL(pi_old || pi))`` over the micro-batch (weighted like every other term)."""
    if settings.kl_estimator == ANALYTIC:
        kl = analytic_kl(micro.old_dist, distribution)  # type: ignore[arg-type]
    else:
        kl = k3_kl(log_prob, micro.samples.old_log_prob)
    return settings.kl_coef * _mean(kl, micro.weights, micro.mask)


def _value_loss(policy: ActorCriticPolicy, values: th.Tensor, data: Any, weights: th.Tensor | None,
                mask: th.Tensor | None, settings: LossSettings) -> th.Tensor:
    """SB3's value loss (clipped to ``clip_range_vf`` around the rollout's values when set); with
    ``settings.normalize_value`` the error and the clip range are in units of the value head's return std."""
    returns, values_pred = data.returns, values
    std = policy.value_net.std if settings.normalize_value else None
    if settings.clip_range_vf is not None:
        clip = settings.clip_range_vf if std is None else settings.clip_range_vf * std
        values_pred = data.old_values + th.clamp(values - data.old_values, -clip, clip)
    if std is not None:
        returns, values_pred = returns / std, values_pred / std
    if weights is None and mask is None:
        return F.mse_loss(returns, values_pred)
    return _mean((returns - values_pred) ** 2, weights, mask)


def ppo_loss(
    policy: ActorCriticPolicy,
    micro: MicroBatch,
    normalize: AdvantageNormalizer,
    settings: LossSettings,
) -> tuple[th.Tensor, th.Tensor]:
    """The PPO loss of ``settings.objective`` on one micro-batch (PPO-Clip performs exactly SB3 PPO's operations).

    :return: ``(loss, stats)`` where ``loss`` carries the gradient and ``stats`` is a detached vector in
        :data:`STAT_NAMES` order (means over the micro-batch). ``policy_gradient_loss`` is the surrogate term
        alone; ``loss`` includes the KL penalty.
    """
    data, weights, mask = micro.samples, micro.weights, micro.mask
    actions = data.actions
    if settings.discrete_actions:
        actions = actions.long().flatten()
    objective = settings.terms
    with_distribution = objective.penalises_kl or settings.mean_bound is not None
    values, log_prob, entropy, distribution = settings.evaluator(policy, micro, actions, with_distribution)
    values = values.flatten()
    advantages = normalize(data.advantages)

    ratio = th.exp(log_prob - data.old_log_prob)
    policy_loss = -_mean(objective.surrogate(ratio, advantages, settings.clip_range), weights, mask)

    value_loss = _value_loss(policy, values, data, weights, mask, settings)

    entropy_loss = -_mean(-log_prob if entropy is None else entropy, weights, mask)
    loss = policy_loss + settings.ent_coef * entropy_loss + settings.vf_coef * value_loss
    if objective.penalises_kl:
        loss = loss + kl_penalty(micro, distribution, log_prob, settings)
    if settings.mean_bound is not None:
        mean_actions = distribution.distribution.loc  # type: ignore[union-attr]
        loss = loss + settings.mean_bound.coef * _mean(settings.mean_bound(mean_actions), weights, mask)

    with th.no_grad():
        log_ratio = log_prob - data.old_log_prob
        approx_kl = _mean((th.exp(log_ratio) - 1) - log_ratio, None, mask)
        clip_fraction = _mean((th.abs(ratio - 1) > settings.clip_range).float(), None, mask)
        stats = th.stack([policy_loss, value_loss, entropy_loss, clip_fraction, approx_kl, loss]).detach()
    return loss, stats


class TrainStats:
    """Per-logical-minibatch statistics kept on the device; read back with one host sync.

    Reproduces SB3's logging: losses and clip fraction are means over every minibatch of the call,
    ``approx_kl`` is the mean over the last epoch's minibatches, ``loss`` is the last minibatch's.
    """

    def __init__(self) -> None:
        self._rows: list[th.Tensor] = []
        self._epochs: list[int] = []

    def add(self, stats: th.Tensor, epoch: int) -> None:
        self._rows.append(stats)
        self._epochs.append(epoch)

    def last_kl(self) -> float:
        """The last minibatch's approx KL (a host sync)."""
        return float(self._rows[-1][KL_INDEX])

    def summary(self, extra: dict[str, th.Tensor] | None = None) -> dict[str, Any]:
        """Means as SB3 logs them (keys of :data:`STAT_NAMES`), plus the ``extra`` device scalars read back in
        the same single sync. The means are SB3's own ``np.mean`` calls on the same values in the same order:
        float64 over the minibatches' ``.item()`` values (np.float64), and for ``approx_kl`` float32 over their
        float32 KL arrays (np.float32, summed in float32 as NumPy does; a float64 mean differs in the last digits)."""
        extra = extra or {}
        table = th.stack(self._rows)
        flat = th.cat([table.flatten(), *[e.reshape(1).to(table) for e in extra.values()]]).cpu().double()
        table, extra_values = flat[: table.numel()].view_as(table), flat[table.numel() :].tolist()
        last_epoch = [i for i, e in enumerate(self._epochs) if e == self._epochs[-1]]
        columns = table.numpy().T.copy()  # one contiguous row per statistic, as SB3's lists hold them
        summary: dict[str, Any] = {name: np.mean(columns[i]) for i, name in enumerate(STAT_NAMES)}
        summary["approx_kl"] = np.mean(columns[KL_INDEX, last_epoch].astype(np.float32))
        summary["loss"] = float(table[-1, LOSS_INDEX])
        return {**summary, **dict(zip(extra, extra_values))}
