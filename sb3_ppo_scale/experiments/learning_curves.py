"""The learning benchmark's curves (:mod:`sb3_ppo_scale.experiments.learning_report` writes them with its report):
one ``learning_<task>.png`` per task, per label the IQM over seeds at each evaluation with its 95% bootstrap band,
against env steps and against training wall-clock seconds (titled with the box's raw env step cost as the runs
recorded it), and forward distance and episode length against env steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sb3_ppo_scale.experiments import intervals
from sb3_ppo_scale.experiments.algorithms import label_order
from sb3_ppo_scale.experiments.pipeline import path_part

Run = dict[str, Any]


def env_step_us(results: list[Run], task: str) -> float | None:
    """The task's raw env step cost in microseconds, as its runs recorded it (``box.env_step_us``, median over
    runs); None where no run recorded it."""
    recorded = recorded_env_step_us(results, task)
    return float(np.median(recorded)) if recorded else None


def recorded_env_step_us(results: list[Run], task: str) -> list[float]:
    """The raw env step costs in microseconds the task's runs recorded, one per run that did (the box it started
    on)."""
    return [r["box"]["env_step_us"] for r in results
            if r["task"] == task and r.get("box", {}).get("env_step_us") is not None]


#: the panels of a task's curves: (x key, y key, x label, y label); x "train_s" is the wall-clock panel
CURVE_PANELS = (("steps", "return", "env steps", "evaluation return"),
                ("train_s", "return", "training wall-clock s (evaluation excluded)", "evaluation return"),
                ("steps", "forward_distance", "env steps", "forward distance (m)"),
                ("steps", "length", "env steps", "episode length (steps)"))


def _common_evaluations(runs: list[Run]) -> int:
    """How many evaluations every run has (the first ones)."""
    return min(len(r["curve"]) for r in runs)


def _iqm_band(runs: list[Run], key: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(iqm, low, high)`` over the runs of ``key`` at their first ``n`` evaluations (:func:`intervals.iqm_curve`);
    None where some run did not record it."""
    values = [[p.get(key) for p in r["curve"][:n]] for r in runs]
    if any(v is None for row in values for v in row):
        return None
    return intervals.iqm_curve(values)


def _plot_label(axes: Any, runs: list[Run], label: str, color: Any) -> None:
    """One label's lines in every panel: the IQM over seeds at each evaluation (the first evaluations every seed
    has), its bootstrap band, at the seeds' mean x; a panel whose value some run did not record stays empty."""
    n = _common_evaluations(runs)
    bands: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray] | None] = {}
    for ax, (x_key, y_key, _, _) in zip(axes, CURVE_PANELS):
        if y_key not in bands:
            bands[y_key] = _iqm_band(runs, y_key, n)
        if bands[y_key] is None:
            continue
        iqm, low, high = bands[y_key]
        x = np.mean([[p[x_key] for p in r["curve"][:n]] for r in runs], axis=0)
        ax.plot(x, iqm, color=color, label=f"{label} ({len(runs)} seeds)")
        ax.fill_between(x, low, high, color=color, alpha=0.15)


def curve_against_band(runs: list[Run], baseline_runs: list[Run]) -> tuple[int, list[int], list[int]] | None:
    """Where the IQM return curve of ``runs`` lies against the 95% band of ``baseline_runs``' at the evaluations
    both have: ``(evaluations compared, env steps where below the band, env steps where above it)``; None where the
    two evaluate at different env steps."""
    n = min(_common_evaluations(runs), _common_evaluations(baseline_runs))
    steps = {tuple(p["steps"] for p in r["curve"][:n]) for r in runs + baseline_runs}
    if len(steps) != 1:
        return None
    at = steps.pop()
    ours, (_, low, high) = _iqm_band(runs, "return", n)[0], _iqm_band(baseline_runs, "return", n)
    return (n, [s for s, v, lo in zip(at, ours, low) if v < lo], [s for s, v, hi in zip(at, ours, high) if v > hi])


def step_cost_title(results: list[Run], task: str) -> str:
    """The wall-clock panel's title: the task's raw env step cost as its runs recorded it (:func:`env_step_us`)."""
    step_us = env_step_us(results, task)
    return "raw env step: " + (f"{step_us:.0f} us (gym.make, one env, random actions; median over runs)"
                               if step_us is not None else "not recorded for these runs")


def plot_curves(results: list[Run], out: Path, baseline: str = "sb3_ppo") -> list[Path]:
    """``<out>/learning_<task>.png`` per task: evaluation return against env steps and against training wall-clock
    seconds (its title: the box's raw env step cost), forward distance and episode length against env steps; per
    label the IQM over seeds with a 95% bootstrap band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for task in sorted({r["task"] for r in results}):
        labels = sorted({r["algo"] for r in results if r["task"] == task}, key=lambda a: label_order(a, baseline))
        fig, axes = plt.subplots(1, len(CURVE_PANELS), figsize=(21, 4.8))
        colors = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20").colors
        for label, color in zip(labels, colors):
            _plot_label(axes, [r for r in results if r["task"] == task and r["algo"] == label], label, color)
        for ax, (_, _, xlabel, ylabel) in zip(axes, CURVE_PANELS):
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if not ax.lines:  # e.g. forward distance of an env without an x position
                ax.text(0.5, 0.5, "not recorded for this task", ha="center", va="center", transform=ax.transAxes)
        axes[1].set_title(step_cost_title(results, task), fontsize=9)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{task}: the Scalable classes and the classes they extend, config entries in the labels "
                     "(line: IQM over seeds; band: 95% bootstrap interval)")
        fig.tight_layout()
        path = out / f"learning_{path_part(task)}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
