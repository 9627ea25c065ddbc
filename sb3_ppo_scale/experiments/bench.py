"""Learning benchmark: ScalablePPO's config variants (@cpu, @gpu, ...) against SB3 PPO with the zoo's config.

Same env, same sample budget, same seeds. Each run is one single-threaded process; at most ``--workers`` run at
once. Every run writes ``<out>/runs/<task>__<algo>__seed<k>.json``; existing files are skipped (resumable).

Measured per run: deterministic evaluation return every ``--eval-every`` env steps (``--eval-episodes`` episodes,
VecNormalize statistics frozen, rewards unnormalised) against the *training* wall-clock time (evaluation time is
excluded); the final return is the mean of the last evaluation (``--final-episodes`` episodes). Reported per
task and algorithm: mean over seeds with a 95% percentile bootstrap interval (10 000 resamples) of the final
return, of the training time to the return threshold (first evaluation at or above it; the threshold is
``--threshold-frac`` x SB3 PPO's mean final return on that task) and of wall-clock env steps/s.

    python -m sb3_ppo_scale.experiments.bench --tasks HalfCheetah-v5 Hopper-v5 --budget 50000 --seeds 0 1 2
    sb3-ppo-scale bench --tasks Hopper-v5 --budget 20000 --seeds 0     # the same, through the CLI
"""

from __future__ import annotations

import argparse
import sys
import json
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from sb3_ppo_scale.experiments.stats import bootstrap_ci
from sb3_ppo_scale.experiments.zoo import DEFAULT_CONFIG

#: results land under the working directory unless ``--out`` says otherwise
DEFAULT_OUT = Path("bench_results")
#: algorithm label -> (config variant, class path)
ALGOS = {
    "sb3_ppo": (None, "stable_baselines3.PPO"),
    "scalable_ppo": ("cpu", "sb3_ppo_scale.ScalablePPO"),
    "scalable_ppo_linear": ("cpu_linear", "sb3_ppo_scale.ScalablePPO"),  # same, linear lr rule (HalfCheetah only)
    "scalable_ppo_zoo_batch": ("cpu_zoo_batch", "sb3_ppo_scale.ScalablePPO"),  # zoo batch, 4 envs (HalfCheetah only)
    "scalable_ppo_gpu": ("gpu", "sb3_ppo_scale.ScalablePPO"),  # the large-batch GPU variant (64 envs, batch 16 384), run here on the CPU
    "scalable_ppo_gpu_linear": ("gpu_linear", "sb3_ppo_scale.ScalablePPO"),  # same, linear lr rule (HalfCheetah only)
}
DEFAULT_ALGOS = ["sb3_ppo", "scalable_ppo"]


# ------------------------------------------------------------------------------------------------ one run
def run_one(task: str, algo: str, seed: int, budget: int, eval_every: int, eval_episodes: int, final_episodes: int,
            config_path: str, out_file: str) -> str:
    """Train one (task, algo, seed) for ``budget`` env steps and write its JSON result; returns the file path."""
    import torch as th
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import sync_envs_normalization

    from sb3_ppo_scale import ScalablePPO
    from sb3_ppo_scale.experiments import zoo

    th.set_num_threads(1)
    variant, _ = ALGOS[algo]
    config = zoo.load_config(config_path, task, variant)
    env = zoo.make_envs(config, seed=seed)
    eval_env = zoo.make_envs(config, n_envs=min(eval_episodes, 5), seed=seed + 10_000, eval_env=True)
    model = zoo.build_model(config, env, algo=PPO if algo == "sb3_ppo" else ScalablePPO, seed=seed, device="cpu")
    curve: list[dict[str, float]] = []

    class Timed(BaseCallback):
        """Evaluates every ``eval_every`` steps; the evaluation time is excluded from the training clock."""

        def __init__(self) -> None:
            super().__init__()
            self.excluded = 0.0
            self.next_eval = 0
            self.start = time.perf_counter()
            self.cpu_start = time.process_time()
            self.cpu_excluded = 0.0

        def evaluate(self, episodes: int) -> None:
            paused, cpu_paused = time.perf_counter(), time.process_time()
            sync_envs_normalization(self.model.get_env(), eval_env)
            mean, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=episodes, deterministic=True)
            train_s = paused - self.start - self.excluded
            cpu_s = cpu_paused - self.cpu_start - self.cpu_excluded
            curve.append({"steps": int(self.num_timesteps), "train_s": train_s, "cpu_s": cpu_s, "return": float(mean)})
            self.excluded += time.perf_counter() - paused
            self.cpu_excluded += time.process_time() - cpu_paused

        def _on_rollout_start(self) -> None:
            if self.num_timesteps >= self.next_eval:
                self.evaluate(eval_episodes)
                self.next_eval += eval_every

        def _on_step(self) -> bool:
            return True

    timer = Timed()
    model.learn(total_timesteps=budget, callback=timer)
    timer.evaluate(final_episodes)
    result = {
        "task": task, "algo": algo, "seed": seed, "budget": budget, "entry": config.entry,
        "hyperparams": {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
                        for k, v in config.hyperparams.items()},
        "steps": int(model.num_timesteps), "train_s": curve[-1]["train_s"], "final_return": curve[-1]["return"],
        "steps_per_s": model.num_timesteps / curve[-1]["train_s"], "cpu_s": curve[-1]["cpu_s"], "curve": curve,
    }
    Path(out_file).write_text(json.dumps(result, indent=1))
    return out_file


# ------------------------------------------------------------------------------------------------ statistics
def time_to_threshold(curve: list[dict[str, float]], threshold: float) -> float:
    """Training seconds at the first evaluation whose return is >= threshold (inf if never)."""
    for point in curve:
        if point["return"] >= threshold:
            return point["train_s"]
    return float("inf")


# ------------------------------------------------------------------------------------------------ report
def load_results(out: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted((out / "runs").glob("*.json"))]


def _fmt(stat: tuple[float, float, float], digits: int = 0) -> str:
    mean, low, high = stat
    if not np.isfinite(mean):
        return "not reached (some seeds)"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def summarise(results: list[dict[str, Any]], threshold_frac: float) -> dict[str, dict[str, Any]]:
    """Per task: threshold and, per algo, bootstrap stats of final return, time to threshold, steps/s."""
    summary: dict[str, dict[str, Any]] = {}
    for task in sorted({r["task"] for r in results}):
        runs = {a: [r for r in results if r["task"] == task and r["algo"] == a] for a in ALGOS}
        baseline = runs["sb3_ppo"] or runs["scalable_ppo"]
        # no baseline runs in this folder (e.g. a variant alone at a longer budget): no threshold to reach
        threshold = threshold_frac * float(np.mean([r["final_return"] for r in baseline])) if baseline else float("nan")
        per_algo = {}
        for algo, algo_runs in runs.items():
            if not algo_runs:
                continue
            per_algo[algo] = {
                "seeds": [r["seed"] for r in algo_runs],
                "final_return": bootstrap_ci([r["final_return"] for r in algo_runs]),
                "time_to_threshold": bootstrap_ci([time_to_threshold(r["curve"], threshold) for r in algo_runs]),
                "train_s": bootstrap_ci([r["train_s"] for r in algo_runs]),
                "cpu_s": bootstrap_ci([r["cpu_s"] for r in algo_runs]),
                "steps_per_s": bootstrap_ci([r["steps_per_s"] for r in algo_runs]),
                "budget": algo_runs[0]["budget"], "entry": algo_runs[0]["entry"],
            }
        summary[task] = {"threshold": threshold, "algos": per_algo}
    return summary


def _ratio(summary_task: dict[str, Any], key: str, algo: str = "scalable_ppo") -> float:
    algos = summary_task["algos"]
    if "sb3_ppo" not in algos or algo not in algos:
        return float("nan")
    return algos["sb3_ppo"][key][0] / algos[algo][key][0]


def _threshold_cells(threshold: float, time_to_threshold: tuple[float, float, float]) -> str:
    """The threshold and s-to-threshold cells; both n/a when the folder holds no baseline runs."""
    if np.isnan(threshold):
        return "n/a (no baseline runs) | n/a"
    return f"{threshold:.0f} | {_fmt(time_to_threshold, 1)}"


def write_markdown(summary: dict[str, dict[str, Any]], out: Path, threshold_frac: float, command: str) -> Path:
    lines = [
        "# Learning benchmark: ScalablePPO (config variants) vs SB3 PPO (zoo config)", "",
        f"Generated by `{command}`.", "",
        "Each run: one process, `torch.set_num_threads(1)`, at most 2 runs at once on a shared 2-core CPU box.",
        "Values: mean over seeds [95% percentile bootstrap interval of the mean]. Final return: deterministic",
        "evaluation after the last update. Time: training wall-clock seconds, evaluation excluded (CPU s: the",
        "process's CPU time, less sensitive to other load on the shared box). Threshold:",
        f"{threshold_frac:g} x SB3 PPO's mean final return on the task.", "",
        "| task | algo (config entry) | budget (steps) | seeds | final return | threshold | s to threshold |"
        " train s | CPU s | steps/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, data in summary.items():
        for algo, s in data["algos"].items():
            lines.append(
                f"| {task} | {algo} (`{s['entry']}`) | {s['budget']} | {len(s['seeds'])} | {_fmt(s['final_return'])} | "
                f"{_threshold_cells(data['threshold'], s['time_to_threshold'])} | {_fmt(s['train_s'], 1)} | {_fmt(s['cpu_s'], 1)} | "
                f"{_fmt(s['steps_per_s'])} |"
            )
    lines += ["", "Ratios (SB3 PPO / ScalablePPO, from the means; > 1 means ScalablePPO is faster):", ""]
    for task, data in summary.items():
        for algo in data["algos"]:
            if algo == "sb3_ppo":
                continue
            to_threshold = _ratio(data, "time_to_threshold", algo)
            reached = f"{to_threshold:.2f}x" if 0 < to_threshold < float("inf") else "n/a (not reached on every seed)"
            lines.append(
                f"- {task}, {algo}: time to threshold {reached}, "
                f"training time {_ratio(data, 'train_s', algo):.2f}x, CPU time {_ratio(data, 'cpu_s', algo):.2f}x, "
                f"steps/s {1 / _ratio(data, 'steps_per_s', algo):.2f}x, final return "
                f"{data['algos'][algo]['final_return'][0] / data['algos']['sb3_ppo']['final_return'][0]:.2f}x of SB3's"
                if "sb3_ppo" in data["algos"] else f"- {task}, {algo}: no SB3 PPO runs to compare with"
            )
    path = out / "learning_summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def plot_curves(results: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per task: mean evaluation return (band: min..max over seeds) vs env steps and vs wall-clock s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for task in sorted({r["task"] for r in results}):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for algo, color in zip(ALGOS, plt.rcParams["axes.prop_cycle"].by_key()["color"]):  # one color per algo
            runs = [r for r in results if r["task"] == task and r["algo"] == algo]
            if not runs:
                continue
            n = min(len(r["curve"]) for r in runs)
            returns = np.array([[p["return"] for p in r["curve"][:n]] for r in runs])
            for ax, key in zip(axes, ("steps", "train_s")):
                x = np.array([[p[key] for p in r["curve"][:n]] for r in runs]).mean(axis=0)
                ax.plot(x, returns.mean(axis=0), color=color, label=f"{algo} ({len(runs)} seeds)")
                ax.fill_between(x, returns.min(axis=0), returns.max(axis=0), color=color, alpha=0.2)
        axes[0].set_xlabel("env steps")
        axes[1].set_xlabel("training wall-clock s (1 thread, evaluation excluded)")
        for ax in axes:
            ax.set_ylabel("evaluation return")
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle(f"{task}: ScalablePPO (config variants) vs SB3 PPO (zoo config)")
        fig.tight_layout()
        path = out / f"learning_{task}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------------------ driver
def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["HalfCheetah-v5", "Hopper-v5"])
    parser.add_argument("--algos", nargs="+", default=DEFAULT_ALGOS, choices=list(ALGOS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=50_000, help="env steps per run (default 50000)")
    parser.add_argument("--eval-every", type=int, default=10_000, help="env steps between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--final-episodes", type=int, default=10)
    parser.add_argument("--threshold-frac", type=float, default=0.9,
                        help="threshold = this x SB3 PPO's mean final return (default 0.9)")
    parser.add_argument("--workers", type=int, default=2, help="parallel single-threaded runs (default 2)")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="results folder (runs/ inside, resumable)")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the tables and plots")
    return parser


def main(args: argparse.Namespace, command: str = "sb3-ppo-scale bench") -> int:
    if args.budget < 1 or args.workers < 1:
        raise ValueError(f"budget and workers must be >= 1, got {args.budget}, {args.workers}")
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    jobs = []
    for seed in args.seeds:  # seed-major: a partial (interrupted) benchmark still pairs both algos on every task
        for task in args.tasks:
            for algo in args.algos:
                path = out / "runs" / f"{task}__{algo}__seed{seed}.json"
                if not path.exists() and not args.report_only:
                    jobs.append((task, algo, seed, args.budget, args.eval_every, args.eval_episodes,
                                 args.final_episodes, args.config, str(path)))
    print(f"{len(jobs)} runs to do, {args.workers} at a time")
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn")) as pool:
        for done in pool.map(run_one, *zip(*jobs)) if jobs else []:
            print("done:", done, flush=True)
    results = [r for r in load_results(out) if r["task"] in args.tasks]
    summary = summarise(results, args.threshold_frac)
    print(write_markdown(summary, out, args.threshold_frac, command).read_text())
    for path in plot_curves(results, out):
        print("plot:", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(build_parser().parse_args()))
