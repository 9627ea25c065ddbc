"""Data-parallel ScalablePPO with torch.distributed: N processes, each with its own envs, one shared policy.

Run it under torchrun, or plainly (it then starts itself under torchrun with ``--nproc`` processes):

    torchrun --standalone --nproc-per-node 2 examples/data_parallel.py [--env CartPole-v1] [--timesteps 100000]
    python examples/data_parallel.py --nproc 2

The script is an ordinary SB3 script: the only data-parallel lines are the ones that keep evaluation and saving
on rank 0. ``batch_size`` is the GLOBAL minibatch (each of the N ranks trains on batch_size / N samples of it),
``n_envs`` is per rank, ``learn(total_timesteps)`` counts the steps of all ranks, and rank ``r`` seeds its envs
with ``seed + r * n_envs``. After training rank 0 saves the model (it loads in a plain single process) and
evaluates it; every rank checks that all ranks hold the same parameters.

``SB3_PPO_SCALE_SMOKE=1`` (the CI smoke test) trains 2 processes for 2048 steps on CartPole and evaluates one
episode.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch as th
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale import distributed as dp

SMOKE = os.environ.get("SB3_PPO_SCALE_SMOKE") == "1"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--timesteps", type=int, default=2048 if SMOKE else 100_000, help="env steps of ALL ranks")
    parser.add_argument("--n-envs", type=int, default=4, help="envs per rank")
    parser.add_argument("--batch-size", type=int, default=256, help="global minibatch (divisible by the ranks)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nproc", type=int, default=2, help="processes when started without torchrun")
    parser.add_argument("--save", default="data_parallel_model.zip", help="where rank 0 saves the model")
    return parser.parse_args()


def _without_nproc(argv: list[str]) -> list[str]:
    """``argv`` without ``--nproc N`` / ``--nproc=N`` (torchrun's own parser would read it as ``--nproc-per-node``)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            kept.append(arg)
    return kept


def relaunch_under_torchrun(nproc: int) -> int:
    """Start this script again as ``nproc`` torchrun workers (one torch thread each); returns their exit code."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               __file__, *_without_nproc(sys.argv[1:])]
    return subprocess.run(command, env=dict(os.environ, OMP_NUM_THREADS="1"), check=False).returncode


def train(args: argparse.Namespace) -> None:
    th.set_num_threads(1)
    env = make_vec_env(args.env, n_envs=args.n_envs)  # seeded by the model: seed + rank * n_envs + i
    model = ScalablePPO("MlpPolicy", env, n_steps=64, batch_size=args.batch_size, n_epochs=4, learning_rate=1e-3,
                        seed=args.seed, device="cpu", verbose=1 if dp.is_main_process() else 0)
    model.learn(args.timesteps)  # the process group is set up here (gloo on the CPU, NCCL on CUDA)
    dp.assert_parameters_in_sync(model)  # a collective: every rank calls it
    print(f"rank {dp.rank()}: {model.num_timesteps} env steps of all ranks, parameters identical on every rank",
          flush=True)
    th.distributed.barrier()  # rank 0's report comes last
    if dp.is_main_process():
        model.save(args.save)
        reloaded = ScalablePPO.load(args.save, device="cpu")  # as a plain single process would
        mean, std = evaluate_policy(reloaded, make_vec_env(args.env, n_envs=1, seed=10_000),
                                    n_eval_episodes=1 if SMOKE else 10)
        if SMOKE:
            os.remove(args.save)
        print(f"rank 0 saved the model to {args.save} and reloaded it in this process; mean return: {mean:.1f} "
              f"+/- {std:.1f}", flush=True)


def main() -> int:
    args = parse_args()
    if "LOCAL_RANK" not in os.environ:  # not started by torchrun
        return relaunch_under_torchrun(args.nproc)
    train(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
