"""Helpers shared by the benchmarks: synthetic rollouts, timing, machine description."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv


class SpacesEnv(gym.Env):
    """An env that only carries spaces: benchmarks fill the rollout buffer directly."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space) -> None:
        self.observation_space, self.action_space = observation_space, action_space

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


SHAPES: dict[str, tuple[spaces.Space, spaces.Space, str]] = {
    "halfcheetah": (spaces.Box(-np.inf, np.inf, (17,), np.float32), spaces.Box(-1, 1, (6,), np.float32), "MlpPolicy"),
    "atari": (spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6), "CnnPolicy"),
}


def synthetic_model(cls: type[PPO], shape: str, n_envs: int, n_steps: int, device: str, **kwargs) -> PPO:
    """A model whose rollout buffer is full of seeded random data (identical for every class)."""
    obs_space, act_space, policy = SHAPES[shape]
    env = DummyVecEnv([lambda: SpacesEnv(obs_space, act_space)] * n_envs)
    model = cls(policy, env, n_steps=n_steps, seed=0, device=device, **kwargs)
    model.set_logger(configure(None, []))
    model._current_progress_remaining = 1.0
    fill_rollout(model.rollout_buffer, obs_space, act_space)
    return model


def refill(model: PPO) -> None:
    """A fresh rollout, as after collection: SB3's ``get()`` flattens the buffer in place on its first call, and
    ScalablePPO stages (flattens) it once per rollout, so each timed ``train()`` must start from a new rollout."""
    model.rollout_buffer.reset()
    fill_rollout(model.rollout_buffer, model.observation_space, model.action_space)


def fill_rollout(buffer, obs_space: spaces.Space, act_space: spaces.Space, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    shape = (buffer.buffer_size, buffer.n_envs)
    if obs_space.dtype == np.uint8:
        buffer.observations[:] = rng.integers(0, 256, size=buffer.observations.shape, dtype=np.uint8)
    else:
        buffer.observations[:] = rng.standard_normal(buffer.observations.shape, dtype=np.float32)
    if isinstance(act_space, spaces.Discrete):
        buffer.actions[:] = rng.integers(0, act_space.n, size=buffer.actions.shape)
    else:
        buffer.actions[:] = rng.uniform(-1, 1, size=buffer.actions.shape).astype(np.float32)
    buffer.rewards[:] = rng.standard_normal(shape, dtype=np.float32)
    buffer.log_probs[:] = rng.normal(-2.0, 0.3, size=shape).astype(np.float32)
    buffer.values[:] = rng.standard_normal(shape, dtype=np.float32)
    buffer.advantages[:] = rng.standard_normal(shape, dtype=np.float32)
    buffer.returns[:] = buffer.values + buffer.advantages
    buffer.pos, buffer.full = buffer.buffer_size, True


def sync(device: str) -> None:
    if device.startswith("cuda"):
        th.cuda.synchronize()


def timed_train(model: PPO, device: str) -> float:
    """Seconds of one ``model.train()`` on a fresh copy of the synthetic rollout (refilled outside the timing)."""
    refill(model)
    return timed(model.train, device)


def timed(fn: Callable[[], None], device: str) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine_line(device: str) -> str:
    if device.startswith("cuda"):
        where = th.cuda.get_device_name(0)
    else:
        where = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads {th.get_num_threads()}"
    return f"torch {th.__version__}, device {device} ({where}), python {platform.python_version()}"
