"""PPO-Penalty: analytic KL, the adaptive beta rule, exactness with accumulation, gradients, save/load, errors."""

from __future__ import annotations

import copy
import inspect
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.distributions import make_proba_distribution
from stable_baselines3.common.envs import IdentityEnvMultiBinary, IdentityEnvMultiDiscrete
from torch.distributions import kl_divergence

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core.update.kl import (
    KL_COEF_BOUNDS,
    AdaptiveKLCoefficient,
    analytic_kl,
    distribution_params,
    k3_kl,
    kl_estimator,
    mean_rollout_kl,
    rollout_distribution_params,
)
from sb3_ppo_scale.core.update.objectives import LossSettings, kl_penalty
from sb3_ppo_scale.core.update.sampling import MinibatchLoader
from tests.helpers import ACCUMULATION_ATOL, HistoryLogger, assert_identical, assert_params_close

SMALL = dict(n_steps=128, batch_size=32, n_epochs=3, seed=0, device="cpu")


def _random_distribution(space: spaces.Space, batch: int, generator: th.Generator):
    dist = make_proba_distribution(space)
    if isinstance(space, spaces.Box):
        mean = th.randn(batch, space.shape[0], generator=generator)
        log_std = th.randn(space.shape[0], generator=generator) * 0.5
        return dist.proba_distribution(mean, log_std)
    n_logits = {spaces.Discrete: lambda s: s.n, spaces.MultiDiscrete: lambda s: int(s.nvec.sum()), spaces.MultiBinary: lambda s: s.n}
    return dist.proba_distribution(th.randn(batch, n_logits[type(space)](space), generator=generator) * 2)


def _torch_kl(old, new) -> th.Tensor:
    if isinstance(old.distribution, list):  # MultiCategorical: independent parts
        return sum(kl_divergence(o, n) for o, n in zip(old.distribution, new.distribution))
    kl = kl_divergence(old.distribution, new.distribution)
    return kl.sum(dim=1) if kl.dim() == 2 else kl


@pytest.mark.parametrize(
    "space",
    [spaces.Box(-1, 1, (3,)), spaces.Discrete(5), spaces.MultiDiscrete([3, 4, 2]), spaces.MultiBinary(4)],
    ids=["diag_gaussian", "categorical", "multicategorical", "bernoulli"],
)
def test_analytic_kl_equals_torch_kl_divergence(space) -> None:
    generator = th.Generator().manual_seed(0)
    old, new = (_random_distribution(space, 256, generator) for _ in range(2))
    assert kl_estimator(new) == "analytic"
    ours = analytic_kl(distribution_params(old), new)
    # two float32 formulas for the same quantity (ours from log-softmax / the Gaussian closed form, torch's own):
    # per-sample rounding differences of a few ulps, so float32-level tolerances, not identity
    th.testing.assert_close(ours, _torch_kl(old, new), rtol=1e-5, atol=1e-6)
    assert (ours >= -1e-6).all()


def test_adaptive_rule_and_bounds() -> None:
    rule = AdaptiveKLCoefficient(target=0.01, factor=2.0, tolerance=1.5)
    beta, trajectory = 1.0, []
    for kl in [0.001, 0.0067, 0.0066, 0.01, 0.015, 0.0151, 0.5]:
        beta = rule.update(beta, kl)
        trajectory.append(beta)
    assert trajectory == [0.5, 0.5, 0.25, 0.25, 0.25, 0.5, 1.0]
    assert AdaptiveKLCoefficient(None).update(3.0, 10.0) == 3.0
    low, high = KL_COEF_BOUNDS
    assert rule.update(low, 0.0) == low and rule.update(high, 1.0) == high


def test_beta_trajectory_follows_the_rule_end_to_end() -> None:
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", objective="kl_penalty", kl_coef=1.0, kl_penalty_target=0.003, **SMALL)
    model.set_logger(HistoryLogger())
    model.learn(6 * 128)
    kls, betas = model.logger.history["train/kl"], model.logger.history["train/kl_coef"]
    assert len(kls) == len(betas) == 6
    rule = AdaptiveKLCoefficient(0.003)
    expected = [1.0]
    for kl in kls:
        expected.append(rule.update(expected[-1], kl))
    assert betas == expected[:-1] and model.kl_beta == expected[-1]
    assert len(set(expected)) > 1  # the rule actually moved beta
    assert model.logger.history["train/kl_estimator"][0] == "analytic"


def test_gsde_kl_is_the_k3_estimate_over_the_rollout() -> None:
    """The logged KL equals k3 = mean((r - 1) - log r), r = pi(a) / pi_old(a), recomputed here from the rollout
    buffer's actions and log-probs and the updated policy; k1 = mean(-log r) and the reversed k3 differ from it."""
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", objective="kl_penalty", use_sde=True, **SMALL)
    model.set_logger(HistoryLogger())
    model.learn(128)  # one rollout, one train(): the KL is measured after this update with the final policy
    assert model.logger.history["train/kl_estimator"] == ["k3"]
    buffer = model.rollout_buffer
    with th.no_grad():
        _, log_prob, _ = model.policy.evaluate_actions(th.as_tensor(buffer.observations.reshape(128, -1)),
                                                       th.as_tensor(buffer.actions.reshape(128, -1)))
    log_ratio = log_prob - th.as_tensor(buffer.log_probs.reshape(-1))
    k3 = ((log_ratio.exp() - 1) - log_ratio).mean().item()
    k1, reversed_k3 = (-log_ratio).mean().item(), ((-log_ratio).exp() - 1 + log_ratio).mean().item()
    # same float32 per-sample formula; only the order of the 128-term sum may differ
    assert model.logger.history["train/kl"] == [pytest.approx(k3, rel=1e-5)]
    assert k3 > 0 and abs(k1 - k3) > 1e-3 * k3 and abs(reversed_k3 - k3) > 1e-3 * k3


def test_zero_beta_equals_unclipped_surrogate() -> None:
    # each model is seeded at construction and trained before the next is built (they share global RNGs)
    ours = ScalablePPO("MlpPolicy", "Pendulum-v1", objective="kl_penalty", kl_coef=0.0, kl_penalty_target=None, **SMALL)
    ours.learn(3 * 128)
    unclipped = PPO("MlpPolicy", "Pendulum-v1", clip_range=1e9, **SMALL)  # clip never binds: min(rA, rA) = rA
    unclipped.learn(3 * 128)
    assert_identical(ours, unclipped)


@pytest.mark.parametrize("objective", ["kl_penalty", "clip_kl_penalty"])
@pytest.mark.parametrize("make_env", ["Pendulum-v1", "CartPole-v1", lambda: IdentityEnvMultiDiscrete(3), lambda: IdentityEnvMultiBinary(3)])
def test_penalty_with_accumulation_matches_one_big_batch(objective, make_env) -> None:
    models = []
    for k in (1, 4):
        env = make_env if isinstance(make_env, str) else make_env()
        model = ScalablePPO("MlpPolicy", env, objective=objective, grad_accum_steps=k, target_kl=0.05, **SMALL)
        model.learn(3 * 128)
        models.append(model)
    assert_params_close(*models, ACCUMULATION_ATOL)  # micro-batch gradients summed in another order: see there
    assert models[0].kl_beta == models[1].kl_beta


def _reference_distribution(policy64, obs64: th.Tensor) -> th.distributions.Distribution:
    """The policy's action distribution computed in float64 with torch.distributions (vector observations)."""
    out = policy64.action_net(policy64.mlp_extractor.forward_actor(obs64.flatten(1)))
    if hasattr(policy64, "log_std"):
        return th.distributions.Normal(out, policy64.log_std.exp().expand_as(out))
    return th.distributions.Categorical(logits=out)


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_penalty_gradient_matches_float64_reference(env_id) -> None:
    model = ScalablePPO("MlpPolicy", env_id, objective="kl_penalty", kl_coef=0.7, **SMALL)
    model.learn(128)
    policy, rollout = model.policy, model._stage_rollout()
    reference = copy.deepcopy(policy).double()
    obs64 = rollout.observations.double()
    with th.no_grad():  # the rollout policy = the policy before this update
        old = _reference_distribution(reference, obs64)
        rollout.old_dist = distribution_params(policy.get_distribution(rollout.observations))
        for p, p64 in zip(policy.parameters(), reference.parameters()):  # move both policies away from it
            p.add_(0.05 * th.randn_like(p))
            p64.copy_(p.double())
    micro = next(next(iter(MinibatchLoader(rollout, len(rollout), shuffle=False))).micro_batches())
    settings = LossSettings(0.2, None, 0.0, 0.5, objective="kl_penalty", kl_coef=0.7)

    policy.zero_grad()
    kl_penalty(micro, policy.get_distribution(micro.samples.observations), None, settings).backward()  # type: ignore[arg-type]
    reference.zero_grad()
    kl = kl_divergence(old, _reference_distribution(reference, obs64))
    (0.7 * (kl.sum(dim=1) if kl.dim() == 2 else kl).mean()).backward()

    grads = [(p.grad, p64.grad) for p, p64 in zip(policy.parameters(), reference.parameters()) if p64.grad is not None]
    assert len(grads) >= 3
    for got, want in grads:  # float32 against a float64 reference: float32 rounding through the network and KL
        th.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-7)
        assert want.abs().max() > 0


def test_beta_survives_save_and_load(tmp_path) -> None:
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", objective="clip_kl_penalty", kl_penalty_target=1e-5, **SMALL)
    model.learn(2 * 128)
    assert model.kl_beta != 1.0
    model.save(tmp_path / "m")
    loaded = ScalablePPO.load(tmp_path / "m", device="cpu")
    assert loaded.kl_beta == model.kl_beta and loaded.objective == "clip_kl_penalty"
    assert loaded.kl_penalty_target == 1e-5


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (dict(objective="trust_region"), r"objective must be one of 'clip', 'kl_penalty', 'clip_kl_penalty'"),
        (dict(objective="kl_penalty", kl_coef=-1.0), r"kl_coef must be 0 or a number in"),
        (dict(objective="kl_penalty", kl_penalty_target=0.0), r"kl_penalty_target must be a finite number > 0"),
        (dict(objective="kl_penalty", kl_adapt_factor=1.0), r"kl_adapt_factor must be a finite number > 1"),
        (dict(objective="kl_penalty", kl_adapt_tolerance=0.5), r"kl_adapt_tolerance must be a finite number >= 1"),
        (dict(objective="kl_penalty", kl_coef=0.0), r"kl_coef must be > 0 when kl_penalty_target is set"),
    ],
)
def test_bad_kl_arguments(kwargs, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        ScalablePPO("MlpPolicy", "CartPole-v1", **kwargs)


@contextmanager
def count_calls(*functions: Callable) -> Iterator[Counter]:
    """Count calls of ``functions`` by their code objects (wherever they were imported into), via sys.setprofile."""
    codes = {inspect.unwrap(function).__code__: function.__name__ for function in functions}
    calls: Counter = Counter({name: 0 for name in codes.values()})

    def profile(frame, event, arg) -> None:
        if event == "call" and frame.f_code in codes:
            calls[codes[frame.f_code]] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(previous)


KL_WORK = (rollout_distribution_params, mean_rollout_kl, analytic_kl, k3_kl)


@pytest.mark.parametrize("objective", ["clip", "kl_penalty"])
def test_kl_work_runs_only_when_the_objective_penalises_kl(objective: str) -> None:
    """With the clip objective no KL is computed at all (not merely not logged); the penalty objective's counts
    show that the counting works: one old-distribution pass and one measurement per train(), an analytic KL per
    micro-batch loss."""
    model = ScalablePPO("MlpPolicy", "CartPole-v1", objective=objective, **SMALL)
    model.set_logger(HistoryLogger())
    with count_calls(*KL_WORK) as calls:
        model.learn(2 * 128)
    if objective == "clip":
        assert calls == Counter({f.__name__: 0 for f in KL_WORK})
        assert "train/kl" not in model.logger.history and model.kl_beta == 1.0
        assert np.isfinite(model.logger.history["train/loss"]).all()
    else:
        assert calls["rollout_distribution_params"] == calls["mean_rollout_kl"] == 2  # one per train()
        # the loss of every gradient step, plus the measurement's chunks
        assert calls["analytic_kl"] >= model._n_grad_steps == 2 * 3 * 4 and calls["k3_kl"] == 0
        assert len(model.logger.history["train/kl"]) == 2
