"""Overhead of prioritized sampling in ScalablePPO.train(): a synthetic rollout, uniform vs PrioritizedRolloutBuffer.

The rollout buffer (HalfCheetah-shaped: obs 17, action 6, MLP 64x64; ``benchmarks/common.py``) is filled with random data once and
``model.train()`` is timed on it; configurations alternate within each repeat and the medians are reported.
Default: N = 1 048 576 samples, batch 65 536, 1 epoch, 5 repeats, one CPU thread. Both wall time and process
CPU time are reported (on a shared machine CPU time of a single-threaded process is the steadier measure).

    .venv/bin/python benchmarks/studies/prioritized_overhead.py [--samples N] [--batch B] [--epochs E] [--repeats R] [--device D]

Writes ``benchmarks/results/prioritized_overhead.md``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import synthetic_model  # noqa: E402
from sb3_ppo_scale import PrioritizedRolloutBuffer, ScalablePPO  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"

#: name -> rollout_buffer_kwargs (None: default uniform buffer). "retain" has capacity 2 x N, so from the second
#: update on it trains on 2N samples per epoch: compare its time per trained sample, not its train() time.
CONFIGS: dict[str, dict[str, Any] | None] = {
    "uniform": None,
    "prioritized reward": dict(priority="reward"),
    "prioritized abs_advantage": dict(priority="abs_advantage"),
    "prioritized reward, no correction": dict(priority="reward", importance_correction=False),
    "prioritized reward, retain (capacity 2N)": dict(priority="reward", capacity=2),
}


def make_model(kwargs: dict[str, Any] | None, samples: int, batch: int, epochs: int, device: str) -> ScalablePPO:
    """A ScalablePPO on the shared synthetic HalfCheetah-shaped rollout, with the given prioritized-buffer kwargs."""
    extra: dict[str, Any] = {}
    if kwargs is not None:
        kwargs = dict(kwargs)
        if "capacity" in kwargs:
            kwargs["capacity"] *= samples
        extra = dict(rollout_buffer_class=PrioritizedRolloutBuffer, rollout_buffer_kwargs=kwargs)
    return synthetic_model(ScalablePPO, "halfcheetah", 1, samples, device, batch_size=batch, n_epochs=epochs, **extra)


def timed_train(model: ScalablePPO) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one ``model.train()``; CPU time is robust to other processes."""
    if model.device.type == "cuda":
        th.cuda.synchronize()
    start, cpu_start = time.perf_counter(), time.process_time()
    model.train()
    if model.device.type == "cuda":
        th.cuda.synchronize()
    return time.perf_counter() - start, time.process_time() - cpu_start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_048_576)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS / "prioritized_overhead.md")
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    models = {name: make_model(kw, args.samples, args.batch, args.epochs, args.device) for name, kw in CONFIGS.items()}
    for model in models.values():  # warm-up (allocations; the retain pool reaches 2N)
        timed_train(model)
    times: dict[str, list[float]] = {name: [] for name in models}
    cpu: dict[str, list[float]] = {name: [] for name in models}
    pool_sizes: dict[str, int] = {}
    for repeat in range(args.repeats):
        names = list(models) if repeat % 2 == 0 else list(reversed(models))  # alternate the order
        for name in names:
            wall, cpu_s = timed_train(models[name])
            times[name].append(wall)
            cpu[name].append(cpu_s)
            buffer = models[name].rollout_buffer
            pool_sizes[name] = buffer.sampler.size if isinstance(buffer, PrioritizedRolloutBuffer) else args.samples
        print(f"repeat {repeat}: " + ", ".join(f"{n}={times[n][-1]:.2f}s/{cpu[n][-1]:.2f}cpu" for n in models), flush=True)
    base, cpu_base = float(np.median(times["uniform"])), float(np.median(cpu["uniform"]))
    lines = [
        "# Overhead of prioritized sampling in train()", "",
        f"`benchmarks/studies/prioritized_overhead.py --samples {args.samples} --batch {args.batch} --epochs {args.epochs} "
        f"--repeats {args.repeats} --threads {args.threads} --device {args.device}`; synthetic HalfCheetah-shaped "
        f"rollout (obs 17, action 6, MLP 64x64), {platform.processor() or platform.machine()}, torch {th.__version__}. "
        "Configurations alternate within each repeat; medians over repeats.", "",
        "| configuration | samples per epoch | wall s: median (min-max) | wall vs uniform | CPU s: median (min-max) | CPU vs uniform | CPU vs uniform per trained sample |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, values in times.items():
        median, cpu_median = float(np.median(values)), float(np.median(cpu[name]))
        per_sample = (cpu_median / pool_sizes[name]) / (cpu_base / args.samples)
        lines.append(f"| {name} | {pool_sizes[name]:,} | {median:.2f} ({min(values):.2f}-{max(values):.2f}) | "
                     f"{100 * (median / base - 1):+.1f}% | {cpu_median:.2f} ({min(cpu[name]):.2f}-{max(cpu[name]):.2f}) | "
                     f"{100 * (cpu_median / cpu_base - 1):+.1f}% | {100 * (per_sample - 1):+.1f}% |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
