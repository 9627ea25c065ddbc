"""FusedEvaluator: SB3's ``evaluate_actions`` of a diagonal-Gaussian or categorical policy, and sb3-contrib's of a
masked categorical one, with the same values and the same gradients.

End to end, tests/test_parity.py and tests/test_contrib_maskable.py compare parameters and Adam state after learn()
with SB3's PPO (Pendulum, CartPole: through this evaluator) and MaskablePPO.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.envs import FakeImageEnv
from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy, MultiInputActorCriticPolicy
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiDiscrete
from sb3_contrib.common.maskable.policies import MaskableActorCriticCnnPolicy, MaskableActorCriticPolicy

from sb3_ppo_scale import ScalableMaskablePPO, ScalablePPO
from sb3_ppo_scale.contrib.maskable import evaluate_masked
from sb3_ppo_scale.core.policy.evaluation import FusedEvaluator, evaluate_actions

ACTIONS = spaces.Box(-2.0, 2.0, (3,))
IMAGE = spaces.Box(0, 255, (1, 36, 36), dtype=np.uint8)  # channel-first, as after VecTransposeImage
#: name -> (policy class, observation space, policy keyword arguments)
CASES = {
    "mlp_defaults": (ActorCriticPolicy, spaces.Box(-1.0, 1.0, (5,)), {}),
    "separate_extractors_relu_log_std": (ActorCriticPolicy, spaces.Box(-1.0, 1.0, (5,)), dict(
        activation_fn=th.nn.ReLU, net_arch=dict(pi=[16, 8], vf=[12]), log_std_init=-0.5, share_features_extractor=False)),
    "no_hidden_layers": (ActorCriticPolicy, spaces.Box(-1.0, 1.0, (2, 3)), dict(net_arch=[])),
    "cnn": (ActorCriticCnnPolicy, IMAGE, {}),
    "multi_input": (MultiInputActorCriticPolicy, spaces.Dict({"image": IMAGE, "vector": spaces.Box(-1.0, 1.0, (4,))}), {}),
}


DISCRETE = spaces.Discrete(6)
#: cases with image observations: the fused evaluation is exact there too, but not used (it measured slower at Atari)
IMAGE_CASES = ("cnn", "multi_input")


def _policy(case: str, action_space: spaces.Space = ACTIONS, policy_class: type | None = None) -> ActorCriticPolicy:
    default_class, observation_space, kwargs = CASES[case]
    th.manual_seed(0)
    policy = (policy_class or default_class)(observation_space, action_space, lambda _: 3e-4, **kwargs)
    with th.no_grad():  # away from round initial values (log_std = 0): every bit of the arithmetic shows
        for parameter in policy.parameters():
            parameter.add_(0.1 * th.randn_like(parameter))
    return policy


def _batch(space: spaces.Space, n: int = 16) -> th.Tensor | dict[str, th.Tensor]:
    space.seed(1)
    samples = [space.sample() for _ in range(n)]
    if isinstance(space, spaces.Dict):
        return {key: th.as_tensor(np.stack([sample[key] for sample in samples])) for key in space.spaces}
    return th.as_tensor(np.stack(samples))


def _gradients(policy: ActorCriticPolicy, outputs: tuple) -> list[th.Tensor]:
    policy.zero_grad(set_to_none=True)
    values, log_prob, entropy = outputs[:3]
    (values.sum() + 0.3 * log_prob.sum() + 0.7 * entropy.sum()).backward()
    return [p.grad.clone() for p in policy.parameters()]


def _actions(action_space: spaces.Space) -> th.Tensor:
    generator = th.Generator().manual_seed(2)
    if isinstance(action_space, spaces.Discrete):
        return th.randint(0, int(action_space.n), (16,), generator=generator)  # as PPO's train() casts them: long
    return th.randn(16, 3, generator=generator)


def _assert_same(expected: tuple, policy: ActorCriticPolicy, samples: SimpleNamespace, actions: th.Tensor) -> None:
    expected_gradients = _gradients(policy, expected)
    fused = FusedEvaluator(policy)(policy, SimpleNamespace(samples=samples), actions, False)
    assert fused[3] is None
    for a, b in zip(expected, fused[:3]):
        assert a.shape == b.shape and th.equal(a, b)
    for a, b in zip(expected_gradients, _gradients(policy, fused)):
        assert th.equal(a, b)


@pytest.mark.parametrize("action_space", [ACTIONS, DISCRETE], ids=["gaussian", "categorical"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_values_and_gradients_as_sb3(case: str, action_space: spaces.Space) -> None:
    policy = _policy(case, action_space)
    assert (FusedEvaluator.blocker(policy) is None) == (case not in IMAGE_CASES)  # image policies: exact, not used
    obs = _batch(policy.observation_space)
    actions = _actions(action_space)
    _assert_same(policy.evaluate_actions(obs, actions), policy, SimpleNamespace(observations=obs), actions)


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("case", ["mlp_defaults", "separate_extractors_relu_log_std", "cnn"])
def test_same_values_and_gradients_as_maskable_policy(case: str, masked: bool) -> None:
    """MaskableActorCriticPolicy.evaluate_actions(obs, actions, action_masks) (contrib's MaskableCategorical), with
    masks that leave at least one action per row (the taken one), and without masks."""
    kwargs = {k: v for k, v in CASES[case][2].items() if k != "log_std_init"}
    policy_class = MaskableActorCriticCnnPolicy if case == "cnn" else MaskableActorCriticPolicy
    th.manual_seed(0)
    policy = policy_class(CASES[case][1], DISCRETE, lambda _: 3e-4, **kwargs)
    with th.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.1 * th.randn_like(parameter))
    assert (FusedEvaluator.blocker(policy) is None) == (case not in IMAGE_CASES)
    obs = _batch(policy.observation_space)
    actions = _actions(DISCRETE)
    masks = None
    if masked:
        masks = th.rand(16, 6, generator=th.Generator().manual_seed(3)) < 0.5
        masks[th.arange(16), actions] = True
    expected = policy.evaluate_actions(obs, actions, action_masks=masks)
    _assert_same(expected, policy, SimpleNamespace(observations=obs, action_masks=masks), actions)


def test_what_it_leaves_to_sb3() -> None:
    assert "MultiCategoricalDistribution" in FusedEvaluator.blocker(
        ActorCriticPolicy(spaces.Box(-1.0, 1.0, (5,)), spaces.MultiDiscrete([3, 2]), lambda _: 3e-4))
    assert "StateDependentNoise" in FusedEvaluator.blocker(
        ActorCriticPolicy(spaces.Box(-1.0, 1.0, (5,)), ACTIONS, lambda _: 3e-4, use_sde=True))

    class OwnEvaluation(ActorCriticPolicy):
        def evaluate_actions(self, obs, actions):  # type: ignore[no-untyped-def]
            return super().evaluate_actions(obs, actions)

    assert "evaluate_actions" in FusedEvaluator.blocker(OwnEvaluation(spaces.Box(-1.0, 1.0, (5,)), ACTIONS,
                                                                              lambda _: 3e-4))
    policy = _policy("mlp_defaults")
    policy.evaluate_actions = lambda obs, actions: None  # type: ignore[method-assign]  # SB3 would call it
    assert "evaluate_actions is replaced" in FusedEvaluator.blocker(policy)
    policy = _policy("mlp_defaults")
    policy.value_net.register_forward_hook(lambda *args: None)
    assert "hooks" in FusedEvaluator.blocker(policy)


def test_scalable_ppo_evaluates_gaussian_and_categorical_policies_fused_and_anything_else_as_sb3() -> None:
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, device="cpu", seed=0)
    evaluator = model._evaluator
    assert isinstance(evaluator, FusedEvaluator) and model._evaluator is evaluator  # one per policy
    assert isinstance(ScalablePPO("MlpPolicy", "CartPole-v1", device="cpu")._evaluator, FusedEvaluator)
    assert ScalablePPO("MlpPolicy", "Pendulum-v1", use_sde=True, device="cpu")._evaluator is evaluate_actions
    assert ScalablePPO("MlpPolicy", "CartPole-v1", compile_loss=True, device="cpu")._evaluator is evaluate_actions
    atari_shaped = DummyVecEnv([lambda: FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)])
    assert ScalablePPO("CnnPolicy", atari_shaped, device="cpu")._evaluator is evaluate_actions


def test_scalable_maskable_ppo_evaluates_discrete_masks_fused_and_falls_back_to_maskable_ppo() -> None:
    model = ScalableMaskablePPO("MlpPolicy", InvalidActionEnvDiscrete(dim=10, n_invalid_actions=4), n_steps=64,
                                batch_size=32, device="cpu", seed=0)
    evaluator = model._evaluator
    assert isinstance(evaluator, FusedEvaluator) and evaluator.fallback is evaluate_masked
    multi = ScalableMaskablePPO("MlpPolicy", InvalidActionEnvMultiDiscrete(dims=[3, 4], n_invalid_actions=2),
                                n_steps=64, batch_size=32, device="cpu")
    assert multi._evaluator is evaluate_masked
