"""PrioritizedRolloutBuffer: sampling statistics, importance weights, retention/eviction, errors, end-to-end learn()."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_scale import PrioritizedRolloutBuffer, ScalablePPO
from sb3_ppo_scale.buffers.prioritized import PRIORITIES, PrioritySampler, RetainedPool, n_to_evict, top_k_indices
from sb3_ppo_scale.core.update.rollout import DeviceRollout
from tests.helpers import ACCUMULATION_ATOL, assert_identical, assert_params_close

Z_999 = 3.2905  # two-sided 99.9% normal quantile


def binomial_interval(n: int, p: float) -> tuple[float, float]:
    """99.9% interval for the share of successes in n Bernoulli(p) draws (normal approximation, n p (1-p) >> 1)."""
    half = Z_999 * math.sqrt(p * (1 - p) / n)
    return p - half, p + half


# ------------------------------------------------------------------------------------------------ sampling
@pytest.mark.parametrize("high_fraction", [0.7, 0.3, 1.0])
def test_share_from_high_set_is_high_fraction(high_fraction: float) -> None:
    th.manual_seed(0)
    priority = th.randn(5_000)
    sampler = PrioritySampler(priority, high_fraction)
    high = priority > priority.mean()
    assert sampler.n_high == int(high.sum()) and 0 < sampler.n_high < 5_000
    n = 400_000
    idx, from_high = sampler.draw(n)
    # draws routed to the high stream: Binomial(n, h)
    share = from_high.float().mean().item()
    if high_fraction < 1.0:
        low, up = binomial_interval(n, high_fraction)
        assert low <= share <= up
    else:
        assert share == 1.0
    assert bool(high[idx[from_high]].all())  # the high stream only yields above-mean samples
    # every drawn index is in H with probability h + (1 - h) |H| / M
    p_h = high_fraction + (1 - high_fraction) * sampler.n_high / 5_000
    in_high = high[idx].float().mean().item()
    if p_h < 1.0:
        low, up = binomial_interval(n, p_h)
        assert low <= in_high <= up
    else:
        assert in_high == 1.0


def test_probabilities_and_weights_are_consistent() -> None:
    priority = th.tensor([0.0, 1.0, 2.0, 10.0, -3.0, 4.0])  # mean 2.333: H = {3, 5}
    sampler = PrioritySampler(priority, 0.7)
    prob = sampler.probabilities()
    expected = th.full((6,), 0.3 / 6, dtype=th.float64)
    expected[[3, 5]] += 0.7 / 2
    # float64 sums in another order than the package's: equal to a few ulps (default allclose tolerance)
    assert th.allclose(prob, expected) and abs(prob.sum().item() - 1) < 1e-12
    weights = sampler.importance_weights().double()
    assert th.allclose(weights, 1 / (6 * expected), rtol=1e-6)  # the weights are float32: 1e-6 is ~8 ulps
    assert abs((prob * weights).sum().item() - 1) < 1e-6  # expected weight under P is exactly 1


def test_importance_weighted_mean_matches_uniform_mean() -> None:
    th.manual_seed(1)
    m = 2_000
    priority = th.randn(m)
    f = 3.0 * priority + priority**2 + 0.5 * th.randn(m)  # a fixed per-sample quantity, correlated with priority
    sampler = PrioritySampler(priority, 0.7)
    weights = sampler.importance_weights()
    n = 200_000
    idx, _ = sampler.draw(n)
    weighted = (weights[idx] * f[idx]).double()
    estimate, stderr = weighted.mean().item(), weighted.std().item() / math.sqrt(n)
    target = f.double().mean().item()
    assert abs(estimate - target) < 4 * stderr  # Monte-Carlo tolerance
    biased = f[idx].double().mean().item()
    assert abs(biased - target) > 20 * stderr  # without the correction the mean is clearly off


def test_high_fraction_zero_is_uniform_permutation() -> None:
    sampler = PrioritySampler(th.randn(1000), 0.0)
    assert sampler.uniform
    np.random.seed(3)
    order = np.asarray(sampler.epoch_order(1000))
    np.random.seed(3)
    assert np.array_equal(order, np.random.permutation(1000))  # exactly SB3's epoch order
    assert th.all(sampler.probabilities() == 1 / 1000)


def test_constant_priority_falls_back_to_uniform() -> None:
    sampler = PrioritySampler(th.ones(100), 0.7)
    assert sampler.n_high == 0 and sampler.uniform
    assert sorted(np.asarray(sampler.epoch_order(100)).tolist()) == list(range(100))


# ------------------------------------------------------------------------------------------------ retention
def test_top_k_indices_partial_selection_with_ties() -> None:
    th.manual_seed(2)
    p = th.randint(0, 20, (1_000,)).float()  # many ties
    for k in (0, 1, 37, 500, 999, 1_000):
        idx = top_k_indices(p, k)
        assert idx.shape[0] == k and idx.unique().shape[0] == k
        if 0 < k < 1_000:
            kept = th.zeros(1_000, dtype=th.bool)
            kept[idx] = True
            assert p[kept].min() >= p[~kept].max()  # exactly a set of k highest
            assert th.equal(th.sort(p[idx]).values, th.sort(p).values[-k:])


def _rows(priority: th.Tensor, tag: float) -> dict[str, th.Tensor]:
    n = priority.shape[0]
    return {
        "observations": th.arange(n, dtype=th.float32).unsqueeze(1) + tag,
        "actions": th.full((n, 2), tag),
        "old_values": th.full((n,), tag),
        "old_log_prob": priority * 2 + tag,
        "advantages": priority * 3 + tag,
        "returns": priority * 4 + tag,
        "priority": priority.clone(),
    }


def test_eviction_keeps_exactly_the_highest_priority_retained_samples() -> None:
    pool = RetainedPool(capacity=250, evict_fraction=0.2)
    g = th.Generator().manual_seed(4)
    first = th.randperm(100, generator=g).float()  # distinct priorities
    pool.merge(_rows(first, 1000.0))
    second = th.randperm(100, generator=g).float() + 0.5
    pool.merge(_rows(second, 2000.0))
    assert pool.size == 200 and pool.n_retained == 100
    third = th.rand(100, generator=g)
    view = pool.merge(_rows(third, 3000.0))
    # 300 > 250: evict max(ceil(0.2 * 300), 300 - 250) = 60 of the 200 retained
    assert pool.n_retained == 140 and pool.size == 240
    old = th.cat([first, second])
    assert th.equal(th.sort(view["priority"][:140]).values, th.sort(old).values[-140:])
    # retained rows keep their own log-prob, advantage and return target; the new rollout follows unchanged
    p = view["priority"]
    tag = th.where(view["old_values"] > 1500, 2000.0, 1000.0)[:140]
    assert th.equal(view["old_log_prob"][:140], p[:140] * 2 + tag)
    assert th.equal(view["advantages"][:140], p[:140] * 3 + tag)
    assert th.equal(view["returns"][:140], p[:140] * 4 + tag)
    assert th.equal(view["returns"][140:], third * 4 + 3000.0)


def test_capacity_is_never_exceeded() -> None:
    rng = np.random.default_rng(5)
    capacity, n = 1_000, 300
    pool = RetainedPool(capacity=capacity, evict_fraction=0.2)
    for _ in range(50):
        retained_before = pool.size
        view = pool.merge(_rows(th.as_tensor(rng.normal(size=n), dtype=th.float32), 0.0))
        assert pool.size <= capacity and view["priority"].shape[0] == pool.size
        total = retained_before + n
        evicted = retained_before - pool.n_retained
        assert evicted == n_to_evict(retained_before, n, capacity, 0.2)
        if total > capacity:
            assert evicted >= math.ceil(0.2 * total)
        else:
            assert evicted == 0
    assert pool.allocated_bytes == sum(t.numel() * t.element_size() for t in pool._store.values())
    assert all(t.shape[0] == capacity for t in pool._store.values())


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(priority="value"), "priority"),
        (dict(high_fraction=1.5), "high_fraction"),
        (dict(high_fraction=-0.1), "high_fraction"),
        (dict(capacity=100), "capacity"),
        (dict(capacity=2.5e3), "capacity"),
        (dict(evict_fraction=0.0), "evict_fraction"),
        (dict(evict_fraction=1.0), "evict_fraction"),
        (dict(importance_correction="yes"), "importance_correction"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        ScalablePPO("MlpPolicy", "CartPole-v1", n_steps=256, batch_size=64,
                    rollout_buffer_class=PrioritizedRolloutBuffer, rollout_buffer_kwargs=kwargs)


def test_numpy_numbers_are_numbers() -> None:
    """np.float32 fractions (a sweep's) were refused as "must be a number"; np.float64 and np.int64 were taken."""
    model = ScalablePPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1,
                        rollout_buffer_class=PrioritizedRolloutBuffer,
                        rollout_buffer_kwargs=dict(high_fraction=np.float32(0.5), evict_fraction=np.float32(0.25),
                                                   capacity=np.int64(128)))
    model.learn(128)
    assert model.rollout_buffer.high_fraction == 0.5 and model.rollout_buffer.evict_fraction == 0.25
    for bad in (dict(high_fraction=np.float32("nan")), dict(capacity=np.True_), dict(evict_fraction=np.float32(1))):
        with pytest.raises(ValueError, match=next(iter(bad))):
            PrioritizedRolloutBuffer(64, spaces.Box(-1, 1, (2,)), spaces.Discrete(2), **bad)


def test_unsupported_space_is_a_clear_error() -> None:
    obs = spaces.Dict({"a": spaces.Box(-1, 1, (2,))})
    with pytest.raises(ValueError, match="Dict observations are not supported"):
        PrioritizedRolloutBuffer(8, obs, spaces.Discrete(2))
    with pytest.raises(ValueError, match="action spaces"):
        PrioritizedRolloutBuffer(8, spaces.Box(-1, 1, (2,)), spaces.Tuple([spaces.Discrete(2)]))


def test_plain_sb3_ppo_refuses_the_buffer() -> None:
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1,
                rollout_buffer_class=PrioritizedRolloutBuffer)
    with pytest.raises(RuntimeError, match="ScalablePPO"):
        model.learn(64)


# ------------------------------------------------------------------------------------------------ end to end
def _params(model: ScalablePPO) -> th.Tensor:
    return th.cat([p.detach().flatten() for p in model.policy.parameters()])


def _model(env: str | gym.Env, buffer_kwargs: dict | None, **kwargs: object) -> ScalablePPO:
    extra = {} if buffer_kwargs is None else dict(rollout_buffer_class=PrioritizedRolloutBuffer, rollout_buffer_kwargs=buffer_kwargs)
    defaults = dict(n_steps=128, batch_size=64, n_epochs=2, seed=0, device="cpu")
    return ScalablePPO("MlpPolicy", make_vec_env(env, n_envs=2, seed=0), **{**defaults, **kwargs}, **extra)


def test_high_fraction_zero_trains_exactly_like_default() -> None:
    default = _model("CartPole-v1", None)
    default.learn(512)
    uniform = _model("CartPole-v1", dict(high_fraction=0.0, capacity=None))
    uniform.learn(512)
    assert_identical(default, uniform)


def test_gradient_accumulation_with_weights_matches_one_big_batch() -> None:
    kw = dict(priority="abs_advantage", capacity=640)
    one = _model("Pendulum-v1", kw, batch_size=128)
    one.learn(768)
    four = _model("Pendulum-v1", kw, batch_size=128, grad_accum_steps=4, buffer_device="cpu")
    four.learn(768)
    assert one.rollout_buffer.n_retained > 0
    assert_params_close(one, four, ACCUMULATION_ATOL)  # summation order of micro-batch gradients: see there


@pytest.mark.parametrize("priority", PRIORITIES)
@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_learn_with_each_priority_logs_retained_fraction(priority: str, env: str) -> None:
    # rollout 256, capacity 640: pools of 256, 512 (256 retained), then 768 > 640 -> evict 154 of 512 -> 358 + 256
    model = _model(env, dict(priority=priority, capacity=640))
    model.learn(3 * 256)
    logged = model.logger.name_to_value
    assert logged["train/retained_fraction"] == pytest.approx(358 / 614)
    if env == "CartPole-v1" and priority == "reward":
        assert logged["train/high_set_fraction"] == 0.0  # constant reward 1: nothing above the mean -> uniform
    else:
        assert 0.0 < logged["train/high_set_fraction"] < 1.0
    assert model.rollout_buffer.n_retained == 358
    assert th.isfinite(_params(model)).all()
    assert model._n_grad_steps == 2 * (4 + 8 + 10)  # epochs x ceil(pool / batch) per update


class _ImageMultiDiscreteEnv(gym.Env):
    """8x8x1 uint8 frames, MultiDiscrete([3, 2]) actions; reward 1 when the first action matches a pixel's parity."""

    observation_space = spaces.Box(0, 255, (8, 8, 1), np.uint8)
    action_space = spaces.MultiDiscrete([3, 2])

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return self.np_random.integers(0, 256, (8, 8, 1), dtype=np.uint8)

    def step(self, action):  # type: ignore[override]
        self._t += 1
        return self._obs(), float(action[0] == 1), False, self._t >= 20, {}


def test_image_observations_and_multidiscrete_actions() -> None:
    model = _model(_ImageMultiDiscreteEnv, dict(priority="reward", capacity=512, high_fraction=0.7))
    model.learn(3 * 256)
    pool = model.rollout_buffer.pool
    assert pool._store["observations"].dtype == th.uint8 and pool._store["observations"].shape == (512, 1, 8, 8)  # SB3 transposes images to channel-first
    assert pool._store["actions"].shape == (512, 2)
    assert model.logger.name_to_value["train/retained_fraction"] == pytest.approx(256 / 512)


def test_retained_samples_do_not_survive_save_load_but_state_dict_does(tmp_path) -> None:
    model = _model("CartPole-v1", dict(priority="return", capacity=512))
    model.learn(2 * 256)
    assert model.rollout_buffer.n_retained == 256
    model.save(tmp_path / "m.zip")
    loaded = ScalablePPO.load(tmp_path / "m.zip", env=make_vec_env("CartPole-v1", n_envs=2, seed=1), device="cpu")
    buffer = loaded.rollout_buffer
    assert isinstance(buffer, PrioritizedRolloutBuffer)
    assert (buffer.priority, buffer.capacity, buffer.high_fraction) == ("return", 512, 0.7)
    assert buffer.n_retained == 0 and buffer.pool.size == 0 and buffer.state_dict()["rows"] == {}
    # explicit persistence of the pool: the restored rows come back as the retained part of the next pool
    state = model.rollout_buffer.state_dict()
    th.save(state, tmp_path / "pool.pt")
    buffer.load_state_dict(th.load(tmp_path / "pool.pt"))
    loaded.learn(256, reset_num_timesteps=False)
    assert buffer.n_retained == 512 - 256 or buffer.n_retained == 512 - math.ceil(0.2 * 768)
    saved_rows = state["rows"]
    # 512 saved + 256 new > 512: evict max(ceil(0.2 * 768), 256) = 256 lowest-return of the saved rows
    keep = top_k_indices(saved_rows["priority"], 256)
    now = buffer.state_dict()["rows"]
    for name in ("old_log_prob", "advantages", "returns", "priority"):
        assert th.equal(now[name][:256], saved_rows[name][keep])


def test_prepare_rollout_weights_follow_the_sampler() -> None:
    buffer = PrioritizedRolloutBuffer(4, spaces.Box(-1, 1, (3,)), spaces.Discrete(2), n_envs=2, priority="reward")
    buffer.rewards[:] = np.array([[0, 5], [1, 0], [0, 0], [9, 0]], dtype=np.float32)  # (n_steps, n_envs)
    n = 8
    rollout = DeviceRollout(th.zeros(n, 3), th.zeros(n, 1), th.zeros(n), th.zeros(n), th.zeros(n), th.zeros(n))
    prepared = buffer.prepare_rollout(rollout)
    # env-major flattening: env 0 rewards 0,1,0,9 then env 1 rewards 5,0,0,0; mean 1.875 -> H = {3, 4}
    assert th.equal(buffer.sampler.high_idx, th.tensor([3, 4]))
    expected = 1 / (8 * (0.3 / 8 + 0.7 / 2 * th.tensor([0, 0, 0, 1, 1, 0, 0, 0.0])))
    assert th.allclose(prepared.weights, expected.float())  # float32 weights against a float64-derived value
    assert buffer.train_log() == {"train/retained_fraction": 0.0, "train/high_set_fraction": 0.25}
    no_corr = PrioritizedRolloutBuffer(4, spaces.Box(-1, 1, (3,)), spaces.Discrete(2), n_envs=2, importance_correction=False)
    no_corr.rewards[:] = buffer.rewards
    assert no_corr.prepare_rollout(rollout).weights is None
