"""Update-phase throughput: SB3 PPO.train() against ScalablePPO.train() on the same synthetic rollout.

For each rollout shape (HalfCheetah-like: obs 17 float32, 6-d Box actions, MLP; Atari-like: 4x84x84 uint8,
Discrete(6), CnnPolicy) and each batch size, both models train on identical data in this process, alternating
PPO / ScalablePPO for ``--repeats`` rounds after ``WARMUP_CALLS`` untimed calls each, each timed call on a freshly filled rollout
(as after collection: each starts from an unflattened buffer); samples/s is ``n_epochs * N / seconds``
and the ratio is ScalablePPO / PPO of the medians. On CUDA ScalablePPO(cuda_graphs=True), and on the CPU
ScalablePPO(compile_loss=True), are timed in the same rotation (the compile happens in the untimed warm-up). Then the peak memory of one train() call, not counting the
rollout storage (CUDA: max_memory_allocated over two calls from a fresh model, above what was allocated
before them, minus ScalablePPO's device rollout; CPU: the torch profiler's memory timeline of the second call,
peak above its first sample), for batch 65 536 with grad_accum_steps 16 against
batch 4 096 without accumulation.

    python benchmarks/train_phase.py [--device cpu|cuda] [--repeats 3] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np
import torch as th
from stable_baselines3 import PPO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine_line, median, refill, sync, synthetic_model, timed_train  # noqa: E402
from sb3_ppo_scale import ScalablePPO  # noqa: E402

#: untimed train() calls per model first (steady state: ScalablePPO(cuda_graphs=True) captures its graph once
#: nothing changes between calls, at the latest in the third call)
WARMUP_CALLS = 3
# shape -> (n_envs, n_steps, batch sizes, n_epochs)
CONFIGS = {
    "halfcheetah": (16, 4096, [64, 256, 1024, 4096, 16384, 65536], 1),
    "atari": (8, 1024, [256, 1024, 4096, 8192], 1),
}


def variants(device: str, graphs: bool = True, compiled: bool | None = None) -> dict[str, tuple[type[PPO], dict]]:
    """What is timed: SB3 PPO, ScalablePPO as constructed by default, on CUDA ScalablePPO(cuda_graphs=True)
    (``graphs``), and ScalablePPO(compile_loss=True) (``compiled``; None: on the CPU only)."""
    timed = {"PPO": (PPO, {}), "ScalablePPO": (ScalablePPO, {})}
    if device.startswith("cuda") and graphs:
        timed["ScalablePPO cuda_graphs"] = (ScalablePPO, {"cuda_graphs": True})
    if compiled or (compiled is None and device == "cpu"):
        timed["ScalablePPO compile_loss"] = (ScalablePPO, {"compile_loss": True})
    return timed


def throughput_rows(shape: str, device: str, repeats: int, graphs: bool = True, compiled: bool | None = None) -> list[dict]:
    n_envs, n_steps, batches, n_epochs = CONFIGS[shape]
    n_samples = n_envs * n_steps
    rows = []
    for batch in batches:
        models = {
            name: synthetic_model(cls, shape, n_envs, n_steps, device, batch_size=batch, n_epochs=n_epochs, **extra)
            for name, (cls, extra) in variants(device, graphs, compiled).items()
        }
        for model in models.values():  # warm-up: allocator, kernels, staging buffers, a graph captured once
            for _ in range(WARMUP_CALLS):
                timed_train(model, device)
        seconds: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(repeats):
            for name, model in models.items():
                seconds[name].append(timed_train(model, device))
        rate = {name: n_epochs * n_samples / median(s) for name, s in seconds.items()}
        rows.append(dict(batch=batch, rate=rate))
        print(f"{shape:12s} batch {batch:6d}: " + "  ".join(
            f"{name} {value:12,.0f} ({value / rate['PPO']:.2f}x)" for name, value in rate.items()), flush=True)
        del models
    return rows


def peak_train_memory(model: PPO, device: str) -> int:
    """Bytes allocated at peak by train() above what was live before it, rollout storage excluded.

    CUDA: over two calls from a fresh model (so memory kept between calls, such as a cached CUDA graph's pool and
    the optimizer state, counts), minus ScalablePPO's device copy of the rollout. CPU: the second call alone."""
    if device.startswith("cuda"):
        sync(device)
        th.cuda.reset_peak_memory_stats()
        before = th.cuda.memory_allocated()
        model.train()
        refill(model)
        model.train()
        sync(device)
        stager = getattr(model, "_rollout_stager", None)
        rollout_bytes = 0 if stager is None else sum(t.numel() * t.element_size() for t in stager._device.values())
        return th.cuda.max_memory_allocated() - before - rollout_bytes
    model.train()  # allocate optimizer state first
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        model.train()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(th.device("cpu"))
    totals = np.asarray(sizes).sum(axis=1)
    return int(totals.max() - totals[0])


def memory_rows(device: str, graphs: bool = True) -> list[dict]:
    n_envs, n_steps = 16, 4096
    settings = [("PPO", PPO, 4096, {}), ("ScalablePPO", ScalablePPO, 4096, {}),
                ("PPO", PPO, 65536, {}), ("ScalablePPO", ScalablePPO, 65536, {}),
                ("ScalablePPO", ScalablePPO, 65536, {"grad_accum_steps": 16})]
    if device.startswith("cuda") and graphs:  # graphs keep their activations in a private pool: measured too
        settings.append(("ScalablePPO cuda_graphs", ScalablePPO, 4096, {"cuda_graphs": True}))
    rows = []
    for name, cls, batch, extra in settings:
        model = synthetic_model(cls, "halfcheetah", n_envs, n_steps, device, batch_size=batch, n_epochs=1, **extra)
        peak = peak_train_memory(model, device)
        rows.append(dict(name=name, batch=batch, accum=extra.get("grad_accum_steps", 1), peak=peak))
        print(f"memory {name:12s} batch {batch:6d} accum {rows[-1]['accum']:2d}: {peak / 2**20:8.2f} MiB", flush=True)
    return rows


def render(device: str, repeats: int, tables: dict[str, list[dict]], memory: list[dict], flags: str = "") -> str:
    lines = [f"# Update-phase throughput, {device}", "",
             f"Produced by `python benchmarks/train_phase.py --device {device}{flags} --repeats {repeats}` on "
             f"{datetime.date.today()}; {machine_line(device)}.", "",
             "Samples/s through `train()` on the same synthetic rollout, medians over "
             f"{repeats} alternating repeats after {WARMUP_CALLS} untimed calls per model; ratio = that column / SB3 PPO.",
             "`ScalablePPO` is built with defaults (its parameters equal PPO's); the other columns are opt-in: "
             "`cuda_graphs=True`, and `compile_loss=True` (its one-off compilation, tens of seconds per rollout shape, "
             "falls in the untimed warm-up; its parameters differ from PPO's by float rounding).", ""]
    for shape, rows in tables.items():
        n_envs, n_steps, _, n_epochs = CONFIGS[shape]
        names = [name for name in rows[0]["rate"] if name != "PPO"]
        lines += [f"## {shape}-shaped rollout (N = {n_envs * n_steps:,}, n_epochs = {n_epochs})", "",
                  "| batch | SB3 PPO samples/s | " + " | ".join(f"{n} samples/s | ratio" for n in names) + " |",
                  "|---:|---:|" + "---:|---:|" * len(names)]
        for r in rows:
            cells = " | ".join(f"{r['rate'][n]:,.0f} | {r['rate'][n] / r['rate']['PPO']:.2f}" for n in names)
            lines.append(f"| {r['batch']:,} | {r['rate']['PPO']:,.0f} | {cells} |")
        lines.append("")
    base = next(r["peak"] for r in memory if r["name"] == "ScalablePPO" and r["batch"] == 4096)
    lines += ["## Peak memory of one train() call, rollout storage excluded (HalfCheetah-shaped, N = 65,536)", "",
              "| model | batch | grad_accum_steps | peak MiB | vs ScalablePPO batch 4,096 |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['name']} | {r['batch']:,} | {r['accum']} | {r['peak'] / 2**20:.2f} | {r['peak'] / base:.2f}x |"
              for r in memory]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if th.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timed repeats per setting (default 3)")
    parser.add_argument("--shapes", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="on CUDA, also time ScalablePPO(cuda_graphs=True) (default on)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="also time ScalablePPO(compile_loss=True) (default: on the CPU only)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    tables = {shape: throughput_rows(shape, args.device, args.repeats, args.graphs, args.compile) for shape in args.shapes}
    memory = memory_rows(args.device, args.graphs)
    out = Path(args.out) / f"train_phase_{args.device.split(':')[0]}.md"
    flags = ("" if args.graphs else " --no-graphs") + {None: "", True: " --compile", False: " --no-compile"}[args.compile]
    out.write_text(render(args.device, args.repeats, tables, memory, flags))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
