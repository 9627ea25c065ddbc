"""How a policy evaluates a micro-batch: the one step of the loss that differs between on-policy PPO algorithms.

An :data:`Evaluator` takes the policy, a :class:`~sb3_ppo_scale.core.sampling.MicroBatch` and the actions (already
cast as the loss uses them) and returns ``(values, log_prob, entropy, distribution)``; ``distribution`` is the
SB3 action distribution when ``with_distribution`` is True (a KL term needs it), else None. SB3's PPO uses
:func:`evaluate_actions`; sb3-contrib's algorithms supply theirs (action masks: :mod:`sb3_ppo_scale.contrib.maskable`;
LSTM states and sequences: :mod:`sb3_ppo_scale.contrib.recurrent`). Each performs its policy's
``evaluate_actions`` operations in the same order, so the default update stays bit-identical to the algorithm's own.

:class:`FusedGaussianEvaluator` is SB3 PPO's evaluation for a diagonal-Gaussian policy (MuJoCo-style tasks) without
module dispatch or Distribution objects: the policy's layers through
:class:`~sb3_ppo_scale.core.inference.FusedActorCritic` and torch's ``Normal.log_prob`` / ``entropy`` statements
inlined, so the autograd graph, and with it every gradient, is the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch as th
from stable_baselines3.common.distributions import DiagGaussianDistribution, Distribution
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_ppo_scale.core.inference import _LOG_SQRT_2PI, REPLACED_METHODS, FusedActorCritic, fusion_blocker

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


class FusedGaussianEvaluator:
    """:func:`evaluate_actions` of a diagonal-Gaussian ``ActorCriticPolicy``, same operations in the same order.

    ``DiagGaussianDistribution`` builds ``Normal(mean, ones_like(mean) * exp(log_std))`` (``broadcast_all`` on both)
    and sums ``log_prob`` and ``entropy`` over the action dimensions; this does exactly that on plain tensors. With
    ``with_distribution`` (a KL term needs the distribution object) it is :func:`evaluate_actions`.

    :param policy: a policy for which :meth:`blocker` is None; its parameters are read by reference.
    """

    def __init__(self, policy: ActorCriticPolicy) -> None:
        self.policy = policy
        self.network = FusedActorCritic(policy).network
        self.log_std = policy.log_std

    @staticmethod
    def blocker(policy: ActorCriticPolicy) -> str | None:
        """Why ``policy.evaluate_actions`` cannot be replaced exactly, or None when it can."""
        if type(policy.action_dist) is not DiagGaussianDistribution:
            return f"action distribution {type(policy.action_dist).__name__} is not DiagGaussianDistribution"
        return fusion_blocker(policy, replaced=(*REPLACED_METHODS, "evaluate_actions"))

    def __call__(self, policy: ActorCriticPolicy, micro: Any, actions: th.Tensor,
                 with_distribution: bool) -> Evaluation:
        if with_distribution or policy is not self.policy:
            return evaluate_actions(policy, micro, actions, with_distribution)
        mean_actions, _, values = self.network(micro.samples.observations)
        loc, scale = th.broadcast_tensors(mean_actions, th.ones_like(mean_actions) * self.log_std.exp())
        var = scale**2  # Normal.log_prob, statement for statement
        log_scale = scale.log()
        log_prob = -((actions - loc) ** 2) / (2 * var) - log_scale - _LOG_SQRT_2PI
        entropy = _HALF_LOG_2PI_E + th.log(scale)
        return values, log_prob.sum(dim=1), entropy.sum(dim=1), None
