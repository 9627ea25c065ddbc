"""ScalableMaskablePPO against sb3-contrib's MaskablePPO: identical by default (parameters and Adam state after
learn(), Discrete / MultiDiscrete / MultiBinary masks), exact accumulation, every objective finite under masks, the
masked distribution in the KL, predict and save/load as MaskablePPO's, and bad masks refused by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete
from sb3_contrib.common.maskable.distributions import make_masked_proba_distribution
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_scale import MaskablePrioritizedRolloutBuffer, PrioritizedRolloutBuffer, ScalableMaskablePPO
from sb3_ppo_scale.core.policy.evaluation import evaluate_actions
from sb3_ppo_scale.core.update.kl import analytic_kl, distribution_params
from tests.helpers import ACCUMULATION_ATOL, HistoryLogger, assert_identical, assert_params_close, max_param_diff, train_one

SMALL = dict(n_steps=64, batch_size=32, n_epochs=3)
ENVS = {
    "discrete": lambda: InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10),
    "multidiscrete": lambda: InvalidActionEnvMultiDiscrete(dims=[3, 4, 5], n_invalid_actions=6),
    "multibinary": lambda: InvalidActionEnvMultiBinary(dims=6, n_invalid_actions=3),
}


def vec(kind: str, n_envs: int = 2):
    return lambda: make_vec_env(ENVS[kind], n_envs=n_envs, seed=0)


def pair(kind: str, steps: int, scalable: dict | None = None, **common) -> tuple[MaskablePPO, ScalableMaskablePPO]:
    common = {**SMALL, **common}
    contrib = train_one(MaskablePPO, vec(kind), steps, "MlpPolicy", "cpu", **common)
    ours = train_one(ScalableMaskablePPO, vec(kind), steps, "MlpPolicy", "cpu", **common, **(scalable or {}))
    return contrib, ours  # type: ignore[return-value]


@pytest.mark.parametrize("kind", list(ENVS))
@pytest.mark.parametrize("target_kl", [None, 0.002])
def test_defaults_are_maskable_ppo_bit_for_bit(kind: str, target_kl: float | None) -> None:
    extra = {} if target_kl is None else dict(target_kl=target_kl, learning_rate=3e-3)
    contrib, ours = pair(kind, 3 * 128, **extra)
    assert_identical(contrib, ours)  # parameters and Adam state, torch.equal
    assert ours._n_updates == contrib._n_updates
    if target_kl is not None:  # the early stop really fired
        assert ours._n_grad_steps < 3 * 3 * (128 // 32)
    for key in ("train/policy_gradient_loss", "train/value_loss", "train/entropy_loss", "train/approx_kl",
                "train/clip_fraction", "train/loss"):
        assert ours.logger.seen[key] == pytest.approx(contrib.logger.seen[key], rel=1e-6), key


@pytest.mark.parametrize("kind", ["discrete", "multidiscrete"])
@pytest.mark.parametrize(("batch_size", "grad_accum_steps"), [(32, 3), (100, 7)])
def test_accumulation_equals_the_big_batch(kind: str, batch_size: int, grad_accum_steps: int) -> None:
    contrib, ours = pair(kind, 2 * 128, dict(grad_accum_steps=grad_accum_steps), batch_size=batch_size)
    assert 0 < ours._n_grad_steps
    assert max_param_diff(contrib, ours) <= ACCUMULATION_ATOL


class _UnmaskedUpdate(ScalableMaskablePPO):
    """Collects with masks but evaluates the update without them (the bug the parity test must catch)."""

    _evaluator = property(lambda self: evaluate_actions)


def test_an_unmasked_update_fails_the_comparison() -> None:
    """The parity comparison has teeth: the same run with the unmasked distribution in the update ends far outside
    even the accumulation tolerance."""
    contrib, _ = pair("discrete", 2 * 128)
    unmasked = train_one(_UnmaskedUpdate, vec("discrete"), 2 * 128, "MlpPolicy", "cpu", **SMALL)
    assert max_param_diff(contrib, unmasked) > 100 * ACCUMULATION_ATOL


@pytest.mark.parametrize("kind", ["discrete", "multidiscrete", "multibinary"])
@pytest.mark.parametrize("objective", ["clip", "kl_penalty", "clip_kl_penalty"])
def test_every_objective_stays_finite_under_masks(kind: str, objective: str) -> None:
    model = ScalableMaskablePPO("MlpPolicy", vec(kind)(), objective=objective, learning_rate="kl_adaptive", seed=0,
                                device="cpu", **SMALL)
    model.set_logger(HistoryLogger())
    model.learn(3 * 128)
    history = model.logger.history
    for key in ("train/loss", "train/policy_gradient_loss", "train/entropy_loss", "train/approx_kl", "train/kl"):
        assert np.isfinite(history[key]).all(), key
    assert all(th.isfinite(p).all() for p in model.policy.parameters())
    assert model._n_nonfinite_steps == 0
    assert min(history["train/kl"]) >= 0.0


@pytest.mark.parametrize("space", [spaces.Discrete(5), spaces.MultiDiscrete([3, 4])])
def test_analytic_kl_uses_the_masked_distribution(space) -> None:
    """KL(old || new) between masked distributions equals torch's KL between the renormalised valid actions, and is
    finite where every masked logit is -1e8 (no 0 * inf)."""
    th.manual_seed(0)
    dims = [space.n] if isinstance(space, spaces.Discrete) else list(space.nvec)
    masks = th.ones(4, sum(dims), dtype=th.bool)
    masks[:, 1] = False
    masks[0, 0] = False
    old, new = make_masked_proba_distribution(space), make_masked_proba_distribution(space)
    old.proba_distribution(th.randn(4, sum(dims))).apply_masking(masks)
    new.proba_distribution(th.randn(4, sum(dims))).apply_masking(masks)
    kl = analytic_kl(distribution_params(old), new)
    parts_old = old.distributions if hasattr(old, "distributions") else [old.distribution]
    parts_new = new.distributions if hasattr(new, "distributions") else [new.distribution]
    expected = 0.0
    for part_old, part_new, mask in zip(parts_old, parts_new, th.split(masks, dims, dim=1)):
        valid_old = th.where(mask, part_old.logits, -th.inf).log_softmax(-1)
        valid_new = th.where(mask, part_new.logits, -th.inf).log_softmax(-1)
        expected = expected + th.where(mask, valid_old.exp() * (valid_old - valid_new), 0.0).sum(-1)
    assert th.isfinite(kl).all()
    assert th.allclose(kl, expected, atol=1e-6)


def test_predict_and_save_load_behave_as_maskable_ppo(tmp_path) -> None:
    contrib, ours = pair("discrete", 128)
    env = vec("discrete", 1)()
    obs = env.reset()
    masks = np.stack(env.env_method("action_masks"))
    ours_action, _ = ours.predict(obs, deterministic=True, action_masks=masks)
    contrib_action, _ = contrib.predict(obs, deterministic=True, action_masks=masks)
    assert np.array_equal(ours_action, contrib_action) and masks[0, ours_action[0]]
    ours.save(tmp_path / "model.zip")
    loaded = ScalableMaskablePPO.load(tmp_path / "model.zip", device="cpu")
    assert_identical(ours, loaded)
    assert np.array_equal(loaded.predict(obs, deterministic=True, action_masks=masks)[0], ours_action)
    single = obs[0]
    assert loaded.predict(single, deterministic=True, action_masks=masks[0])[0] == ours_action[0]


@pytest.mark.parametrize(("masks", "pattern"), [
    (np.ones((1, 19)), r"action_masks must hold 20 entries per observation .*got shape \(1, 19\)"),
    (np.ones((2, 20)), r"action_masks must hold 20 entries per observation .*shape \(1, 20\)"),
    (np.zeros((1, 20)), r"action_masks allows no action at row 0"),
])
def test_bad_masks_in_predict_are_clear_errors(masks: np.ndarray, pattern: str) -> None:
    model = ScalableMaskablePPO("MlpPolicy", vec("discrete", 1)(), device="cpu", **SMALL)
    obs = model.env.reset()
    with pytest.raises(ValueError, match=pattern):
        model.predict(obs, action_masks=masks)


def test_an_all_false_sub_action_is_named() -> None:
    model = ScalableMaskablePPO("MlpPolicy", vec("multidiscrete", 1)(), device="cpu", **SMALL)
    masks = np.ones((1, 12))
    masks[0, 3:7] = 0  # sub-action 1 (4 choices) has none left
    with pytest.raises(ValueError, match=r"action_masks allows no action at row 0, sub-action 1"):
        model.predict(model.env.reset(), action_masks=masks)


class _BadMasks(InvalidActionEnvDiscrete):
    def __init__(self, bad: str) -> None:
        super().__init__(dim=4, n_invalid_actions=1)
        self.bad, self.t = bad, 0

    def step(self, action):
        self.t += 1
        return super().step(action)

    def action_masks(self) -> list[bool]:
        if self.t < 5:
            return super().action_masks()
        return [False] * 4 if self.bad == "all_false" else [True] * 3


class _OwnForward(MaskableActorCriticPolicy):
    """A policy with its own ``forward``: collection runs MaskablePPO's loop, not the lean one."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize("policy", ["MlpPolicy", _OwnForward])
@pytest.mark.parametrize(("bad", "pattern"), [("all_false", r"env.action_masks\(\) allows no action at row 0"),
                                              ("shape", r"env.action_masks\(\) must hold 4 entries per observation")])
def test_bad_env_masks_stop_collection_with_a_clear_error(bad: str, pattern: str, policy: Any) -> None:
    model = ScalableMaskablePPO(policy, make_vec_env(lambda: _BadMasks(bad), n_envs=1), device="cpu", **SMALL)
    with pytest.raises(ValueError, match=pattern):
        model.learn(128)


class _TypedMasks(InvalidActionEnvDiscrete):
    def __init__(self, kind: str) -> None:
        super().__init__(dim=4, n_invalid_actions=1)
        self.kind = kind

    def action_masks(self):
        masks = np.asarray(super().action_masks())
        return {"str": masks.astype(str), "none": None, "float": masks.astype(np.float32)}[self.kind]


@pytest.mark.parametrize(("kind", "pattern"), [("str", r"env.action_masks\(\) must hold booleans \(or numbers: nonzero "
                                                        r"allows the action\), got dtype <U5"),
                                               ("none", r"env.action_masks\(\) must hold booleans .*got dtype object")])
def test_env_masks_that_are_not_booleans_or_numbers_are_named(kind: str, pattern: str) -> None:
    """MaskablePPO fails inside torch ("can't convert np.ndarray of type numpy.str_"); numbers are masks there."""
    with pytest.raises(ValueError, match=pattern):
        ScalableMaskablePPO("MlpPolicy", make_vec_env(lambda: _TypedMasks(kind), n_envs=2), device="cpu", **SMALL).learn(64)
    ScalableMaskablePPO("MlpPolicy", make_vec_env(lambda: _TypedMasks("float"), n_envs=2), device="cpu", **SMALL).learn(64)


def test_predict_masks_as_contrib_takes_them() -> None:
    """Strings are named; a tensor that requires grad (contrib reads it with th.as_tensor) is a mask, as on any device."""
    model = ScalableMaskablePPO("MlpPolicy", vec("discrete", 1)(), device="cpu", **SMALL)
    obs = model.env.reset()
    with pytest.raises(ValueError, match=r"action_masks must hold booleans .*got dtype <U"):
        model.predict(obs, action_masks=np.full((1, 20), "True"))
    masks = th.zeros((1, 20), requires_grad=True) + th.eye(20)[3]
    assert model.predict(obs, action_masks=masks, deterministic=True)[0][0] == 3


def test_use_masking_false_is_maskable_ppo_without_masks() -> None:
    contrib = MaskablePPO("MlpPolicy", vec("discrete")(), seed=0, device="cpu", **SMALL).learn(128, use_masking=False)
    ours = ScalableMaskablePPO("MlpPolicy", vec("discrete")(), seed=0, device="cpu", **SMALL).learn(128, use_masking=False)
    assert_identical(contrib, ours)


@pytest.mark.parametrize(("kwargs", "pattern"), [
    (dict(rollout_buffer_class=PrioritizedRolloutBuffer), r"rollout_buffer_class must store action masks.*"
                                                           r"MaskablePrioritizedRolloutBuffer"),
    (dict(batch_size=1), r"batch_size must be >= 2 when normalize_advantage=True"),
    (dict(grad_accum_steps=0), r"grad_accum_steps must be an int >= 1"),
])
def test_unsupported_arguments_are_named(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        ScalableMaskablePPO("MlpPolicy", vec("discrete")(), device="cpu", **{**SMALL, **kwargs})


def test_accumulated_objectives_match_their_big_batch() -> None:
    """kl_penalty with masks: grad_accum_steps=4 equals grad_accum_steps=1 within the accumulation tolerance."""
    big = train_one(ScalableMaskablePPO, vec("multidiscrete"), 2 * 128, "MlpPolicy", "cpu", objective="clip_kl_penalty", **SMALL)
    small = train_one(ScalableMaskablePPO, vec("multidiscrete"), 2 * 128, "MlpPolicy", "cpu", objective="clip_kl_penalty",
                      grad_accum_steps=4, **SMALL)
    assert_params_close(big, small, ACCUMULATION_ATOL)


def test_info_action_masker_serves_the_mask_of_the_current_observation() -> None:
    import gymnasium as gym

    from sb3_ppo_scale.contrib.masks import InfoActionMasker

    env = InfoActionMasker(gym.make("Taxi-v4"))
    with pytest.raises(RuntimeError, match="before reset"):
        env.action_masks()
    obs, info = env.reset(seed=0)
    assert env.action_masks().dtype == bool and (env.action_masks() == info["action_mask"].astype(bool)).all()
    taxi = env.unwrapped
    for _ in range(30):
        action = int(np.flatnonzero(env.action_masks())[0])
        obs, *_, info = env.step(action)
        assert (env.action_masks() == taxi.action_mask(obs).astype(bool)).all()  # Taxi's own mask of this state
    with pytest.raises(ValueError, match="no 'legal' \\(key\\)"):
        InfoActionMasker(gym.make("Taxi-v4"), key="legal").reset(seed=0)


# ------------------------------------------------------------------------------------------------ prioritized buffer
def _prioritized(kind: str, steps: int, **buffer_kwargs) -> ScalableMaskablePPO:
    return train_one(ScalableMaskablePPO, vec(kind), steps, "MlpPolicy", "cpu", **SMALL,
                     rollout_buffer_class=MaskablePrioritizedRolloutBuffer, rollout_buffer_kwargs=buffer_kwargs)


@pytest.mark.parametrize("kind", ["discrete", "multidiscrete"])
def test_prioritized_buffer_with_high_fraction_zero_is_maskable_ppo(kind: str) -> None:
    contrib, _ = pair(kind, 2 * 128)
    assert_identical(contrib, _prioritized(kind, 2 * 128, high_fraction=0.0))


def test_prioritized_accumulation_with_weights_equals_the_big_batch() -> None:
    kwargs = dict(priority="abs_advantage", high_fraction=0.7)
    big = _prioritized("discrete", 2 * 128, **kwargs)
    small = train_one(ScalableMaskablePPO, vec("discrete"), 2 * 128, "MlpPolicy", "cpu", **SMALL, grad_accum_steps=4,
                      rollout_buffer_class=MaskablePrioritizedRolloutBuffer, rollout_buffer_kwargs=kwargs)
    assert_params_close(big, small, ACCUMULATION_ATOL)
    assert max_param_diff(big, pair("discrete", 2 * 128)[0]) > 1e-4  # the prioritized order really differs


def test_retained_samples_keep_the_mask_they_were_collected_with() -> None:
    model = _prioritized("discrete", 4 * 128, priority="reward", capacity=3 * 128)
    buffer = model.rollout_buffer
    assert buffer.n_retained > 0
    pool = buffer.prepare_rollout(model._stage_rollout())  # the last rollout again, on top of the retained ones
    masks, actions = pool.extras["action_masks"].bool(), pool.actions.long().reshape(-1)
    assert masks.shape == (len(pool), 20) and len(pool) == 3 * 128
    assert masks[th.arange(len(pool)), actions].all()  # each (retained) action is allowed by its own mask
    assert (masks.sum(dim=1) == 10).all()
    restored = MaskablePrioritizedRolloutBuffer(64, buffer.observation_space, buffer.action_space, "cpu", n_envs=2,
                                                capacity=3 * 128)
    restored.load_state_dict(buffer.state_dict())
    assert "extra:action_masks" in buffer.state_dict()["rows"]
