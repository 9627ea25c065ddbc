"""The PPO paper's Table 1 (Schulman et al. 2017), reproduced with ScalablePPO's objectives on MuJoCo v5 tasks.

Settings: no clipping or penalty; clip eps 0.1 / 0.2 / 0.3; adaptive KL penalty d_targ 0.003 / 0.01 / 0.03
(beta starts at 1, the paper's rule); fixed beta 0.3 / 1 / 3 / 10. Hyperparameters are the paper's (T = 2048,
lr 3e-4, 10 epochs, minibatch 64, gamma 0.99, lambda 0.95, one env, 64x64 tanh MLP: SB3's defaults).
Score of a run: mean return of its last 100 training episodes (the paper's metric). Normalised per task as the
paper does: random policy 0, best setting (mean over seeds) 1; then averaged over tasks and seeds.

Runs are independent single-threaded processes cached as JSON under ``--out/runs`` (stop and resume at will).

    python benchmarks/kl_vs_clip.py run [--steps 16384] [--seeds 3] [--workers 2] [--tasks ...]
    python benchmarks/kl_vs_clip.py report
"""

from __future__ import annotations

import argparse
import json
import time
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
PAPER = dict(n_steps=2048, batch_size=64, n_epochs=10, learning_rate=3e-4, gamma=0.99, gae_lambda=0.95)
LAST_EPISODES = 100


#: points of a run's learning curve (mean training-episode return per window of steps / CURVE_POINTS env steps)
CURVE_POINTS = 50


def LearningCurve(window: int) -> Any:  # noqa: N802 - a callback class built where SB3 is imported
    """A callback recording ``[window end step, mean return, episodes]`` of the training episodes that ended in each
    window of ``window`` env steps (``points``), for the report's curves."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Curve(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.points: list[list[float]] = []
            self._returns: list[float] = []

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    self._returns.append(float(info["episode"]["r"]))
            if self.num_timesteps % window == 0 and self._returns:
                self.points.append([self.num_timesteps, round(float(np.mean(self._returns)), 3), len(self._returns)])
                self._returns = []
            return True

    return Curve()


def run_path(out: Path, task: str, setting: str, seed: int) -> Path:
    slug = setting.replace(" ", "_").replace("=", "").replace(",", "")
    return out / "runs" / f"{task}__{slug}__{seed}.json"


def run_one(task: str, setting: str, seed: int, steps: int, out: Path) -> str:
    """Train one (task, setting, seed) and cache its episode returns (skipped if already cached)."""
    path = run_path(out, task, setting, seed)
    if path.exists():
        return f"{task} | {setting} | seed {seed}: cached"
    import torch as th

    th.set_num_threads(1)
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_ppo_scale import ScalablePPO

    start = time.perf_counter()
    model = ScalablePPO("MlpPolicy", make_vec_env(task, n_envs=1, seed=seed), seed=seed, device="cpu",
                        **PAPER, **SETTINGS[setting][0])
    curve = LearningCurve(max(steps // CURVE_POINTS, 1))
    model.learn(steps, callback=curve)
    returns = [float(info["r"]) for info in model.ep_info_buffer]  # the last (up to) 100 episodes
    record = dict(task=task, setting=setting, seed=seed, steps=steps, last_returns=returns,
                  seconds=time.perf_counter() - start, final_kl_beta=model.kl_beta, curve=curve.points)
    path.write_text(json.dumps(record))
    return f"{task} | {setting} | seed {seed}: {np.mean(returns):9.1f} ({record['seconds']:.0f} s)"


def random_score(task: str, episodes: int = 20) -> float:
    """Mean return of a uniformly random policy (the paper's 0 of the normalised score)."""
    import gymnasium as gym

    env = gym.make(task)
    env.action_space.seed(0)
    totals = []
    for episode in range(episodes):
        env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total, done = total + float(reward), terminated or truncated
        totals.append(total)
    return float(np.mean(totals))


def run(args: argparse.Namespace) -> None:
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    jobs = [(t, s, seed) for extra in (False, True) for seed in range(args.seeds) for t in args.tasks
            for s in SETTINGS if (s in BEYOND_THE_ISSUE) == extra and not run_path(args.out, t, s, seed).exists()]
    print(f"{len(jobs)} runs to do ({args.steps} steps each, {args.workers} workers)", flush=True)
    with ProcessPoolExecutor(args.workers) as pool:
        for line in pool.map(run_one, *zip(*jobs), [args.steps] * len(jobs), [args.out] * len(jobs)) if jobs else []:
            print(line, flush=True)


def load_runs(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]


def normalised_scores(runs: list[dict[str, Any]]) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Per task: mean raw score per setting; and per setting, per task: normalised score (random 0, best 1).

    A task whose best setting does not beat the random policy has no scale to normalise by (nothing learned yet):
    it gets no normalised scores and is left out of the averages.
    """
    raw: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        raw.setdefault(r["task"], {}).setdefault(r["setting"], []).append(float(np.mean(r["last_returns"])))
    means = {t: {s: float(np.mean(v)) for s, v in by_setting.items()} for t, by_setting in raw.items()}
    normalised: dict[str, dict[str, float]] = {s: {} for s in SETTINGS}
    for task, by_setting in means.items():
        zero, best = random_score(task), max(by_setting.values())
        if best <= zero:
            continue
        for setting, value in by_setting.items():
            normalised[setting][task] = (value - zero) / (best - zero)
    return means, normalised


def report(args: argparse.Namespace) -> None:
    runs = load_runs(args.out)
    means, normalised = normalised_scores(runs)
    tasks = sorted(means)
    excluded = [t for t in tasks if all(t not in normalised[s] for s in SETTINGS)]
    seeds = sorted({r["seed"] for r in runs})
    steps = sorted({r["steps"] for r in runs})
    lines = ["# PPO paper Table 1 design: clipping vs KL penalty (ScalablePPO objectives)", "",
             f"Produced by `python benchmarks/kl_vs_clip.py run --steps {steps[-1]} --seeds {len(seeds)}` then "
             "`python benchmarks/kl_vs_clip.py report`.", "",
             f"Budget: **{', '.join(map(str, steps))} environment steps per run** (the paper: 1,000,000), "
             f"{len(seeds)} seeds, tasks: {', '.join(tasks)}; {len(runs)} runs. Hyperparameters are the paper's "
             "(T=2048, lr 3e-4, 10 epochs, minibatch 64, gamma 0.99, lambda 0.95). Score: mean return of the last "
             "100 training episodes; normalised per task with a random policy at 0 and the best setting at 1, "
             "then averaged over tasks. At this budget PPO has made only a few updates, so these are early-learning "
             "numbers, not the paper's asymptotic ones.", "",
             "| setting | ours (normalised) | paper (normalised) | " + " | ".join(tasks) + " |",
             "|---|---:|---:|" + "---:|" * len(tasks)]
    for setting, (_, paper) in SETTINGS.items():
        per_task = normalised[setting]
        ours = np.mean(list(per_task.values())) if per_task else float("nan")
        cells = " | ".join(f"{per_task[t]:.2f}" if t in per_task else "n/a" for t in tasks)
        lines.append(f"| {setting} | {ours:.2f} | {'not in the paper' if np.isnan(paper) else f'{paper:.2f}'} | {cells} |")
    if excluded:
        lines += ["", f"Left out of the normalised averages (no setting beat the random policy at this budget, so "
                  f"there is no scale to normalise by): {', '.join(excluded)}."]
    lines += ["", "Raw scores (mean over seeds of the last-100-episode mean return):", "",
              "| setting | " + " | ".join(tasks) + " |", "|---|" + "---:|" * len(tasks)]
    for setting in SETTINGS:
        lines.append(f"| {setting} | " + " | ".join(f"{means[t].get(setting, float('nan')):.1f}" for t in tasks) + " |")
    lines += ["", "Random-policy scores (20 episodes): " + ", ".join(f"{t} {random_score(t):.1f}" for t in tasks), ""]
    (args.out / "kl_vs_clip.md").write_text("\n".join(lines))
    plot(normalised, args.out / "kl_vs_clip.png")
    print("\n".join(lines))


def plot(normalised: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(SETTINGS)
    ours = [np.mean(list(normalised[s].values())) if normalised[s] else np.nan for s in names]
    paper = [SETTINGS[s][1] for s in names]
    y = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.barh(y - 0.2, ours, 0.4, label="ours (ScalablePPO, small budget)")
    ax.barh(y + 0.2, paper, 0.4, label="PPO paper, Table 1")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("normalised score (random = 0, best setting = 1), mean over tasks")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "report"])
    parser.add_argument("--steps", type=int, default=16_384, help="environment steps per run (default 16384)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=TASKS)
    parser.add_argument("--out", type=Path, default=RESULTS / "kl_vs_clip")
    args = parser.parse_args()
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
