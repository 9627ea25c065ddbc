"""How a policy evaluates a micro-batch: the one step of the loss that differs between on-policy PPO algorithms.

An :data:`Evaluator` takes the policy, a :class:`~sb3_ppo_scale.core.update.sampling.MicroBatch` and the actions (already
cast as the loss uses them) and returns ``(values, log_prob, entropy, distribution)``; ``distribution`` is the
SB3 action distribution when ``with_distribution`` is True (a KL term needs it), else None. SB3's PPO uses
:func:`evaluate_actions`; sb3-contrib's algorithms supply theirs (action masks: :mod:`sb3_ppo_scale.contrib.maskable`;
LSTM states and sequences: :mod:`sb3_ppo_scale.contrib.recurrent`). Each performs its policy's
``evaluate_actions`` operations in the same order, so the default update stays bit-identical to the algorithm's own.

:class:`FusedEvaluator` is that evaluation without module dispatch or Distribution objects, for a diagonal-Gaussian
(MuJoCo-style tasks), categorical or masked categorical policy on non-image observations: the policy's layers through
:class:`~sb3_ppo_scale.core.policy.inference.FusedActorCritic` and torch's ``Normal`` / ``Categorical`` statements (and
sb3-contrib's ``MaskableCategorical``'s) inlined, so the autograd graph, and with it every gradient, is the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch as th
import torch.nn.functional as F
from gymnasium import spaces
from sb3_contrib.common.maskable.distributions import MaskableCategoricalDistribution
from stable_baselines3.common.distributions import CategoricalDistribution, DiagGaussianDistribution, Distribution
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.preprocessing import is_image_space

from sb3_ppo_scale.core.policy.inference import (
    _LOG_SQRT_2PI,
    REPLACED_METHODS,
    FusedActorCritic,
    fusion_blocker,
    mask_logits,
)

#: ``(values, log_prob, entropy or None, distribution or None)``
Evaluation = tuple[th.Tensor, th.Tensor, "th.Tensor | None", "Distribution | None"]
#: ``(policy, micro-batch, actions, with_distribution) -> Evaluation``
Evaluator = Callable[[ActorCriticPolicy, Any, th.Tensor, bool], Evaluation]


def evaluate_with_distribution(
    policy: ActorCriticPolicy,
    obs: th.Tensor | dict[str, th.Tensor],
    actions: th.Tensor,
    action_masks: th.Tensor | None = None,
) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, Distribution]:
    """``policy.evaluate_actions`` that also returns the action distribution (same operations, same values); with
    ``action_masks`` the distribution is masked first, as sb3-contrib's ``MaskableActorCriticPolicy`` does."""
    features = policy.extract_features(obs)
    if policy.share_features_extractor:
        latent_pi, latent_vf = policy.mlp_extractor(features)
    else:
        pi_features, vf_features = features
        latent_pi = policy.mlp_extractor.forward_actor(pi_features)
        latent_vf = policy.mlp_extractor.forward_critic(vf_features)
    distribution = policy._get_action_dist_from_latent(latent_pi)
    if action_masks is not None:
        distribution.apply_masking(action_masks)  # type: ignore[attr-defined]
    log_prob = distribution.log_prob(actions)
    return policy.value_net(latent_vf), log_prob, distribution.entropy(), distribution


def evaluate_actions(policy: ActorCriticPolicy, micro: Any, actions: th.Tensor, with_distribution: bool) -> Evaluation:
    """SB3 PPO's evaluation: ``policy.evaluate_actions(obs, actions)`` (or the same with the distribution)."""
    obs = micro.samples.observations
    if with_distribution:
        return evaluate_with_distribution(policy, obs, actions)
    values, log_prob, entropy = policy.evaluate_actions(obs, actions)
    return values, log_prob, entropy, None


#: 0.5 + 0.5 log(2 pi), the constant of torch's ``Normal.entropy`` (``_LOG_SQRT_2PI`` is ``Normal.log_prob``'s)
_HALF_LOG_2PI_E = 0.5 + 0.5 * math.log(2 * math.pi)
#: ``(action net output, actions, micro-batch samples) -> (log_prob, entropy)``
Scorer = Callable[[th.Tensor, th.Tensor, Any], tuple[th.Tensor, th.Tensor]]


def gaussian_scorer(policy: ActorCriticPolicy) -> Scorer:
    """``DiagGaussianDistribution``: ``Normal(mean, ones_like(mean) * exp(log_std))`` (``broadcast_all`` on both),
    ``log_prob`` and ``entropy`` summed over the action dimensions, statement for statement."""
    log_std = policy.log_std

    def score(mean_actions: th.Tensor, actions: th.Tensor, samples: Any) -> tuple[th.Tensor, th.Tensor]:
        loc, scale = th.broadcast_tensors(mean_actions, th.ones_like(mean_actions) * log_std.exp())
        var = scale**2  # Normal.log_prob
        log_scale = scale.log()
        log_prob = -((actions - loc) ** 2) / (2 * var) - log_scale - _LOG_SQRT_2PI
        entropy = _HALF_LOG_2PI_E + th.log(scale)
        return log_prob.sum(dim=1), entropy.sum(dim=1)

    return score


def _categorical_log_prob(logits: th.Tensor, actions: th.Tensor) -> th.Tensor:
    """torch's ``Categorical.log_prob`` on normalised ``logits``, without its sample validation."""
    value = actions.long().unsqueeze(-1)
    value, log_pmf = th.broadcast_tensors(value, logits)
    value = value[..., :1]
    return log_pmf.gather(-1, value).squeeze(-1)


def categorical_scorer(policy: ActorCriticPolicy) -> Scorer:
    """``CategoricalDistribution``: torch's ``Categorical(logits=...)``, then ``log_prob`` and ``entropy``, statement
    for statement, without argument validation."""

    def score(logits: th.Tensor, actions: th.Tensor, samples: Any) -> tuple[th.Tensor, th.Tensor]:
        logits = logits - logits.logsumexp(dim=-1, keepdim=True)  # Categorical.__init__
        log_prob = _categorical_log_prob(logits, actions)
        clamped = th.clamp(logits, min=th.finfo(logits.dtype).min)  # Categorical.entropy; probs is softmax, lazily
        p_log_p = clamped * F.softmax(logits, dim=-1)
        return log_prob, -p_log_p.sum(-1)

    return score


def masked_categorical_scorer(policy: ActorCriticPolicy) -> Scorer:
    """sb3-contrib's ``MaskableCategoricalDistribution`` under ``apply_masking(samples.action_masks)``, as
    ``MaskableActorCriticPolicy.evaluate_actions`` uses it: the logits normalised, masked to -1e8, normalised again,
    then ``log_prob`` and the masked ``entropy``. (``MaskableCategorical`` also normalises the normalised logits once
    more before masking; that result feeds nothing, so it is left out.)"""
    action_dim = policy.action_dist.action_dim
    unmasked = categorical_scorer(policy)

    def score(action_logits: th.Tensor, actions: th.Tensor, samples: Any) -> tuple[th.Tensor, th.Tensor]:
        logits = action_logits.view(-1, action_dim)  # proba_distribution
        logits = logits - logits.logsumexp(dim=-1, keepdim=True)
        masks = samples.action_masks
        if masks is None:  # apply_masking(None): Categorical on these logits, its own entropy
            return unmasked(logits, actions, samples)
        allowed, logits = mask_logits(logits, masks)
        logits = logits - logits.logsumexp(dim=-1, keepdim=True)
        log_prob = _categorical_log_prob(logits, actions)
        p_log_p = logits * F.softmax(logits, dim=-1)  # MaskableCategorical.entropy
        # contrib's th.tensor(0.0, device), by a fill as mask_logits makes its -1e8
        p_log_p = th.where(allowed, p_log_p, th.zeros((), device=logits.device))
        return log_prob, -p_log_p.sum(-1)

    return score


#: The distributions whose scoring :class:`FusedEvaluator` inlines, by exact class.
SCORERS: dict[type, Callable[[ActorCriticPolicy], Scorer]] = {
    DiagGaussianDistribution: gaussian_scorer,
    CategoricalDistribution: categorical_scorer,
    MaskableCategoricalDistribution: masked_categorical_scorer,
}


def _holds_images(space: spaces.Space) -> bool:
    """Whether ``space`` (or a subspace of a Dict space) is an image, as SB3 decides for its CNN extractors."""
    if isinstance(space, spaces.Dict):
        return any(_holds_images(subspace) for subspace in space.spaces.values())
    return is_image_space(space, check_channels=False)


class FusedEvaluator:
    """The policy's ``evaluate_actions`` without module dispatch or Distribution objects, same operations in the same
    order, so the autograd graph, and with it every gradient, is the same: the network through
    :class:`~sb3_ppo_scale.core.policy.inference.FusedActorCritic`, then the distribution's statements (:data:`SCORERS`).
    With ``with_distribution`` (a KL term needs the distribution object) it is ``fallback``.

    :param policy: a policy for which :meth:`blocker` is None; its parameters are read by reference.
    :param fallback: the algorithm's own evaluator (default SB3 PPO's :func:`evaluate_actions`).
    """

    def __init__(self, policy: ActorCriticPolicy, fallback: Evaluator = evaluate_actions) -> None:
        self.policy = policy
        self.fallback = fallback
        fused = FusedActorCritic(policy)
        self.parts = fused.parts  #: the policy's modules and parameters it reads
        self.network = fused.network
        self.score = SCORERS[type(policy.action_dist)](policy)

    @staticmethod
    def blocker(policy: ActorCriticPolicy) -> str | None:
        """Why ``policy.evaluate_actions`` is not replaced (it cannot be exactly, or it would not pay), or None."""
        if _holds_images(policy.observation_space):
            # the convolutions are the update's time; at the zoo's Atari config the fused evaluation measured 0.96x
            # (benchmarks/results/update_trims_atari), so image policies keep their own evaluate_actions
            return "image observations (the convolutions dominate; fusing measured slower)"
        if type(policy.action_dist) not in SCORERS:
            return (f"action distribution {type(policy.action_dist).__name__} is not one of "
                    f"{', '.join(kind.__name__ for kind in SCORERS)}")
        return fusion_blocker(policy, replaced=(*REPLACED_METHODS, "evaluate_actions"))

    def __call__(self, policy: ActorCriticPolicy, micro: Any, actions: th.Tensor,
                 with_distribution: bool) -> Evaluation:
        if with_distribution or policy is not self.policy:
            return self.fallback(policy, micro, actions, with_distribution)
        action_out, _, values = self.network(micro.samples.observations)
        log_prob, entropy = self.score(action_out, actions, micro.samples)
        return values, log_prob, entropy, None
