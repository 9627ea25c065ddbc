"""Update-phase cost of the KL-penalty objectives against clipping (the source claims clip is 40% cheaper).

Times ``ScalablePPO.train()`` on one synthetic rollout per shape for ``objective`` = clip, kl_penalty and
clip_kl_penalty, alternating objectives for ``--repeats`` rounds after a warm-up; reports median wall seconds,
median process CPU seconds and the ratio to clip. The KL objectives' train() includes their two extra no-grad
passes over the rollout (the rollout policy's distribution before, the measured KL after).

    python benchmarks/studies/kl_cost.py [--device cpu|cuda] [--repeats 5]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import machine_line, median, synthetic_model, timed_train  # noqa: E402
from sb3_ppo_scale import ScalablePPO  # noqa: E402

OBJECTIVES = ["clip", "kl_penalty", "clip_kl_penalty"]
# shape -> (n_envs, n_steps, batch sizes, n_epochs)
CONFIGS = {"halfcheetah": (8, 2048, [64, 4096], 4), "atari": (8, 128, [256], 4)}


def measure(shape: str, batch: int, device: str, repeats: int) -> dict[str, tuple[float, float]]:
    n_envs, n_steps, _, n_epochs = CONFIGS[shape]
    models = {o: synthetic_model(ScalablePPO, shape, n_envs, n_steps, device, batch_size=batch, n_epochs=n_epochs,
                                 objective=o) for o in OBJECTIVES}
    for model in models.values():
        model.train()
    wall: dict[str, list[float]] = {o: [] for o in OBJECTIVES}
    cpu: dict[str, list[float]] = {o: [] for o in OBJECTIVES}
    for _ in range(repeats):
        for objective, model in models.items():
            start = time.process_time()
            wall[objective].append(timed_train(model, device))
            cpu[objective].append(time.process_time() - start)
    return {o: (median(wall[o]), median(cpu[o])) for o in OBJECTIVES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if th.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    args = parser.parse_args()
    lines = [f"# Update-phase cost: KL penalty vs clipping ({args.device})", "",
             f"Produced by `python benchmarks/studies/kl_cost.py --device {args.device} --repeats {args.repeats}` on "
             f"{datetime.date.today()}; {machine_line(args.device)}. Medians of {args.repeats} alternating repeats of "
             "`ScalablePPO.train()` on the same synthetic rollout; ratio = objective / clip (wall time).", "",
             "| rollout | batch | objective | wall s | CPU s | ratio to clip (wall) | ratio to clip (CPU) |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for shape, (n_envs, n_steps, batches, n_epochs) in CONFIGS.items():
        for batch in batches:
            result = measure(shape, batch, args.device, args.repeats)
            clip_wall, clip_cpu = result["clip"]
            for objective, (wall, cpu) in result.items():
                row = (f"| {shape} N={n_envs * n_steps:,}, {n_epochs} epochs | {batch:,} | {objective} | {wall:.3f} | "
                       f"{cpu:.3f} | {wall / clip_wall:.2f} | {cpu / clip_cpu:.2f} |")
                lines.append(row)
                print(row, flush=True)
    out = args.out / f"kl_cost_{args.device.split(':')[0]}.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
