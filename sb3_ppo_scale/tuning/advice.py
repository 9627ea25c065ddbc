"""The documented advice, checked where a study can check it: one line per claim saying what was measured.

- "small epsilon for continuous control": Spearman correlation of ``clip_range`` with the objective (sampled trials
  of a study whose env has a continuous action space); the advice holds where it is negative at p < :data:`ALPHA`.
- "batch as large as memory allows": the same for ``log2(batch_size)``; the advice holds where it is positive.
- "lambda lower for more stochastic environments": across studies with noise repeats, the noisier env (coefficient
  of variation of its single-seed objectives at the centre configuration) should have the lower median
  ``gae_lambda`` among its best 10% of trials.
- "use linear decay": only where a study ran both a constant and a linear learning rate; otherwise says it was not
  measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from optuna.trial import FrozenTrial

from sb3_ppo_scale.tuning.importance import TOP_FRACTION
from sb3_ppo_scale.tuning.noise import NoiseEstimate

#: Significance level of the trend tests.
ALPHA = 0.05


class StudyLike(Protocol):
    """What the checks read from a report's study result."""

    label: str
    env_id: str
    trials: list[FrozenTrial]
    arguments: dict[str, str]
    noise: NoiseEstimate
    schedules: dict[str, str] | None


def trend(trials: list[FrozenTrial], name: str) -> tuple[float, float] | None:
    """Spearman (rho, p) of Optuna parameter ``name`` against the objective; None with < 5 trials or no spread."""
    from scipy.stats import spearmanr

    pairs = [(float(t.params[name]), float(t.value)) for t in trials if name in t.params and t.value is not None]
    if len(pairs) < 5 or len({x for x, _ in pairs}) < 2 or len({y for _, y in pairs}) < 2:
        return None
    result = spearmanr(*zip(*pairs))
    return (float(result.statistic), float(result.pvalue)) if math.isfinite(result.statistic) else None


def _trend_line(result: StudyLike, argument: str, sign: int, claim: str, scope: str) -> str | None:
    name = next((p for p, a in result.arguments.items() if a == argument), None)
    if name is None:
        return None
    measured = trend(result.trials, name)
    if measured is None:
        return f"{result.label}: \"{claim}\": not measurable (too few trials or no spread)."
    rho, p = measured
    if p >= ALPHA:
        outcome = "no significant trend: the advice is neither supported nor contradicted"
    elif rho * sign > 0:
        outcome = "supports the advice"
    else:
        outcome = "contradicts the advice"
    return (f"{result.label}: \"{claim}\"{scope}: Spearman rho(`{argument}`{' (log2)' if name.startswith('log2_') else ''}, "
            f"objective) = {rho:+.2f} (p = {p:.2g}, {len(result.trials)} trials): {outcome}.")


def epsilon_line(result: StudyLike) -> str | None:
    """The clip-range advice for one study (continuous action spaces only)."""
    kind = action_kind(result.env_id)
    if kind != "continuous":
        name = next((p for p, a in result.arguments.items() if a == "clip_range"), None)
        return None if name is None else (f"{result.label}: \"small epsilon for continuous control\": not applicable "
                                          f"(action space {kind}).")
    return _trend_line(result, "clip_range", -1, "small epsilon for continuous control", " (continuous actions)")


def batch_line(result: StudyLike) -> str | None:
    """The batch-size advice for one study."""
    return _trend_line(result, "batch_size", +1, "batch as large as memory allows", "")


def decay_line(result: StudyLike) -> str | None:
    """The linear-decay advice: measured only where both schedules were run."""
    name = next((p for p, a in result.arguments.items() if a == "learning_rate"), None)
    if name is None:
        return None
    if result.schedules is None:
        return f"{result.label}: \"use linear decay\": not measured (the study did not record its schedules)."
    used = result.schedules.get(name, "constant")
    return (f"{result.label}: \"use linear decay\": not measured; every trial used a {used} learning rate (a study "
            "comparing both would search the schedule as a parameter).")


def lambda_lines(results: Sequence[StudyLike]) -> list[str]:
    """The GAE-lambda advice across studies: noisier env -> lower top-decile lambda."""
    points = []
    for r in results:
        name = next((p for p, a in r.arguments.items() if a == "gae_lambda"), None)
        cv = r.noise.std_seed / abs(r.noise.mean) if r.noise.n_trials and r.noise.mean else math.nan
        if name is not None and math.isfinite(cv):
            points.append((r.label, cv, top_median(r.trials, name)))
    if len(points) < 2:
        return ["\"lambda lower for more stochastic environments\": not checkable here (needs two studies with noise "
                "repeats and `gae_lambda` searched)."]
    points.sort(key=lambda p: p[1])
    text = "; ".join(f"{label}: seed CV {cv:.2f}, top-10% median lambda {lam:.3f}" for label, cv, lam in points)
    ordered = all(later[2] <= earlier[2] for earlier, later in zip(points, points[1:]))
    outcome = "consistent with the advice" if ordered else "does not follow the advice"
    return [f"\"lambda lower for more stochastic environments\" ({len(points)} envs, noisiest last): {text}: {outcome} "
            "(an ordering of a few envs, not a test)."]


def top_median(trials: list[FrozenTrial], name: str) -> float:
    """Median of Optuna parameter ``name`` over the best ceil(10%) trials."""
    best = sorted(trials, key=lambda t: (-float(t.value), t.number))[: max(1, math.ceil(TOP_FRACTION * len(trials)))]  # type: ignore[arg-type]
    return float(np.median([float(t.params[name]) for t in best]))


def action_kind(env_id: str) -> str:
    """``continuous`` (Box actions), ``discrete`` or ``unknown`` (the env cannot be built here)."""
    import gymnasium as gym

    try:
        env = gym.make(env_id)
    except Exception:  # noqa: BLE001  (a missing extra or an env id the report only knows by name)
        return "unknown"
    try:
        return "continuous" if isinstance(env.action_space, gym.spaces.Box) else "discrete"
    finally:
        env.close()


def advice_lines(results: Sequence[StudyLike]) -> list[str]:
    """Every checkable claim of the documented advice, one line each."""
    lines: list[Any] = []
    for r in results:
        lines += [epsilon_line(r), batch_line(r), decay_line(r)]
    lines += lambda_lines(results)
    return [line for line in lines if line]
