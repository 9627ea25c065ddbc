"""ScalablePPO works wherever PPO works, and learns exactly what PPO learns there."""

from __future__ import annotations

import glob
import os

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.envs import (
    IdentityEnv,
    IdentityEnvBox,
    IdentityEnvMultiBinary,
    IdentityEnvMultiDiscrete,
)
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecNormalize

from sb3_ppo_scale import ScalablePPO
from tests.helpers import ACCUMULATION_ATOL, assert_identical, assert_params_close, seeded_dict_env, train_pair

SMALL = dict(n_steps=64, batch_size=32, n_epochs=2)

ENVS = {
    "discrete": lambda: IdentityEnv(5),
    "box": lambda: IdentityEnvBox(),
    "multidiscrete": lambda: IdentityEnvMultiDiscrete(3),
    "multibinary": lambda: IdentityEnvMultiBinary(3),
}


@pytest.mark.parametrize("space", sorted(ENVS))
@pytest.mark.parametrize("grad_accum_steps", [1, 4])
def test_action_spaces_match_ppo(space: str, grad_accum_steps: int) -> None:
    ppo, ours = train_pair(ENVS[space], 2 * 64, scalable_kwargs=dict(grad_accum_steps=grad_accum_steps), **SMALL)
    if grad_accum_steps == 1:  # default settings: bit-identical, optimizer state included
        assert_identical(ppo, ours)
    else:  # summation order of the micro-batch gradients differs: see ACCUMULATION_ATOL
        assert_params_close(ppo, ours, ACCUMULATION_ATOL)


def test_dict_observations_match_ppo() -> None:
    ppo, ours = train_pair(seeded_dict_env, 2 * 64, policy="MultiInputPolicy", **SMALL)
    assert_identical(ppo, ours)


@pytest.mark.parametrize("grad_accum_steps", [1, 2])
def test_gsde_matches_ppo(grad_accum_steps: int) -> None:
    kwargs = dict(use_sde=True, sde_sample_freq=4, **SMALL)
    ppo, ours = train_pair("Pendulum-v1", 2 * 64, scalable_kwargs=dict(grad_accum_steps=grad_accum_steps), **kwargs)
    if grad_accum_steps == 1:
        assert_identical(ppo, ours)
    else:  # see ACCUMULATION_ATOL
        assert_params_close(ppo, ours, ACCUMULATION_ATOL)


class _SmallExtractor(BaseFeaturesExtractor):
    """A user's own features extractor: one Linear + ReLU."""

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 8) -> None:
        super().__init__(observation_space, features_dim)
        self.net = th.nn.Sequential(th.nn.Linear(observation_space.shape[0], features_dim), th.nn.ReLU())

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return self.net(observations)


#: policy_kwargs users pass, each touching a part the lean paths replace (fused step and evaluation, flat Adam)
POLICY_VARIANTS = {
    "rmsprop": ("CartPole-v1", dict(optimizer_class=th.optim.RMSprop, optimizer_kwargs=dict(alpha=0.99, eps=1e-5))),
    "adam_weight_decay": ("CartPole-v1", dict(optimizer_kwargs=dict(eps=1e-7, weight_decay=1e-4))),
    "adamw": ("CartPole-v1", dict(optimizer_class=th.optim.AdamW)),
    "sgd_momentum": ("CartPole-v1", dict(optimizer_class=th.optim.SGD, optimizer_kwargs=dict(momentum=0.9))),
    "separate_extractors": ("CartPole-v1", dict(share_features_extractor=False)),
    "net_arch_dict_relu": ("CartPole-v1", dict(net_arch=dict(pi=[32], vf=[16, 16]), activation_fn=th.nn.ReLU)),
    "net_arch_empty": ("CartPole-v1", dict(net_arch=[])),
    "own_extractor": ("CartPole-v1", dict(features_extractor_class=_SmallExtractor, share_features_extractor=False)),
    "gaussian_no_ortho_log_std": ("Pendulum-v1", dict(ortho_init=False, log_std_init=-2.0)),
}


@pytest.mark.parametrize("variant", sorted(POLICY_VARIANTS))
def test_policy_and_optimizer_variants_match_ppo(variant: str) -> None:
    env_id, policy_kwargs = POLICY_VARIANTS[variant]
    ppo, ours = train_pair(lambda: make_vec_env(env_id, n_envs=2, seed=1), 3 * 128, policy_kwargs=policy_kwargs,
                           **SMALL)
    assert_identical(ppo, ours)


def _atari() -> VecFrameStack:
    import ale_py

    gym.register_envs(ale_py)
    return VecFrameStack(make_atari_env("ALE/Pong-v5", n_envs=2, seed=0), n_stack=4)


def test_atari_cnn_policy_matches_ppo_and_keeps_uint8() -> None:
    ppo, ours = train_pair(_atari, 2 * 32 * 2, policy="CnnPolicy", n_steps=32, batch_size=32, n_epochs=1)
    assert_identical(ppo, ours)
    staged = ours._stage_rollout()
    assert staged.observations.dtype == th.uint8
    assert tuple(staged.observations.shape) == (64, 4, 84, 84)  # channel-first after VecTransposeImage


def test_vecnormalize_matches_ppo() -> None:
    def make() -> VecNormalize:
        return VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))

    ppo, ours = train_pair(make, 3 * 128, n_steps=64, batch_size=64, n_epochs=2)
    assert_identical(ppo, ours)
    for stats in ("obs_rms", "ret_rms"):  # the normalisation statistics saw the same observations and rewards
        theirs, mine = getattr(ppo.get_vec_normalize_env(), stats), getattr(ours.get_vec_normalize_env(), stats)
        assert theirs.count == mine.count
        np.testing.assert_array_equal(theirs.mean, mine.mean)
        np.testing.assert_array_equal(theirs.var, mine.var)


class CountingCallback(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.steps = 0
        self.rollouts = 0

    def _on_step(self) -> bool:
        self.steps += 1
        return True

    def _on_rollout_end(self) -> None:
        self.rollouts += 1


def test_callbacks_progress_bar_and_tensorboard(tmp_path) -> None:
    callback = CountingCallback()
    model = ScalablePPO("MlpPolicy", "CartPole-v1", tensorboard_log=str(tmp_path), seed=0, device="cpu", **SMALL)
    model.learn(3 * 64, callback=callback, progress_bar=True, tb_log_name="run")
    assert callback.steps == 3 * 64 and callback.rollouts == 3
    events = glob.glob(os.path.join(tmp_path, "run_1", "events.out.tfevents.*"))
    assert len(events) == 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(events[0]).Reload().Tags()["scalars"]
    assert {"train/approx_kl", "train/policy_gradient_loss", "train/n_grad_steps", "train/loss"} <= set(tags)


def test_save_load_round_trip_and_continue(tmp_path) -> None:
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", grad_accum_steps=4, buffer_device="cpu", seed=0, device="cpu", **SMALL)
    model.learn(2 * 64)
    model.save(tmp_path / "model")

    loaded = ScalablePPO.load(tmp_path / "model", device="cpu")
    assert loaded.grad_accum_steps == 4 and loaded.buffer_device == "cpu"
    assert loaded._n_grad_steps == model._n_grad_steps == 2 * 2 * 2
    assert loaded._rollout_stager is None and loaded.rollout_buffer is None  # inference: no rollout storage
    assert_identical(model, loaded)  # parameters and Adam state
    obs = np.zeros((1, 3), dtype=np.float32)
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])

    loaded.set_env(make_vec_env("Pendulum-v1", n_envs=1, seed=1))
    loaded.learn(64, reset_num_timesteps=False)  # the rollout storage appears when learning needs it
    assert loaded.rollout_buffer.observations.shape == (64, 1, 3)
    assert loaded.num_timesteps == 3 * 64
    assert loaded._n_grad_steps == 2 * 2 * 2 + 2 * 2


def test_load_with_fewer_envs_trains_on_the_whole_rollout_as_ppo(tmp_path) -> None:
    """batch_size = the whole rollout of 4 envs; loaded with 1 env, PPO trains on the 16-step rollout as one minibatch,
    and so does ScalablePPO (parameters and Adam state equal)."""
    PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4), n_steps=16, batch_size=64, seed=3, device="cpu").save(tmp_path / "m")
    models = []
    for cls in (PPO, ScalablePPO):
        model = cls.load(tmp_path / "m", env=make_vec_env("CartPole-v1", n_envs=1, seed=2), device="cpu")
        model.set_random_seed(5)
        model.learn(32)
        models.append(model)
    assert models[1].predict(np.zeros((1, 4), dtype=np.float32))[0].shape == (1,)
    assert_identical(*models)


def test_load_rejects_bad_new_argument(tmp_path) -> None:
    ScalablePPO("MlpPolicy", "CartPole-v1", device="cpu", **SMALL).save(tmp_path / "m")
    with pytest.raises(ValueError, match="grad_accum_steps"):
        ScalablePPO.load(tmp_path / "m", grad_accum_steps=0)


def test_is_a_ppo_and_continues_like_ppo() -> None:
    """learn() twice in a row equals PPO doing the same."""
    models = []
    for cls in (PPO, ScalablePPO):
        model = cls("MlpPolicy", DummyVecEnv([lambda: gym.make("CartPole-v1")]), seed=1, device="cpu", **SMALL)
        model.learn(64)
        model.learn(64, reset_num_timesteps=False)
        models.append(model)
    assert isinstance(models[1], PPO)
    assert_identical(*models)
