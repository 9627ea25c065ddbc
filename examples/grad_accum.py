"""A big logical minibatch on a small GPU: ``batch_size`` with ``grad_accum_steps``.

Large-batch PPO (many envs, a minibatch of tens of thousands of samples, few optimizer steps per rollout) runs
out of GPU memory long before it runs out of compute: activation memory grows with the minibatch. With
``grad_accum_steps=k`` ScalablePPO computes each logical minibatch of ``batch_size`` samples as ``k``
micro-batches of ``batch_size / k``, accumulates their gradients and takes one gradient clip and one optimizer
step, so peak activation memory scales with ``batch_size / k`` while the update stays the big-batch one
(advantages normalised over the logical minibatch, ``target_kl`` decided on it). On a CPU or a large GPU leave
``grad_accum_steps=1``: it only costs time.

Part 1 checks the claim: one rollout's update with ``grad_accum_steps=4`` against ``grad_accum_steps=1`` from the
same seed; the parameters agree to float rounding (on CUDA it also prints both peak memories; with this small
MLP the activations are a small part of them, the gap grows with the network and the batch).
Part 2 trains Pendulum-v1 with 16 envs and a logical minibatch of 1024 in 4 micro-batches of 256.

    python examples/grad_accum.py [--timesteps 200000] [--device auto] [--seed 0]

``SB3_PPO_SCALE_SMOKE=1`` runs part 1 on a small rollout and two updates of part 2 (the CI smoke test).
"""

from __future__ import annotations

import argparse
import os

import torch as th
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_ppo_scale import ScalablePPO

SMOKE = os.environ.get("SB3_PPO_SCALE_SMOKE") == "1"
N_ENVS = 16
N_STEPS = 64 if SMOKE else 256  # rollout: 16 x 256 = 4096 samples
BATCH_SIZE = 1024  # logical minibatch, 16 x SB3's default 64: 4 optimizer steps per epoch (1 in smoke mode)
ACCUM = 4  # micro-batches of 256


def make_model(grad_accum_steps: int, device: str, seed: int, verbose: int = 0) -> ScalablePPO:
    """Pendulum-v1, zoo hyperparameters (gamma 0.9, lr 1e-3, gSDE) with 16 envs and a big logical minibatch."""
    env = make_vec_env("Pendulum-v1", n_envs=N_ENVS, seed=seed)
    return ScalablePPO("MlpPolicy", env, n_steps=N_STEPS, batch_size=BATCH_SIZE, grad_accum_steps=grad_accum_steps,
                       n_epochs=10, gamma=0.9, gae_lambda=0.95, learning_rate=1e-3, use_sde=True, sde_sample_freq=4,
                       seed=seed, device=device, verbose=verbose)


def one_update(grad_accum_steps: int, device: str, seed: int) -> tuple[th.Tensor, int | None]:
    """Parameters after one rollout and its update, and the peak CUDA memory of the run (None on a CPU)."""
    model = make_model(grad_accum_steps, device, seed)
    if model.device.type == "cuda":
        th.cuda.reset_peak_memory_stats(model.device)
    model.learn(N_ENVS * N_STEPS)
    peak = th.cuda.max_memory_allocated(model.device) if model.device.type == "cuda" else None
    return th.nn.utils.parameters_to_vector(model.policy.parameters()).detach().cpu(), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=2 * N_ENVS * N_STEPS if SMOKE else 200_000,
                        help="env steps of part 2 (default 200000)")
    parser.add_argument("--device", default="auto", help="torch device (default auto: CUDA if available)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    th.set_num_threads(1)  # small MLP: one thread is fastest, above all on a busy machine

    big, big_peak = one_update(1, args.device, args.seed)
    accumulated, accum_peak = one_update(ACCUM, args.device, args.seed)
    print(f"logical minibatch {BATCH_SIZE} samples: {ACCUM} micro-batches of {BATCH_SIZE // ACCUM}")
    if big_peak is not None and accum_peak is not None:
        print(f"peak CUDA memory of one update: {big_peak / 2**20:.1f} MiB in one batch, "
              f"{accum_peak / 2**20:.1f} MiB accumulated")
    difference = (big - accumulated).abs().max()
    print(f"max |parameter difference| after one update, accumulated vs one batch: {difference:.2e}")

    model = make_model(ACCUM, args.device, args.seed, verbose=1)
    model.learn(args.timesteps, log_interval=10)
    mean_return, std_return = evaluate_policy(model, model.get_env(), n_eval_episodes=N_ENVS)
    print("Pendulum-v1: an untrained policy scores about -1200, a solved one about -200")
    print(f"mean evaluation return: {mean_return:.1f} +/- {std_return:.1f}")


if __name__ == "__main__":
    main()
