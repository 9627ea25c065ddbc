"""sb3-contrib's masking env ``InvalidActionEnvDiscrete`` under Gymnasium ids, registered when this module is imported
(``gymnasium.make("sb3_ppo_scale.experiments.masking_envs:InvalidActionEnvDiscrete-v0")`` works in any process, a
``SubprocVecEnv`` worker's too)."""

from __future__ import annotations

import gymnasium as gym

#: Gymnasium id -> keyword arguments of sb3-contrib's InvalidActionEnvDiscrete registered under it (episodes of 100
#: steps; each step ``n_invalid_actions`` of the ``dim`` actions are masked, never the correct one)
MASKING_ENVS: dict[str, dict[str, int]] = {
    "InvalidActionEnvDiscrete-v0": dict(dim=20, n_invalid_actions=10),  # sb3-contrib's test setting
    "InvalidActionEnvDiscrete80-v0": dict(dim=80, n_invalid_actions=60),  # benchmarks/contrib_train.py's
}


def masking_env(render_mode: str | None = None, **kwargs: int) -> gym.Env:
    """sb3-contrib's InvalidActionEnvDiscrete, built through ``gym.make`` (which passes SB3's ``render_mode``; the
    env renders nothing)."""
    from sb3_contrib.common.envs import InvalidActionEnvDiscrete

    return InvalidActionEnvDiscrete(**kwargs)


for _env_id, _kwargs in MASKING_ENVS.items():
    if _env_id not in gym.registry:
        gym.register(_env_id, entry_point=masking_env, kwargs=_kwargs)
