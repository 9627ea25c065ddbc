"""A step whose policy outputs are not numbers stops collection where the upstream class stops it, with its error.

SB3's (and sb3-contrib's) policy call builds a torch ``Distribution`` with argument validation, which refuses NaN
means or logits (a NaN observation from a broken env, diverged weights) with a ``ValueError`` at that step. The
lean loops' fused step validates nothing; without a check a Gaussian policy sent NaN actions to the envs for the
rest of the rollout (polluting ``VecNormalize``'s statistics and the episode returns) and a categorical one failed
later, in ``torch.multinomial``, with another error. Each case here runs the upstream class and the Scalable one
on the same poisoned step and compares the exception (type and message) and ``num_timesteps``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiDiscrete
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import IdentityEnvMultiBinary, IdentityEnvMultiDiscrete
from stable_baselines3.common.vec_env import VecNormalize
from torch.distributions import Distribution

from sb3_ppo_scale import ScalableMaskablePPO, ScalablePPO, ScalableRecurrentPPO

POISONED_STEP = 5


class NanObservationAt(gym.ObservationWrapper):
    """Returns an all-NaN observation at the ``at``-th observation (reset included), as a broken env would."""

    def __init__(self, env: gym.Env, at: int = POISONED_STEP) -> None:
        super().__init__(env)
        self.at, self.seen = at, 0

    def observation(self, observation: np.ndarray) -> np.ndarray:
        self.seen += 1
        return observation * np.nan if self.seen == self.at else observation


class NanWeightsAt(BaseCallback):
    """Sets the action head's bias to NaN in ``on_step`` of step ``at`` (diverged weights, changed in place)."""

    def __init__(self, at: int = POISONED_STEP) -> None:
        super().__init__()
        self.at = at

    def _on_step(self) -> bool:
        if self.n_calls == self.at:
            with th.no_grad():
                self.model.policy.action_net.bias.fill_(float("nan"))
        return True


#: name -> (upstream class, Scalable class, policy, env factory, poisoned by: "observation" or "weights")
CASES: dict[str, tuple[type, type, str, Callable[[], Any], str]] = {
    "box_nan_observation": (PPO, ScalablePPO, "MlpPolicy",
                            lambda: VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, wrapper_class=NanObservationAt,
                                                              seed=0)), "observation"),
    "discrete_nan_observation": (PPO, ScalablePPO, "MlpPolicy",
                                 lambda: make_vec_env("CartPole-v1", n_envs=2, wrapper_class=NanObservationAt, seed=0),
                                 "observation"),
    "box_nan_weights": (PPO, ScalablePPO, "MlpPolicy", lambda: make_vec_env("Pendulum-v1", n_envs=2, seed=0),
                        "weights"),
    "multidiscrete_nan_weights": (PPO, ScalablePPO, "MlpPolicy",
                                  lambda: make_vec_env(lambda: IdentityEnvMultiDiscrete(3), n_envs=2, seed=0), "weights"),
    "multibinary_nan_weights": (PPO, ScalablePPO, "MlpPolicy",
                                lambda: make_vec_env(lambda: IdentityEnvMultiBinary(3), n_envs=2, seed=0), "weights"),
    "masked_discrete_nan_weights": (MaskablePPO, ScalableMaskablePPO, "MlpPolicy",
                                    lambda: make_vec_env(lambda: InvalidActionEnvDiscrete(dim=8, n_invalid_actions=3),
                                                         n_envs=2, seed=0), "weights"),
    "masked_multidiscrete_nan_weights": (MaskablePPO, ScalableMaskablePPO, "MlpPolicy",
                                         lambda: make_vec_env(lambda: InvalidActionEnvMultiDiscrete(dims=[3, 4],
                                                                                                    n_invalid_actions=2),
                                                              n_envs=2, seed=0), "weights"),
    "recurrent_box_nan_observation": (RecurrentPPO, ScalableRecurrentPPO, "MlpLstmPolicy",
                                      lambda: make_vec_env("Pendulum-v1", n_envs=2, wrapper_class=NanObservationAt,
                                                           seed=0), "observation"),
    "recurrent_discrete_nan_weights": (RecurrentPPO, ScalableRecurrentPPO, "MlpLstmPolicy",
                                       lambda: make_vec_env("CartPole-v1", n_envs=2, seed=0), "weights"),
}


def _first_error(cls: type, policy: str, make_env: Callable[[], Any], poison: str) -> tuple[str, int]:
    """(the exception ``learn()`` raised, as 'Type: message', and ``num_timesteps`` when it was raised)."""
    model = cls(policy, make_env(), n_steps=16, batch_size=16, seed=0, device="cpu")
    callback = NanWeightsAt() if poison == "weights" else None
    with pytest.raises(Exception) as raised:
        model.learn(64, callback=callback)
    return f"{type(raised.value).__name__}: {raised.value}", model.num_timesteps


@pytest.mark.parametrize("case", sorted(CASES))
def test_nan_outputs_stop_collection_with_the_upstream_classs_error(case: str) -> None:
    upstream, scalable, policy, make_env, poison = CASES[case]
    expected = _first_error(upstream, policy, make_env, poison)
    assert expected[0].startswith("ValueError: Expected parameter")  # torch's validation of the distribution
    assert _first_error(scalable, policy, make_env, poison) == expected


def test_without_distribution_validation_nan_actions_are_collected_as_sb3_collects_them() -> None:
    """With torch's validation switched off SB3 samples NaN actions from NaN means; so does the lean loop, the same
    rollout (the check above must not raise where SB3 does not)."""
    _, _, policy, make_env, _ = CASES["box_nan_weights"]
    buffers = []
    previous = Distribution._validate_args
    Distribution.set_default_validate_args(False)
    try:
        for cls in (PPO, ScalablePPO):
            model = cls(policy, make_env(), n_steps=16, batch_size=16, seed=0, device="cpu")
            _, callback = model._setup_learn(16, NanWeightsAt())
            assert model.collect_rollouts(model.env, callback, model.rollout_buffer, 16)
            buffers.append(model.rollout_buffer)
    finally:
        Distribution.set_default_validate_args(previous)
    sb3, lean = buffers
    assert np.isnan(sb3.actions).any()
    for field in ("observations", "actions", "rewards", "values", "log_probs"):
        assert np.array_equal(getattr(sb3, field), getattr(lean, field), equal_nan=True), field
