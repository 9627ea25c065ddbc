"""The learning rate a KL-adaptive entry arrives at: ScalablePPO on a config entry, the optimizer's learning rate
at every rollout start, written as a markdown table.

    python benchmarks/studies/lr_trace.py --tasks HalfCheetah-v5 Hopper-v5 --variant gpu_kl --budget 400000 --seed 2 \
        --out benchmarks/results/learning_v2/lr_trace.md

One process, one torch thread, CPU. The rule (``sb3_ppo_scale/core/update/lr.py``): after each update, lr / 1.5 when the
measured KL > 2 x target, x 1.5 when < target / 2, within [min_lr, max_lr].
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from sb3_ppo_scale.experiments import zoo


class LearningRateTrace(BaseCallback):
    """Records ``(num_timesteps, learning rate)`` at every rollout start."""

    def __init__(self) -> None:
        super().__init__()
        self.points: list[tuple[int, float]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        self.points.append((self.num_timesteps, self.model.policy.optimizer.param_groups[0]["lr"]))


def trace(task: str, variant: str, budget: int, seed: int) -> list[tuple[int, float]]:
    """The learning rate at each rollout start of ``budget`` env steps of ScalablePPO on ``task@variant``."""
    config = zoo.load_config(zoo.DEFAULT_CONFIG, task, variant)
    model = zoo.build_model(config, zoo.make_envs(config, seed=seed), seed=seed, device="cpu")
    callback = LearningRateTrace()
    model.learn(budget, callback=callback)
    return callback.points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["HalfCheetah-v5", "Hopper-v5"])
    parser.add_argument("--variant", default="gpu_kl")
    parser.add_argument("--budget", type=int, default=400_000, help="env steps per task (default 400000)")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--every", type=int, default=3, help="print every n-th rollout (default 3)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/learning_v2/lr_trace.md"))
    args = parser.parse_args()
    th.set_num_threads(1)
    traces = {task: trace(task, args.variant, args.budget, args.seed) for task in args.tasks}
    steps = [s for s, _ in traces[args.tasks[0]]][::args.every]
    lines = [f"# Learning rate of `@{args.variant}` at each rollout start (seed {args.seed})", "",
             f"Produced by `python benchmarks/studies/lr_trace.py --tasks {' '.join(args.tasks)} --variant {args.variant} "
             f"--budget {args.budget} --seed {args.seed} --every {args.every}`; torch {th.__version__}, 1 thread, "
             f"{platform.machine()}.", "",
             "| env steps | " + " | ".join(args.tasks) + " |", "|---:|" + "---:|" * len(args.tasks)]
    for i, step in enumerate(steps):
        values = [traces[task][i * args.every][1] if i * args.every < len(traces[task]) else float("nan")
                  for task in args.tasks]
        lines.append(f"| {step} | " + " | ".join(f"{v:.2e}" for v in values) + " |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
