"""FusedGaussianEvaluator: SB3's ``evaluate_actions`` of a diagonal-Gaussian policy, same values and same gradients.

End to end, tests/test_parity.py compares parameters and Adam state after learn() with SB3's PPO on Pendulum (a
Gaussian policy, so through this evaluator).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy, MultiInputActorCriticPolicy

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core.evaluation import FusedGaussianEvaluator, evaluate_actions

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


def _policy(case: str) -> ActorCriticPolicy:
    policy_class, observation_space, kwargs = CASES[case]
    th.manual_seed(0)
    policy = policy_class(observation_space, ACTIONS, lambda _: 3e-4, **kwargs)
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


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_values_and_gradients_as_sb3(case: str) -> None:
    policy = _policy(case)
    assert FusedGaussianEvaluator.blocker(policy) is None
    obs = _batch(policy.observation_space)
    actions = th.randn(16, 3, generator=th.Generator().manual_seed(2))
    expected = policy.evaluate_actions(obs, actions)
    expected_gradients = _gradients(policy, expected)
    fused = FusedGaussianEvaluator(policy)(policy, SimpleNamespace(samples=SimpleNamespace(observations=obs)), actions, False)
    assert fused[3] is None
    for a, b in zip(expected, fused[:3]):
        assert a.shape == b.shape and th.equal(a, b)
    for a, b in zip(expected_gradients, _gradients(policy, fused)):
        assert th.equal(a, b)


def test_what_it_leaves_to_sb3() -> None:
    assert "CategoricalDistribution" in FusedGaussianEvaluator.blocker(
        ActorCriticPolicy(spaces.Box(-1.0, 1.0, (5,)), spaces.Discrete(3), lambda _: 3e-4))
    assert "StateDependentNoise" in FusedGaussianEvaluator.blocker(
        ActorCriticPolicy(spaces.Box(-1.0, 1.0, (5,)), ACTIONS, lambda _: 3e-4, use_sde=True))

    class OwnEvaluation(ActorCriticPolicy):
        def evaluate_actions(self, obs, actions):  # type: ignore[no-untyped-def]
            return super().evaluate_actions(obs, actions)

    assert "evaluate_actions" in FusedGaussianEvaluator.blocker(OwnEvaluation(spaces.Box(-1.0, 1.0, (5,)), ACTIONS,
                                                                              lambda _: 3e-4))
    policy = _policy("mlp_defaults")
    policy.evaluate_actions = lambda obs, actions: None  # type: ignore[method-assign]  # SB3 would call it
    assert "evaluate_actions is replaced" in FusedGaussianEvaluator.blocker(policy)
    policy = _policy("mlp_defaults")
    policy.value_net.register_forward_hook(lambda *args: None)
    assert "hooks" in FusedGaussianEvaluator.blocker(policy)


def test_scalable_ppo_evaluates_a_gaussian_policy_fused_and_anything_else_as_sb3() -> None:
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, device="cpu", seed=0)
    evaluator = model._evaluator
    assert isinstance(evaluator, FusedGaussianEvaluator) and model._evaluator is evaluator  # one per policy
    assert ScalablePPO("MlpPolicy", "CartPole-v1", device="cpu")._evaluator is evaluate_actions
    assert ScalablePPO("MlpPolicy", "Pendulum-v1", use_sde=True, device="cpu")._evaluator is evaluate_actions
