"""Models and checkpoints written before a module moved still load, and a checkpoint still resumes exactly.

``tests/data/saved_before_core_move/`` was written at commit 93f653f, before ``sb3_ppo_scale/core/`` was split into
parts: their pickles name the old module paths (``sb3_ppo_scale.core.lr.KLAdaptiveLR``). The files were made with::

    make = lambda: ScalablePPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=0), n_steps=32,
        batch_size=32, n_epochs=2, learning_rate="kl_adaptive", objective="kl_penalty", seed=0, device="cpu",
        policy_kwargs={"net_arch": [8]})
    model = make(); model.learn(128); model.save(".../model.zip")
    learn_resumable(make(), 192, ResumableCheckpoint(".../checkpoint.pt", every_steps=10**9, signals=()),
        callback=<SIGTERM to that checkpoint at step 138>)  # preempted: the checkpoint holds step 128
    ScalableRecurrentPPO("MlpLstmPolicy", <the same env>, n_steps=32, batch_size=32, n_epochs=1,
        learning_rate="kl_adaptive", seed=0, device="cpu", policy_kwargs={"net_arch": [8], "lstm_hidden_size": 8}
        ).learn(64) then .save(".../recurrent.zip")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch as th
from gymnasium.envs.classic_control import PendulumEnv
import gymnasium
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_scale import ScalablePPO, ScalableRecurrentPPO
from sb3_ppo_scale.checkpoint import ResumableCheckpoint, learn_resumable, load_checkpoint, resume_notes

SAVED = Path(__file__).parent / "data" / "saved_before_core_move"


#: gymnasium's own TimeLimit, also after rl_zoo3 replaced every public name of it with its subclass
TimeLimit = next(cls for cls in gymnasium.wrappers.TimeLimit.__mro__
                 if cls.__name__ == "TimeLimit" and cls.__module__ == "gymnasium.wrappers.common")


def _pendulum() -> gymnasium.Env:
    """``gym.make("Pendulum-v1")``'s layers, built by hand: importing rl_zoo3 (other tests do) swaps the registry's
    TimeLimit for its own, and the checkpoint's episodes resume only on the layers they were captured from."""
    return TimeLimit(OrderEnforcing(PassiveEnvChecker(PendulumEnv())), max_episode_steps=200)


def _env() -> VecEnv:
    return make_vec_env(_pendulum, n_envs=2, seed=0)


def _make() -> ScalablePPO:
    return ScalablePPO("MlpPolicy", _env(), n_steps=32, batch_size=32,
                       n_epochs=2, learning_rate="kl_adaptive", objective="kl_penalty", seed=0, device="cpu",
                       policy_kwargs={"net_arch": [8]})


def test_a_model_saved_before_the_move_loads_with_its_adapted_learning_rate() -> None:
    loaded = ScalablePPO.load(SAVED / "model.zip", device="cpu")
    fresh = _make()
    fresh.learn(128)
    assert type(loaded.learning_rate) is type(fresh.learning_rate)  # the class at its current path
    assert loaded.learning_rate.value == fresh.learning_rate.value != 3e-4  # adapted, and saved as adapted
    assert loaded.kl_beta == fresh.kl_beta
    for saved, trained in zip(loaded.policy.parameters(), fresh.policy.parameters()):
        assert th.equal(saved, trained)
    obs = np.zeros((1, 3), dtype=np.float32)
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], fresh.predict(obs, deterministic=True)[0])


def test_a_checkpoint_written_before_the_move_resumes_bit_identical(tmp_path: Path) -> None:
    resumed = load_checkpoint(SAVED / "checkpoint.pt", _env(), device="cpu")
    assert resumed.num_timesteps == 128 and resume_notes(resumed) == []  # episodes continue: exact
    learn_resumable(resumed, None, ResumableCheckpoint(tmp_path / "checkpoint.pt", signals=()))
    uninterrupted = _make()
    uninterrupted.learn(192)
    assert resumed.num_timesteps == uninterrupted.num_timesteps == 192
    assert type(resumed.learning_rate) is type(uninterrupted.learning_rate)
    assert resumed.learning_rate.value == uninterrupted.learning_rate.value
    for a, b in zip(resumed.policy.parameters(), uninterrupted.policy.parameters()):
        assert th.equal(a, b)


def test_a_recurrent_model_saved_before_the_move_loads() -> None:
    loaded = ScalableRecurrentPPO.load(SAVED / "recurrent.zip", device="cpu")
    assert type(loaded.learning_rate).__name__ == "KLAdaptiveLR" and loaded.num_timesteps == 64
    actions, states = loaded.predict(np.zeros((1, 3), dtype=np.float32), deterministic=True)
    assert actions.shape == (1, 1) and states[0].shape == (1, 1, 8)
