"""PPO-Penalty: the KL-penalty objective of the PPO paper (section 4) instead of clipping.

``objective="kl_penalty"`` maximises ``r * A - beta * KL(pi_old || pi)`` with no clipping. After every update the
mean KL over the rollout is measured and beta is doubled when it exceeds ``kl_penalty_target * 1.5`` and halved
when it is below ``kl_penalty_target / 1.5`` (``kl_penalty_target=None`` keeps beta fixed). The current beta is
saved with the model. ``objective="clip_kl_penalty"`` uses both terms (as RLlib does).

SB3's log (``verbose=1``) shows the measured ``train/kl`` and the adapted ``train/kl_coef`` after every update.
Pendulum-v1 with the zoo's PPO hyperparameters; about 100k steps bring the return from about -1200 to -200.

    python examples/kl_penalty.py [--timesteps 100000] [--kl-target 0.01] [--seed 0]

``SB3_PPO_SCALE_SMOKE=1`` trains 2 updates (the CI smoke test).
"""

from __future__ import annotations

import argparse
import os

import torch as th
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_ppo_scale import ScalablePPO

SMOKE = os.environ.get("SB3_PPO_SCALE_SMOKE") == "1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=2048 if SMOKE else 100_000, help="env steps (default 100000)")
    parser.add_argument("--kl-target", type=float, default=0.01,
                        help="d_targ, the KL that beta steers towards (default 0.01)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    th.set_num_threads(1)  # small MLP: one thread is fastest, above all on a busy machine

    env = make_vec_env("Pendulum-v1", n_envs=4, seed=args.seed)
    model = ScalablePPO(
        "MlpPolicy",
        env,
        objective="kl_penalty",
        kl_coef=1.0,  # initial beta (the paper's)
        kl_penalty_target=args.kl_target,
        n_steps=256 if SMOKE else 1024,
        gamma=0.9,
        gae_lambda=0.95,
        n_epochs=10,
        learning_rate=1e-3,
        ent_coef=0.0,
        use_sde=True,
        sde_sample_freq=4,
        seed=args.seed,
        device="cpu",
        verbose=1,
    )
    model.learn(args.timesteps, log_interval=1 if SMOKE else 5)
    mean_return, std_return = evaluate_policy(model, model.get_env(), n_eval_episodes=1 if SMOKE else 10)
    print(f"final beta (kl_coef): {model.kl_beta:.4g}")
    print(f"mean evaluation return: {mean_return:.1f} +/- {std_return:.1f}")


if __name__ == "__main__":
    main()
