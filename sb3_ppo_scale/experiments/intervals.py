"""Interval estimates for few-seed RL results, as the field reports them: rliable (Agarwal et al. 2021, "Deep
Reinforcement Learning at the Edge of the Statistical Precipice").

Scores are arrays of shape ``(runs, tasks)``: one row per seed, one column per task. Aggregates (interquartile
mean, mean) come with 95% stratified bootstrap intervals (seeds resampled within each task); probability of
improvement compares two such arrays task by task (Mann-Whitney U, averaged over tasks). With one task the
stratified bootstrap is the plain percentile bootstrap over seeds.

Every function takes a ``seed`` (default 0) so that a report rebuilt from the same runs prints the same intervals.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: bootstrap resamples per interval (rliable's default is 50 000; 10 000 moves a bound by well under 1%)
RESAMPLES = 10_000
#: the width of every interval
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its ``CONFIDENCE`` interval. ``point`` is inf (``low``, ``high`` nan) where some run
    never got a finite value (e.g. a threshold one seed never reached); all nan where there are no runs."""

    point: float
    low: float
    high: float

    def text(self, digits: int = 0) -> str:
        """``"3412 [3150, 3590]"``; ``"n/a"`` without runs; ``"not reached (some seeds)"`` for an infinite point."""
        if np.isnan(self.point):
            return "n/a"
        if not np.isfinite(self.point):
            return "not reached (some seeds)"
        point, low, high = (_rounded(value, digits) for value in (self.point, self.low, self.high))
        return f"{point} [{low}, {high}]"


def _rounded(value: float, digits: int) -> str:
    """``value`` with ``digits`` decimals, without the sign of a value that rounds to zero ("0", not "-0")."""
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


NOT_AVAILABLE = Estimate(float("nan"), float("nan"), float("nan"))
NOT_REACHED = Estimate(float("inf"), float("nan"), float("nan"))


def _matrix(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """Scores as a float ``(runs, tasks)`` array: a flat sequence is the seeds of one task."""
    array = np.asarray(scores, dtype=float)
    return array.reshape(-1, 1) if array.ndim == 1 else array


def iqm_columns(x: np.ndarray) -> np.ndarray:
    """The interquartile mean of each column of ``x`` (``(runs, columns)``): the mean of what is left after cutting
    ``int(0.25 * runs)`` runs from each end; rliable's ``aggregate_iqm`` (scipy's ``trim_mean``) without scipy's
    per-call overhead, which dominated a 10 000-resample bootstrap."""
    runs = x.shape[0]
    cut = int(0.25 * runs)
    return np.sort(x, axis=0)[cut:runs - cut].mean(axis=0)


def _rng(seed: int) -> np.random.RandomState:
    return np.random.RandomState(seed)  # rliable's bootstraps take a legacy RandomState


def _estimates(scores: Mapping[str, object], func: Callable[[np.ndarray], object], resamples: int,
               seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """rliable's ``get_interval_estimates``, seeded: rliable 1.2's stratified bootstraps draw their resamples from
    NumPy's global RNG (the ``random_state`` they take is not used for them), so that RNG is seeded with ``seed``
    for the call and its state restored after. arch's FutureWarning on ``random_state`` (rliable passes it, not
    arch's newer ``generator``) is silenced here only."""
    from rliable import library

    state = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="random_state is deprecated", category=FutureWarning)
            return library.get_interval_estimates(scores, func, reps=resamples, confidence_interval_size=CONFIDENCE,
                                                  random_state=_rng(seed))
    finally:
        np.random.set_state(state)


def aggregates(scores: Sequence[float] | np.ndarray, resamples: int = RESAMPLES,
               seed: int = 0) -> dict[str, Estimate]:
    """``{"iqm": ..., "mean": ...}`` of ``scores`` (``(runs, tasks)``, or the seeds of one task) with stratified
    bootstrap intervals. Non-finite scores give :data:`NOT_REACHED`; no scores :data:`NOT_AVAILABLE`."""
    matrix = _matrix(scores)
    if matrix.size == 0:
        return {"iqm": NOT_AVAILABLE, "mean": NOT_AVAILABLE}
    if not np.all(np.isfinite(matrix)):
        return {"iqm": NOT_REACHED, "mean": NOT_REACHED}

    def both(x: np.ndarray) -> np.ndarray:  # rliable's aggregate_iqm and aggregate_mean over all runs of all tasks
        return np.array([iqm_columns(x.reshape(-1, 1))[0], x.mean()])

    if matrix.shape[0] == 1 or np.ptp(matrix, axis=0).max() == 0:  # nothing to resample: the interval is the point
        point = both(matrix)
        return {name: Estimate(float(p), float(p), float(p)) for name, p in zip(("iqm", "mean"), point)}
    points, intervals = _estimates({"x": matrix}, both, resamples, seed)
    return {name: Estimate(float(points["x"][i]), float(intervals["x"][0, i]), float(intervals["x"][1, i]))
            for i, name in enumerate(("iqm", "mean"))}


def aggregates_by_name(columns: Mapping[str, Sequence[float | None]], resamples: int = RESAMPLES,
                       seed: int = 0) -> dict[str, dict[str, Estimate]]:
    """:func:`aggregates` of each named list of one task's runs (e.g. one label's final returns, times, steps/s: one
    value per seed, the lists of equal length) in one bootstrap: each list is resampled on its own, so each gets the
    interval one :func:`aggregates` call would give it (up to resampling noise), in a fraction of the time. A list
    with a None (a value older runs did not record) or no values gives :data:`NOT_AVAILABLE`, one with a non-finite
    value :data:`NOT_REACHED`."""
    out: dict[str, dict[str, Estimate]] = {}
    finite: dict[str, np.ndarray] = {}
    for name, values in columns.items():
        array = np.asarray([np.nan if v is None else v for v in values], dtype=float)
        if array.size == 0 or any(v is None for v in values):
            out[name] = {"iqm": NOT_AVAILABLE, "mean": NOT_AVAILABLE}
        elif not np.all(np.isfinite(array)):
            out[name] = {"iqm": NOT_REACHED, "mean": NOT_REACHED}
        else:
            finite[name] = array
    if finite:
        out.update(_column_estimates(np.column_stack(list(finite.values())), list(finite), resamples, seed))
    return {name: out[name] for name in columns}


def _column_estimates(matrix: np.ndarray, names: list[str], resamples: int,
                      seed: int) -> dict[str, dict[str, Estimate]]:
    """IQM and mean of each column of ``matrix`` (``(runs, columns)``, finite), columns resampled independently."""
    columns = matrix.shape[1]

    def both(x: np.ndarray) -> np.ndarray:  # rliable's aggregate_iqm and aggregate_mean, per column
        return np.concatenate([iqm_columns(x), x.mean(axis=0)])

    if matrix.shape[0] == 1:  # one run: nothing to resample
        points = both(matrix)
        low = high = points
    else:
        estimates, bounds = _estimates({"x": matrix}, both, resamples, seed)
        points, low, high = estimates["x"], bounds["x"][0], bounds["x"][1]
    return {name: {kind: Estimate(float(points[k * columns + i]), float(low[k * columns + i]),
                                  float(high[k * columns + i])) for k, kind in enumerate(("iqm", "mean"))}
            for i, name in enumerate(names)}


def mean(values: Sequence[float], resamples: int = RESAMPLES, seed: int = 0) -> Estimate:
    """The mean of one task's seeds with its bootstrap interval (:func:`aggregates`' ``"mean"``)."""
    return aggregates(values, resamples, seed)["mean"]


def iqm_curve(values: Sequence[Sequence[float]] | np.ndarray, resamples: int = 2_000,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(iqm, low, high)``, each one value per column of ``values`` (``(runs, points)``: e.g. each seed's return at
    the same evaluations): the IQM over runs and its bootstrap band, one resample of runs for every point (rliable's
    sample-efficiency curves). With one run the band is the curve itself."""
    matrix = np.asarray(values, dtype=float)[:, None, :]  # (runs, 1 task, points)

    def iqm(x: np.ndarray) -> np.ndarray:  # rliable's aggregate_iqm at each point
        return iqm_columns(x.reshape(-1, x.shape[-1]))

    if matrix.shape[0] == 1:
        point = iqm(matrix)
        return point, point, point
    points, bands = _estimates({"x": matrix}, iqm, resamples, seed)
    return points["x"], bands["x"][0], bands["x"][1]


def probability_of_improvement(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
                               resamples: int = 2_000, seed: int = 0) -> Estimate:
    """P(X > Y): the chance that a run of ``x`` scores above a run of ``y`` on a task (ties count half), averaged
    over tasks, with a stratified bootstrap interval. ``x``, ``y``: ``(runs, tasks)`` with the same tasks (the
    runs may differ in number); raw returns are fine (it compares within each task)."""
    from rliable import metrics

    mx, my = _matrix(x), _matrix(y)
    if mx.shape[1] != my.shape[1]:
        raise ValueError(f"probability_of_improvement: x has {mx.shape[1]} tasks, y {my.shape[1]}")
    if mx.size == 0 or my.size == 0:
        return NOT_AVAILABLE
    points, intervals = _estimates({"x,y": (mx, my)}, metrics.probability_of_improvement, resamples, seed)
    return Estimate(float(points["x,y"]), float(intervals["x,y"][0, 0]), float(intervals["x,y"][1, 0]))


def of_groups(statistic: Callable[..., float], *groups: Sequence[Any] | np.ndarray, resamples: int = RESAMPLES,
              seed: int = 0) -> Estimate:
    """``statistic(*groups)`` with a percentile bootstrap interval that resamples each group's runs (rows: e.g. one
    seed's return, or one seed's whole learning curve) independently of the others: arch's
    IndependentSamplesBootstrap, the bootstrap rliable builds on. nan where a group is empty or the statistic is."""
    arrays = [np.asarray(group, dtype=float) for group in groups]
    if any(a.shape[0] == 0 for a in arrays):
        return NOT_AVAILABLE
    point = float(statistic(*arrays))
    if not np.isfinite(point):
        return Estimate(point, float("nan"), float("nan"))
    if all(np.all(a == a[0]) for a in arrays):  # every run alike: nothing to resample
        return Estimate(point, point, point)
    from arch.bootstrap import IndependentSamplesBootstrap

    bootstrap = IndependentSamplesBootstrap(*arrays, seed=seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        low, high = np.ravel(bootstrap.conf_int(lambda *a: np.array([statistic(*a)]), reps=resamples,
                                                method="percentile", size=CONFIDENCE))
    return Estimate(point, float(low), float(high))


def ratio_of_means(x: Sequence[float], y: Sequence[float], resamples: int = RESAMPLES, seed: int = 0) -> Estimate:
    """mean(x) / mean(y) of two independent groups of runs (e.g. two methods' seeds on one task), each group
    resampled on its own (:func:`of_groups`); nan where a group is empty or mean(y) is 0."""
    def ratio(a: np.ndarray, b: np.ndarray) -> float:
        return float(a.mean() / b.mean()) if b.mean() != 0 else float("nan")

    return of_groups(ratio, x, y, resamples=resamples, seed=seed)


def normalised(returns: np.ndarray, zero: Sequence[float], one: Sequence[float]) -> np.ndarray:
    """Per task (columns of ``returns``), ``(return - zero) / (one - zero)``: e.g. a random policy at 0 and a
    reference return at 1, so that tasks of different scales can be aggregated."""
    low, high = np.asarray(zero, dtype=float), np.asarray(one, dtype=float)
    if np.any(high <= low):
        raise ValueError(f"normalised: every reference must be above its zero, got zero {list(low)}, one {list(high)}")
    return (np.asarray(returns, dtype=float) - low) / (high - low)


def performance_profile_png(scores: Mapping[str, np.ndarray], path: Path, xlabel: str, title: str,
                            resamples: int = 2_000, seed: int = 0) -> Path:
    """The fraction of runs (all seeds of all tasks) scoring above each threshold tau, per label, with its
    stratified bootstrap band (rliable's performance profile), as a PNG at ``path``. ``scores``: label ->
    ``(runs, tasks)`` normalised scores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import library

    matrices = {label: _matrix(s) for label, s in scores.items()}
    top = max(float(np.max(m)) for m in matrices.values())
    taus = np.linspace(min(0.0, min(float(np.min(m)) for m in matrices.values())), max(top, 1.0) * 1.05, 101)
    # rliable's create_performance_profile (run score distributions), with a seed
    profiles, bands = _estimates(matrices, lambda x: library.score_distributions(x, taus), resamples, seed)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (label, profile), color in zip(profiles.items(), plt.get_cmap("tab10").colors):
        ax.plot(taus, profile, color=color, label=f"{label} ({matrices[label].shape[0]} runs x "
                                                  f"{matrices[label].shape[1]} tasks)")
        ax.fill_between(taus, bands[label][0], bands[label][1], color=color, alpha=0.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
