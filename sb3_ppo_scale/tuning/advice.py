"""The documented sensitivity table (seed digest, post 001: :data:`DOCUMENTED`, printed beside our measurement) and
its advice, checked where a study can check it: one line per claim saying what was measured.

- "small epsilon for continuous control": Spearman correlation of ``clip_range`` with the objective (sampled trials
  of a study whose env has a continuous action space); the advice holds where it is negative at p < :data:`ALPHA`.
- "batch as large as memory allows": the same for ``log2(batch_size)``; the advice holds where it is positive.
- "lambda lower for more stochastic environments": across studies with noise repeats, the noisier env (coefficient
  of variation of its single-seed objectives at the centre configuration) should have the lower median
  ``gae_lambda`` among its best 10% of trials.
- "use linear decay": where a study ran decay repeats (``decay_repeats`` in its spec), each seed of decay repeat k
  against the same seed of noise repeat k (the centre configuration with a constant learning rate): a Wilcoxon
  signed-rank test of the paired objectives and of the paired last evaluations; the advice holds where decay is
  better at p < :data:`ALPHA`. Otherwise says it was not measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from optuna.trial import FrozenTrial

from sb3_ppo_scale.tuning.importance import TOP_FRACTION
from sb3_ppo_scale.tuning.noise import DECAY_ATTR, NOISE_ATTR, NoiseEstimate

@dataclass(frozen=True)
class DocumentedRow:
    """One row of the documented table: the ScalablePPO argument it is about and what the post claims."""

    argument: str
    label: str
    range: str
    stars: int
    advice: str


DOCUMENTED: tuple[DocumentedRow, ...] = (
    DocumentedRow("clip_range", "clip epsilon", "0.1-0.3", 4, "small for continuous control, larger for sparse rewards"),
    DocumentedRow("learning_rate", "learning rate", "1e-4 to 3e-4", 3, "use linear decay"),
    DocumentedRow("gae_lambda", "GAE lambda", "0.9-0.99", 2, "lower for more stochastic environments"),
    DocumentedRow("batch_size", "batch size", "64-4096", 2, "as large as GPU memory allows"),
    DocumentedRow("n_epochs", "update epochs", "3-10", 2, "tune together with epsilon"),
)


def documented_row(argument: str) -> DocumentedRow | None:
    """The documented row for a ScalablePPO argument, or None when the table does not list it."""
    return next((row for row in DOCUMENTED if row.argument == argument), None)


#: Significance level of the trend tests.
ALPHA = 0.05


class StudyLike(Protocol):
    """What the checks read from a report's study result."""

    label: str
    env_id: str
    trials: list[FrozenTrial]
    arguments: dict[str, str]
    noise: NoiseEstimate
    noise_trials: list[FrozenTrial]
    decay_trials: list[FrozenTrial]
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
    """The linear-decay advice: the decay repeats against their noise repeats (see the module docstring), or why it
    was not measured."""
    name = next((p for p, a in result.arguments.items() if a == "learning_rate"), None)
    if name is None:
        return None
    pairs = seed_pairs(result.noise_trials, result.decay_trials)
    if pairs:
        return _decay_comparison(result, name, pairs)
    if result.schedules is None:
        return f"{result.label}: \"use linear decay\": not measured (the study did not record its schedules)."
    used = result.schedules.get(name, "constant")
    return (f"{result.label}: \"use linear decay\": not measured; every trial used a {used} learning rate (a spec's "
            "`decay_repeats` run the centre configuration with it decayed linearly).")


#: One seed of a decay repeat beside the same seed of its noise repeat: ((objective, last evaluation) constant,
#: (objective, last evaluation) decayed); a last evaluation is NaN where the trial stored no curves.
SeedPair = tuple[tuple[float, float], tuple[float, float]]


def seed_pairs(noise_trials: list[FrozenTrial], decay_trials: list[FrozenTrial]) -> list[SeedPair]:
    """Every seed that decay repeat k and noise repeat k both trained (same index, same seed), in repeat order."""
    constant = {int(t.user_attrs[NOISE_ATTR]): t for t in noise_trials}
    pairs = []
    for decayed in sorted(decay_trials, key=lambda t: int(t.user_attrs[DECAY_ATTR])):
        twin = constant.get(int(decayed.user_attrs[DECAY_ATTR]))
        if twin is None:
            continue
        both = (_per_seed(twin), _per_seed(decayed))
        pairs += [(both[0][seed], both[1][seed]) for seed in both[0] if seed in both[1]]
    return pairs


def _per_seed(trial: FrozenTrial) -> dict[int, tuple[float, float]]:
    """seed -> (objective, last evaluation return) of one trial."""
    seeds = trial.user_attrs.get("seeds") or []
    values = trial.user_attrs.get("seed_values") or []
    curves = trial.user_attrs.get("eval_returns") or [[] for _ in values]
    return {int(s): (float(v), float(c[-1]) if c else math.nan) for s, v, c in zip(seeds, values, curves)}


def paired_test(constant: list[float], decayed: list[float]) -> tuple[float, int, int, float] | None:
    """(mean of decayed - constant, pairs where decayed is higher, finite pairs, Wilcoxon signed-rank two-sided p);
    None with fewer than 5 finite pairs or no difference at all."""
    from scipy.stats import wilcoxon

    diffs = [d - c for c, d in zip(constant, decayed) if math.isfinite(c) and math.isfinite(d)]
    if len(diffs) < 5 or not any(diffs):
        return None
    return float(np.mean(diffs)), sum(d > 0 for d in diffs), len(diffs), float(wilcoxon(diffs).pvalue)


def _decay_comparison(result: StudyLike, name: str, pairs: list[SeedPair]) -> str:
    centre = float(result.decay_trials[0].params[name])
    parts = []
    for index, measure in enumerate(("objective", "last evaluation")):
        constant, decayed = [c[index] for c, _ in pairs], [d[index] for _, d in pairs]
        tested = paired_test(constant, decayed)
        if tested is None:
            parts.append(f"{measure}: not testable")
            continue
        mean_diff, wins, n, p = tested
        outcome = ("no significant difference" if p >= ALPHA else
                   "supports the advice" if mean_diff > 0 else "contradicts the advice")
        parts.append(f"{measure} {np.nanmean(decayed):.1f} decayed vs {np.nanmean(constant):.1f} constant (decayed "
                     f"higher in {wins} of {n}, Wilcoxon p = {p:.2g}): {outcome}")
    return (f"{result.label}: \"use linear decay\": the centre configuration (learning rate {centre:.3g}) with the "
            f"learning rate decayed linearly to 0 against constant, {len(pairs)} seed pairs ({len(result.decay_trials)} "
            f"decay repeats, each seed paired with the same seed of its noise repeat): " + "; ".join(parts) + ".")


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
