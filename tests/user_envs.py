"""A user's own env, registered when this module is imported: what ``"tests.user_envs:UserCartPole-v0"`` names
(Gymnasium's ``module:EnvId`` form) in the CLI and tuning tests."""

from __future__ import annotations

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class UserCartPole(CartPoleEnv):
    """CartPole under a name Gymnasium does not know until this module is imported."""


if "UserCartPole-v0" not in gym.registry:
    gym.register("UserCartPole-v0", entry_point=UserCartPole, max_episode_steps=200)
