"""The main job: a short ScalablePPO training run on a real MuJoCo task, with a progress bar.

Swapping ``PPO`` for ``ScalablePPO`` is the only change an SB3 script needs; the extra arguments below ask for
large minibatches (a quarter of the rollout) accumulated over micro-batches.

    python examples/quickstart.py [--env HalfCheetah-v5] [--timesteps 100000] [--device auto]
"""

from __future__ import annotations

import argparse
import time

from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_ppo_scale import ScalablePPO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="HalfCheetah-v5", help="gymnasium env id (default HalfCheetah-v5)")
    parser.add_argument("--timesteps", type=int, default=100_000, help="environment steps to train (default 100000)")
    parser.add_argument("--device", default="auto", help="torch device for policy and rollout (default auto)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    env = make_vec_env(args.env, n_envs=4, seed=args.seed)
    model = ScalablePPO(
        "MlpPolicy",
        env,
        n_steps=1024,  # rollout = 1024 steps x 4 envs = 4096 samples
        batch_size=1024,  # oversized minibatch (SB3's default is 64)
        grad_accum_steps=4,  # ... computed as 4 micro-batches of 256, one optimizer step
        n_epochs=10,
        learning_rate=1e-3,
        seed=args.seed,
        device=args.device,
        verbose=0,
    )
    start = time.perf_counter()
    model.learn(args.timesteps, progress_bar=True)
    train_seconds = time.perf_counter() - start

    eval_env = make_vec_env(args.env, n_envs=1, seed=args.seed + 1000)
    mean_return, std_return = evaluate_policy(model, eval_env, n_eval_episodes=5, deterministic=True)
    print(f"env={args.env} timesteps={args.timesteps} device={model.device}")
    print(f"mean return over 5 deterministic episodes: {mean_return:.1f} +/- {std_return:.1f}")
    print(f"wall time: {train_seconds:.1f} s training ({args.timesteps / train_seconds:.0f} steps/s)")


if __name__ == "__main__":
    main()
