"""Exact resume for sb3-contrib's classes (sb3_ppo_scale.checkpoint): ScalableMaskablePPO and ScalableRecurrentPPO
runs stopped by a real SIGTERM inside rollout k+1 and resumed from their checkpoint end bit-identical to the
uninterrupted run (episodes end at rollout boundaries, as in tests/test_checkpoint.py); ``load_checkpoint`` rebuilds
the class that wrote the checkpoint; RecurrentPPO's ``_last_lstm_states`` (left out of ``save()``) are restored as
they were at the checkpoint's rollout boundary."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_scale import ScalableMaskablePPO, ScalableRecurrentPPO
from sb3_ppo_scale.contrib.masks import InfoActionMasker
from sb3_ppo_scale.checkpoint import (
    PREEMPTED_EXIT_CODE,
    ResumableCheckpoint,
    TrainingPreempted,
    learn_resumable,
    load_checkpoint,
    read_checkpoint,
    resume_notes,
)
from tests.helpers import assert_identical
from tests.test_checkpoint import EPISODE, FixedLengthEnv

N_STEPS, N_ENVS = 2 * EPISODE, 2  # rollouts of N_STEPS end exactly at episode ends
ROLLOUT = N_STEPS * N_ENVS
TOTAL = 5 * ROLLOUT
STOP_ROLLOUT = 2  #: SIGTERM arrives inside rollout STOP_ROLLOUT + 1: the checkpoint holds STOP_ROLLOUT updates


class MaskedFixedLengthEnv(gym.Env):
    """Episodes of exactly :data:`EPISODE` steps; Discrete(4) actions, one of them (``t % 4``) masked each step;
    every step adds noise from the env's ``np_random`` (an exact resume needs each env's RNG restored)."""

    observation_space = spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = spaces.Discrete(4)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t, self.x = 0, np.array([0.5, -0.5, 0.0], dtype=np.float32)
        return self.x.copy(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        noise = self.np_random.normal(0.0, 0.1, size=3).astype(np.float32)
        self.x = np.clip(0.9 * self.x + 0.3 * (int(action) - 1.5) + noise, -10, 10).astype(np.float32)
        return self.x.copy(), float(-np.sum(self.x**2)), False, self.t >= EPISODE, {}

    def action_masks(self) -> np.ndarray:
        mask = np.ones(4, dtype=bool)
        mask[self.t % 4] = False
        return mask


ALGOS: dict[str, tuple[type, Any, str, dict[str, Any]]] = {
    # name -> (class, env class, policy, constructor arguments)
    "maskable": (ScalableMaskablePPO, MaskedFixedLengthEnv, "MlpPolicy", dict(policy_kwargs={"net_arch": [16]})),
    "recurrent": (ScalableRecurrentPPO, FixedLengthEnv, "MlpLstmPolicy",
                  dict(policy_kwargs={"net_arch": [16], "lstm_hidden_size": 8})),
    "recurrent_batched": (ScalableRecurrentPPO, FixedLengthEnv, "MlpLstmPolicy",
                          dict(policy_kwargs={"net_arch": [16], "lstm_hidden_size": 8}, batched_sequences=True)),
    "recurrent_chunks": (ScalableRecurrentPPO, FixedLengthEnv, "MlpLstmPolicy",
                         dict(policy_kwargs={"net_arch": [16], "lstm_hidden_size": 8}, sequence_length=8)),
}


def make_env(name: str) -> VecEnv:
    return make_vec_env(ALGOS[name][1], n_envs=N_ENVS, seed=3)


def make_model(name: str) -> Any:
    cls, _, policy, kwargs = ALGOS[name]
    return cls(policy, make_env(name), n_steps=N_STEPS, batch_size=32, n_epochs=2, seed=1, device="cpu", **kwargs)


class SigtermAt(BaseCallback):
    """Sends this process a real SIGTERM once ``num_timesteps`` reaches ``at``; keeps the recurrent model's
    ``_last_lstm_states`` as they were when the rollout holding ``at`` started (the checkpoint's boundary)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.boundary_lstm_states = at, None

    def _on_rollout_start(self) -> None:
        if self.model.num_timesteps == self.at - self.at % ROLLOUT and hasattr(self.model, "_last_lstm_states"):
            self.boundary_lstm_states = [t.clone() for pair in self.model._last_lstm_states for t in pair]

    def _on_step(self) -> bool:
        if self.num_timesteps == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return True


def preempt_and_resume(name: str, path: Path) -> tuple[Any, SigtermAt]:
    """Train, stopped by SIGTERM in the middle of rollout STOP_ROLLOUT + 1, then resume from the checkpoint."""
    model = make_model(name)
    checkpoint = ResumableCheckpoint(path, every_steps=ROLLOUT, signals=(signal.SIGTERM,))
    stop = SigtermAt(STOP_ROLLOUT * ROLLOUT + 10)
    with pytest.raises(TrainingPreempted) as stopped:
        learn_resumable(model, TOTAL, checkpoint, callback=stop)
    assert stopped.value.code == PREEMPTED_EXIT_CODE and stopped.value.signal_name == "SIGTERM"
    assert stopped.value.num_timesteps == STOP_ROLLOUT * ROLLOUT
    state = read_checkpoint(path)
    assert state["counters"]["num_timesteps"] == STOP_ROLLOUT * ROLLOUT
    assert state["algorithm_class"] == f"{type(model).__module__}:{type(model).__qualname__}"
    del model
    resumed = load_checkpoint(path, make_env(name), device="cpu")  # the class is read from the checkpoint
    assert type(resumed) is ALGOS[name][0]
    assert resume_notes(resumed) == []  # every env at an episode start, env RNGs readable: exact
    return resumed, stop


@pytest.mark.parametrize("name", list(ALGOS))
def test_preempted_and_resumed_run_is_bit_identical(name: str, tmp_path: Path) -> None:
    reference = make_model(name)
    reference.learn(TOTAL)
    path = tmp_path / "checkpoint.pt"
    resumed, stop = preempt_and_resume(name, path)
    if name.startswith("recurrent"):  # restored as at the boundary, not as a fresh model's zeros
        restored = [t for pair in resumed._last_lstm_states for t in pair]
        assert all(th.equal(a, b) for a, b in zip(restored, stop.boundary_lstm_states))
        assert all(t.abs().sum() > 0 for t in restored)
    if name == "recurrent_batched":
        assert resumed.batched_sequences is True
    if name == "recurrent_chunks":
        assert resumed.sequence_length == 8
    learn_resumable(resumed, None, ResumableCheckpoint(path, signals=()))
    assert_identical(reference, resumed)  # every parameter and Adam state tensor, torch.equal
    for attribute in ("num_timesteps", "_n_updates", "_n_grad_steps", "_total_timesteps"):
        assert getattr(resumed, attribute) == getattr(reference, attribute), attribute
    assert resumed.num_timesteps == TOTAL
    assert [info["r"] for info in resumed.ep_info_buffer] == [info["r"] for info in reference.ep_info_buffer]
    if name.startswith("recurrent"):
        for a, b in zip(resumed._last_lstm_states, reference._last_lstm_states):
            assert th.equal(a[0], b[0]) and th.equal(a[1], b[1])


def test_lstm_states_are_not_in_the_saved_model(tmp_path: Path) -> None:
    """Why the checkpoint carries them itself: RecurrentPPO's save() leaves ``_last_lstm_states`` out, so a model
    loaded from the checkpoint's zip alone starts from zeros."""
    model = make_model("recurrent")
    model.learn(ROLLOUT)
    model.save(tmp_path / "model.zip")
    loaded = ScalableRecurrentPPO.load(tmp_path / "model.zip", env=make_env("recurrent"), device="cpu")
    assert any(t.abs().sum() > 0 for pair in model._last_lstm_states for t in pair)
    assert all(t.abs().sum() == 0 for pair in loaded._last_lstm_states for t in pair)


class MaskedCartPole(gym.Wrapper):
    """CartPole with an action mask (both actions allowed); its own episode state is the env's (nothing of its own)."""

    def action_masks(self) -> np.ndarray:
        return np.ones(2, dtype=bool)

    def get_episode_state(self) -> None:  # opts in: holds no state of its own
        return None

    def set_episode_state(self, state: None) -> None:
        pass


def config_envs(env_id: str, **kwargs: Any) -> VecEnv:
    """2 envs of one of the contrib configs' env ids (configs/contrib.yml), registered as `train` registers them."""
    from sb3_ppo_scale.experiments.algorithms import register_envs

    register_envs(env_id)
    return make_vec_env(env_id, n_envs=2, seed=5, **kwargs)


@pytest.mark.parametrize("cls, policy, make", [
    (ScalableRecurrentPPO, "MlpLstmPolicy", lambda: make_vec_env("CartPole-v1", n_envs=2, seed=5)),
    (ScalableMaskablePPO, "MlpPolicy", lambda: make_vec_env("CartPole-v1", n_envs=2, seed=5, wrapper_class=MaskedCartPole)),
    # the contrib configs' envs (their episodes restarted on resume before their layers were known)
    (ScalableRecurrentPPO, "MlpLstmPolicy", lambda: config_envs("CartPoleNoVel-v1")),
    (ScalableRecurrentPPO, "MlpLstmPolicy", lambda: config_envs("PendulumNoVel-v1")),
    (ScalableMaskablePPO, "MlpPolicy", lambda: config_envs("InvalidActionEnvDiscrete-v0")),
    (ScalableMaskablePPO, "MlpPolicy", lambda: config_envs("Taxi-v4", wrapper_class=InfoActionMasker)),
], ids=["CartPole-recurrent", "CartPole-maskable", "CartPoleNoVel", "PendulumNoVel", "InvalidActionEnvDiscrete",
        "Taxi"])
def test_episodes_in_progress_continue_bit_identically(cls: type, policy: str, make: Any, tmp_path: Path) -> None:
    """A checkpoint mid-episode (23-step rollouts, CartPole's episodes run on): the episodes and, for the recurrent
    policy, the LSTM states continue where they were."""
    def build() -> Any:
        return cls(policy, make(), n_steps=23, batch_size=23, n_epochs=1, seed=2, device="cpu",
                   policy_kwargs={"net_arch": [8]})

    reference = build()
    reference.learn(5 * 46)
    model, path = build(), tmp_path / "checkpoint.pt"
    checkpoint = ResumableCheckpoint(path, every_steps=46, signals=(signal.SIGTERM,))
    with pytest.raises(TrainingPreempted):
        learn_resumable(model, 5 * 46, checkpoint, callback=SigtermAt(2 * 46 + 6))
    assert not read_checkpoint(path)["ranks"][0]["last_episode_starts"].all()
    resumed = load_checkpoint(path, make(), device="cpu")
    assert resume_notes(resumed) == []
    learn_resumable(resumed, None, ResumableCheckpoint(path, signals=()))
    assert_identical(reference, resumed)
