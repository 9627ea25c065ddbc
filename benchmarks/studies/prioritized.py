"""Uniform vs prioritized sampling (PrioritizedRolloutBuffer) on a dense and a sparse-reward task.

Every configuration trains ScalablePPO for the same number of environment steps on each seed; the learning
curve is the mean return of the training episodes (Monitor, undiscounted, raw reward) finished in each of
``--points`` equal step windows. Per run: final return = mean of the last two windows; AUC = mean of all
windows (a return, comparable to the final return). Table: mean over seeds with a 95% bootstrap interval of that
mean (rliable, 10 000 resamples of seeds: ``sb3_ppo_scale.experiments.intervals``).

Runs are independent processes (one thread each) whose results are cached as JSON under ``--out/runs``, so the
script can be stopped and resumed; ``--workers`` bounds the processes at once.

    .venv/bin/python benchmarks/studies/prioritized.py run --workers 2      # trains what is missing
    .venv/bin/python benchmarks/studies/prioritized.py report               # table + plot from the cached runs
"""

from __future__ import annotations

import argparse
import sys
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sb3_ppo_scale.experiments import intervals  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"

#: name -> rollout_buffer_kwargs (None: the default uniform buffer). Capacity is in rollouts (x rollout size).
CONFIGS: dict[str, dict[str, Any] | None] = {
    "uniform": None,
    "reward": dict(priority="reward", importance_correction=True),
    "reward, no corr": dict(priority="reward", importance_correction=False),
    "abs_adv": dict(priority="abs_advantage", importance_correction=True),
    "abs_adv, no corr": dict(priority="abs_advantage", importance_correction=False),
    "reward, retain": dict(priority="reward", importance_correction=True, capacity=4),
    "reward, no corr, retain": dict(priority="reward", importance_correction=False, capacity=4),
    "abs_adv, retain": dict(priority="abs_advantage", importance_correction=True, capacity=4),
    "abs_adv, no corr, retain": dict(priority="abs_advantage", importance_correction=False, capacity=4),
}

#: env id -> (steps budget, n_envs, ScalablePPO kwargs). HalfCheetah: SB3 defaults with batch 256 and
#: VecNormalize, 4 envs x 512 steps. MountainCarContinuous: rl-zoo's tuned PPO (gSDE, VecNormalize) with 4 envs x 64 steps.
#: Budgets fit ~60 min wall for 9 configs x 5 seeds x 2 envs on 2 shared cores (2 single-threaded workers).
ENVS: dict[str, tuple[int, int, dict[str, Any]]] = {
    "HalfCheetah-v5": (
        40_000,
        4,
        dict(n_steps=512, batch_size=256, n_epochs=10, learning_rate=3e-4, gamma=0.99, gae_lambda=0.95),
    ),
    "MountainCarContinuous-v0": (
        30_000,
        4,
        dict(
            n_steps=64, batch_size=64, n_epochs=10, learning_rate=7.77e-5, gamma=0.9999, gae_lambda=0.9,
            ent_coef=0.00429, clip_range=0.1, max_grad_norm=5.0, vf_coef=0.19, use_sde=True,
            policy_kwargs=dict(log_std_init=-3.29, ortho_init=False),
        ),
    ),
}


def run_one(env_id: str, config: str, seed: int, steps: int, out: Path) -> dict[str, Any]:
    """Train one (env, config, seed); cache and return its episode log."""
    import torch as th

    th.set_num_threads(1)
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from sb3_ppo_scale import PrioritizedRolloutBuffer, ScalablePPO

    _, n_envs, ppo_kwargs = ENVS[env_id]
    env = VecNormalize(make_vec_env(env_id, n_envs=n_envs, seed=seed), gamma=ppo_kwargs["gamma"])  # Monitor: raw returns
    buffer_kwargs = CONFIGS[config]
    extra: dict[str, Any] = {}
    if buffer_kwargs is not None:
        buffer_kwargs = dict(buffer_kwargs)
        if "capacity" in buffer_kwargs:
            buffer_kwargs["capacity"] *= ppo_kwargs["n_steps"] * n_envs
        extra = dict(rollout_buffer_class=PrioritizedRolloutBuffer, rollout_buffer_kwargs=buffer_kwargs)
    model = ScalablePPO("MlpPolicy", env, seed=seed, device="cpu", **ppo_kwargs, **extra)
    episodes = EpisodeLog()
    start = time.perf_counter()
    model.learn(steps, callback=episodes)
    record = {
        "env": env_id, "config": config, "seed": seed, "steps": steps, "seconds": time.perf_counter() - start,
        "episodes": episodes.rows,
    }
    run_path(out, env_id, config, seed).write_text(json.dumps(record))
    return record


def run_path(out: Path, env_id: str, config: str, seed: int) -> Path:
    return out / "runs" / f"{env_id}__{config.replace(', ', '_').replace(' ', '-')}__{seed}.json"


def _episode_log_class() -> type:
    from stable_baselines3.common.callbacks import BaseCallback

    class _EpisodeLog(BaseCallback):
        """Records (env steps so far, raw episode return) for every finished training episode."""

        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[int, float]] = []

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.rows.append((int(self.num_timesteps), float(info["episode"]["r"])))
            return True

    return _EpisodeLog


def EpisodeLog() -> Any:  # noqa: N802 - a factory, so importing this module stays light
    return _episode_log_class()()


# ------------------------------------------------------------------------------------------------ analysis
def curve(rows: list[list[float]], steps: int, points: int) -> np.ndarray:
    """Mean episode return per step window (NaN-free: an empty window repeats the previous value)."""
    edges = np.linspace(0, steps, points + 1)
    t = np.array([r[0] for r in rows], dtype=float)
    ret = np.array([r[1] for r in rows], dtype=float)
    values = np.empty(points)
    last = ret[0] if len(ret) else np.nan
    for k in range(points):
        mask = (t > edges[k]) & (t <= edges[k + 1])
        last = ret[mask].mean() if mask.any() else last
        values[k] = last
    return values


def report(out: Path, points: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = ["# Prioritized vs uniform rollout sampling (ScalablePPO)", "",
             "Generated by `benchmarks/studies/prioritized.py report` from the runs of `benchmarks/studies/prioritized.py run`.",
             "Final = mean training-episode return over the last 2 of %d step windows; AUC = mean over all windows." % points,
             "Mean over seeds [95% bootstrap interval of the mean, rliable]. Capacity for `retain` = 4 rollouts. minutes/run: wall time on 2 shared, heavily loaded cores.", ""]
    fig, axes = plt.subplots(1, len(ENVS), figsize=(7 * len(ENVS), 4.5))
    for ax, (env_id, (steps, n_envs, kwargs)) in zip(np.atleast_1d(axes), ENVS.items()):
        lines += [f"## {env_id}: {steps} steps, n_envs={n_envs}, " + ", ".join(f"{k}={v}" for k, v in kwargs.items() if k != "policy_kwargs"), "",
                  "| config | seeds | final return | AUC | per-seed final | minutes/run |", "|---|---|---|---|---|---|"]
        for config in CONFIGS:
            files = sorted((out / "runs").glob(run_path(out, env_id, config, 0).name.replace("__0.json", "__*.json")))
            records = [json.loads(f.read_text()) for f in files]
            if not records:
                continue
            curves = np.stack([curve(r["episodes"], steps, points) for r in records])
            final, auc = curves[:, -2:].mean(axis=1), curves.mean(axis=1)
            stats = intervals.aggregates_by_name({"final": list(final), "auc": list(auc)})
            minutes = np.mean([r["seconds"] for r in records]) / 60
            lines.append(f"| {config} | {len(records)} | {stats['final']['mean'].text(1)} | "
                         f"{stats['auc']['mean'].text(1)} | {' '.join(f'{v:.0f}' for v in final)} | {minutes:.1f} |")
            x = np.linspace(0, steps, points + 1)[1:]
            style = "-" if config == "uniform" else ("--" if "retain" in config else ":" if "no corr" in config else "-.")
            ax.plot(x, curves.mean(axis=0), style, label=config, lw=2.2 if config == "uniform" else 1.2)
        ax.set_title(env_id)
        ax.set_xlabel("environment steps")
        ax.set_ylabel("training episode return (mean over seeds)")
        lines.append("")
    np.atleast_1d(axes)[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "prioritized_curves.png", dpi=110)
    (RESULTS / "prioritized_learning.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "report"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--envs", nargs="*", default=list(ENVS))
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    parser.add_argument("--steps-scale", type=float, default=1.0, help="multiply every step budget (quick checks)")
    parser.add_argument("--shard", default="0/1", help="i/n: of all jobs, only every n-th starting at i (then those missing)")
    parser.add_argument("--out", type=Path, default=Path("runs/prioritized"))
    args = parser.parse_args()
    if args.command == "report":
        report(args.out, args.points)
        return
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    shard, n_shards = (int(v) for v in args.shard.split("/"))
    jobs = [(env_id, config, seed, int(ENVS[env_id][0] * args.steps_scale), args.out)
            for seed in range(args.seeds) for env_id in args.envs for config in args.configs][shard::n_shards]
    jobs = [job for job in jobs if not run_path(args.out, *job[:3]).exists()]
    print(f"{len(jobs)} runs to do with {args.workers} workers", flush=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(run_one, *job) for job in jobs]
        for future in futures:
            r = future.result()
            print(f"{r['env']} | {r['config']} | seed {r['seed']}: {r['seconds']:.0f} s, {len(r['episodes'])} episodes", flush=True)


if __name__ == "__main__":
    main()
