"""PNG figures of a report: importance bar chart (all studies) and one slice plot per study with seed error bars
(plain matplotlib)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402
import numpy as np  # noqa: E402
from optuna.trial import FrozenTrial  # noqa: E402

from sb3_ppo_scale.tuning.importance import EVALUATOR_TITLES, TOP_FRACTION  # noqa: E402

#: Fixed PNG metadata so that a report of a fixed study is byte-identical across runs.
PNG_METADATA = {"Software": None}


def importance_chart(path: Path, results: dict[str, dict[str, dict[str, float]]], labels: dict[str, str],
                     intervals: dict[str, dict[str, tuple[dict[str, float], dict[str, float]]]] | None = None) -> None:
    """Horizontal grouped bars: one bar per (study, evaluator) for each parameter, ``results[study][evaluator]``;
    ``intervals[study][evaluator] = (low, high)`` adds bootstrap 5-95% whiskers."""
    params = list(labels)
    groups = [(study, ev) for study in results for ev in results[study]]
    height = 0.8 / max(1, len(groups))
    legend_rows = -(-len(groups) // 2)
    fig, ax = plt.subplots(figsize=(9.0, 1.6 + 0.9 * len(params) + 0.2 * legend_rows))
    for index, (study, ev) in enumerate(groups):
        values = [results[study][ev].get(p, 0.0) for p in params]
        positions = np.arange(len(params)) + index * height
        low, high = (intervals or {}).get(study, {}).get(ev, ({}, {}))
        xerr = None
        if low and high:
            xerr = np.array([[max(0.0, v - low[p]) for p, v in zip(params, values)],
                             [max(0.0, high[p] - v) for p, v in zip(params, values)]])
        ax.barh(positions, values, height=height, xerr=xerr, capsize=2, error_kw={"elinewidth": 0.8},
                label=f"{study} - {EVALUATOR_TITLES[ev]}")
    ax.set_yticks(np.arange(len(params)) + 0.4 - height / 2, [labels[p] for p in params])
    ax.invert_yaxis()
    ax.set_xlabel("normalised importance (sums to 1 per study and evaluator; whiskers: bootstrap 5-95%)")
    ax.set_title("PPO hyperparameter importance")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1 - 0.3 / len(params)), ncol=2)  # below the axes
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=PNG_METADATA, bbox_inches="tight")
    plt.close(fig)


def slice_plot(path: Path, title: str, trials: list[FrozenTrial], labels: dict[str, str], log_axes: set[str],
               noise_trials: list[FrozenTrial] | None = None) -> None:
    """Objective against each parameter, one point per trial with its seed spread as an error bar (min to max of the
    per-seed objectives, ``seed_values``); the top 10% of trials highlighted; the noise repeats' mean +- one
    standard deviation (of their trial objectives) as a grey band. ``log2_*`` axes show 2**x ticks."""
    params = list(labels)
    values = np.array([float(t.value) for t in trials])
    seeds = [np.asarray(t.user_attrs.get("seed_values") or [t.value], dtype=float) for t in trials]
    errors = np.array([[v - s.min() for v, s in zip(values, seeds)], [s.max() - v for v, s in zip(values, seeds)]])
    cutoff = np.sort(values)[::-1][max(1, int(np.ceil(TOP_FRACTION * len(values)))) - 1]
    top = values >= cutoff
    band = _noise_band(noise_trials or [])
    fig, axes = plt.subplots(1, len(params), figsize=(3.0 * len(params), 3.2), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], params):
        xs = np.array([float(t.params[name]) for t in trials])
        for mask, color, size, label in ((~top, "tab:blue", 4, "trials (bars: seed min-max)"),
                                         (top, "tab:red", 5, f"top {TOP_FRACTION:.0%}")):
            ax.errorbar(xs[mask], values[mask], yerr=errors[:, mask], fmt="o", ms=size, color=color, alpha=0.75,
                        elinewidth=0.7, capsize=1.5, label=label)
        if band is not None:
            ax.axhspan(band[0], band[1], color="0.6", alpha=0.3, lw=0, label="noise repeats: mean +- std")
        ax.set_xlabel(labels[name])
        if name.startswith("log2_"):
            ticks = np.arange(np.floor(xs.min()), np.ceil(xs.max()) + 1)
            ax.set_xticks(ticks, [str(int(2**t)) for t in ticks], fontsize=7)
        elif name in log_axes:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on a range under a decade
            ticks = np.geomspace(xs.min(), xs.max(), 3) if xs.min() < xs.max() else xs[:1]
            ax.set_xticks(ticks, [f"{t:.1e}" for t in ticks], fontsize=7)  # a range under a decade has no major tick
    axes[0][0].set_ylabel("objective (mean over seeds)")
    axes[0][0].legend(fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata=PNG_METADATA)
    plt.close(fig)


def _noise_band(noise_trials: list[FrozenTrial]) -> tuple[float, float] | None:
    """(mean - std, mean + std) of the noise repeats' objectives; None with fewer than two."""
    values = [float(t.value) for t in noise_trials if t.value is not None]
    if len(values) < 2:
        return None
    mean, std = float(np.mean(values)), float(np.std(values, ddof=1))
    return mean - std, mean + std
