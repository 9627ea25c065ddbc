"""One CPU Adam step: torch's multi-tensor (foreach) step against FlatAdam's step on flat buffers, by policy size.

FlatAdam (sb3_ppo_scale/core/update/flat_adam.py) takes the step of ScalablePPO's update for policies up to
``MAX_FLAT_ELEMENTS`` parameter elements; this measures where that pays. Both optimizers hold the same state and
step the same gradients (their results are equal bit for bit: tests/test_flat_adam.py); medians over alternating
repeats of 20 steps each, one torch thread.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/studies/flat_adam.py [--repeats 7] [--out benchmarks/results]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import machine_line  # noqa: E402
from sb3_ppo_scale.core.update.flat_adam import MAX_FLAT_ELEMENTS, FlatAdam  # noqa: E402

MUJOCO_OBS, MUJOCO_ACTIONS = spaces.Box(-1.0, 1.0, (17,)), spaces.Box(-1.0, 1.0, (6,))
#: name -> policy factory (HalfCheetah-shaped MLPs of growing width, and the zoo's Atari CNN)
POLICIES = {
    "MlpPolicy 64x64 (SB3's default)": lambda: ActorCriticPolicy(MUJOCO_OBS, MUJOCO_ACTIONS, lambda _: 3e-4),
    "MlpPolicy 256x256": lambda: ActorCriticPolicy(MUJOCO_OBS, MUJOCO_ACTIONS, lambda _: 3e-4, net_arch=[256, 256]),
    "MlpPolicy 384x384": lambda: ActorCriticPolicy(MUJOCO_OBS, MUJOCO_ACTIONS, lambda _: 3e-4, net_arch=[384, 384]),
    "MlpPolicy 512x512": lambda: ActorCriticPolicy(MUJOCO_OBS, MUJOCO_ACTIONS, lambda _: 3e-4, net_arch=[512, 512]),
    "CnnPolicy, Atari 4x84x84": lambda: ActorCriticCnnPolicy(spaces.Box(0, 255, (4, 84, 84), "uint8"),
                                                             spaces.Discrete(6), lambda _: 3e-4),
}


def _stepped_adam(parameters: list[th.nn.Parameter], gradients: list[th.Tensor]) -> th.optim.Adam:
    """SB3's PPO optimizer (Adam, eps 1e-5) after one step on ``gradients``, in the multi-tensor mode ScalablePPO's
    update uses; the gradients stay set for the timed steps."""
    optimizer = th.optim.Adam(parameters, lr=3e-4, eps=1e-5, foreach=True)
    for p, gradient in zip(parameters, gradients):
        p.grad = gradient.clone()
    optimizer.step()
    return optimizer


def step_times(policy: th.nn.Module, repeats: int, steps: int = 20) -> tuple[float, float, bool]:
    """Median microseconds per step (multi-tensor Adam, FlatAdam) and whether both ended with equal parameters and
    state (the first flat step builds the buffers, inside the first repeat)."""
    parameters = list(policy.parameters())
    twins = [th.nn.Parameter(p.detach().clone()) for p in parameters]
    gradients = [th.randn_like(p) for p in parameters]
    foreach = _stepped_adam(parameters, gradients)
    flat = FlatAdam(_stepped_adam(twins, gradients))
    times: list[tuple[float, float]] = []
    for _ in range(repeats):
        pair = []
        for step in (foreach.step, flat.step):
            start = time.perf_counter()
            for _ in range(steps):
                step()
            pair.append((time.perf_counter() - start) / steps * 1e6)
        times.append((pair[0], pair[1]))
    flat.close()
    states = [[t for p in ps for t in opt.state[p].values()] for ps, opt in ((parameters, foreach),
                                                                             (twins, flat.optimizer))]
    equal = all(th.equal(a, b) for a, b in zip(parameters + states[0], twins + states[1]))
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times), equal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    args = parser.parse_args()
    th.set_num_threads(1)
    lines = ["# One CPU Adam step: multi-tensor against flat buffers", "",
             f"Produced by `{' '.join(['OMP_NUM_THREADS=1 python benchmarks/studies/flat_adam.py', *sys.argv[1:]])}` on "
             f"{time.strftime('%Y-%m-%d')}; {machine_line('cpu')}.", "",
             f"Microseconds per step, median over {args.repeats} alternating repeats of 20 steps; same state, same "
             f"gradients; 'equal': parameters and Adam state equal bit for bit after all steps. ScalablePPO steps flat "
             f"up to {MAX_FLAT_ELEMENTS:,} parameter elements.", "",
             "| policy | parameter elements | multi-tensor us | flat us | speed-up | equal | stepped flat |",
             "|---|---:|---:|---:|---:|---|---|"]
    for name, make in POLICIES.items():
        th.manual_seed(0)
        policy = make()
        n_elements = sum(p.numel() for p in policy.parameters())
        foreach_us, flat_us, equal = step_times(policy, args.repeats)
        lines.append(f"| {name} | {n_elements:,} | {foreach_us:,.0f} | {flat_us:,.0f} | {foreach_us / flat_us:.2f}x | "
                     f"{'yes' if equal else 'NO'} | "
                     f"{'yes' if n_elements <= MAX_FLAT_ELEMENTS else 'no'} |")
        print(lines[-1], flush=True)
    out = args.out / "flat_adam_cpu.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
