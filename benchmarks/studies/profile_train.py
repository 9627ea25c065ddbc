"""Where the time of one update phase goes: cProfile of ``train()`` for SB3 PPO and ScalablePPO.

Uses the same synthetic rollouts as ``train_phase.py``; each profiled call trains on a freshly filled rollout
(the refill is outside the profile). Prints the top functions by own time and by cumulative time.

With ``--ops``: the torch profiler's operator table (self time) of one ``train()`` call instead, for SB3 PPO,
ScalablePPO and ScalablePPO(compile_loss=True) (with the seconds of each model's first, compiling, call), after
a timing of single element-wise ops on a 16 384 x 64 float32 tensor (why ``tanh`` dominates eager CPU updates).

    python benchmarks/studies/profile_train.py [--device cuda] [--shape halfcheetah] [--batch 65536] [--calls 3] [--ops]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import time

import torch as th
from stable_baselines3 import PPO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
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


def elementwise_timings(device: str, repeats: int = 50) -> str:
    """Milliseconds per call of single ops on a (16 384, 64) float32 tensor, the hidden layer of an MLP update."""
    x = th.randn(16384, 64, device=device)
    weight = th.randn(64, 64, device=device)
    ops = {"tanh": lambda: th.tanh(x), "sigmoid": lambda: th.sigmoid(x), "relu": lambda: th.relu(x),
           "exp": lambda: th.exp(x), "mm 64x64": lambda: x @ weight}
    lines = [f"ms per call on a (16384, 64) float32 tensor, {device}, torch threads {th.get_num_threads()}, "
             f"CPU capability {th.backends.cpu.get_cpu_capability()}:"]
    for name, op in ops.items():
        op()
        sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            op()
        sync(device)
        lines.append(f"  {name:10s} {(time.perf_counter() - start) / repeats * 1e3:7.3f}")
    return "\n".join(lines)


def operator_table(model: PPO, device: str) -> str:
    """Seconds of the first (warm-up; compiling) train() call, then the torch profiler's table of a later call."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    model.train()
    first = time.perf_counter() - start
    refill(model)
    model.train()
    refill(model)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        model.train()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    return f"first train() call: {first:.1f} s\n{table}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if th.cuda.is_available() else "cpu")
    parser.add_argument("--shape", default="halfcheetah", choices=list(CONFIGS))
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--ops", action="store_true", help="torch profiler operator tables, compile_loss included")
    args = parser.parse_args()
    n_envs, n_steps, _, n_epochs = CONFIGS[args.shape]
    if args.ops:
        print(elementwise_timings(args.device))
    models = [("PPO", PPO, {}), ("ScalablePPO", ScalablePPO, {})]
    if args.ops:
        models.append(("ScalablePPO compile_loss", ScalablePPO, {"compile_loss": True}))
    for name, cls, extra in models:
        model = synthetic_model(cls, args.shape, n_envs, n_steps, args.device, batch_size=args.batch, n_epochs=n_epochs, **extra)
        if args.ops:
            print(f"===== {name} {args.shape} batch {args.batch} on {args.device}: operators of one train() call =====")
            print(operator_table(model, args.device))
            continue
        print(f"===== {name} {args.shape} batch {args.batch} on {args.device}, {args.calls} train() calls =====")
        print(profile_train(model, args.device, args.calls))


if __name__ == "__main__":
    main()
