"""One rollout: SB3's ``collect_rollouts`` run lean with the same numbers (:mod:`~.lean`), the lean ``env.step`` of
SB3's own VecEnv stack (:mod:`~.vec_step`), the policy step replayed from a CUDA graph (:mod:`~.graphed_step`) and
collection on another device than training (:mod:`~.device`, ``collect_device``).

Its old module ``sb3_ppo_scale.core.collect`` is :mod:`~.device`; its names stay importable from here.
"""

from sb3_ppo_scale.core.collect.device import CollectionPolicy, collecting_on, resolve_collect_device

__all__ = ["CollectionPolicy", "collecting_on", "resolve_collect_device"]
