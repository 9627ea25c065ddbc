"""The learning benchmark's report, rebuilt from the run files of ``sb3-ppo-scale bench`` (bench.py makes the runs
and calls :func:`write_report`; ``--report-only`` only calls it): ``learning_summary.md``,
``performance_profile.png`` and one ``learning_<task>.png`` per task.

Statistics (rliable, through :mod:`sb3_ppo_scale.experiments.intervals`: 95% intervals, seeded, so a rebuilt report
prints the same numbers):

- Returns (final return, return over the last 20% of the run, forward distance, return at the baseline's budget):
  IQM and mean over seeds, each with a stratified bootstrap interval (one task: seeds resampled).
- Times, steps, steps/s, episode lengths, and per-seed ratios and differences: mean over seeds [bootstrap interval].
- Over tasks (:mod:`sb3_ppo_scale.experiments.learning_over_tasks`): normalised final returns per label (IQM and
  mean), their performance profile as a PNG, and probabilities of improvement of the Scalable labels.
- Curves per task (:mod:`sb3_ppo_scale.experiments.learning_curves`): the IQM over seeds at each evaluation with a
  bootstrap band, against env steps and against training wall-clock seconds (with the box's raw env step cost), and
  forward distance and episode length.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sb3_ppo_scale.experiments import intervals
from sb3_ppo_scale.experiments.algorithms import ALGO_CLASSES, label_order, pair_of, parsed_or_unknown
from sb3_ppo_scale.experiments.intervals import Estimate
from sb3_ppo_scale.experiments.learning_curves import (curve_against_band, env_step_us, plot_curves,
                                                       recorded_env_step_us)
from sb3_ppo_scale.experiments.learning_over_tasks import (OverTasks, improvement_lines, over_tasks, over_tasks_lines,
                                                           performance_profile, random_policy_return, report_baseline)

Run = dict[str, Any]
#: the share of a run's budget whose evaluations make its late return (:func:`late_return`)
LATE_FRACTION = 0.2
#: return floors of the time-to-threshold per task, above what standing still earns in an episode of 1000 steps at
#: most. Hopper-v5 pays 1 healthy point per step and 125 per metre forward (dt 0.008 s): standing earns <= 1000, and
#: 1500 needs >= 4 m. Ant-v5 pays 1 per step and 20 per metre (dt 0.05 s): standing earns <= 1000 (an untrained
#: policy's deterministic episode scores ~1000 at step 0), and 1500 needs >= 25 m. Humanoid-v5 pays 5 per step and
#: 1.25 / 0.015 = 83 per metre: standing earns <= 5000, and 6000 needs >= 12 m.
THRESHOLD_FLOORS = {"Hopper-v5": 1500.0, "Ant-v5": 1500.0, "Humanoid-v5": 6000.0}
#: the report's file names inside ``--out``
SUMMARY_FILE = "learning_summary.md"


def load_results(out: Path) -> list[Run]:
    """Every run file of ``<out>/runs/``, in file-name order."""
    return [json.loads(path.read_text()) for path in sorted((out / "runs").glob("*.json"))]


# ------------------------------------------------------------------------------------------------ per-run measures
def time_to_threshold(curve: list[dict[str, float]], threshold: float, key: str = "train_s") -> float:
    """``key`` (training wall-clock s; ``cpu_s``: CPU s; ``steps``: env steps) at the first evaluation whose return
    is >= threshold (inf if never)."""
    for point in curve:
        if point["return"] >= threshold:
            return point[key]
    return float("inf")


def late_return(run: Run, fraction: float = LATE_FRACTION) -> float:
    """Mean evaluation return over the last ``fraction`` of the run's budget (its final evaluation included):
    steadier than the final evaluation alone, which can swing by > 1000 on Hopper."""
    start = run["budget"] * (1 - fraction)
    return float(np.mean([p["return"] for p in run["curve"] if p["steps"] >= start]))


def return_at(run: Run, steps: int) -> float:
    """The return of the run's first evaluation at or after ``steps`` env steps (NaN if it stopped before)."""
    return next((p["return"] for p in run["curve"] if p["steps"] >= steps), float("nan"))


def task_threshold(task: str, baseline_runs: list[Run], threshold_frac: float) -> float:
    """``max(threshold_frac x the baseline's mean final return, the task's floor)``; nan with neither."""
    candidates = [THRESHOLD_FLOORS.get(task, float("nan"))]
    if baseline_runs:
        candidates.append(threshold_frac * float(np.mean([r["final_return"] for r in baseline_runs])))
    finite = [c for c in candidates if np.isfinite(c)]
    return max(finite) if finite else float("nan")


# ------------------------------------------------------------------------------------------------ per task
def _measures(runs: list[Run], threshold: float, baseline_budget: int | None) -> dict[str, list[float | None]]:
    """Per measure, one value per seed (None: older runs did not record it)."""
    measures: dict[str, list[float | None]] = {
        "final_return": [r["final_return"] for r in runs],
        "late_return": [late_return(r) for r in runs],
        "final_forward_distance": [r.get("final_forward_distance") for r in runs],
        "final_length": [r.get("final_length") for r in runs],
        "time_to_threshold": [time_to_threshold(r["curve"], threshold) for r in runs],
        "cpu_to_threshold": [time_to_threshold(r["curve"], threshold, "cpu_s") for r in runs],
        "steps_to_threshold": [time_to_threshold(r["curve"], threshold, "steps") for r in runs],
        "train_s": [r["train_s"] for r in runs],
        "cpu_s": [r["cpu_s"] for r in runs],
        "steps_per_s": [r["steps_per_s"] for r in runs],
    }
    if baseline_budget is not None and runs[0]["budget"] > baseline_budget:  # learning per sample
        measures["return_at_baseline_budget"] = [return_at(r, baseline_budget) for r in runs]
    return measures


def summarise(results: list[Run], threshold_frac: float, baseline: str = "sb3_ppo") -> dict[str, dict[str, Any]]:
    """Per task: its threshold, its runs per label and, per label, ``{"iqm": Estimate, "mean": Estimate}`` of each
    measure of :func:`_measures` (returns, forward distance, episode length, times and steps to threshold, train and
    CPU seconds, steps/s), the seeds, how many reached the threshold, the budget and the config entry."""
    summary: dict[str, dict[str, Any]] = {}
    for task in sorted({r["task"] for r in results}):
        task_runs = [r for r in results if r["task"] == task]
        labels = sorted({r["algo"] for r in task_runs}, key=lambda a: label_order(a, baseline))
        runs = {a: [r for r in task_runs if r["algo"] == a] for a in labels}
        threshold = task_threshold(task, runs.get(baseline, []), threshold_frac)
        baseline_budget = runs[baseline][0]["budget"] if runs.get(baseline) else None
        algos = {}
        for label, label_runs in runs.items():
            measures = _measures(label_runs, threshold, baseline_budget)
            algos[label] = {**intervals.aggregates_by_name(measures), "seeds": [r["seed"] for r in label_runs],
                            "reached": int(np.isfinite(measures["time_to_threshold"]).sum()),
                            "budget": label_runs[0]["budget"], "entry": label_runs[0]["entry"]}
        summary[task] = {"threshold": threshold, "baseline": baseline, "algos": algos, "runs": runs,
                         "baseline_budget": baseline_budget}
    return summary


def _returns_cells(stats: dict[str, Estimate], digits: int = 0) -> str:
    return f"{stats['iqm'].text(digits)} | {stats['mean'].text(digits)}"


def _threshold_cells(threshold: float, stats: dict[str, Any]) -> str:
    """The threshold, steps-, s- and CPU-s-to-threshold cells (means); n/a without a baseline run or a floor."""
    if np.isnan(threshold):
        return "n/a (no baseline runs) | n/a | n/a | n/a"
    if stats["reached"] < len(stats["seeds"]):
        missed = f"reached on {stats['reached']} of {len(stats['seeds'])} seeds"
        return f"{threshold:.0f} | {missed} | {missed} | {missed}"
    return (f"{threshold:.0f} | {stats['steps_to_threshold']['mean'].text()} | "
            f"{stats['time_to_threshold']['mean'].text(1)} | {stats['cpu_to_threshold']['mean'].text(1)}")


def _table(summary: dict[str, dict[str, Any]], columns: list[str],
           cells: Callable[[dict[str, Any], str, dict[str, Any]], str]) -> list[str]:
    """A markdown table, one row per task and label: the task, then ``cells(task data, label, label stats)``."""
    lines = ["| task | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for task, data in summary.items():
        lines += [f"| {task} | {cells(data, algo, stats)} |" for algo, stats in data["algos"].items()]
    return lines


def returns_table(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Per task and label: IQM and mean [interval] of the returns and the forward distance, mean episode length."""
    return _table(summary, ["algo (config entry)", "budget (steps)", "seeds", "final return IQM", "final return mean",
                            "return, last 20%: IQM", "return, last 20%: mean", "forward m: IQM", "forward m: mean",
                            "episode length"],
                  lambda data, algo, s: f"{algo} (`{s['entry']}`) | {s['budget']} | {len(s['seeds'])} | "
                                        f"{_returns_cells(s['final_return'])} | {_returns_cells(s['late_return'])} | "
                                        f"{_returns_cells(s['final_forward_distance'], 1)} | "
                                        f"{s['final_length']['mean'].text()}")


def time_table(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Per task and label: the threshold, mean [interval] of steps / s / CPU s to it, train and CPU s, steps/s."""
    return _table(summary, ["algo", "threshold", "steps to threshold", "s to threshold", "CPU s to threshold",
                            "train s", "CPU s", "steps/s"],
                  lambda data, algo, s: f"{algo} | {_threshold_cells(data['threshold'], s)} | "
                                        f"{s['train_s']['mean'].text(1)} | {s['cpu_s']['mean'].text(1)} | "
                                        f"{s['steps_per_s']['mean'].text()}")


def _ratio(summary_task: dict[str, Any], key: str, algo: str) -> float:
    """The baseline's mean ``key`` over ``algo``'s (nan without either)."""
    algos, baseline = summary_task["algos"], summary_task["baseline"]
    if baseline not in algos or algo not in algos:
        return float("nan")
    return algos[baseline][key]["mean"].point / algos[algo][key]["mean"].point


def _time_to_threshold_ratio(data: dict[str, Any], algo: str) -> str:
    """The baseline's mean wall-clock time to the task's threshold over ``algo``'s. Where ``algo`` reached it on
    every seed and the baseline did not, a lower bound: each baseline seed that never reached it counts its whole
    training time. n/a where ``algo`` missed it on a seed."""
    stats, baseline = data["algos"][algo], data["algos"][data["baseline"]]
    if stats["reached"] < len(stats["seeds"]):
        return "n/a (not reached on every seed)"
    ours = stats["time_to_threshold"]["mean"].point
    if ours <= 0:
        return "n/a (reached at the first evaluation, before any training)"
    if baseline["reached"] == len(baseline["seeds"]):
        return f"{_ratio(data, 'time_to_threshold', algo):.2f}x"
    runs = data["runs"][data["baseline"]]
    censored = [min(time_to_threshold(r["curve"], data["threshold"]), r["train_s"]) for r in runs]
    return (f">= {float(np.mean(censored)) / ours:.2f}x ({data['baseline']} reached it on {baseline['reached']} of "
            f"{len(runs)} seeds; a seed that never did counts its whole training time)")


def _baseline_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """One line per label against the task's baseline (config and plugin together), from the means."""
    lines = []
    for task, data in summary.items():
        baseline = data["baseline"]
        for algo in data["algos"]:
            if algo == baseline:
                continue
            if baseline not in data["algos"]:
                lines.append(f"- {task}, {algo}: no {baseline} runs to compare with")
                continue
            lines.append(
                f"- {task}, {algo}: time to threshold {_time_to_threshold_ratio(data, algo)}, "
                f"training time {_ratio(data, 'train_s', algo):.2f}x, CPU time {_ratio(data, 'cpu_s', algo):.2f}x, "
                f"steps/s {1 / _ratio(data, 'steps_per_s', algo):.2f}x, "
                + _final_return_against(data['algos'][algo]['final_return']['mean'].point,
                                        data['algos'][baseline]['final_return']['mean'].point, baseline)
                + _at_baseline_budget(data, algo)
                + _against_band(data, algo, baseline)
            )
    return lines


def _against_band(data: dict[str, Any], algo: str, baseline: str) -> str:
    """Where ``algo``'s IQM return curve lies against the baseline's 95% band (:func:`curve_against_band`)."""
    placed = curve_against_band(data["runs"][algo], data["runs"][baseline])
    if placed is None:
        return "; return curves evaluated at other env steps than the baseline's"
    n, below, above = placed
    where = "; ".join(f"{side} it at {', '.join(f'{s:,}' for s in steps)} steps"
                      for side, steps in (("below", below), ("above", above)) if steps)
    return (f"; IQM return curve inside {baseline}'s 95% band at {n - len(below) - len(above)} of {n} evaluations"
            + (f" ({where})" if where else ""))


def _final_return_against(ours: float, theirs: float, baseline: str) -> str:
    """Mean final returns side by side; their ratio only when both are positive (for negative returns, e.g.
    Pendulum's, a ratio below 1 would mean *better*)."""
    ratio = f" ({ours / theirs:.2f}x)" if ours >= 0 and theirs > 0 else ""
    return f"final return {ours:.4g} against {baseline}'s {theirs:.4g}{ratio}"


def _at_baseline_budget(data: dict[str, Any], algo: str) -> str:
    """For a run longer than the baseline's: its return at the baseline's budget (learning per sample)."""
    stats = data["algos"][algo].get("return_at_baseline_budget")
    if stats is None:
        return ""
    return (f"; at the baseline's budget ({data['baseline_budget']} steps) its return is IQM "
            f"{stats['iqm'].text()}, mean {stats['mean'].text()}")


def _plugin_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Each Scalable label against its pair under the same entry, per seed: what the plugin alone changes."""
    lines = []
    for task, data in summary.items():
        runs = data["runs"]
        for label, ours in runs.items():
            pair = pair_of(label)
            if pair not in runs:
                continue
            theirs = {q["seed"]: q for q in runs[pair]}
            matched = [(r, theirs[r["seed"]]) for r in ours if r["seed"] in theirs]
            stats = intervals.aggregates_by_name({
                "train_s": [t["train_s"] / r["train_s"] for r, t in matched],
                "cpu_s": [t["cpu_s"] / r["cpu_s"] for r, t in matched],
                "gap": [r["final_return"] - t["final_return"] for r, t in matched]})
            same = sum([p["return"] for p in r["curve"]] == [p["return"] for p in t["curve"]] for r, t in matched)
            classes = f"{_class_name(pair)} / {_class_name(label)}"
            lines.append(f"- {task}, {label} vs {pair} (entry `{data['algos'][label]['entry']}`): training time ratio "
                         f"({classes}) {stats['train_s']['mean'].text(2)}, CPU time ratio "
                         f"{stats['cpu_s']['mean'].text(2)}, final return {stats['gap']['mean'].text()} higher (per "
                         f"seed); evaluation returns identical on {same} of {len(matched)} seeds")
    return lines or ["- (no Scalable label with its baseline pair in these results)"]


def _class_name(label: str) -> str:
    """The class a label runs (``ScalablePPO`` for ``scalable_ppo@cpu``)."""
    return ALGO_CLASSES[parsed_or_unknown(label)[0]].rpartition(".")[2]


# ------------------------------------------------------------------------------------------------ the report
def box_line(results: list[Run]) -> str:
    """The header's line on the box: from the runs' ``box`` records (runs older than the record: said so)."""
    boxes = [r["box"] for r in results if "box" in r]
    older = len(results) - len(boxes)
    if not boxes:
        return "Each run: one process, `torch.set_num_threads(1)`; the box's load was not recorded for these runs."
    loads = [b["load_avg_1min"] for b in boxes]
    tasks = sorted({r["task"] for r in results})
    step_text = "; ".join(text for task in tasks if (text := _step_cost_text(results, task)))
    days = sorted({b["date"] for b in boxes if "date" in b})
    started = f"Runs started {days[0]}" + (f" to {days[-1]}" if len(days) > 1 else "") + ". " if days else ""
    workers = max(b["workers"] for b in boxes)
    return (f"{started}Each run: one process, `torch.set_num_threads(1)`, {workers} at a time on "
            f"a {boxes[0]['cores']}-core box; 1-minute load average as runs started: {min(loads):.1f}-{max(loads):.1f} "
            f"(a load near the runs at a time: nothing else ran)" + (f"; {older} older runs did not record it" if older
            else "") + f". Raw env step (gym.make, one env, random actions; median over runs): {step_text or 'n/a'}.")


#: raw env step costs further apart than this factor make the report say that its runs' boxes differ
BOX_SPREAD_NOTED = 1.5


def _step_cost_text(results: list[Run], task: str) -> str:
    """The task's median raw env step cost, and its range where the runs' boxes differ by more than
    :data:`BOX_SPREAD_NOTED` (their wall-clock figures then differ by the box as well as by the config); "" where
    no run of the task recorded it."""
    recorded = recorded_env_step_us(results, task)
    if not recorded:
        return ""
    low, high = min(recorded), max(recorded)
    text = f"{task} {env_step_us(results, task):.0f} us"
    if high > BOX_SPREAD_NOTED * low:
        text += (f" (from {low:.0f} to {high:.0f} us on its runs' boxes: wall-clock figures of runs on different "
                 f"boxes differ by up to {high / low:.1f}x from the box alone, so compare env steps there)")
    return text


def _header(summary: dict[str, dict[str, Any]], threshold_frac: float, command: str, box: str) -> list[str]:
    floors = ", ".join(f"{t} {v:g}" for t, v in THRESHOLD_FLOORS.items() if t in summary) or "none for these tasks"
    baseline = report_baseline(summary) or "sb3_ppo"
    return [
        "# Learning benchmark: the Scalable classes and the classes they extend, under the same configs", "",
        f"Generated by `{command}`; the same command with `--report-only` rebuilds this file and its PNGs from "
        "`runs/`.",
        "", box,
        "Labels: `<algo>@<variant>` runs `<algo>` (sb3_ppo: SB3's PPO, scalable_ppo: ScalablePPO; maskable_ppo / "
        "recurrent_ppo: sb3-contrib's MaskablePPO / RecurrentPPO, scalable_maskable_ppo / scalable_recurrent_ppo: "
        "ours) with the config",
        "entry named in brackets; `@plain` is the task's plain entry (as `sb3_ppo` alone); `scalable_ppo` alone is "
        "`scalable_ppo@cpu` (earlier label).",
        "Statistics (rliable): returns and forward distance as IQM (interquartile mean: the mean of the middle half "
        "of the seeds; the plain mean below 4 seeds) and mean over seeds; episode lengths, times, steps, steps/s and "
        "per-seed ratios as mean over seeds; each [95% stratified bootstrap interval] (seeds resampled within each "
        f"task, {intervals.RESAMPLES:,} resamples).",
        "Final return, episode length and forward distance (x at the episode's end minus at its start, metres): "
        "deterministic evaluation after the last update. Return, last 20%: per seed, the mean of the evaluations in "
        "the last 20% of the run's steps (steadier than the final one).",
        "Time: training wall-clock seconds, evaluation excluded (CPU s: the process's CPU time, less sensitive to "
        f"other load). Threshold: max({threshold_frac:g} x the baseline's ({baseline}) mean final return, the "
        f"task's floor above known plateaus: {floors}); steps / s / CPU s to threshold: at the first evaluation "
        "whose mean return reaches it (env steps do not depend on the box's load).",
    ]


def write_markdown(summary: dict[str, dict[str, Any]], out: Path, threshold_frac: float, command: str,
                   box: str = "Each run: one process, `torch.set_num_threads(1)`.",
                   over: OverTasks | None = None) -> Path:
    """``<out>/learning_summary.md``: the header, the returns and time tables, the comparisons with the baseline and
    of each Scalable class with its pair, and the aggregate over tasks (``over``; None: :func:`over_tasks` with
    the real random-policy scores)."""
    over = over_tasks(summary) if over is None else over
    baseline = report_baseline(summary) or "sb3_ppo"
    lines = [
        *_header(summary, threshold_frac, command, box),
        "", "## Per task", "", "Returns: IQM and mean over seeds [95% stratified bootstrap interval]; episode "
        "length: mean [interval].", "", *returns_table(summary),
        "", "Time: mean over seeds [95% bootstrap interval].", "", *time_table(summary),
        "", f"Against the baseline ({baseline}; ratios from the means, > 1: faster than the baseline):", "",
        *_baseline_lines(summary),
        "", "Plugin effect: each Scalable class against the class it extends under the same config entry, same seeds "
        "(training time: theirs / ours per seed; mean [interval]):", "",
        *_plugin_lines(summary),
        "", *over_tasks_lines(over), *improvement_lines(summary),
    ]
    path = out / SUMMARY_FILE
    path.write_text("\n".join(lines) + "\n")
    return path


def write_report(results: list[Run], out: Path, threshold_frac: float, baseline: str, command: str,
                 random_return: Callable[[str], float | None] = random_policy_return) -> list[Path]:
    """Everything the report holds, from ``results``: ``learning_summary.md`` first, then the performance profile
    (where a label ran on every task that normalises) and the per-task curves."""
    summary = summarise(results, threshold_frac, baseline)
    over = over_tasks(summary, random_return)
    markdown = write_markdown(summary, out, threshold_frac, command, box_line(results), over)
    profile = performance_profile(over, out)
    return [markdown, *([profile] if profile else []), *plot_curves(results, out, baseline)]
