"""ScalableMaskablePPO and ScalableRecurrentPPO collect with lean loops and write their contrib class's rollout bit
for bit.

Two identical ScalableMaskablePPO models (same seed, same env construction) collect two rollouts from the same torch
RNG state: one through sb3-contrib's ``MaskablePPO.collect_rollouts`` (with the scale layer's mask check), the other
through the model's own collection (the lean loop with the fused, masked policy call). Every buffer field (the
masks included), the RNG state afterwards, ``num_timesteps``, ``_last_obs``, the episode-info buffer and what a
callback reads from ``locals`` at every step must be equal, with masks and with ``use_masking=False``. ``learn()``
against MaskablePPO (parameters and Adam state) is in tests/test_contrib_maskable.py.

ScalableRecurrentPPO is compared the same way with ``RecurrentPPO.collect_rollouts`` (the LSTM states stored per
step and carried between rollouts included), for tests/test_contrib_recurrent.py's policy cases and a time limit
that truncates episodes inside the rollout (the bootstrap uses the ended env's critic state).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete
import gymnasium as gym
from sb3_contrib import RecurrentPPO
from sb3_contrib.common.maskable.policies import MaskableMultiInputActorCriticPolicy
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_scale import ScalableMaskablePPO, ScalableRecurrentPPO
from sb3_ppo_scale.contrib import maskable, recurrent
from sb3_ppo_scale.contrib.maskable import _CheckedMaskablePPO
from sb3_ppo_scale.contrib.masks import InfoActionMasker, mask_blocks
from sb3_ppo_scale.contrib.recurrent_collect import FusedRecurrentActorCritic, recurrent_lean_blocker
from sb3_ppo_scale.core.policy.inference import FusedActorCritic, fusion_blocker
from tests.helpers import LocalsRecorder, assert_identical, assert_same_state, seeded_dict_env
from tests.test_contrib_recurrent import CASES as RECURRENT_CASES

N_STEPS = 40
class DictObservation(gym.ObservationWrapper):
    """The masking env's observation in a Dict (a MultiInputPolicy and a dict rollout buffer); masks pass through."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = spaces.Dict({"obs": env.observation_space})

    def observation(self, observation: Any) -> dict[str, Any]:
        return {"obs": observation}


ENVS = {
    "discrete": lambda: InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10),
    "multidiscrete": lambda: InvalidActionEnvMultiDiscrete(dims=[3, 4, 5], n_invalid_actions=6),
    "multibinary": lambda: InvalidActionEnvMultiBinary(dims=6, n_invalid_actions=3),
    "dict_observation": lambda: DictObservation(InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10)),
    "taxi": lambda: InfoActionMasker(gym.make("Taxi-v4")),  # a Discrete observation (one-hot), masks from info
}
#: what MaskablePPO's loop offers callbacks in ``locals`` and the test compares at every step
LOCALS = ("actions", "values", "log_probs", "obs_tensor", "action_masks", "new_obs", "rewards", "dones", "infos",
          "n_steps", "n_rollout_steps")
BUFFER_FIELDS = ("observations", "actions", "rewards", "episode_starts", "values", "log_probs", "advantages",
                 "returns", "action_masks")


def _model(kind: str) -> ScalableMaskablePPO:
    env = make_vec_env(ENVS[kind], n_envs=3, seed=0)
    policy = "MultiInputPolicy" if kind == "dict_observation" else "MlpPolicy"
    return ScalableMaskablePPO(policy, env, n_steps=N_STEPS, batch_size=20, seed=0, device="cpu")


def _collect(kind: str, lean: bool, use_masking: bool) -> tuple[ScalableMaskablePPO, LocalsRecorder]:
    model = _model(kind)
    recorder = LocalsRecorder(LOCALS)
    _, callback = model._setup_learn(10**6, recorder)
    th.manual_seed(1)
    for _ in range(2):
        if lean:
            assert model.collect_rollouts(model.env, callback, model.rollout_buffer, N_STEPS, use_masking)
        else:
            assert _CheckedMaskablePPO.collect_rollouts(model, model.env, callback, model.rollout_buffer, N_STEPS,
                                                        use_masking)
    return model, recorder


@pytest.mark.parametrize("use_masking", [True, False])
@pytest.mark.parametrize("kind", list(ENVS))
def test_rollout_equals_maskable_ppo_loop(kind: str, use_masking: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    contrib, contrib_locals = _collect(kind, lean=False, use_masking=use_masking)
    after_contrib = th.rand(4)
    lean_calls: list[Any] = []
    lean_loop = maskable.collect_rollouts_lean
    monkeypatch.setattr(maskable, "collect_rollouts_lean", lambda *a: lean_calls.append(a) or lean_loop(*a))
    lean, lean_locals = _collect(kind, lean=True, use_masking=use_masking)
    assert len(lean_calls) == 2  # the model's own collection ran the lean loop, once per rollout
    assert th.equal(after_contrib, th.rand(4))  # the same random draws
    for field in BUFFER_FIELDS:
        assert_same_state(getattr(contrib.rollout_buffer, field), getattr(lean.rollout_buffer, field), field)
    assert contrib.num_timesteps == lean.num_timesteps == 2 * N_STEPS * 3
    assert_same_state(contrib._last_obs, lean._last_obs, "_last_obs")
    assert_same_state(list(contrib.ep_info_buffer), list(lean.ep_info_buffer), "ep_info_buffer")
    assert len(contrib_locals.steps) == len(lean_locals.steps) == 2 * N_STEPS
    assert_same_state(contrib_locals.steps, lean_locals.steps, "locals")
    # callbacks find the training VecEnv under "env", as in MaskablePPO's loop (the masks' check wraps nothing)
    assert all(env is contrib.env for env in contrib_locals.envs) and all(env is lean.env for env in lean_locals.envs)
    masks_seen = [step["action_masks"] is not None for step in lean_locals.steps]
    assert all(masks_seen) if use_masking else not any(masks_seen)
    if use_masking:  # the masks were obeyed: every stored action is allowed by its stored mask
        _assert_actions_allowed(lean)
    assert_identical(contrib, lean)


def _assert_actions_allowed(model: ScalableMaskablePPO) -> None:
    buffer = model.rollout_buffer
    blocks = mask_blocks(model.action_space)
    starts = np.cumsum([0, *blocks[:-1]])
    actions = buffer.actions.reshape(-1, len(blocks)).astype(int)
    masks = buffer.action_masks.reshape(-1, sum(blocks)).astype(bool)
    assert masks[np.arange(len(masks))[:, None], starts + actions].all()


def _random_masks(action_space: spaces.Space, rows: int, rng: np.random.Generator) -> np.ndarray:
    """Random masks with at least one allowed action per row and sub-action block."""
    parts = []
    for size in mask_blocks(action_space):
        block = rng.random((rows, size)) < 0.5
        block[np.arange(rows), rng.integers(0, size, rows)] = True
        parts.append(block)
    return np.concatenate(parts, axis=1)


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("kind", [*ENVS, "multi_input"])
def test_fused_step_equals_masked_policy_forward(kind: str, rows: int, masked: bool) -> None:
    if kind == "multi_input":
        observation_space = spaces.Dict({"position": spaces.Box(-1, 1, (3,)), "goal": spaces.Discrete(4)})
        policy = MaskableMultiInputActorCriticPolicy(observation_space, spaces.Discrete(6), lambda _: 1e-3)
    else:
        policy = _model(kind).policy
    policy.set_training_mode(False)
    assert fusion_blocker(policy) is None
    sample = [policy.observation_space.sample() for _ in range(rows)]
    obs = ({key: np.stack([s[key] for s in sample]) for key in sample[0]} if isinstance(sample[0], dict)
           else np.stack(sample))
    obs_tensor = policy.obs_to_tensor(obs)[0]
    masks = _random_masks(policy.action_space, rows, np.random.default_rng(rows)) if masked else None
    th.manual_seed(3)
    with th.no_grad():
        expected = policy(obs_tensor, action_masks=masks)
    th.manual_seed(3)
    with th.inference_mode():
        got = FusedActorCritic(policy)(obs_tensor, masks)
    assert_same_state(list(expected), list(got), "actions, values, log_prob")


# ------------------------------------------------------------------------------------------------ recurrent
RECURRENT = {
    **RECURRENT_CASES,
    "two_layer_lstm": (lambda: make_vec_env("CartPole-v1", n_envs=2, seed=0), "MlpLstmPolicy",
                       dict(policy_kwargs=dict(lstm_hidden_size=16, net_arch=[16], n_lstm_layers=2))),
    "multi_input": (lambda: make_vec_env(seeded_dict_env, n_envs=2, seed=0),
                    "MultiInputLstmPolicy", dict(policy_kwargs=dict(lstm_hidden_size=16, net_arch=[16]))),
    "time_limit_bootstrap": (lambda: make_vec_env(lambda: gym.make("Pendulum-v1", max_episode_steps=15), n_envs=3,
                                                  seed=0), "MlpLstmPolicy",
                             dict(policy_kwargs=dict(lstm_hidden_size=16, net_arch=[16]))),
}
RECURRENT_LOCALS = ("actions", "clipped_actions", "values", "log_probs", "obs_tensor", "episode_starts", "lstm_states",
                    "new_obs", "rewards", "dones", "infos", "n_steps")
STATE_FIELDS = ("hidden_states_pi", "cell_states_pi", "hidden_states_vf", "cell_states_vf")


def _recurrent_collect(case: str, lean: bool) -> tuple[ScalableRecurrentPPO, LocalsRecorder]:
    make_env, policy, kwargs = RECURRENT[case]
    kwargs = {key: value for key, value in kwargs.items() if key not in ("n_steps", "batch_size", "n_epochs")}
    model = ScalableRecurrentPPO(policy, make_env(), n_steps=N_STEPS, batch_size=40, seed=0, device="cpu", **kwargs)
    recorder = LocalsRecorder(RECURRENT_LOCALS)
    _, callback = model._setup_learn(10**6, recorder)
    th.manual_seed(1)
    for _ in range(2):
        collect = model.collect_rollouts if lean else lambda *a: RecurrentPPO.collect_rollouts(model, *a)
        assert collect(model.env, callback, model.rollout_buffer, N_STEPS)
    return model, recorder


@pytest.mark.parametrize("case", sorted(RECURRENT))
def test_rollout_equals_recurrent_ppo_loop(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    contrib, contrib_locals = _recurrent_collect(case, lean=False)
    after_contrib = th.rand(4)
    lean_calls: list[Any] = []
    lean_loop = recurrent.collect_rollouts_recurrent_lean
    monkeypatch.setattr(recurrent, "collect_rollouts_recurrent_lean", lambda *a: lean_calls.append(a) or lean_loop(*a))
    lean, lean_locals = _recurrent_collect(case, lean=True)
    assert len(lean_calls) == 2  # the model's own collection ran the lean loop, once per rollout
    assert th.equal(after_contrib, th.rand(4))
    for field in (*BUFFER_FIELDS[:-1], *STATE_FIELDS):
        assert_same_state(getattr(contrib.rollout_buffer, field), getattr(lean.rollout_buffer, field), field)
    assert_same_state(contrib._last_lstm_states, lean._last_lstm_states, "_last_lstm_states")
    assert_same_state(contrib._last_obs, lean._last_obs, "_last_obs")
    assert_same_state(contrib._last_episode_starts, lean._last_episode_starts, "_last_episode_starts")
    assert_same_state(list(contrib.ep_info_buffer), list(lean.ep_info_buffer), "ep_info_buffer")
    assert_same_state(contrib_locals.steps, lean_locals.steps, "locals")
    if case not in ("gsde", "cnn_lstm", "multi_input"):  # (episodes outlast the rollouts; step 0 is a start in all)
        assert lean.rollout_buffer.episode_starts[1:].any(), "no episode start inside the rollout"
    if case == "time_limit_bootstrap":
        truncated = [(step, i) for step, seen in enumerate(lean_locals.steps[N_STEPS:])
                     for i, info in enumerate(seen["infos"]) if info.get("TimeLimit.truncated")]
        assert truncated and all(lean.rollout_buffer.rewards[step, i] != lean_locals.steps[N_STEPS + step]["rewards"][i]
                                 for step, i in truncated)
    assert_identical(contrib, lean)


@pytest.mark.parametrize("starts", ["none", "some"])
@pytest.mark.parametrize("case", ["mlp_critic_lstm", "mlp_no_critic_lstm", "mlp_shared_lstm", "gsde", "cnn_lstm",
                                  "two_layer_lstm"])
def test_fused_recurrent_step_equals_policy_forward(case: str, starts: str) -> None:
    model, _ = _recurrent_collect(case, lean=True)  # states from two rollouts: not zeros
    policy = model.policy
    policy.set_training_mode(False)
    obs = policy.obs_to_tensor(model._last_obs)[0]
    begun = np.zeros(model.n_envs, dtype=bool) if starts == "none" else np.arange(model.n_envs) % 2 == 0
    episode_starts = th.tensor(begun, dtype=th.float32)
    th.manual_seed(3)
    with th.no_grad():
        expected = policy(obs, model._last_lstm_states, episode_starts)
    th.manual_seed(3)
    with th.no_grad():
        got = FusedRecurrentActorCritic(policy)(obs, model._last_lstm_states, episode_starts, bool(begun.any()))
    assert_same_state(list(expected), list(got), "actions, values, log_prob, states")


class _CustomSequencePolicy(RecurrentActorCriticPolicy):
    """A user's recurrent policy that changes how sequences are processed: collection must not be fused."""

    @staticmethod
    def _process_sequence(features, lstm_states, episode_starts, lstm):  # type: ignore[no-untyped-def]
        return RecurrentActorCriticPolicy._process_sequence(features, lstm_states, episode_starts, lstm)


def test_custom_recurrent_policy_keeps_recurrent_ppo_loop_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    model = ScalableRecurrentPPO(_CustomSequencePolicy, make_vec_env("CartPole-v1", n_envs=2, seed=0), n_steps=16,
                                 batch_size=32, n_epochs=1, seed=0, device="cpu")
    assert recurrent_lean_blocker(model.policy) == "policy class _CustomSequencePolicy overrides _process_sequence"
    lean_calls: list[Any] = []
    monkeypatch.setattr(recurrent, "collect_rollouts_recurrent_lean", lambda *a: lean_calls.append(a))
    with pytest.warns(UserWarning, match="collects with RecurrentPPO's loop, not the lean one: policy class _CustomSequencePolicy"):
        model.learn(32)
    assert not lean_calls
