"""Shared test utilities: build a PPO and a ScalablePPO the same way and compare what they learned."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.logger import Logger, configure

from sb3_ppo_scale import ScalablePPO


def flat_params(model: PPO) -> th.Tensor:
    return th.cat([p.detach().flatten() for p in model.policy.parameters()])


def max_param_diff(a: PPO, b: PPO) -> float:
    return (flat_params(a) - flat_params(b)).abs().max().item()


class RecordingLogger(Logger):
    """An SB3 logger that also remembers every value recorded (last value per key)."""

    def __init__(self) -> None:
        super().__init__(folder=None, output_formats=[])
        self.seen: dict[str, Any] = {}

    def record(self, key: str, value: Any, exclude: Any = None) -> None:
        self.seen[key] = value
        super().record(key, value, exclude)


def train_pair(
    make_env: Callable[[], Any] | str,
    total_timesteps: int,
    policy: str = "MlpPolicy",
    scalable_kwargs: dict[str, Any] | None = None,
    device: str = "cpu",
    baseline_kwargs: dict[str, Any] | None = None,
    baseline_cls: type[PPO] = PPO,
    **common: Any,
) -> tuple[PPO, ScalablePPO]:
    """Train a baseline (default: PPO) and ScalablePPO with identical seeds/hyperparameters, one after the other;
    returns both, each with a RecordingLogger."""
    baseline = train_one(baseline_cls, make_env, total_timesteps, policy, device, **common, **(baseline_kwargs or {}))
    scalable = train_one(ScalablePPO, make_env, total_timesteps, policy, device, **common, **(scalable_kwargs or {}))
    return baseline, scalable  # type: ignore[return-value]


def train_one(
    cls: type[PPO], make_env: Callable[[], Any] | str, total_timesteps: int, policy: str, device: str, **kwargs: Any
) -> PPO:
    env = make_env if isinstance(make_env, str) else make_env()
    model = cls(policy, env, seed=0, device=device, **kwargs)
    model.set_logger(RecordingLogger())
    model.learn(total_timesteps)
    return model


def unused_logger() -> Logger:
    return configure(None, [])
