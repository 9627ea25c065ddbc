"""What keeping the episodes in progress costs a checkpointed run: ``capture_episodes`` (called by
``ResumableCheckpoint`` at every rollout start) against one rollout and its update, on the same model.

For each config a ScalablePPO is trained for two warm-up rollouts; then, ``--repeats`` times, one ``learn()`` of one
rollout (rollout + update) and ``--captures`` calls of ``capture_episodes`` on its env are timed, alternating. Medians
are reported, and the capture's share of the rollout + update. One torch thread.

    OMP_NUM_THREADS=1 python benchmarks/studies/episode_capture.py [--repeats 5] [--captures 20] [--out benchmarks/results]

Writes ``<out>/episode_capture.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.end_to_end import header  # noqa: E402
from sb3_ppo_scale import ScalablePPO  # noqa: E402
from sb3_ppo_scale.envs.episodes import capture_episodes  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
#: name -> (env id, n_envs, n_steps); every env under SB3's Monitor, in a DummyVecEnv, with VecNormalize
CONFIGS: dict[str, tuple[str, int, int]] = {
    "hopper_1env": ("Hopper-v5", 1, 2048),
    "halfcheetah_16envs": ("HalfCheetah-v5", 16, 128),
    "cartpole_8envs": ("CartPole-v1", 8, 256),
}


def measure(env_id: str, n_envs: int, n_steps: int, repeats: int, captures: int) -> tuple[float, float]:
    """(median seconds of one capture_episodes, median seconds of one rollout + update)."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    model = ScalablePPO("MlpPolicy", VecNormalize(make_vec_env(env_id, n_envs, seed=0)), n_steps=n_steps, seed=0,
                        device="cpu")
    rollout = n_steps * n_envs
    model.learn(2 * rollout)
    capture_s, rollout_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        model.learn(rollout, reset_num_timesteps=False)
        rollout_s.append(time.perf_counter() - start)
        for _ in range(captures):
            start = time.perf_counter()
            captured, why = capture_episodes(model.env)
            capture_s.append(time.perf_counter() - start)
            assert captured is not None, why
    model.env.close()
    return statistics.median(capture_s), statistics.median(rollout_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", choices=tuple(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--repeats", type=int, default=5, help="timed rollouts per config (default 5)")
    parser.add_argument("--captures", type=int, default=20, help="captures timed after each rollout (default 20)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    th.set_num_threads(1)
    warnings.filterwarnings("ignore", module="gymnasium")
    rows = ["| config | capture_episodes ms | rollout + update ms | capture share |", "|---|---:|---:|---:|"]
    for name in args.configs:
        env_id, n_envs, n_steps = CONFIGS[name]
        capture, rollout = measure(env_id, n_envs, n_steps, args.repeats, args.captures)
        rows.append(f"| {name}: {env_id}, {n_envs} env(s) x {n_steps} steps | {capture * 1e3:.2f} | "
                    f"{rollout * 1e3:.0f} | {capture / rollout:.1%} |")
    argv = sys.argv[1:]
    lines = header("Cost of capturing the episodes in progress", argv,
                   f"Medians over {args.repeats} rollouts (x {args.captures} captures each); a checkpointed run "
                   "captures once per rollout.", script="episode_capture.py") + rows
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "episode_capture.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
