"""The PPO paper's Table 1 (Schulman et al. 2017), reproduced with ScalablePPO's objectives on MuJoCo v5 tasks.

Settings: no clipping or penalty; clip eps 0.1 / 0.2 / 0.3; adaptive KL penalty d_targ 0.003 / 0.01 / 0.03
(beta starts at 1, the paper's rule); fixed beta 0.3 / 1 / 3 / 10. Hyperparameters are the paper's (T = 2048,
lr 3e-4, 10 epochs, minibatch 64, gamma 0.99, lambda 0.95, one env, 64x64 tanh MLP: SB3's defaults).
Score of a run: mean return of its last 100 training episodes (the paper's metric). Normalised per task as the
paper does: random policy 0, best setting (mean over seeds) 1; then averaged over tasks and seeds.

The table's aggregate: mean and interquartile mean over (seed, task) with 95% stratified bootstrap intervals
(rliable, via sb3_ppo_scale.experiments.intervals). ``--claims`` adds the source's two measurable claims on
HalfCheetah-v5: data reuse (n_epochs 1 / 3 / 10 / 20) and PPO against vanilla policy gradient in equal time (CPU
seconds of single-threaded runs); the report gives each a verdict.

Runs are independent single-threaded processes cached as JSON under ``--out/runs`` (stop and resume at will).

    python benchmarks/kl_vs_clip.py run [--steps 16384] [--seeds 3] [--workers 2] [--tasks ...] [--claims]
    python benchmarks/kl_vs_clip.py report [--out ...]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
TASKS = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Swimmer-v5", "InvertedDoublePendulum-v5",
         "InvertedPendulum-v5", "Reacher-v5"]
DEFAULT_TASKS = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5", "Reacher-v5", "Swimmer-v5"]

#: setting -> ScalablePPO kwargs; paper score (Table 1, 7 tasks, 1M steps, 3 seeds)
SETTINGS: dict[str, tuple[dict[str, Any], float]] = {
    "no clipping or penalty": (dict(objective="kl_penalty", kl_coef=0.0, kl_penalty_target=None), -0.39),
    "clip eps=0.1": (dict(clip_range=0.1), 0.76),
    "clip eps=0.2": (dict(clip_range=0.2), 0.82),
    "clip eps=0.3": (dict(clip_range=0.3), 0.70),
    "adaptive KL d_targ=0.003": (dict(objective="kl_penalty", kl_coef=1.0, kl_penalty_target=0.003), 0.68),
    "adaptive KL d_targ=0.01": (dict(objective="kl_penalty", kl_coef=1.0, kl_penalty_target=0.01), 0.74),
    "adaptive KL d_targ=0.03": (dict(objective="kl_penalty", kl_coef=1.0, kl_penalty_target=0.03), 0.71),
    "fixed KL beta=0.3": (dict(objective="kl_penalty", kl_coef=0.3, kl_penalty_target=None), 0.62),
    "fixed KL beta=1": (dict(objective="kl_penalty", kl_coef=1.0, kl_penalty_target=None), 0.71),
    "fixed KL beta=3": (dict(objective="kl_penalty", kl_coef=3.0, kl_penalty_target=None), 0.72),
    "fixed KL beta=10": (dict(objective="kl_penalty", kl_coef=10.0, kl_penalty_target=None), 0.69),
    # not in the paper's table: clipping and the adaptive penalty together, ScalablePPO's defaults for it
    "clip eps=0.2 + adaptive KL d_targ=0.01": (dict(objective="clip_kl_penalty"), float("nan")),
}
#: settings of the paper's table beyond those the 1M comparison must have: run after all the others
BEYOND_THE_ISSUE = ("fixed KL beta=0.3", "fixed KL beta=10")
#: the source's claims (issue item 4), run on one task with ``--claims``: setting -> (kwargs over PAPER, budget as
#: a multiple of ``--steps``). 10 epochs is the table's "clip eps=0.2". The policy gradient gets more steps than
#: PPO so that its runs last at least as long as PPO's 1M (one epoch costs far less); the report reads it at PPO's
#: CPU time (single-threaded runs: their CPU seconds are the time they computed, whatever else ran on the box).
CLAIMS_TASK = "HalfCheetah-v5"
REFERENCE, ONE_EPOCH, PG = "clip eps=0.2", "clip eps=0.2, 1 epoch", "policy gradient (1 epoch, no clipping)"
CLAIM_SETTINGS: dict[str, tuple[dict[str, Any], int]] = {
    ONE_EPOCH: (dict(clip_range=0.2, n_epochs=1), 1),
    "clip eps=0.2, 3 epochs": (dict(clip_range=0.2, n_epochs=3), 1),
    "clip eps=0.2, 20 epochs": (dict(clip_range=0.2, n_epochs=20), 1),
    PG: (dict(objective="kl_penalty", kl_coef=0.0, kl_penalty_target=None, n_epochs=1), 3),
}
PAPER = dict(n_steps=2048, batch_size=64, n_epochs=10, learning_rate=3e-4, gamma=0.99, gae_lambda=0.95)
LAST_EPISODES = 100
#: every setting a run can have
ALL_SETTINGS: dict[str, tuple[dict[str, Any], float]] = {
    **SETTINGS, **{name: (kwargs, float("nan")) for name, (kwargs, _) in CLAIM_SETTINGS.items()}}
#: settings of the table that the paper's Table 1 lacks: not used for the normalisation's 1
NOT_IN_THE_PAPER = tuple(s for s, (_, paper) in SETTINGS.items() if np.isnan(paper))


#: points of a run's learning curve (mean training-episode return per window of steps / CURVE_POINTS env steps)
CURVE_POINTS = 50


def LearningCurve(window: int) -> Any:  # noqa: N802 - a callback class built where SB3 is imported
    """A callback recording ``[window end step, mean return, episodes, wall s, CPU s]`` for the training episodes
    that ended in each window of ``window`` env steps (``points``; seconds since ``learn()`` started, the process's
    CPU seconds), for the report's curves and the equal-time comparison."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Curve(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.points: list[list[float]] = []
            self._returns: list[float] = []
            self._start = (time.perf_counter(), time.process_time())

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    self._returns.append(float(info["episode"]["r"]))
            if self.num_timesteps % window == 0 and self._returns:
                wall, cpu = time.perf_counter() - self._start[0], time.process_time() - self._start[1]
                self.points.append([self.num_timesteps, round(float(np.mean(self._returns)), 3), len(self._returns),
                                    round(wall, 2), round(cpu, 2)])
                self._returns = []
            return True

    return Curve()


def run_path(out: Path, task: str, setting: str, seed: int) -> Path:
    slug = setting.replace(" ", "_").translate(str.maketrans("", "", "=,()"))
    return out / "runs" / f"{task}__{slug}__{seed}.json"


def run_one(task: str, setting: str, seed: int, steps: int, out: Path, window: int) -> str:
    """Train one (task, setting, seed) for ``steps`` env steps and cache its episode returns and learning curve
    (points every ``window`` steps); skipped if already cached."""
    path = run_path(out, task, setting, seed)
    if path.exists():
        return f"{task} | {setting} | seed {seed}: cached"
    import torch as th

    th.set_num_threads(1)
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_ppo_scale import ScalablePPO

    start = time.perf_counter()
    model = ScalablePPO("MlpPolicy", make_vec_env(task, n_envs=1, seed=seed), seed=seed, device="cpu",
                        **{**PAPER, **ALL_SETTINGS[setting][0]})
    curve = LearningCurve(window)
    model.learn(steps, callback=curve)
    returns = [float(info["r"]) for info in model.ep_info_buffer]  # the last (up to) 100 episodes
    record = dict(task=task, setting=setting, seed=seed, steps=steps, last_returns=returns,
                  seconds=time.perf_counter() - start, final_kl_beta=model.kl_beta, curve=curve.points)
    path.write_text(json.dumps(record))
    return f"{task} | {setting} | seed {seed}: {np.mean(returns):9.1f} ({record['seconds']:.0f} s)"


@functools.cache
def random_score(task: str) -> float:
    """Mean return of a uniformly random policy over 20 episodes (the paper's 0 of the normalised score); computed
    once per task and process (the report reads it for the normalisation and again for its line of scores)."""
    from sb3_ppo_scale.experiments.learning_report import random_policy_return

    score = random_policy_return(task, episodes=20)
    if score is None:
        raise ValueError(f"Gymnasium cannot make {task!r}")
    return score


def jobs(args: argparse.Namespace) -> list[tuple[str, str, int, int]]:
    """``(task, setting, seed, steps)`` still to run, in order: the issue's settings (seed-major, so a partial run
    covers every task), then with ``--claims`` the claim settings on their task, then the paper's other settings."""
    table = [(t, s, seed, args.steps) for seed in range(args.seeds) for t in args.tasks for s in SETTINGS
             if s not in BEYOND_THE_ISSUE]
    claims = [(CLAIMS_TASK, s, seed, args.steps * multiple) for seed in range(args.seeds)
              for s, (_, multiple) in CLAIM_SETTINGS.items()] if args.claims else []
    extra = [(t, s, seed, args.steps) for seed in range(args.seeds) for t in args.tasks for s in BEYOND_THE_ISSUE]
    return [job for job in table + claims + extra if not run_path(args.out, *job[:3]).exists()]


def run(args: argparse.Namespace) -> None:
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    todo = jobs(args)
    window = max(args.steps // CURVE_POINTS, 1)  # the same window for every run, whatever its budget
    print(f"{len(todo)} runs to do ({args.steps} steps each, claims' policy gradient x{CLAIM_SETTINGS[PG][1]}; "
          f"{args.workers} workers)", flush=True)
    with ProcessPoolExecutor(args.workers) as pool:
        tasks, settings, seeds, steps = zip(*todo) if todo else ((), (), (), ())
        for line in pool.map(run_one, tasks, settings, seeds, steps, [args.out] * len(todo), [window] * len(todo)):
            print(line, flush=True)


# ------------------------------------------------------------------------------------------------ report
def load_runs(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]


def score(run: dict[str, Any]) -> float:
    """A run's score: the mean return of its last (up to) 100 training episodes (the paper's metric)."""
    return float(np.mean(run["last_returns"]))


def seed_matrix(runs: list[dict[str, Any]], setting: str, tasks: list[str]) -> tuple[np.ndarray, list[int]]:
    """Scores of ``setting`` as a ``(seeds, tasks)`` array over the seeds it has on every one of ``tasks`` (rliable's
    stratified bootstrap needs a full matrix), and those seeds."""
    by_cell = {(r["task"], r["seed"]): score(r) for r in runs if r["setting"] == setting}
    seeds = sorted(seed for seed in {s for _, s in by_cell} if all((t, seed) in by_cell for t in tasks))
    return np.array([[by_cell[(t, seed)] for t in tasks] for seed in seeds]).reshape(len(seeds), len(tasks)), seeds


def normalisation(runs: list[dict[str, Any]], tasks: list[str],
                  zero_of: Callable[[str], float] = random_score) -> tuple[list[str], list[float], list[float]]:
    """The tasks that can be normalised and, for each, its zero (random policy) and one (the best of the paper's
    settings, mean over its seeds), as the paper defines the score. A task whose best setting does not beat the
    random policy has no scale (nothing learned yet) and is left out."""
    kept, zeros, ones = [], [], []
    for task in tasks:
        means = [np.mean([score(r) for r in runs if r["task"] == task and r["setting"] == s])
                 for s in SETTINGS if s not in NOT_IN_THE_PAPER and any(r["task"] == task and r["setting"] == s
                                                                        for r in runs)]
        zero = zero_of(task)
        if means and max(means) > zero:
            kept.append(task), zeros.append(zero), ones.append(float(max(means)))
    return kept, zeros, ones


def table_lines(runs: list[dict[str, Any]], zero_of: Callable[[str], float]) -> tuple[list[str], dict[str, np.ndarray]]:
    """The normalised-score table (mean over tasks and seeds with a stratified bootstrap interval, IQM, the
    paper's number, each task's mean with its bootstrap interval) and the normalised ``(seeds, tasks)`` scores per
    setting for the plot."""
    from sb3_ppo_scale.experiments import intervals

    tasks = sorted({r["task"] for r in runs if r["setting"] in SETTINGS})
    kept, zeros, ones = normalisation(runs, tasks, zero_of)
    lines = ["| setting | ours: mean [95% interval] | ours: IQM [95% interval] | seeds x tasks | paper | "
             + " | ".join(kept) + " |", "|---|---:|---:|---:|---:|" + "---:|" * len(kept)]
    scores: dict[str, np.ndarray] = {}
    for setting, (_, paper) in SETTINGS.items():
        matrix, seeds = seed_matrix(runs, setting, kept)
        if not seeds:
            continue
        scores[setting] = intervals.normalised(matrix, zeros, ones)
        estimate = intervals.aggregates(scores[setting])
        cells = " | ".join(intervals.mean(column).text(2) for column in scores[setting].T)
        lines.append(f"| {setting} | {estimate['mean'].text(2)} | {estimate['iqm'].text(2)} | {len(seeds)} x "
                     f"{len(kept)} | {'not in the paper' if np.isnan(paper) else f'{paper:.2f}'} | {cells} |")
    left_out = sorted(set(tasks) - set(kept))
    if left_out:
        lines += ["", f"Left out (no setting beat the random policy, so there is no scale to normalise by): "
                  f"{', '.join(left_out)}."]
    return lines, scores


def raw_lines(runs: list[dict[str, Any]]) -> list[str]:
    """Mean raw score per setting and task (over the seeds each cell has, their number in brackets)."""
    tasks = sorted({r["task"] for r in runs if r["setting"] in SETTINGS})
    lines = ["| setting | " + " | ".join(tasks) + " |", "|---|" + "---:|" * len(tasks)]
    for setting in SETTINGS:
        cells = []
        for task in tasks:
            values = [score(r) for r in runs if r["task"] == task and r["setting"] == setting]
            cells.append(f"{np.mean(values):.1f} ({len(values)})" if values else "")
        if any(cells):
            lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    return lines


def recent_return(points: list[list[float]], episodes: int = LAST_EPISODES) -> float:
    """The mean training return of (about) the last ``episodes`` episodes of curve ``points``: their windows, newest
    first, until they hold ``episodes`` episodes (the paper's score, read at any point of a run); nan if empty."""
    total, count = 0.0, 0
    for point in reversed(points):
        total, count = total + point[1] * point[2], count + point[2]
        if count >= episodes:
            break
    return total / count if count else float("nan")


#: a curve point's CPU seconds since ``learn()`` started (index 3 is the wall clock)
CPU = 4


def cpu_seconds(run: dict[str, Any]) -> float:
    """The run's CPU seconds in ``learn()``: its last curve point's. A run is one thread, so this is the time it
    computed, which a box shared with other runs, or a run paused and continued, does not change (its wall clock,
    ``seconds``, does). ValueError for runs recorded before curves held CPU seconds."""
    if not run["curve"] or len(run["curve"][-1]) <= CPU:
        raise ValueError(f"run {run['task']} | {run['setting']} | seed {run['seed']} has no CPU seconds in its curve; "
                         "delete its file from runs/ and run the same command again")
    return float(run["curve"][-1][CPU])


def returns_at_cpu_seconds(run: dict[str, Any], seconds: float) -> float:
    """:func:`recent_return` of the windows that ended within ``seconds`` of the run's CPU time."""
    return recent_return([p for p in run["curve"] if p[CPU] <= seconds])


def score_curve(run: dict[str, Any], grid: np.ndarray) -> np.ndarray:
    """:func:`recent_return` at each env step of ``grid`` (from the curve points up to it; nan before the first)."""
    curve = run["curve"]
    return np.array([recent_return([p for p in curve if p[0] <= step]) for step in grid])


def reuse(grid: np.ndarray, one_epoch: np.ndarray, more: np.ndarray) -> float:
    """Data reuse of a setting: the budget (``grid[-1]``) over the env steps at which its mean score curve (``more``:
    ``(seeds, points)``) first reaches where the one-epoch mean curve ends (0 if it never does)."""
    target = one_epoch.mean(axis=0)[-1]
    reached = np.nonzero(more.mean(axis=0) >= target)[0]
    return float(grid[-1] / grid[reached[0]]) if reached.size else 0.0


def verdict(estimate: Any, claimed: float) -> str:
    """holds (the interval is above 1 and reaches the claimed factor), does not hold (above 1 but below it, or below
    1), or not distinguishable (the interval holds 1: no difference either way)."""
    if np.isnan(estimate.low):
        return "not distinguishable (no interval)"
    if estimate.low <= 1.0 <= estimate.high:
        return "not distinguishable"
    if estimate.high < 1.0:
        return "does not hold (the other side is better)"
    return "holds" if estimate.high >= claimed else f"does not hold (below {claimed:g}x)"


def claim_lines(runs: list[dict[str, Any]]) -> list[str]:
    """The source's two measurable claims on HalfCheetah-v5, each with a verdict (empty without the claims' runs)."""
    from sb3_ppo_scale.experiments import intervals

    task_runs = [r for r in runs if r["task"] == CLAIMS_TASK]
    by_setting = {s: [r for r in task_runs if r["setting"] == s] for s in [*CLAIM_SETTINGS, REFERENCE]}
    if not by_setting[ONE_EPOCH] or not by_setting[REFERENCE]:
        return []
    budget = by_setting[REFERENCE][0]["steps"]
    grid = np.arange(1, CURVE_POINTS + 1) * (budget // CURVE_POINTS)
    curves = {s: np.array([score_curve(r, grid) for r in group]) for s, group in by_setting.items() if group}
    target = float(curves[ONE_EPOCH].mean(axis=0)[-1])
    lines = ["## The source's other claims (HalfCheetah-v5, the paper's hyperparameters, clip eps 0.2)", "",
             f"**Data reuse (\"8-12x data reuse on HalfCheetah\")**: a run's score curve is the mean return of its "
             f"last 100 training episodes at each of {CURVE_POINTS} points; per epoch count, the env steps at which the "
             f"mean curve over seeds first reaches where one epoch's ends ({target:.0f} at {budget:,} steps), and "
             f"reuse = {budget:,} / those steps (0: never). Intervals: 95%, seeds of both settings resampled "
             "(whole curves).", "",
             "| n_epochs | final score, mean [95% interval] | steps to reach the 1-epoch final | reuse |",
             "|---:|---:|---:|---:|"]
    reuse_of = {}
    for setting in (ONE_EPOCH, "clip eps=0.2, 3 epochs", REFERENCE, "clip eps=0.2, 20 epochs"):
        if setting not in curves:
            continue
        epochs = {**PAPER, **ALL_SETTINGS[setting][0]}["n_epochs"]
        if setting == ONE_EPOCH:  # against itself: one resample for both sides (1, or above where it peaked early)
            reuse_of[epochs] = intervals.of_groups(lambda one: reuse(grid, one, one), curves[ONE_EPOCH])
        else:
            reuse_of[epochs] = intervals.of_groups(lambda one, more: reuse(grid, one, more), curves[ONE_EPOCH],
                                                   curves[setting])
        steps = budget / reuse_of[epochs].point if reuse_of[epochs].point else float("inf")
        lines.append(f"| {epochs} | {intervals.mean([score(r) for r in by_setting[setting]]).text()} | "
                     f"{'never' if np.isinf(steps) else f'{steps:,.0f}'} | {reuse_of[epochs].text(1)} |")
    best = max(reuse_of.values(), key=lambda e: e.point)
    lines += ["", f"Verdict: **{verdict(best, 8.0)}** at the best epoch count ({best.text(1)}x, claimed 8-12x).", ""]
    lines += pg_lines(by_setting[REFERENCE], by_setting[PG])
    return lines


def pg_lines(ppo: list[dict[str, Any]], pg: list[dict[str, Any]]) -> list[str]:
    """PPO (clip 0.2, 10 epochs) at its full budget against policy gradient at the same time: CPU seconds of
    single-threaded runs (:func:`cpu_seconds`)."""
    from sb3_ppo_scale.experiments import intervals

    if not pg:
        return []
    seconds = float(np.median([cpu_seconds(r) for r in ppo]))
    ppo_scores, pg_scores = [score(r) for r in ppo], [returns_at_cpu_seconds(r, seconds) for r in pg]
    ppo_mean, pg_mean = intervals.mean(ppo_scores), intervals.mean(pg_scores)
    pg_steps = [max((p[0] for p in r["curve"] if p[CPU] <= seconds), default=0) for r in pg]
    lines = [f"**PPO against vanilla policy gradient in the same time (\"2.3x the final return\")**: PPO's score after "
             f"{ppo[0]['steps']:,} steps ({seconds:.0f} CPU s, median of its runs; one thread a run, both settings from "
             "the same command on the same box; CPU time, which other runs on the box do not change) "
             f"against the policy-gradient setting's ({PG}) last {LAST_EPISODES} training episodes before the same "
             f"CPU time ({np.mean(pg_steps):,.0f} env steps on average).", "",
             f"- PPO {ppo_mean.text()}; policy gradient {pg_mean.text()}."]
    if pg_mean.point <= 0:  # no ratio: compare the intervals
        apart = ppo_mean.low > pg_mean.high or ppo_mean.high < pg_mean.low
        result = ("holds" if ppo_mean.low > max(pg_mean.high, 0.0) else "does not hold" if apart
                  else "not distinguishable")
        return lines + [f"- The policy gradient's mean return is not positive, so there is no ratio; verdict from the "
                        f"two intervals: **{result}**.", ""]
    ratio = intervals.ratio_of_means(ppo_scores, pg_scores)
    return lines + [f"- Ratio of means {ratio.text(2)}; verdict: **{verdict(ratio, 2.3)}** (claimed 2.3x).", ""]


def report(args: argparse.Namespace) -> None:
    runs = load_runs(args.out)
    table_runs = [r for r in runs if r["setting"] in SETTINGS]
    tasks = sorted({r["task"] for r in table_runs})
    steps = sorted({r["steps"] for r in table_runs})
    seeds = sorted({r["seed"] for r in table_runs})
    table, normalised = table_lines(table_runs, random_score)
    early = steps[-1] < 1_000_000
    view = ("**Early-learning view**: at this budget PPO has made only a few updates, so these are not the paper's "
            "numbers at its budget." if early else "The paper's budget.")
    lines = ["# PPO paper Table 1 design: clipping vs KL penalty (ScalablePPO objectives)", "",
             f"Produced by `python benchmarks/kl_vs_clip.py run --steps {steps[-1]} --seeds {len(seeds)} --tasks "
             f"{' '.join(tasks)}{' --claims' if len(runs) > len(table_runs) else ''} --out {args.out}` then "
             f"`python benchmarks/kl_vs_clip.py report --out {args.out}`.", "",
             f"Budget: **{', '.join(f'{s:,}' for s in steps)} environment steps per run** (the paper: 1,000,000). "
             f"{view} {len(table_runs)} runs, seeds {', '.join(map(str, seeds))}, tasks: {', '.join(tasks)}. "
             "Hyperparameters are the paper's (T=2048, lr 3e-4, 10 epochs, minibatch 64, gamma 0.99, lambda 0.95, "
             "one env, SB3's 64x64 tanh MLP). Score of a run: mean return of its last 100 training episodes. "
             "Normalised per task as the paper does: a random policy at 0, the best of the paper's settings (mean "
             "over its seeds) at 1. Ours: the mean (the paper's aggregate) and the interquartile mean over every "
             "(seed, task) of the setting, with 95% stratified bootstrap intervals (rliable: seeds resampled within "
             "tasks; the normalisation held fixed); a setting counts only the seeds it has on every task. Each "
             "task's column: the mean over its seeds with a 95% bootstrap interval.", "",
             *table, "", "Raw scores (mean over seeds of the last-100-episode mean return; seeds in brackets):", "",
             *raw_lines(table_runs), "",
             "Random-policy scores (20 episodes): " + ", ".join(f"{t} {random_score(t):.1f}" for t in tasks), ""]
    lines += claim_lines(runs)
    (args.out / "kl_vs_clip.md").write_text("\n".join(lines))
    plot(normalised, args.out / "kl_vs_clip.png", early)
    plot_curves(table_runs, args.out / "kl_vs_clip_curves.png")
    print("\n".join(lines))


def plot(normalised: dict[str, np.ndarray], path: Path, early: bool) -> None:
    """Mean normalised score per setting (bar, 95% stratified bootstrap interval) beside the paper's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sb3_ppo_scale.experiments import intervals

    names = [s for s in SETTINGS if s in normalised]
    estimates = [intervals.aggregates(normalised[s])["mean"] for s in names]
    ours = np.array([e.point for e in estimates])
    errors = np.array([[e.point - e.low, e.high - e.point] for e in estimates]).T.reshape(2, len(names))
    y = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.barh(y - 0.2, ours, 0.4, xerr=errors, capsize=2,
            label=f"ours (ScalablePPO, {'early-learning budget' if early else '1M steps'}; 95% interval)")
    ax.barh(y + 0.2, [SETTINGS[s][1] for s in names], 0.4, label="PPO paper, Table 1")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("normalised score (random = 0, best setting = 1), mean over tasks and seeds")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_curves(runs: list[dict[str, Any]], path: Path) -> None:
    """Per task, each setting's mean training return (over its seeds) against env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in runs if r.get("curve")})
    if not tasks:  # runs made before curves were recorded
        return
    columns = min(len(tasks), 2)
    fig, axes = plt.subplots((len(tasks) + 1) // 2, columns, figsize=(7 * columns, 4 * ((len(tasks) + 1) // 2)),
                             squeeze=False)
    colors = plt.get_cmap("tab20").colors
    for ax, task in zip(axes.flat, tasks):
        for setting, color in zip(SETTINGS, colors):
            curves = [r["curve"] for r in runs if r["task"] == task and r["setting"] == setting and r.get("curve")]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            steps = [p[0] for p in curves[0][:n]]
            ax.plot(steps, np.mean([[p[1] for p in c[:n]] for c in curves], axis=0), color=color,
                    label=f"{setting} ({len(curves)})", linestyle="--" if setting in BEYOND_THE_ISSUE else "-")
        ax.set_title(task)
        ax.set_xlabel("env steps")
        ax.set_ylabel("training return (mean over seeds)")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=6)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "report"])
    parser.add_argument("--steps", type=int, default=16_384, help="environment steps per run (default 16384)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=TASKS)
    parser.add_argument("--claims", action="store_true",
                        help=f"also run the source's claims on {CLAIMS_TASK} (n_epochs 1 / 3 / 20; policy gradient "
                             f"for {CLAIM_SETTINGS[PG][1]}x the steps), after the table's settings")
    parser.add_argument("--out", type=Path, default=RESULTS / "kl_vs_clip")
    args = parser.parse_args()
    if args.claims and CLAIMS_TASK not in args.tasks:
        parser.error(f"--claims needs {CLAIMS_TASK} among --tasks (its {REFERENCE!r} runs are the claims' reference)")
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
