"""Importance of each searched parameter from a finished study, stars, top-decile ranges and bootstrap stability.

Evaluators (COMPLETE trials only):

- ``ped_anova``: PED-ANOVA, global (``evaluate_on_local=False``); target = the top 10% of trials but at least 5
  (quantile ``max(0.1, 5 / n_trials)``). It assumes lower is better, so it is given the negated return.
- ``fanova``: fANOVA (random forest, 64 trees, fixed seed 0; needs scikit-learn).

Both are normalised to sum to 1 over the parameters, dummy parameters included. Stars rule (same 1-4 scale as the
documented table, whose top parameter has 4), over the real (non-dummy) parameters:
``stars = max(1, ceil(4 * importance / largest real importance))``, so the top parameter gets 4 stars, one with more
than 3/4 of its importance 4, more than 1/2 -> 3, more than 1/4 -> 2, otherwise 1 (exactly 3/4 -> 3). Whether a
parameter keeps its stars (noise floor, star stability) is decided in :mod:`sb3_ppo_scale.tuning.verdicts`.
Noise-repeat trials (:mod:`sb3_ppo_scale.tuning.noise`) never enter importance.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import optuna
from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator
from optuna.trial import FrozenTrial, TrialState

from sb3_ppo_scale.tuning.noise import is_decay_trial, is_noise_trial, is_repeat_trial

EVALUATORS = ("ped_anova", "fanova")
EVALUATOR_TITLES = {"ped_anova": "PED-ANOVA", "fanova": "fANOVA"}
STARS_RULE = ("stars = max(1, ceil(4 x importance / top importance)): the top parameter gets 4, above 3/4 of the "
              "top's importance 4, above 1/2 3, above 1/4 2, else 1")
TOP_FRACTION = 0.1
PED_MIN_TOP = 5


def ped_anova_quantile(n_trials: int) -> float:
    """PED-ANOVA's target quantile: the top 10%, but at least 5 trials (its documented minimum for stability)."""
    return min(0.5, max(TOP_FRACTION, PED_MIN_TOP / max(1, n_trials)))


def _evaluator(name: str, n_trials: int) -> optuna.importance.BaseImportanceEvaluator:
    if name == "ped_anova":
        return PedAnovaImportanceEvaluator(target_quantile=ped_anova_quantile(n_trials), evaluate_on_local=False)
    return FanovaImportanceEvaluator(seed=0)


#: What :func:`complete_trials` selects: kind -> test on a trial.
TRIAL_KINDS = {"sampled": lambda t: not is_repeat_trial(t), "noise": is_noise_trial, "decay": is_decay_trial}


def complete_trials(study: optuna.Study, kind: str = "sampled") -> list[FrozenTrial]:
    """COMPLETE trials with a finite value, in trial-number order, of one ``kind``: ``sampled`` (default; importance
    is fitted on them), ``noise`` (the noise repeats) or ``decay`` (the decay repeats)."""
    if kind not in TRIAL_KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, TRIAL_KINDS))}, got {kind!r}")
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return sorted((t for t in trials if t.value is not None and math.isfinite(t.value) and TRIAL_KINDS[kind](t)),
                  key=lambda t: t.number)


def _as_study(trials: list[FrozenTrial]) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    study.add_trials(trials)
    return study


def importances(trials: list[FrozenTrial], params: list[str], evaluator: str) -> dict[str, float]:
    """Normalised importance of ``params`` (Optuna names) over ``trials`` (higher value = better).

    Raises ValueError when the trials cannot separate the parameters: every value equal (checked here, because
    fANOVA's own check compares a float-rounded variance with 0 and so raises on one CPU and ranks rounding noise on
    another), or an evaluator that finds nothing to rank.
    """
    if len({float(t.value) for t in trials}) < 2:  # type: ignore[arg-type]
        raise ValueError(f"{evaluator}: every trial has the same value ({trials[0].value if trials else None}), "
                         "so no parameter changed the result")
    study = _as_study(trials)
    target = (lambda t: -float(t.value)) if evaluator == "ped_anova" else None  # PED-ANOVA minimises its target
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*low `target` values.*")  # intended: we negate the return
        warnings.filterwarnings("ignore", message=".*select the same set of trials.*")
        try:
            result = optuna.importance.get_param_importances(study, evaluator=_evaluator(evaluator, len(trials)), params=params,
                                                             target=target, normalize=True)
        except RuntimeError as error:  # fANOVA: "zero total variance in all trees"
            raise ValueError(f"{evaluator}: {error}") from None
        except ImportError as error:
            raise ValueError(f"{evaluator} needs scikit-learn (a dependency of sb3-ppo-scale): pip install scikit-learn ({error})") from None
    values = {name: float(result.get(name, 0.0)) for name in params}
    if not all(math.isfinite(v) for v in values.values()) or sum(values.values()) <= 0:
        raise ValueError(f"{evaluator}: degenerate importances {values}")
    return values


def stars(values: dict[str, float], dummies: tuple[str, ...] | list[str] = ()) -> dict[str, int]:
    """Map importances to 1-4 stars by :data:`STARS_RULE`, relative to the top real parameter; ``dummies`` (Optuna
    names of noise-floor parameters) get none and are left out."""
    real = {name: value for name, value in values.items() if name not in dummies}
    top = max(real.values())
    if top <= 0:
        return {name: 1 for name in real}
    return {name: max(1, math.ceil(4 * value / top - 1e-9)) for name, value in real.items()}


def top_range(trials: list[FrozenTrial], name: str) -> tuple[float, float]:
    """(min, max) of Optuna parameter ``name`` over the best ``ceil(10%)`` trials (at least 1)."""
    best = sorted(trials, key=lambda t: (-float(t.value), t.number))[: max(1, math.ceil(TOP_FRACTION * len(trials)))]
    values = [float(t.params[name]) for t in best]
    return min(values), max(values)


@dataclass(frozen=True)
class Stability:
    """Bootstrap over trials: 5-95% interval of each importance, how often each parameter keeps its rank, and how
    often each real parameter keeps its star rating (``same_stars``; stars by :func:`stars` in each resample)."""

    low: dict[str, float]
    high: dict[str, float]
    same_rank: dict[str, float]
    same_top: float
    n_resamples: int
    n_degenerate: int = 0
    same_stars: dict[str, float] = field(default_factory=dict)


def bootstrap(trials: list[FrozenTrial], params: list[str], evaluator: str, point: dict[str, float],
              n_resamples: int, seed: int = 0, dummies: tuple[str, ...] | list[str] = ()) -> Stability:
    """Resample trials with replacement ``n_resamples`` times (fixed seed) and recompute the importance (and the
    stars of the parameters other than ``dummies``)."""
    rng = np.random.default_rng(seed)
    point_rank, point_stars = _ranks(point), stars(point, dummies)
    samples, same_rank, same_top, degenerate = [], dict.fromkeys(params, 0), 0, 0
    same_stars = dict.fromkeys(point_stars, 0)
    for _ in range(n_resamples):
        picked = [trials[i] for i in rng.integers(0, len(trials), len(trials))]
        try:
            values = importances(picked, params, evaluator)
        except ValueError:  # a resample without spread in its values: counted, left out
            degenerate += 1
            continue
        samples.append([values[p] for p in params])
        ranks = _ranks(values)
        for p in params:
            same_rank[p] += ranks[p] == point_rank[p]
        for p, n_stars in stars(values, dummies).items():
            same_stars[p] += n_stars == point_stars[p]
        same_top += max(values, key=values.__getitem__) == max(point, key=point.__getitem__)
    array = np.asarray(samples).reshape(len(samples), len(params))
    n = max(1, len(samples))
    return Stability(
        low={p: float(np.percentile(array[:, i], 5)) for i, p in enumerate(params)} if samples else {},
        high={p: float(np.percentile(array[:, i], 95)) for i, p in enumerate(params)} if samples else {},
        same_rank={p: same_rank[p] / n for p in params},
        same_top=same_top / n,
        n_resamples=len(samples),
        n_degenerate=degenerate,
        same_stars={p: same_stars[p] / n for p in same_stars},
    )


def _ranks(values: dict[str, float]) -> dict[str, int]:
    order = sorted(values, key=lambda name: (-values[name], name))
    return {name: rank for rank, name in enumerate(order, start=1)}


def split_half_agreement(trials: list[FrozenTrial], params: list[str], evaluator: str) -> float | None:
    """Spearman rank correlation of the importances computed on the first and second half of the trials (by number).

    With Sobol sampling each half is itself a space-filling design, so this is a second, independent stability
    check. None when a half is too small or degenerate.
    """
    from scipy.stats import spearmanr

    half = len(trials) // 2
    if half < 4:
        return None
    try:
        first, second = importances(trials[:half], params, evaluator), importances(trials[half:], params, evaluator)
    except ValueError:
        return None
    rho = spearmanr([first[p] for p in params], [second[p] for p in params]).statistic
    return None if not math.isfinite(rho) else float(rho)
