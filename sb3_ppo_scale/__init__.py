"""sb3-ppo-scale: PPO for Stable-Baselines3 that trains at scale."""

from sb3_ppo_scale.core.ppo import ScalablePPO
from sb3_ppo_scale.contrib import ScalableMaskablePPO, ScalableRecurrentPPO
from sb3_ppo_scale.buffers.prioritized import MaskablePrioritizedRolloutBuffer, PrioritizedRolloutBuffer
from sb3_ppo_scale.core.update.sampling import MinibatchLoader
from sb3_ppo_scale import checkpoint, distributed
from sb3_ppo_scale.core import extensions

# the layers above the core provide what it plugs in (sb3_ppo_scale.core.extensions)
extensions.install(data_parallel=distributed, checkpoint_loader=checkpoint.load_checkpoint)

__all__ = ["ScalablePPO", "ScalableMaskablePPO", "ScalableRecurrentPPO", "MinibatchLoader", "PrioritizedRolloutBuffer",
           "MaskablePrioritizedRolloutBuffer"]
__version__ = "0.1.0"
