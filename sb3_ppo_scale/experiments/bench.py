"""Learning benchmark: ScalablePPO's config variants against SB3 PPO, the same config on both sides.

Kept as one module (over 600 lines) until its report is rebuilt on rliable (the learning-at-scale issue): the
run protocol, its labels and the statistics that read its run files share one set of constants and labels.

Protocol (docs/benchmarks.md states it in full):

- A run is labelled ``<algo>[@<variant>]``: ``algo`` is ``sb3_ppo`` (SB3's ``PPO``) or ``scalable_ppo``
  (``ScalablePPO``), and the config is the entry ``<task>[@<variant>]`` of ``--config``. Every ScalablePPO label
  is paired with SB3 PPO under the same entry (``scalable_ppo@cpu`` adds ``sb3_ppo@cpu``; ``--no-pairs`` turns
  this off), so the table shows the config's effect (``sb3_ppo@cpu`` vs the baseline) apart from the plugin's
  (``scalable_ppo@cpu`` vs ``sb3_ppo@cpu``). SB3 PPO gets the entry without ScalablePPO's execution-only keys
  (:data:`EXECUTION_ONLY_KEYS`, which do not change the maths); an entry with other ScalablePPO-only keys has no
  SB3 pair (the run is skipped and said so).
- sb3-contrib's classes the same way: ``scalable_maskable_ppo`` / ``scalable_recurrent_ppo`` labels pair with
  ``maskable_ppo`` / ``recurrent_ppo`` (MaskablePPO, RecurrentPPO) under the same entry of ``configs/contrib.yml``
  (``batched_sequences`` is execution-only: dropped for RecurrentPPO), e.g.
  ``sb3-ppo-scale bench --tasks CartPoleNoVel-v1 --algos scalable_recurrent_ppo@batched`` (the baseline is then
  ``recurrent_ppo``).
- Labels of earlier results (``scalable_ppo`` = ``@cpu``, ``scalable_ppo_gpu``, ...) stay valid (:data:`LEGACY_LABELS`).
- Each run is one single-threaded process; at most ``--workers`` (default 1) run at once. Every run writes
  ``<out>/runs/<task>__<label>__seed<k>.json``; existing files are skipped (resumable) when they hold the run the
  command asks for (same budget, evaluation settings and entry hyperparameters; else an error names the difference);
  ``--report-only`` only rebuilds the tables and plots.
- Per evaluation (every ``--eval-every`` env steps, ``--eval-episodes`` deterministic episodes, VecNormalize
  statistics frozen, rewards unnormalised) the run JSON records the mean return, mean episode length, mean
  forward distance (x position at the episode's end minus at its start, MuJoCo envs; ``null`` elsewhere), the
  mean length of the last 100 training episodes, and the training wall-clock and CPU seconds (evaluation
  excluded). The final evaluation (``--final-episodes`` episodes) follows the last update.
- Threshold per task: ``max(--threshold-frac x the baseline label's mean final return, floor)``, with the floors
  of :data:`THRESHOLD_FLOORS` set above known plateaus (Hopper-v5: 1500, which a policy standing still cannot
  reach). Steps / seconds / CPU seconds to threshold: at the first evaluation whose mean return reaches it.
- Reported per task and label: mean over seeds with a 95% percentile bootstrap interval (10 000 resamples).

    sb3-ppo-scale bench --tasks Hopper-v5 --algos sb3_ppo scalable_ppo@cpu --budget 300000 --seeds 0 1 2
    python -m sb3_ppo_scale.experiments.bench --tasks Hopper-v5 --budget 20000 --seeds 0   # the same module
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from sb3_ppo_scale.core.update.lr import KLAdaptiveLR
from sb3_ppo_scale.experiments.stats import bootstrap_ci
from sb3_ppo_scale.experiments.algorithms import ALGORITHMS, Algorithm
from sb3_ppo_scale.experiments.pipeline import path_part, seed_argument

#: results land under the working directory unless ``--out`` says otherwise
DEFAULT_OUT = Path("bench_results")
#: algorithm name -> class path: each Scalable class (``scalable_ppo``, ``scalable_maskable_ppo``,
#: ``scalable_recurrent_ppo``) and the class it is compared with (``sb3_ppo``, ``maskable_ppo``, ``recurrent_ppo``)
ALGO_CLASSES = {name: path for a in ALGORITHMS.values()
                for name, path in ((a.baseline, a.baseline_class), (a.name, a.class_path))}
#: Scalable algorithm -> the algorithm it is paired with under the same entry
PAIRS = {a.name: a.baseline for a in ALGORITHMS.values()}
#: the classes Scalable ones are compared with (they get the entry without the execution-only keys)
BASELINES = frozenset(PAIRS.values())
#: labels of earlier results -> (algorithm, config variant)
LEGACY_LABELS: dict[str, tuple[str, str | None]] = {
    "scalable_ppo": ("scalable_ppo", "cpu"),
    "scalable_ppo_linear": ("scalable_ppo", "cpu_linear"),
    "scalable_ppo_zoo_batch": ("scalable_ppo", "cpu_zoo_batch"),
    "scalable_ppo_gpu": ("scalable_ppo", "gpu"),
    "scalable_ppo_gpu_linear": ("scalable_ppo", "gpu_linear"),
}
DEFAULT_ALGOS = ["sb3_ppo", "scalable_ppo@cpu"]
#: the variant name that selects the task's plain entry (``scalable_ppo@plain``: ScalablePPO with the baseline's config)
PLAIN_VARIANT = "plain"
#: Scalable arguments that change how an update is computed, not what it computes: dropped for the baseline classes
EXECUTION_ONLY_KEYS = ("grad_accum_steps", "buffer_device", "cuda_graphs", "compile_loss", "batched_sequences",
                       "update_threads")
#: the share of a run's budget whose evaluations make its late return (:func:`late_return`)
LATE_FRACTION = 0.2
#: return floors of the time-to-threshold per task, above known plateaus. Hopper-v5 pays 1 healthy point per step
#: and 125 per metre forward (dt 0.008 s), 1000 steps at most: standing still earns <= 1000, and 1500 needs >= 4 m.
THRESHOLD_FLOORS = {"Hopper-v5": 1500.0}


# ------------------------------------------------------------------------------------------------ labels
def parse_label(label: str) -> tuple[str, str | None]:
    """``"sb3_ppo@cpu"`` -> ``("sb3_ppo", "cpu")``, ``"scalable_ppo@plain"`` -> ``("scalable_ppo", None)`` (the plain
    entry); legacy labels map as :data:`LEGACY_LABELS` says."""
    if label in LEGACY_LABELS:
        return LEGACY_LABELS[label]
    algo, _, variant = label.partition("@")
    if algo not in ALGO_CLASSES or (not variant and "@" in label):
        raise ValueError(f"--algos: {label!r} is not <algo>[@<variant>] with algo in {sorted(ALGO_CLASSES)} "
                         f"(or one of {sorted(LEGACY_LABELS)})")
    return algo, None if variant == PLAIN_VARIANT else variant or None


def family(algo: str) -> Algorithm:
    """The Scalable algorithm an algorithm name belongs to (itself, or the one it is the baseline of)."""
    return next(a for a in ALGORITHMS.values() if algo in (a.name, a.baseline))


def with_pairs(labels: list[str]) -> list[str]:
    """The labels, each Scalable one followed by its baseline class under the same entry (``scalable_ppo@cpu`` ->
    ``sb3_ppo@cpu``, ``scalable_recurrent_ppo`` -> ``recurrent_ppo``; no duplicates)."""
    out: list[str] = []
    for label in labels:
        algo, variant = parse_label(label)
        pair = PAIRS.get(algo, "") + (f"@{variant}" if variant else "")
        for item in (label, pair) if algo in PAIRS else (label,):
            if item not in out:
                out.append(item)
    return out


# ------------------------------------------------------------------------------------------------ evaluation
class ForwardDistance(gym.Wrapper):
    """Adds ``info["forward_distance"]``: x position now minus at the last reset (MuJoCo: ``data.qpos[0]``, in
    metres), or ``info["x_position"]`` where the env reports it; absent for envs with neither."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._start: float | None = None

    def _x(self, info: dict[str, Any]) -> float | None:
        data = getattr(self.env.unwrapped, "data", None)
        if data is not None and hasattr(data, "qpos"):
            return float(data.qpos[0])
        return float(info["x_position"]) if "x_position" in info else None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._start = self._x(info)
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        x = self._x(info)
        if x is not None and self._start is not None:
            info["forward_distance"] = x - self._start
        return obs, reward, terminated, truncated, info


def _make_callback(eval_env: Any, eval_every: int, episodes: int) -> Any:
    """The experiments' one evaluation callback: at the start, then at the first rollout start after every
    ``eval_every`` steps; forward distance recorded; evaluation time excluded from the clocks."""
    from sb3_ppo_scale.experiments.pipeline import PeriodicEvalCallback

    return PeriodicEvalCallback(eval_env, eval_every, n_episodes=episodes, eval_at_start=True, eval_at_end=False,
                                info_keys=("forward_distance",), at_rollout_start=True)


def _curve(callback: Any) -> list[dict[str, Any]]:
    """The callback's evaluations as the run JSON's ``curve`` points."""
    return [{"steps": e.timesteps, "train_s": e.train_s, "cpu_s": e.cpu_s, "return": e.mean_return,
             "length": e.mean_length, "forward_distance": e.episode_info.get("forward_distance"),
             "train_length": e.train_length} for e in callback.evaluations]


# ------------------------------------------------------------------------------------------------ one run
def _config_for(config: Any, algo: str) -> tuple[Any, list[str]]:
    """The config a baseline class (SB3 PPO, MaskablePPO, RecurrentPPO) runs: execution-only keys dropped
    (returned); other Scalable-only keys: ValueError."""
    import dataclasses

    if algo not in BASELINES:
        return config, []
    if isinstance(config.model_kwargs.get("learning_rate"), KLAdaptiveLR):  # SB3 would keep it constant, silently
        name = ALGO_CLASSES[algo].rpartition(".")[2]
        raise ValueError(f"{name} does not take learning_rate kl_adaptive (entry {config.entry!r}; Scalable-only)")
    dropped = sorted(k for k in config.model_kwargs if k in EXECUTION_ONLY_KEYS)
    kwargs = {k: v for k, v in config.model_kwargs.items() if k not in EXECUTION_ONLY_KEYS}
    return dataclasses.replace(config, model_kwargs=kwargs), dropped


def run_one(task: str, label: str, seed: int, budget: int, eval_every: int, eval_episodes: int, final_episodes: int,
            config_path: str | None, out_file: str, workers: int = 1) -> str:
    """Train one (task, label, seed) for ``budget`` env steps and write its JSON result; returns the file path.
    ``config_path`` None: the label's algorithm's config (``configs/scalable_ppo.yml`` or ``configs/contrib.yml``).
    ``workers``: how many runs the benchmark runs at once (recorded with the box's load, :func:`box_conditions`)."""
    import dataclasses
    import importlib

    import torch as th

    from sb3_ppo_scale.experiments import zoo

    th.set_num_threads(1)
    algo, variant = parse_label(label)
    config, dropped = _config_for(zoo.load_config(config_path, task, variant, algo=family(algo).name), algo)
    box = box_conditions(task, workers)  # after the config, which registers the task's env (NoVel, masking, ALE)
    module, _, name = ALGO_CLASSES[algo].rpartition(".")
    env = zoo.make_envs(config, seed=seed)
    eval_config = dataclasses.replace(config, env_wrappers=[*config.env_wrappers, (ForwardDistance, {})])
    eval_env = zoo.make_envs(eval_config, n_envs=min(eval_episodes, 5), seed=seed + 10_000, eval_env=True)
    model = zoo.build_model(config, env, algo=getattr(importlib.import_module(module), name), seed=seed, device="cpu")
    timer = _make_callback(eval_env, eval_every, eval_episodes)
    model.learn(total_timesteps=budget, callback=timer)
    timer.evaluate(final_episodes)
    curve = _curve(timer)
    last = curve[-1]
    result = {
        "task": task, "algo": label, "algo_class": ALGO_CLASSES[algo], "seed": seed, "budget": budget,
        "entry": config.entry, "dropped_for_sb3": dropped,
        "hyperparams": recorded_hyperparams(config, dropped),
        "steps": int(model.num_timesteps), "train_s": last["train_s"], "cpu_s": last["cpu_s"],
        "final_return": last["return"], "final_length": last["length"],
        "final_forward_distance": last["forward_distance"], "steps_per_s": model.num_timesteps / last["train_s"],
        "torch_threads": 1, "eval_every": eval_every, "eval_episodes": eval_episodes,
        "final_episodes": final_episodes, "curve": curve, "box": box,
    }
    Path(out_file).write_text(json.dumps(result, indent=1))
    return out_file


def recorded_hyperparams(config: Any, dropped: list[str]) -> dict[str, Any]:
    """The entry's hyperparameters as a run's JSON records them (without ``dropped``; non-scalars as strings)."""
    return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
            for k, v in config.hyperparams.items() if k not in dropped}


def box_conditions(task: str, workers: int, steps: int = 2000) -> dict[str, Any]:
    """What the box was doing when a run started: the day (UTC), its cores, the runs at once (``workers``), the
    1-minute load average, and the task's raw env step cost (``gym.make(task)``, one env, random actions, mean over ``steps``
    steps, in microseconds; None where Gymnasium does not know ``task``), so absolute times from different boxes
    can be compared."""
    import os

    try:
        env = gym.make(task)
        env.reset(seed=0)
        env.action_space.seed(0)
        start = time.perf_counter()
        for _ in range(steps):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        step_us = (time.perf_counter() - start) / steps * 1e6
        env.close()
    except gym.error.Error:
        step_us = None
    return {"cores": os.cpu_count(), "workers": workers, "load_avg_1min": os.getloadavg()[0], "env_step_us": step_us,
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def _box_line(results: list[dict[str, Any]]) -> str:
    """The header's line on the box: from the runs' :func:`box_conditions` (runs older than the record: said so)."""
    boxes = [r["box"] for r in results if "box" in r]
    older = len(results) - len(boxes)
    if not boxes:
        return "Each run: one process, `torch.set_num_threads(1)`; the box's load was not recorded for these runs."
    loads = [b["load_avg_1min"] for b in boxes]
    steps = {}
    for r in results:
        if r.get("box", {}).get("env_step_us") is not None:
            steps.setdefault(r["task"], []).append(r["box"]["env_step_us"])
    step_text = "; ".join(f"{task} {np.median(us):.0f} us" for task, us in steps.items()) or "n/a"
    days = sorted({b["date"] for b in boxes if "date" in b})
    started = f"Runs started {days[0]}" + (f" to {days[-1]}" if len(days) > 1 else "") + ". " if days else ""
    return (f"{started}Each run: one process, `torch.set_num_threads(1)`, {max(b['workers'] for b in boxes)} at a time on a "
            f"{boxes[0]['cores']}-core box; 1-minute load average as runs started: {min(loads):.1f}-{max(loads):.1f} "
            f"(a load near the runs at a time: nothing else ran)" + (f"; {older} older runs did not record it" if older
            else "") + f". Raw env step (gym.make, one env, random actions; median over runs): {step_text}.")


def _try_run(*args: Any) -> str:
    """:func:`run_one`, with a config SB3 PPO cannot take reported instead of raised (no file is written)."""
    try:
        return run_one(*args)
    except ValueError as error:
        if "does not take" not in str(error):
            raise
        return f"skipped {args[0]} {args[1]} seed {args[2]}: {error}"


# ------------------------------------------------------------------------------------------------ statistics
def time_to_threshold(curve: list[dict[str, float]], threshold: float, key: str = "train_s") -> float:
    """``key`` (training wall-clock s; ``cpu_s``: CPU s; ``steps``: env steps) at the first evaluation whose return
    is >= threshold (inf if never)."""
    for point in curve:
        if point["return"] >= threshold:
            return point[key]
    return float("inf")


def late_return(run: dict[str, Any], fraction: float = LATE_FRACTION) -> float:
    """Mean evaluation return over the last ``fraction`` of the run's budget (its final evaluation included):
    steadier than the final evaluation alone, which can swing by > 1000 on Hopper."""
    start = run["budget"] * (1 - fraction)
    return float(np.mean([p["return"] for p in run["curve"] if p["steps"] >= start]))


def return_at(run: dict[str, Any], steps: int) -> float:
    """The return of the run's first evaluation at or after ``steps`` env steps (NaN if it stopped before)."""
    return next((p["return"] for p in run["curve"] if p["steps"] >= steps), float("nan"))


def task_threshold(task: str, baseline_runs: list[dict[str, Any]], threshold_frac: float) -> float:
    """``max(threshold_frac x the baseline's mean final return, the task's floor)``; nan with neither."""
    candidates = [THRESHOLD_FLOORS.get(task, float("nan"))]
    if baseline_runs:
        candidates.append(threshold_frac * float(np.mean([r["final_return"] for r in baseline_runs])))
    finite = [c for c in candidates if np.isfinite(c)]
    return max(finite) if finite else float("nan")


def _optional_ci(values: list[float | None]) -> tuple[float, float, float]:
    """Bootstrap stats of values that older result files lack (None): nan unless every run has one."""
    if not values or any(v is None for v in values):
        return float("nan"), float("nan"), float("nan")
    return bootstrap_ci([float(v) for v in values])  # type: ignore[arg-type]


def _parsed(label: str) -> tuple[str, str | None]:
    """:func:`parse_label`, or ``("", None)`` for a label it does not know (results of other scripts)."""
    try:
        return parse_label(label)
    except ValueError:
        return "", None


def _label_order(label: str, baseline: str) -> tuple[int, str, int, str]:
    algo, variant = _parsed(label)
    return (0 if label == baseline else 1, variant or "", 0 if algo in BASELINES else 1, label)


def summarise(results: list[dict[str, Any]], threshold_frac: float,
              baseline: str = "sb3_ppo") -> dict[str, dict[str, Any]]:
    """Per task: threshold and, per label, bootstrap stats of final return / length / forward distance, time to
    threshold, train and CPU seconds, steps/s."""
    summary: dict[str, dict[str, Any]] = {}
    for task in sorted({r["task"] for r in results}):
        task_runs = [r for r in results if r["task"] == task]
        labels = sorted({r["algo"] for r in task_runs}, key=lambda a: _label_order(a, baseline))
        runs = {a: [r for r in task_runs if r["algo"] == a] for a in labels}
        threshold = task_threshold(task, runs.get(baseline, []), threshold_frac)
        baseline_budget = runs[baseline][0]["budget"] if runs.get(baseline) else None
        per_algo = {}
        for algo, algo_runs in runs.items():
            per_algo[algo] = {
                "seeds": [r["seed"] for r in algo_runs],
                "final_return": bootstrap_ci([r["final_return"] for r in algo_runs]),
                "late_return": bootstrap_ci([late_return(r) for r in algo_runs]),
                "final_length": _optional_ci([r.get("final_length") for r in algo_runs]),
                "final_forward_distance": _optional_ci([r.get("final_forward_distance") for r in algo_runs]),
                "time_to_threshold": bootstrap_ci([time_to_threshold(r["curve"], threshold) for r in algo_runs]),
                "cpu_to_threshold": bootstrap_ci([time_to_threshold(r["curve"], threshold, "cpu_s") for r in algo_runs]),
                "steps_to_threshold": bootstrap_ci([time_to_threshold(r["curve"], threshold, "steps")
                                                    for r in algo_runs]),
                "reached": sum(np.isfinite(time_to_threshold(r["curve"], threshold)) for r in algo_runs),
                "train_s": bootstrap_ci([r["train_s"] for r in algo_runs]),
                "cpu_s": bootstrap_ci([r["cpu_s"] for r in algo_runs]),
                "steps_per_s": bootstrap_ci([r["steps_per_s"] for r in algo_runs]),
                "budget": algo_runs[0]["budget"], "entry": algo_runs[0]["entry"],
            }
            if baseline_budget is not None and algo_runs[0]["budget"] > baseline_budget:  # learning per sample
                per_algo[algo]["return_at_baseline_budget"] = bootstrap_ci(
                    [return_at(r, baseline_budget) for r in algo_runs])
        summary[task] = {"threshold": threshold, "baseline": baseline, "algos": per_algo, "runs": runs,
                         "baseline_budget": baseline_budget}
    return summary


def paired_ratios(sb3_runs: list[dict[str, Any]], ours: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    """Per seed present on both sides, SB3's ``key`` / ScalablePPO's: bootstrap stats of the mean ratio."""
    theirs = {r["seed"]: r[key] for r in sb3_runs}
    return bootstrap_ci([theirs[r["seed"]] / r[key] for r in ours if r["seed"] in theirs])


# ------------------------------------------------------------------------------------------------ report
def load_results(out: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted((out / "runs").glob("*.json"))]


def _fmt(stat: tuple[float, float, float], digits: int = 0) -> str:
    mean, low, high = stat
    if np.isnan(mean):
        return "n/a"
    if not np.isfinite(mean):
        return "not reached (some seeds)"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _ratio(summary_task: dict[str, Any], key: str, algo: str) -> float:
    algos, baseline = summary_task["algos"], summary_task["baseline"]
    if baseline not in algos or algo not in algos:
        return float("nan")
    return algos[baseline][key][0] / algos[algo][key][0]


def _threshold_cells(threshold: float, stats: dict[str, Any]) -> str:
    """The threshold, steps-, s- and CPU-s-to-threshold cells; n/a without a baseline run or a floor."""
    if np.isnan(threshold):
        return "n/a (no baseline runs) | n/a | n/a | n/a"
    if stats["reached"] < len(stats["seeds"]):
        missed = f"reached on {stats['reached']} of {len(stats['seeds'])} seeds"
        return f"{threshold:.0f} | {missed} | {missed} | {missed}"
    return (f"{threshold:.0f} | {_fmt(stats['steps_to_threshold'])} | {_fmt(stats['time_to_threshold'], 1)} | "
            f"{_fmt(stats['cpu_to_threshold'], 1)}")


def _table(summary: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| task | algo (config entry) | budget (steps) | seeds | final return | return, last 20% | episode length |"
        " forward m | threshold | steps to threshold | s to threshold | CPU s to threshold | train s | CPU s | steps/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, data in summary.items():
        for algo, s in data["algos"].items():
            lines.append(
                f"| {task} | {algo} (`{s['entry']}`) | {s['budget']} | {len(s['seeds'])} | {_fmt(s['final_return'])} | "
                f"{_fmt(s['late_return'])} | {_fmt(s['final_length'])} | {_fmt(s['final_forward_distance'], 1)} | "
                f"{_threshold_cells(data['threshold'], s)} | {_fmt(s['train_s'], 1)} | "
                f"{_fmt(s['cpu_s'], 1)} | {_fmt(s['steps_per_s'])} |"
            )
    return lines


def _baseline_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """One line per label against the task's baseline (config and plugin together)."""
    lines = []
    for task, data in summary.items():
        baseline = data["baseline"]
        for algo in data["algos"]:
            if algo == baseline:
                continue
            if baseline not in data["algos"]:
                lines.append(f"- {task}, {algo}: no {baseline} runs to compare with")
                continue
            to_threshold = _ratio(data, "time_to_threshold", algo)
            reached = f"{to_threshold:.2f}x" if 0 < to_threshold < float("inf") else "n/a (not reached on every seed)"
            lines.append(
                f"- {task}, {algo}: time to threshold {reached}, "
                f"training time {_ratio(data, 'train_s', algo):.2f}x, CPU time {_ratio(data, 'cpu_s', algo):.2f}x, "
                f"steps/s {1 / _ratio(data, 'steps_per_s', algo):.2f}x, "
                + _final_return_against(data['algos'][algo]['final_return'][0],
                                        data['algos'][baseline]['final_return'][0], baseline)
                + _at_baseline_budget(data, algo)
            )
    return lines


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
    return f"; at the baseline's budget ({data['baseline_budget']} steps) its return is {_fmt(stats)}"


def _plugin_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """ScalablePPO against SB3 PPO under the same entry, per seed: what the plugin alone changes."""
    lines = []
    for task, data in summary.items():
        runs = data["runs"]
        for label, ours in runs.items():
            algo, variant = _parsed(label)
            pair = PAIRS.get(algo, "") + (f"@{variant}" if variant else "")
            if algo not in PAIRS or pair not in runs:
                continue
            theirs = {q["seed"]: q for q in runs[pair]}
            matched = [r for r in ours if r["seed"] in theirs]
            gap = bootstrap_ci([r["final_return"] - theirs[r["seed"]]["final_return"] for r in matched])
            same = sum([p["return"] for p in r["curve"]] == [p["return"] for p in theirs[r["seed"]]["curve"]]
                       for r in matched)
            classes = f"{_class_name(PAIRS[algo])} / {_class_name(algo)}"
            lines.append(f"- {task}, {label} vs {pair} (entry `{data['algos'][label]['entry']}`): training time ratio "
                         f"({classes}) {_fmt(paired_ratios(runs[pair], ours, 'train_s'), 2)}, CPU time ratio "
                         f"{_fmt(paired_ratios(runs[pair], ours, 'cpu_s'), 2)}, final return {_fmt(gap)} higher (per "
                         f"seed); evaluation returns identical on {same} of {len(matched)} seeds")
    return lines or ["- (no Scalable label with its baseline pair in these results)"]


def _class_name(algo: str) -> str:
    """The class an algorithm label runs (``ScalablePPO`` for ``scalable_ppo``)."""
    return ALGO_CLASSES[algo].rpartition(".")[2]


def write_markdown(summary: dict[str, dict[str, Any]], out: Path, threshold_frac: float, command: str,
                   box_line: str = "Each run: one process, `torch.set_num_threads(1)`.") -> Path:
    floors = ", ".join(f"{t} {v:g}" for t, v in THRESHOLD_FLOORS.items())
    baselines = sorted({data["baseline"] for data in summary.values()}) or ["sb3_ppo"]
    lines = [
        "# Learning benchmark: the Scalable classes and the classes they extend, under the same configs", "",
        f"Generated by `{command}`.", "",
        box_line,
        "Labels: `<algo>@<variant>` runs `<algo>` (sb3_ppo: SB3's PPO, scalable_ppo: ScalablePPO; maskable_ppo / "
        "recurrent_ppo: sb3-contrib's MaskablePPO / RecurrentPPO, scalable_maskable_ppo / scalable_recurrent_ppo: "
        "ours) with the config",
        "entry named in brackets; `@plain` is the task's plain entry (as `sb3_ppo` alone); `scalable_ppo` alone is "
        "`scalable_ppo@cpu` (earlier label).",
        "Values: mean over seeds [95% percentile bootstrap interval of the mean]. Final return, episode length and",
        "forward distance (x at the episode's end minus at its start, metres): deterministic evaluation after the",
        "last update. Time: training wall-clock seconds, evaluation excluded (CPU s: the process's CPU time, less",
        f"sensitive to other load). Threshold: max({threshold_frac:g} x the baseline's ({', '.join(baselines)}) mean",
        f"final return, the task's floor above known plateaus: {floors}); steps / s / CPU s to threshold: at the first",
        "evaluation whose mean return reaches it (env steps do not depend on the box's load). Return, last 20%:",
        "per seed, the mean of the evaluations in the last 20% of the run's steps (steadier than the final one).", "",
        *_table(summary),
        "", f"Against the baseline ({', '.join(baselines)}; ratios from the means, > 1: faster than the baseline):", "",
        *_baseline_lines(summary),
        "", "Plugin effect: each Scalable class against the class it extends under the same config entry, same seeds "
        "(training time: theirs / ours per seed):", "",
        *_plugin_lines(summary),
    ]
    path = out / "learning_summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def plot_curves(results: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per task: mean evaluation return (band: min..max over seeds) vs env steps and vs training CPU s
    (the process's, less sensitive to a busy box than wall-clock), and the mean forward distance and episode length
    vs env steps where recorded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for task in sorted({r["task"] for r in results}):
        labels = sorted({r["algo"] for r in results if r["task"] == task}, key=lambda a: _label_order(a, "sb3_ppo"))
        fig, axes = plt.subplots(1, 4, figsize=(21, 4.5))
        colors = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20").colors
        for label, color in zip(labels, colors):
            runs = [r for r in results if r["task"] == task and r["algo"] == label]
            n = min(len(r["curve"]) for r in runs)
            steps = np.array([[p["steps"] for p in r["curve"][:n]] for r in runs]).mean(axis=0)
            seconds = np.array([[p["cpu_s"] for p in r["curve"][:n]] for r in runs]).mean(axis=0)
            for ax, x, key in ((axes[0], steps, "return"), (axes[1], seconds, "return"),
                               (axes[2], steps, "forward_distance"), (axes[3], steps, "length")):
                values = [[p.get(key) for p in r["curve"][:n]] for r in runs]
                if any(v is None for row in values for v in row):
                    continue
                y = np.array(values, dtype=float)
                ax.plot(x, y.mean(axis=0), color=color, label=f"{label} ({len(runs)} seeds)")
                ax.fill_between(x, y.min(axis=0), y.max(axis=0), color=color, alpha=0.15)
        for ax, xlabel, ylabel in zip(axes, ("env steps", "training CPU s (1 thread, evaluation excluded)", "env steps",
                                             "env steps"), ("evaluation return", "evaluation return",
                                                            "forward distance (m)", "episode length (steps)")):
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{task}: the Scalable classes and the classes they extend, config entries in the labels "
                     "(band: min..max over seeds)")
        fig.tight_layout()
        path = out / f"learning_{path_part(task)}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------------------ driver
def _label(text: str) -> str:
    parse_label(text)
    return text


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["HalfCheetah-v5", "Hopper-v5"])
    parser.add_argument("--algos", nargs="+", type=_label, default=DEFAULT_ALGOS,
                        help="labels <algo>[@<variant>], algo one of " + ", ".join(ALGO_CLASSES) + "; @plain: the "
                             "plain entry (default: sb3_ppo scalable_ppo@cpu)")
    parser.add_argument("--no-pairs", action="store_true", help="do not add sb3_ppo@<v> for each scalable_ppo@<v> "
                        "(maskable_ppo@<v> / recurrent_ppo@<v> for the contrib classes)")
    parser.add_argument("--baseline", type=_label, default="sb3_ppo",
                        help="label the ratios and the threshold refer to (default sb3_ppo: the plain entry; when "
                             "every label is of one contrib algorithm: the first label's maskable_ppo / recurrent_ppo "
                             "pair)")
    parser.add_argument("--seeds", nargs="+", type=seed_argument, default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=50_000, help="env steps per run (default 50000)")
    parser.add_argument("--eval-every", type=int, default=10_000, help="env steps between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--final-episodes", type=int, default=10)
    parser.add_argument("--threshold-frac", type=float, default=0.9,
                        help="threshold = max(this x the baseline's mean final return, the task's floor) (default 0.9)")
    parser.add_argument("--workers", type=int, default=1, help="parallel single-threaded runs (default 1)")
    parser.add_argument("--config", default=None, help="zoo-style YAML (default: each label's algorithm's config, "
                        "configs/scalable_ppo.yml or configs/contrib.yml)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="results folder (runs/ inside, resumable)")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the tables and plots")
    return parser


def _jobs(args: argparse.Namespace, out: Path) -> list[tuple[Any, ...]]:
    """The runs still to do; ValueError (or FileNotFoundError) for a config, entry or env id that cannot load, and for
    a finished run that is not the one asked for."""
    from sb3_ppo_scale.experiments import zoo

    labels = args.algos if args.no_pairs else with_pairs(args.algos)
    if args.report_only:
        return []
    for task in args.tasks:  # before any run starts or any folder is made: a wrong --config or variant is one error
        for label in labels:
            algo, variant = parse_label(label)
            zoo.load_config(args.config, task, variant, algo=family(algo).name)
    jobs = []
    for seed in args.seeds:  # seed-major: a partial (interrupted) benchmark still pairs the labels on every task
        for task in args.tasks:
            for label in labels:
                path = out / "runs" / f"{path_part(task)}__{label}__seed{seed}.json"
                if not path.exists():
                    jobs.append((task, label, seed, args.budget, args.eval_every, args.eval_episodes,
                                 args.final_episodes, args.config, str(path), args.workers))
                elif (different := _differs_from(json.loads(path.read_text()), args, task, label)) is not None:
                    raise ValueError(f"{path} holds a finished run with {different}: bench skips finished runs only "
                                     "for the same command; use another --out, or delete that file to run it again")
    return jobs


def _differs_from(run: dict[str, Any], args: argparse.Namespace, task: str, label: str) -> str | None:
    """What of a finished run differs from the run ``args`` asks for (budget, evaluation settings, the entry's
    hyperparameters), or None. Settings a run did not record yet are not compared."""
    asked = {"budget": args.budget, "eval_every": args.eval_every, "eval_episodes": args.eval_episodes,
             "final_episodes": args.final_episodes}
    for key, value in asked.items():
        if key in run and run[key] != value:
            return f"--{key.replace('_', '-')} {run[key]} (this command: {value})"
    from sb3_ppo_scale.experiments import zoo

    algo, variant = parse_label(label)
    try:
        config, dropped = _config_for(zoo.load_config(args.config, task, variant, algo=family(algo).name), algo)
    except ValueError as error:  # the entry no longer loads for this label
        return f"an entry this command cannot run ({error})"
    if "hyperparams" in run and run["hyperparams"] != recorded_hyperparams(config, dropped):
        return f"other hyperparameters than entry {config.entry!r} of {args.config or 'the default config'} has now"
    return None


def command_line(command: str, args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    """The commands that rerun (resumably) the runs in ``results``, one per group of runs with the same budget and
    evaluation settings (joined by ``; ``): their tasks, labels and seeds, and the report options of ``args``.
    Evaluation settings come from the runs (:func:`evaluation_settings`), else from ``args``."""
    groups: dict[tuple[int, int, int, int], list[dict[str, Any]]] = {}
    for run in results:
        groups.setdefault((run["budget"], *evaluation_settings(run, args)), []).append(run)
    if not groups:
        groups[(args.budget, args.eval_every, args.eval_episodes, args.final_episodes)] = []
    commands = []
    for (budget, eval_every, eval_episodes, final_episodes), runs in sorted(groups.items()):
        def unique(key: str, runs: list[dict[str, Any]] = runs) -> list[Any]:
            return sorted({r[key] for r in runs}, key=lambda v: (_label_order(v, args.baseline) if key == "algo" else v))

        commands.append(" ".join([
            command, "--tasks", *(unique("task") or args.tasks), "--algos", *(unique("algo") or args.algos),
            "--no-pairs", "--seeds", *map(str, unique("seed") or args.seeds), "--budget", str(budget),
            "--eval-every", str(eval_every), "--eval-episodes", str(eval_episodes), "--final-episodes",
            str(final_episodes), "--baseline", args.baseline, "--threshold-frac", f"{args.threshold_frac:g}",
            "--out", str(args.out)]))
    return "; ".join(commands)


def evaluation_settings(run: dict[str, Any], args: argparse.Namespace) -> tuple[int, int, int]:
    """``(eval_every, eval_episodes, final_episodes)`` of a run: as recorded; runs made before they were recorded
    get ``args``' episode counts and the roundest ``eval_every`` consistent with their first evaluation after the
    start (made at the first rollout boundary at or after it): e.g. 50 000 for a first evaluation at 50 176 steps
    with 512-step rollouts."""
    if "eval_every" in run:
        return run["eval_every"], run["eval_episodes"], run["final_episodes"]
    return _inferred_eval_every(run, args.eval_every), args.eval_episodes, args.final_episodes


def _inferred_eval_every(run: dict[str, Any], default: int) -> int:
    steps = [p["steps"] for p in run["curve"] if p["steps"] > 0]
    if len(steps) < 2:  # only the final evaluation: no periodic one happened
        return default
    hyperparams = run.get("hyperparams", {})
    rollout = hyperparams.get("n_steps", 2048) * hyperparams.get("n_envs", 1)
    low, high = max(steps[0] - rollout + 1, 1), steps[0]
    return max(range(low, high + 1), key=lambda v: (len(str(v)) - len(str(v).rstrip("0")), -v))


def default_baseline(labels: list[str], baseline: str) -> str:
    """``baseline``, except the default ``sb3_ppo`` when every label is of one contrib algorithm: the first baseline
    label among them and their pairs (``recurrent_ppo@batched`` for ``scalable_recurrent_ppo@batched``)."""
    families = {family(parse_label(label)[0]).name for label in labels}
    if baseline != "sb3_ppo" or len(families) != 1 or families == {"scalable_ppo"}:
        return baseline
    return next(label for label in with_pairs(labels) if parse_label(label)[0] in BASELINES)


#: bench's count arguments: each must be an int >= 1
COUNT_ARGUMENTS = ("budget", "eval_every", "eval_episodes", "final_episodes", "workers")


def check_arguments(args: argparse.Namespace) -> None:
    """ValueError naming the first argument no benchmark can run with."""
    for name in COUNT_ARGUMENTS:
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.threshold_frac > 0:
        raise ValueError(f"--threshold-frac must be > 0, got {args.threshold_frac}")
    labels = with_pairs(args.algos)
    if parse_label(args.baseline)[0] not in {parse_label(label)[0] for label in labels}:
        raise ValueError(f"--baseline {args.baseline} is not one of the benchmark's algorithms: its labels (with their "
                         f"pairs) are {', '.join(labels)}")


def main(args: argparse.Namespace, command: str = "sb3-ppo-scale bench") -> int:
    check_arguments(args)
    args.baseline = default_baseline(args.algos, args.baseline)
    out = Path(args.out)
    if args.report_only and not any((out / "runs").glob("*.json")):
        raise FileNotFoundError(f"--report-only: no runs in {out / 'runs'}; run bench without --report-only first")
    jobs = _jobs(args, out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    print(f"{len(jobs)} runs to do, {args.workers} at a time")
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn")) as pool:
        for done in pool.map(_try_run, *zip(*jobs)) if jobs else []:
            print("done:", done, flush=True)
    results = [r for r in load_results(out) if r["task"] in args.tasks]
    summary = summarise(results, args.threshold_frac, args.baseline)
    print(write_markdown(summary, out, args.threshold_frac, command_line(command, args, results),
                         _box_line(results)).read_text())
    for path in plot_curves(results, out):
        print("plot:", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(build_parser().parse_args(), command="python -m sb3_ppo_scale.experiments.bench"))
