"""Pong on the 2-core box (issue 14): ScalablePPO on EnvPool against SB3 PPO with the zoo's Atari config.

Both runs use the zoo's Atari PPO hyperparameters (8 envs, n_steps 128, 4 epochs, minibatch 256, lr and clip range
linear from 2.5e-4 / 0.1 over ``--timesteps``, ent_coef 0.01):

- ``sb3_ppo``: SB3's ``PPO`` on Gymnasium's ``PongNoFrameskip-v4`` with SB3's ``AtariWrapper`` and a 4-frame stack
  in a ``DummyVecEnv`` (the zoo's ``atari`` entry);
- ``scalable_ppo``: ``ScalablePPO`` on the EnvPool VecEnv with EnvPool's matching preprocessing
  (``atari@envpool``).

A run stops at ``--timesteps`` env steps or after ``--max-seconds`` of training, whichever comes first; the linear
schedules always span ``--timesteps``, so two runs stopped early are compared at equal steps under the same
schedule. After each rollout the run appends (steps, training seconds, mean return of the last 10 whole games) to
its JSON file, so a run cut short keeps its curve. The learning curve is the training return: whole games, raw
(unclipped) score, as SB3's Monitor records them under ``AtariWrapper``.

Usage (one process per core, 1 torch thread each)::

    OMP_NUM_THREADS=1 python benchmarks/studies/pong.py run --algo sb3_ppo --max-seconds 3600 &
    OMP_NUM_THREADS=1 python benchmarks/studies/pong.py run --algo scalable_ppo --max-seconds 3600
    python benchmarks/studies/pong.py report
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.experiments import zoo
from sb3_ppo_scale.experiments.learning_report import return_at

RESULTS = Path(__file__).resolve().parents[1] / "results" / "pong"
ENV_ID = "PongNoFrameskip-v4"
#: algo -> (class, zoo entry variant)
RUNS: dict[str, tuple[type, str | None]] = {"sb3_ppo": (PPO, None), "scalable_ppo": (ScalablePPO, "envpool")}
#: games averaged into one point of the curve
WINDOW = 10


class CurveWriter(BaseCallback):
    """Counts finished games into ``record["games"]``; after each rollout appends a curve point to ``record`` and
    rewrites ``path``; stops training once ``max_seconds`` of wall-clock time have passed since ``learn()`` started."""

    def __init__(self, record: dict[str, Any], path: Path, max_seconds: float) -> None:
        super().__init__()
        self.record, self.path, self.max_seconds = record, path, max_seconds
        self.start = 0.0

    def _on_training_start(self) -> None:
        self.start = time.perf_counter()

    def _on_step(self) -> bool:
        self.record["games"] += sum("episode" in info for info in self.locals["infos"])
        return time.perf_counter() - self.start < self.max_seconds

    def _on_rollout_end(self) -> None:
        games = list(self.model.ep_info_buffer)[-WINDOW:]
        self.record["curve"].append({
            "steps": int(self.num_timesteps), "train_s": time.perf_counter() - self.start,
            "return": float(np.mean([g["r"] for g in games])) if games else None,
            "games": self.record["games"],
        })
        self.path.write_text(json.dumps(self.record, indent=1))


def run(args: argparse.Namespace) -> None:
    th.set_num_threads(1)
    algo_cls, variant = RUNS[args.algo]
    config = zoo.load_config(None, ENV_ID, variant)
    model = zoo.build_model(config, zoo.make_envs(config, seed=args.seed), algo=algo_cls, seed=args.seed, device="cpu")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.algo}_seed{args.seed}.json"
    record: dict[str, Any] = {
        "algo": args.algo, "class": f"{algo_cls.__module__}.{algo_cls.__name__}", "entry": config.entry,
        "env": env_setup(config),
        "seed": args.seed, "budget": args.timesteps, "max_seconds": args.max_seconds, "torch_threads": 1,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {th.__version__}", "games": 0, "curve": [],
    }
    writer = CurveWriter(record, path, args.max_seconds)
    model.learn(args.timesteps, callback=writer, progress_bar=args.progress)
    record.update(steps_collected=int(model.num_timesteps), train_s=time.perf_counter() - writer.start,
                  load_average_end=os.getloadavg())
    record["steps"] = record["curve"][-1]["steps"] if record["curve"] else 0  # trained on (a cut rollout is not)
    record["steps_per_s"] = record["steps_collected"] / record["train_s"]
    path.write_text(json.dumps(record, indent=1))
    print(f"{args.algo}: {record['steps']} steps in {record['train_s']:.0f} s ({record['steps_per_s']:.0f} steps/s), "
          f"{record['games']} games, last return {record['curve'][-1]['return'] if record['curve'] else None}")


def env_setup(config: zoo.ZooConfig) -> str:
    """How an entry's envs are built, for the table: the VecEnv kind, its wrappers and the frame stack."""
    parts = [config.vec_env] + [wrapper.__name__ for wrapper, _ in config.env_wrappers]
    parts += [f"frame stack {config.frame_stack}"] if config.frame_stack else []
    return " + ".join(parts) + (" (EnvPool's preprocessing)" if config.vec_env == "envpool" else "")


def report(args: argparse.Namespace) -> None:
    records = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*_seed*.json"))]
    common = min(r["curve"][-1]["steps"] for r in records)
    marks = list(range(args.every, common + 1, args.every)) + ([common] if common % args.every else [])
    lines = [
        "# Pong: ScalablePPO on EnvPool against SB3 PPO, the zoo's Atari config",
        "",
        f"Produced by `OMP_NUM_THREADS=1 python benchmarks/studies/pong.py run --algo <algo> --max-seconds "
        f"{records[0]['max_seconds']:.0f}` for each algo at once (one per core), then `python benchmarks/studies/pong.py "
        f"report --every {args.every}`; {records[0]['machine']}, 1 torch thread per run. Schedules span {records[0]['budget']:,} steps; "
        "each run stopped at its time limit. Return: mean raw score of the last 10 whole training games (-21: loses "
        "every point, 21: wins every point). Columns go up to the step count both runs reached. The two envs' Atari "
        "preprocessing differs in details (docs/envpool.md), so the curves compare the two setups, not the two "
        "algorithm classes alone. Curves: `pong_curve.png`; every point: the JSON files here.",
        "",
        "| run | seed | config entry | env | steps reached | train s | steps/s | games | " + " | ".join(
            f"return at {m // 1000}k" for m in marks) + " |",
        "|---|---:|---|---|---:|---:|---:|---:|" + "---:|" * len(marks),
    ]
    for r in records:
        at = [return_at(r, m) for m in marks]  # nan: no curve point there; None: no game had ended yet
        setup = env_setup(zoo.load_config(None, ENV_ID, RUNS[r["algo"]][1]))
        lines.append(f"| {r['class']} | {r['seed']} | `{r['entry']}` | {setup} | {r['steps']:,} | {r['train_s']:.0f} | "
                     f"{r['steps_per_s']:.0f} | {r['games']} | " + " | ".join(
                         "-" if v is None or np.isnan(v) else f"{v:.1f}" for v in at) + " |")
    (RESULTS / "pong.md").write_text("\n".join(lines) + "\n")
    plot(records, RESULTS / "pong_curve.png")
    print("\n".join(lines))


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for record in records:
        points = [p for p in record["curve"] if p["return"] is not None]
        ax.plot([p["steps"] for p in points], [p["return"] for p in points], label=f"{record['class']} ({record['entry']})")
    ax.set(xlabel="env steps", ylabel="training return (last 10 games)", title="PongNoFrameskip-v4, zoo Atari config")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run")
    one.add_argument("--algo", required=True, choices=sorted(RUNS))
    one.add_argument("--timesteps", type=int, default=2_000_000, help="budget in env steps (default 2M)")
    one.add_argument("--max-seconds", type=float, default=3600.0, help="stop after this much training (default 3600)")
    one.add_argument("--seed", type=int, default=0)
    one.add_argument("--progress", action="store_true", help="show a progress bar")
    summary = sub.add_parser("report")
    summary.add_argument("--every", type=int, default=50_000, help="table columns every this many steps")
    args = parser.parse_args(argv)
    {"run": run, "report": report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
