"""KL(pi_old || pi) for PPO-Penalty: analytic where a closed form exists, the k3 estimator elsewhere.

The rollout policy's distribution is summarised per sample by a flat parameter tensor (computed once per
``train()`` in one no-grad pass, as sb3-contrib's TRPO does), so the penalty needs no second network:

- diagonal Gaussian: ``[mean, std]`` (2 * action_dim columns)
- Categorical, MultiCategorical, Bernoulli: normalised logits (sum of the action dims columns)
- sb3-contrib's masked Categorical / MultiCategorical / Bernoulli: the normalised *masked* logits (invalid actions at
  -1e8, never -inf, so ``p_old * (log p_old - log p)`` is ``0 * finite`` there: no NaN in the KL or its gradient)

gSDE (and any other distribution) uses k3 = (r - 1) - log r with r = pi(a) / pi_old(a) on the rollout's
actions, an unbiased, non-negative estimate of KL(pi_old || pi) (http://joschu.net/blog/kl-approx.html).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch as th
import torch.nn.functional as F
from stable_baselines3.common.distributions import (
    BernoulliDistribution,
    CategoricalDistribution,
    DiagGaussianDistribution,
    Distribution,
    MultiCategoricalDistribution,
    SquashedDiagGaussianDistribution,
)
from gymnasium import spaces
from sb3_contrib.common.maskable.distributions import MaskableCategoricalDistribution, MaskableMultiCategoricalDistribution
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_ppo_scale.core.policy.evaluation import Evaluator
from sb3_ppo_scale.core.update.sampling import MicroBatch

#: beta never leaves these bounds (so it can never reach 0 or inf); the initial kl_coef must lie inside them.
KL_COEF_BOUNDS = (1e-6, 1e6)
ANALYTIC, K3 = "analytic", "k3"


def kl_estimator(distribution: Distribution) -> str:
    """"analytic" for diagonal Gaussian, Categorical, MultiCategorical and Bernoulli policies, else "k3"."""
    if isinstance(distribution, SquashedDiagGaussianDistribution):
        return K3
    analytic = (DiagGaussianDistribution, CategoricalDistribution, MultiCategoricalDistribution, BernoulliDistribution,
                MaskableCategoricalDistribution, MaskableMultiCategoricalDistribution)
    return ANALYTIC if isinstance(distribution, analytic) else K3


def distribution_params(distribution: Distribution) -> th.Tensor:
    """Flat per-sample parameters of an SB3 distribution (see module docstring), shape (batch, P)."""
    if isinstance(distribution, DiagGaussianDistribution):
        normal = distribution.distribution
        return th.cat([normal.loc, normal.scale.expand_as(normal.loc)], dim=1)
    if isinstance(distribution, MultiCategoricalDistribution):
        return th.cat([part.logits for part in distribution.distribution], dim=1)
    if isinstance(distribution, MaskableMultiCategoricalDistribution):  # also the masked Bernoulli (2 per dim)
        return th.cat([part.logits for part in distribution.distributions], dim=1)
    return distribution.distribution.logits  # Categorical, Bernoulli, masked Categorical


def _bernoulli_kl(old_logits: th.Tensor, new_logits: th.Tensor) -> th.Tensor:
    p_old = th.sigmoid(old_logits)
    log_p_old, log_q_old = F.logsigmoid(old_logits), F.logsigmoid(-old_logits)
    log_p_new, log_q_new = F.logsigmoid(new_logits), F.logsigmoid(-new_logits)
    return p_old * (log_p_old - log_p_new) + (1 - p_old) * (log_q_old - log_q_new)


def _categorical_kl(old_logits: th.Tensor, new_logits: th.Tensor) -> th.Tensor:
    old_log_p = F.log_softmax(old_logits, dim=-1)
    return (old_log_p.exp() * (old_log_p - F.log_softmax(new_logits, dim=-1))).sum(dim=-1)


def analytic_kl(old_params: th.Tensor, new: Distribution) -> th.Tensor:
    """KL(old || new) per sample, shape (batch,), with ``old_params`` from :func:`distribution_params`."""
    if isinstance(new, DiagGaussianDistribution):
        old_mean, old_std = old_params.chunk(2, dim=1)
        new_mean, new_std = new.distribution.loc, new.distribution.scale
        var_ratio = (old_std / new_std) ** 2
        per_dim = 0.5 * (var_ratio + ((old_mean - new_mean) / new_std) ** 2 - 1 - th.log(var_ratio))
        return per_dim.sum(dim=1)
    if isinstance(new, (CategoricalDistribution, MaskableCategoricalDistribution)):
        return _categorical_kl(old_params, new.distribution.logits)
    if isinstance(new, MaskableMultiCategoricalDistribution):
        parts = th.split(old_params, list(new.action_dims), dim=1)
        return th.stack([_categorical_kl(o, n.logits) for o, n in zip(parts, new.distributions)], dim=1).sum(dim=1)
    if isinstance(new, MultiCategoricalDistribution):
        parts = th.split(old_params, list(new.action_dims), dim=1)
        return th.stack([_categorical_kl(o, n.logits) for o, n in zip(parts, new.distribution)], dim=1).sum(dim=1)
    if isinstance(new, BernoulliDistribution):
        return _bernoulli_kl(old_params, new.distribution.logits).sum(dim=1)
    raise TypeError(f"no analytic KL for {type(new).__name__}; use the k3 estimator")


def k3_kl(log_prob: th.Tensor, old_log_prob: th.Tensor) -> th.Tensor:
    """k3 estimate of KL(old || new) per sample from log-probs of actions drawn from the old policy."""
    log_ratio = log_prob - old_log_prob
    return th.exp(log_ratio) - 1 - log_ratio


@th.no_grad()
def rollout_distribution_params(
    policy: ActorCriticPolicy, chunks: Iterable[MicroBatch], evaluator: Evaluator, n_samples: int, device: th.device
) -> th.Tensor:
    """The current policy's distribution parameters for every rollout sample (``n_samples`` rows in rollout order,
    on ``device``), one no-grad pass over ``chunks``: micro-batches that together cover the rollout once."""
    params: th.Tensor | None = None
    for micro in chunks:
        actions = micro.samples.actions
        part = distribution_params(evaluator(policy, micro, _loss_actions(policy, actions), True)[3])  # type: ignore[arg-type]
        if micro.mask is not None:
            part = part[micro.mask]
        if params is None:
            params = th.empty((n_samples, part.shape[1]), dtype=part.dtype, device=device)
        params.index_copy_(0, micro.rows.to(device), part.to(device))  # type: ignore[union-attr]
    assert params is not None
    return params


@th.no_grad()
def mean_rollout_kl(
    policy: ActorCriticPolicy, chunks: Iterable[MicroBatch], evaluator: Evaluator, n_samples: int, estimator: str
) -> th.Tensor:
    """Mean KL(pi_old || pi) over the rollout (a device scalar; no host sync), from ``chunks`` that cover its
    ``n_samples`` samples once; the analytic estimator reads each chunk's ``old_dist``."""
    total = th.zeros((), device=policy.device)
    for micro in chunks:
        data = micro.samples
        _, log_prob, _, distribution = evaluator(policy, micro, _loss_actions(policy, data.actions), True)
        if estimator == ANALYTIC:
            kl = analytic_kl(micro.old_dist.to(policy.device), distribution)  # type: ignore[union-attr,arg-type]
        else:
            kl = k3_kl(log_prob, data.old_log_prob)
        total += (kl if micro.mask is None else kl[micro.mask]).sum()
    return total / n_samples


def _loss_actions(policy: ActorCriticPolicy, actions: th.Tensor) -> th.Tensor:
    """Actions as the loss scores them: a ``Discrete`` policy's as a flat long tensor (SB3's cast)."""
    return actions.long().flatten() if isinstance(policy.action_space, spaces.Discrete) else actions


@dataclass(frozen=True)
class AdaptiveKLCoefficient:
    """PPO paper's adaptive beta: after each update, beta /= factor if KL < target / tolerance, beta *= factor
    if KL > target * tolerance, then clamp to :data:`KL_COEF_BOUNDS`. ``target=None`` keeps beta fixed.

    The defaults are the PPO paper's (``factor=2.0, tolerance=1.5``). RLlib's rule (x1.5 above 2 x target,
    x0.5 below target / 2) is the same shape with ``tolerance=2.0``; its asymmetric steps are not reproduced.
    """

    target: float | None
    factor: float = 2.0
    tolerance: float = 1.5

    def update(self, beta: float, kl: float) -> float:
        if self.target is None:
            return beta
        if kl < self.target / self.tolerance:
            beta /= self.factor
        elif kl > self.target * self.tolerance:
            beta *= self.factor
        low, high = KL_COEF_BOUNDS
        return min(max(beta, low), high)


class KLCoefficient:
    """The KL-penalty coefficient beta of a KL objective: its current value and the rule that adapts it.

    :param value: the initial beta (``ScalablePPO(kl_coef=...)``).
    :param rule: how beta moves after each update (default: fixed).
    """

    def __init__(self, value: float, rule: AdaptiveKLCoefficient | None = None) -> None:
        self.value = float(value)
        self.rule = AdaptiveKLCoefficient(None) if rule is None else rule

    def adapt(self, measured_kl: float) -> float:
        """Move beta by the rule, given the mean KL(pi_old || pi) measured after the update; returns the new beta."""
        self.value = self.rule.update(self.value, measured_kl)
        return self.value
