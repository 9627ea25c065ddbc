"""compile_loss=True: the compiled loss trains like the eager one, compiles once per kind of update, and round-trips.

Float rounding differs between inductor's fused kernels and eager PyTorch, so the parameters are compared with a
tolerance (1e-5 after three rollouts, the suite's parity tolerance) rather than bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch._dynamo.utils as dynamo_utils
from stable_baselines3.common.envs import FakeImageEnv, SimpleMultiObsEnv
from stable_baselines3.common.utils import LinearSchedule

from sb3_ppo_scale import PrioritizedRolloutBuffer, ScalablePPO
from tests.helpers import max_param_diff, train_pair
from sb3_ppo_scale.core.compiled import compiled_ppo_loss
from sb3_ppo_scale.core.objectives import ppo_loss

CASES = {
    # clip-range and learning-rate schedules, uneven micro-batches and a short last minibatch (100 + 100 + 56)
    "pendulum_schedules_accumulation": (
        "Pendulum-v1",
        dict(
            n_steps=256,
            batch_size=100,
            grad_accum_steps=3,
            clip_range=LinearSchedule(0.3, 0.1, 1.0),
            learning_rate=LinearSchedule(3e-4, 1e-4, 1.0),
        ),
    ),
    # target_kl early stopping fires (checked below through the gradient-step count)
    "cartpole_target_kl": ("CartPole-v1", dict(n_steps=256, batch_size=64, target_kl=0.002)),
    # PPO-Penalty: beta is adapted after every train() call
    "pendulum_kl_penalty": ("Pendulum-v1", dict(n_steps=256, batch_size=64, objective="kl_penalty")),
}


def seeded_dict_env() -> SimpleMultiObsEnv:
    """SB3's Dict-observation env draws its state images and vectors from NumPy's global RNG when it is built."""
    np.random.seed(0)
    return SimpleMultiObsEnv(random_start=False)


def seeded_image_env() -> FakeImageEnv:
    """SB3's fake image env samples every observation from its observation space's own (unseeded) RNG."""
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    env.observation_space.seed(0)
    return env


#: where else the loss runs: other policies, gSDE, prioritized weights. One rollout each, trained for n_epochs: a
#: second rollout would be collected by slightly different policies, and one flipped action sample (a discrete
#: action near a probability boundary) gives another trajectory, so the comparison would no longer be on equal data.
POLICIES = {
    "dict_observations": (seeded_dict_env, "MultiInputPolicy", dict(n_steps=64, batch_size=32)),
    "gsde": ("Pendulum-v1", "MlpPolicy", dict(n_steps=64, batch_size=32, use_sde=True, sde_sample_freq=4)),
    "cnn_uint8": (
        seeded_image_env,
        "CnnPolicy",
        dict(n_steps=32, batch_size=16, n_epochs=2, policy_kwargs=dict(normalize_images=True)),
    ),
    "prioritized_weights": (
        "Pendulum-v1",
        "MlpPolicy",
        dict(n_steps=64, batch_size=32, rollout_buffer_class=PrioritizedRolloutBuffer,
             rollout_buffer_kwargs=dict(priority="abs_advantage")),
    ),
}


def compiled_graphs() -> int:
    return dynamo_utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_loss_trains_like_eager(case: str) -> None:
    env, kwargs = CASES[case]
    eager, compiled = train_pair(
        env, 768, scalable_kwargs=dict(compile_loss=True), baseline_cls=ScalablePPO, **kwargs
    )
    assert compiled._loss is compiled_ppo_loss and eager._loss is ppo_loss
    assert compiled._n_grad_steps == eager._n_grad_steps
    if case == "cartpole_target_kl":
        assert eager._n_grad_steps < 3 * 10 * 4  # early stopping did fire
    assert max_param_diff(eager, compiled) <= 1e-5
    for key in ("train/approx_kl", "train/clip_fraction", "train/value_loss"):
        assert compiled.logger.seen[key] == pytest.approx(eager.logger.seen[key], rel=1e-3, abs=1e-6)


@pytest.mark.parametrize("case", list(POLICIES))
def test_compiled_loss_works_with_other_policies_and_buffers(case: str) -> None:
    make_env, policy, kwargs = POLICIES[case]
    eager, compiled = train_pair(
        make_env, kwargs["n_steps"], policy=policy, scalable_kwargs=dict(compile_loss=True), baseline_cls=ScalablePPO, **kwargs
    )
    assert compiled._n_grad_steps == eager._n_grad_steps > 1
    assert max_param_diff(eager, compiled) <= 1e-5


def test_schedules_and_adaptive_beta_do_not_compile_again() -> None:
    """Changing coefficients enter as tensors: after the first train() call nothing new is compiled."""
    model = ScalablePPO(
        "MlpPolicy",
        "Pendulum-v1",
        n_steps=128,
        batch_size=50,
        seed=0,
        compile_loss=True,
        objective="clip_kl_penalty",
        clip_range=LinearSchedule(0.3, 0.1, 1.0),
    )
    model.learn(128)
    after_first_call = compiled_graphs()
    model.learn(384, reset_num_timesteps=False)
    assert compiled_graphs() == after_first_call


def test_compile_loss_round_trips(tmp_path) -> None:
    model = ScalablePPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, compile_loss=True)
    model.save(tmp_path / "model.zip")
    loaded = ScalablePPO.load(tmp_path / "model.zip")
    assert loaded.compile_loss is True and loaded._loss is compiled_ppo_loss
    assert ScalablePPO.load(tmp_path / "model.zip", compile_loss=False)._loss is ppo_loss
