"""How a policy evaluates a micro-batch: the one step of the loss that differs between on-policy PPO algorithms.

An :data:`Evaluator` takes the policy, a :class:`~sb3_ppo_scale.core.sampling.MicroBatch` and the actions (already
cast as the loss uses them) and returns ``(values, log_prob, entropy, distribution)``; ``distribution`` is the
SB3 action distribution when ``with_distribution`` is True (a KL term needs it), else None. SB3's PPO uses
:func:`evaluate_actions`; sb3-contrib's algorithms supply theirs (action masks: :mod:`sb3_ppo_scale.contrib.maskable`;
LSTM states and sequences: :mod:`sb3_ppo_scale.contrib.recurrent`). Each performs its policy's
``evaluate_actions`` operations in the same order, so the default update stays bit-identical to the algorithm's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch as th
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.policies import ActorCriticPolicy

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
