"""Save a trained model, load it elsewhere (no env needed) and evaluate it.

``ScalablePPO.load(path, device=...)`` works as SB3's ``PPO.load``: a model trained on a GPU loads on a CPU, the
ScalablePPO settings (batching, objective, the current KL beta) come with it, and loading for inference
allocates no rollout storage. Give ``env=`` to ``load`` to continue training. A model trained with
VecNormalize also needs its statistics (``VecNormalize.save`` / ``VecNormalize.load``); CartPole needs none.

    python examples/load_and_evaluate.py [--timesteps 50000] [--episodes 20] [--seed 0]

``SB3_PPO_SCALE_SMOKE=1`` trains 1024 steps and evaluates 2 episodes (the CI smoke test).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import torch as th
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_ppo_scale import ScalablePPO

SMOKE = os.environ.get("SB3_PPO_SCALE_SMOKE") == "1"
ENV_ID = "CartPole-v1"


def train_and_save(path: Path, timesteps: int, seed: int) -> np.ndarray:
    """Train on CartPole-v1 (zoo hyperparameters, 8 envs), save to ``path``; return the model's actions on 16 fixed
    observations, to compare with the loaded model's."""
    env = make_vec_env(ENV_ID, n_envs=8, seed=seed)
    model = ScalablePPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                        ent_coef=0.0, learning_rate=1e-3, clip_range=0.2, seed=seed, device="cpu")
    model.learn(timesteps)
    model.save(path)
    actions, _ = model.predict(probe_observations(), deterministic=True)
    return actions


def probe_observations() -> np.ndarray:
    """16 fixed CartPole observations inside the observation space."""
    return np.random.default_rng(0).uniform(-0.2, 0.2, size=(16, 4)).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=1024 if SMOKE else 50_000, help="env steps (default 50000)")
    parser.add_argument("--episodes", type=int, default=2 if SMOKE else 20, help="evaluation episodes (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    th.set_num_threads(1)  # small MLP: one thread is fastest, above all on a busy machine

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cartpole_scalable_ppo.zip"
        trained_actions = train_and_save(path, args.timesteps, args.seed)
        print(f"saved {path.name} ({path.stat().st_size / 1024:.0f} KiB)")
        model = ScalablePPO.load(path, device="cpu")  # no env: inference only

    loaded_actions, _ = model.predict(probe_observations(), deterministic=True)
    print(f"loaded model gives the trained model's actions: {bool(np.array_equal(trained_actions, loaded_actions))}")
    eval_env = make_vec_env(ENV_ID, n_envs=1, seed=args.seed + 1000)
    mean_return, std_return = evaluate_policy(model, eval_env, n_eval_episodes=args.episodes, deterministic=True)
    print(f"CartPole-v1: 500 is the most an episode can return; evaluated over {args.episodes} episodes")
    print(f"mean evaluation return: {mean_return:.1f} +/- {std_return:.1f}")


if __name__ == "__main__":
    main()
