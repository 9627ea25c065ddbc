"""Where the host time of one update phase goes: cProfile of ``train()`` for SB3 PPO and ScalablePPO.

Uses the same synthetic rollouts as ``train_phase.py``; each profiled call trains on a freshly filled rollout
(the refill is outside the profile). Prints the top functions by own time and by cumulative time.

    python benchmarks/profile_train.py [--device cuda] [--shape halfcheetah] [--batch 65536] [--calls 3]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch as th
from stable_baselines3 import PPO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import refill, sync, synthetic_model  # noqa: E402
from benchmarks.train_phase import CONFIGS  # noqa: E402
from sb3_ppo_scale import ScalablePPO  # noqa: E402


def profile_train(model: PPO, device: str, calls: int) -> str:
    model.train()  # warm-up
    profiler = cProfile.Profile()
    for _ in range(calls):
        refill(model)
        sync(device)
        profiler.enable()
        model.train()
        sync(device)
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(12)
    stats.sort_stats("cumulative").print_stats(18)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if th.cuda.is_available() else "cpu")
    parser.add_argument("--shape", default="halfcheetah", choices=list(CONFIGS))
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    n_envs, n_steps, _, n_epochs = CONFIGS[args.shape]
    for cls in (PPO, ScalablePPO):
        model = synthetic_model(cls, args.shape, n_envs, n_steps, args.device, batch_size=args.batch, n_epochs=n_epochs)
        print(f"===== {cls.__name__} {args.shape} batch {args.batch} on {args.device}, {args.calls} train() calls =====")
        print(profile_train(model, args.device, args.calls))


if __name__ == "__main__":
    main()
