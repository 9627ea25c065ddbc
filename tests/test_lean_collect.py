"""The lean collection loop writes SB3's rollout bit for bit (sb3_ppo_scale.core.collect.lean / core.policy.inference).

Each case builds two identical PPO models (same seed, same env construction) and collects one rollout with SB3's
``OnPolicyAlgorithm.collect_rollouts`` on one and with ``collect_rollouts_lean`` on the other, from the same torch
RNG state. Every buffer field, the RNG state afterwards, ``num_timesteps``, ``_last_obs``,
``_last_episode_starts``, the episode-info buffer and what a callback reads from ``locals`` at every step must be
equal. ScalablePPO's ``learn()`` against PPO's (which now runs through the lean loop) is in tests/test_compat.py and
tests/test_parity.py; here also the cases PPO cannot run (the prioritized buffer) against ScalablePPO on SB3's loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import (
    IdentityEnv,
    IdentityEnvMultiBinary,
    IdentityEnvMultiDiscrete,
)
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.vec_env import VecNormalize

from sb3_ppo_scale import PrioritizedRolloutBuffer, ScalablePPO
from sb3_ppo_scale.core import algorithm
from sb3_ppo_scale.core.policy.inference import FusedActorCritic, fusion_blocker
from sb3_ppo_scale.core.collect.graphed_step import InferenceGraphs
from sb3_ppo_scale.core.collect.lean import collect_rollouts_lean, to_host
from tests.helpers import LocalsRecorder, assert_identical, assert_same_state, seeded_dict_env, train_one

N_STEPS = 40


class ImageEnv(gym.Env):
    """Small uint8 images (CnnPolicy needs >= 36x36), a discrete action, episodes truncated after 7 steps."""

    observation_space = gym.spaces.Box(0, 255, (36, 36, 1), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 256, (36, 36, 1), dtype=np.uint8), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        obs = self.np_random.integers(0, 256, (36, 36, 1), dtype=np.uint8)
        return obs, float(action == 1), False, self.t >= 7, {}


def _vec(make: Callable[[], gym.Env] | str, n_envs: int = 3, normalize: bool = False) -> Any:
    env = make_vec_env(make, n_envs=n_envs, seed=0)
    return VecNormalize(env) if normalize else env


#: name -> (env factory, policy, PPO keyword arguments)
CASES: dict[str, tuple[Callable[[], Any], str, dict[str, Any]]] = {
    "box_pendulum_vecnormalize": (lambda: _vec("Pendulum-v1", normalize=True), "MlpPolicy", {}),
    "box_time_limit_bootstrap": (lambda: _vec(lambda: gym.make("Pendulum-v1", max_episode_steps=15)), "MlpPolicy", {}),
    "discrete_cartpole": (lambda: _vec("CartPole-v1"), "MlpPolicy", {}),
    "discrete_obs_identity": (lambda: _vec(lambda: IdentityEnv(5)), "MlpPolicy", {}),
    "multidiscrete": (lambda: _vec(lambda: IdentityEnvMultiDiscrete(3)), "MlpPolicy", {}),
    "multibinary": (lambda: _vec(lambda: IdentityEnvMultiBinary(3)), "MlpPolicy", {}),
    "gsde_sample_freq": (lambda: _vec("Pendulum-v1"), "MlpPolicy", dict(use_sde=True, sde_sample_freq=4)),
    "gsde_squashed": (lambda: _vec("Pendulum-v1"), "MlpPolicy",
                      dict(use_sde=True, policy_kwargs=dict(squash_output=True, use_expln=True))),
    "separate_extractors_relu": (lambda: _vec("CartPole-v1"), "MlpPolicy",
                                 dict(policy_kwargs=dict(share_features_extractor=False, activation_fn=th.nn.ReLU,
                                                         net_arch=dict(pi=[16, 8], vf=[12])))),
    "cnn": (lambda: _vec(ImageEnv, n_envs=2), "CnnPolicy", {}),
    "multi_input": (lambda: _vec(seeded_dict_env, n_envs=2), "MultiInputPolicy", {}),
    "one_env": (lambda: _vec("Pendulum-v1", n_envs=1, normalize=True), "MlpPolicy", {}),
}


#: what SB3 callbacks read from ``locals`` and the test compares at every step
LOCALS = ("actions", "clipped_actions", "values", "log_probs", "obs_tensor", "new_obs", "rewards", "dones", "infos",
          "n_steps", "n_rollout_steps")


def _collect(collect: Callable[..., bool], case: str, n_rollouts: int = 2, device: str = "cpu",
             graphs: InferenceGraphs | None = None) -> tuple[PPO, LocalsRecorder]:
    """``n_rollouts`` rollouts of ``case`` by ``collect``; ``graphs``: the policy step the lean loop replays."""
    make_env, policy, kwargs = CASES[case]
    model = PPO(policy, make_env(), n_steps=N_STEPS, batch_size=20, seed=0, device=device, **kwargs)
    model._inference_graphs = graphs  # type: ignore[attr-defined]  # what ScalablePPO(cuda_graphs=True) holds
    recorder = LocalsRecorder(LOCALS)
    _, callback = model._setup_learn(10**6, recorder)
    th.manual_seed(1)
    for _ in range(n_rollouts):
        assert collect(model, model.env, callback, model.rollout_buffer, N_STEPS)
    return model, recorder


@pytest.mark.parametrize("case", sorted(CASES))
def test_rollout_equals_sb3_loop(case: str) -> None:
    assert_same_rollouts(case)


def assert_same_rollouts(case: str, device: str = "cpu", graphs: InferenceGraphs | None = None) -> PPO:
    """Two rollouts of ``case`` by SB3's loop and by the lean loop on ``device`` (its policy step from ``graphs``
    when given): every field equal (see the module docstring). Returns the lean loop's model."""
    sb3, sb3_locals = _collect(OnPolicyAlgorithm.collect_rollouts, case, device=device)
    lean, lean_locals = _collect(collect_rollouts_lean, case, device=device, graphs=graphs)
    for field in ("observations", "actions", "rewards", "episode_starts", "values", "log_probs", "advantages",
                  "returns"):
        assert_same_state(getattr(sb3.rollout_buffer, field), getattr(lean.rollout_buffer, field), field)
    assert (sb3.rollout_buffer.pos, sb3.rollout_buffer.full) == (lean.rollout_buffer.pos, lean.rollout_buffer.full)
    assert sb3.num_timesteps == lean.num_timesteps == 2 * N_STEPS * sb3.n_envs
    assert_same_state(sb3._last_obs, lean._last_obs, "_last_obs")
    assert_same_state(sb3._last_episode_starts, lean._last_episode_starts, "_last_episode_starts")
    assert_same_state(list(sb3.ep_info_buffer), list(lean.ep_info_buffer), "ep_info_buffer")
    if isinstance(sb3.env, VecNormalize):  # both loops step it once per step: same running statistics
        for name in ("obs_rms", "ret_rms"):
            sb3_stats, lean_stats = getattr(sb3.env, name), getattr(lean.env, name)
            assert_same_state([sb3_stats.mean, sb3_stats.var, sb3_stats.count],
                              [lean_stats.mean, lean_stats.var, lean_stats.count], name)
        assert_same_state(sb3.env.returns, lean.env.returns, "returns")
    assert len(sb3_locals.steps) == len(lean_locals.steps) == 2 * N_STEPS
    assert all(env is lean.env for env in lean_locals.envs)
    assert_same_state(sb3_locals.steps, lean_locals.steps, "locals")
    assert_identical(sb3, lean)  # collection changes no parameter
    return lean


def test_host_copies_on_the_cpu_are_the_tensors_themselves() -> None:
    """to_host waits for a GPU once per step; on the CPU it hands back the very tensors (nothing copied)."""
    tensors = (th.zeros(2, dtype=th.int64), th.ones(2), th.full((2,), 3.0))
    assert all(a is b for a, b in zip(to_host(*tensors), tensors)) and to_host() == ()


def test_time_limit_bootstrap_happened() -> None:
    """The truncation case really bootstraps (rewards differ from the env's raw rewards at truncations)."""
    model, recorder = _collect(collect_rollouts_lean, "box_time_limit_bootstrap", n_rollouts=1)
    truncated = [(step, i) for step, seen in enumerate(recorder.steps) for i, info in enumerate(seen["infos"])
                 if info.get("TimeLimit.truncated")]
    assert len(truncated) >= 3
    for step, i in truncated:
        assert model.rollout_buffer.rewards[step, i] != recorder.steps[step]["rewards"][i]


def test_generator_state_after_collection_matches() -> None:
    """Both loops consume the torch RNG identically (the next draw is the same)."""
    _collect(OnPolicyAlgorithm.collect_rollouts, "multidiscrete")
    after_sb3 = th.rand(4)
    _collect(collect_rollouts_lean, "multidiscrete")
    assert th.equal(after_sb3, th.rand(4))


def model_and_obs(case: str, rows: int) -> tuple[PPO, Any]:
    """A CPU model of ``case`` in eval mode and ``rows`` sampled observations as its policy's input tensor(s)."""
    make_env, policy, kwargs = CASES[case]
    model = PPO(policy, make_env(), n_steps=N_STEPS, batch_size=20, seed=0, device="cpu", **kwargs)
    model.policy.set_training_mode(False)
    sample = [model.observation_space.sample() for _ in range(rows)]
    obs = ({key: np.stack([s[key] for s in sample]) for key in sample[0]} if isinstance(sample[0], dict)
           else np.stack(sample))
    return model, model.policy.obs_to_tensor(obs)[0]


@pytest.mark.parametrize("case", ["box_pendulum_vecnormalize", "discrete_cartpole", "multidiscrete", "multibinary",
                                  "gsde_sample_freq", "cnn", "multi_input", "separate_extractors_relu"])
@pytest.mark.parametrize("rows", [1, 5])
def test_fused_step_equals_policy_forward(case: str, rows: int) -> None:
    model, obs_tensor = model_and_obs(case, rows)
    fused = FusedActorCritic(model.policy)
    th.manual_seed(3)
    with th.no_grad():
        expected = model.policy(obs_tensor)
    th.manual_seed(3)
    with th.inference_mode():
        got = fused(obs_tensor)
    assert_same_state(list(expected), list(got), "actions, values, log_prob")


class CustomForwardPolicy(ActorCriticPolicy):
    """A user's policy that changes forward: the lean loop cannot promise its numbers."""

    def forward(self, obs: th.Tensor, deterministic: bool = False) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        return super().forward(obs, deterministic)


def test_custom_policy_falls_back_to_sb3_loop_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fusion_blocker(CustomForwardPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), lambda _: 1e-3)) \
        == "policy class CustomForwardPolicy overrides forward"
    lean_calls = []
    monkeypatch.setattr(algorithm, "collect_rollouts_lean", lambda *a: lean_calls.append(a) or collect_rollouts_lean(*a))
    with pytest.warns(UserWarning, match="collects with PPO's loop, not the lean one: policy class CustomForwardPolicy"):
        ScalablePPO(CustomForwardPolicy, "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0,
                    device="cpu").learn(32)
    assert not lean_calls
    ScalablePPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu").learn(64)
    assert len(lean_calls) == 2  # the standard policy collects lean, once per rollout


def test_forward_hook_falls_back() -> None:
    model = PPO("MlpPolicy", "CartPole-v1", seed=0, device="cpu")
    handle = model.policy.action_net.register_forward_hook(lambda module, args, out: None)
    assert fusion_blocker(model.policy) == "forward hooks on action_net"
    handle.remove()
    assert fusion_blocker(model.policy) is None


def _sb3_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(algorithm.ScalableOnPolicyMixin, "_collects_lean", lambda self: False)


@pytest.mark.parametrize("kwargs", [
    dict(rollout_buffer_class=PrioritizedRolloutBuffer),
    dict(collect_device="cpu", use_sde=True, sde_sample_freq=2),
], ids=["prioritized", "collect_device_gsde"])
def test_learn_equals_scalable_ppo_on_sb3_loop(kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Where PPO has no counterpart (the prioritized buffer), ScalablePPO's own SB3-loop run is the reference."""
    common = dict(n_steps=64, batch_size=32, n_epochs=2, **kwargs)
    lean = train_one(ScalablePPO, lambda: _vec("Pendulum-v1", n_envs=2), 3 * 128, "MlpPolicy", "cpu", **common)
    _sb3_loop(monkeypatch)
    reference = train_one(ScalablePPO, lambda: _vec("Pendulum-v1", n_envs=2), 3 * 128, "MlpPolicy", "cpu", **common)
    assert_identical(reference, lean)
    assert_same_state(lean._last_obs, reference._last_obs, "_last_obs")


@pytest.mark.parametrize("obs", [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((1, 4, 4, 3), np.uint8),
                                 np.array([[True, False]])])
def test_observation_tensor_is_obs_as_tensor(obs: np.ndarray) -> None:
    """On the CPU, torch.from_numpy: the same values, dtype and shared memory as obs_as_tensor's torch.as_tensor."""
    from stable_baselines3.common.utils import obs_as_tensor

    from sb3_ppo_scale.core.collect.lean import observation_tensor

    ours, reference = observation_tensor(obs, th.device("cpu")), obs_as_tensor(obs, th.device("cpu"))
    assert ours.dtype == reference.dtype and th.equal(ours, reference)
    assert ours.data_ptr() == reference.data_ptr() == obs.ctypes.data
    as_dict = observation_tensor({"a": obs}, th.device("cpu"))
    assert th.equal(as_dict["a"], reference)
