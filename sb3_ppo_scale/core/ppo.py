"""ScalablePPO: SB3's PPO with a device-resident rollout, oversized minibatches and exact gradient accumulation.

The additions live in :class:`~sb3_ppo_scale.core.algorithm.ScalableOnPolicyMixin`, shared with sb3-contrib's
PPO variants (:mod:`sb3_ppo_scale.contrib`); SB3's PPO needs none of the mixin's algorithm hooks overridden.
"""

from __future__ import annotations

from stable_baselines3 import PPO

from sb3_ppo_scale.core.algorithm import ScalableOnPolicyMixin
from sb3_ppo_scale.core.arguments import SCALE_ARGUMENTS


class ScalablePPO(ScalableOnPolicyMixin, PPO):
    """Proximal Policy Optimization, SB3's ``PPO`` with a faster, bigger update phase.

    Takes every argument of :class:`stable_baselines3.PPO` (same names, positions and defaults) and trains
    identically with the defaults below; rollouts are collected by a leaner loop that writes the same rollout
    (:mod:`sb3_ppo_scale.core.collect.lean`). The additions:
    """


ScalablePPO.__doc__ = f"{ScalablePPO.__doc__.rstrip()}\n\n{SCALE_ARGUMENTS}"
