"""sb3-contrib's PPO variants with the scale layer (:class:`~sb3_ppo_scale.core.algorithm.ScalableOnPolicyMixin`):
:class:`ScalableMaskablePPO` (for ``sb3_contrib.MaskablePPO``) and :class:`ScalableRecurrentPPO` (for
``sb3_contrib.RecurrentPPO``). See docs/contrib.md."""

from sb3_ppo_scale.contrib.maskable import ScalableMaskablePPO
from sb3_ppo_scale.contrib.recurrent import ScalableRecurrentPPO

__all__ = ["ScalableMaskablePPO", "ScalableRecurrentPPO"]
