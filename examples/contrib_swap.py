"""sb3-contrib users swap one import too: ``ScalableMaskablePPO`` and ``ScalableRecurrentPPO``.

Part 1, masking: MaskablePPO and ScalableMaskablePPO train sb3-contrib's own masking env (20 actions, 10 of them
masked each step) from the same seed; the parameters end equal bit for bit, and the masked evaluation scores alike.
Part 2, LSTM: RecurrentPPO and ScalableRecurrentPPO train the velocity-masked CartPole (``CartPoleNoVel-v1``, rl_zoo3's
``ppo_lstm`` hyperparameters) from the same seed, again ending equal. Then ``batched_sequences=True`` runs each
minibatch of sequences through the LSTM in one call instead of contrib's per-step loop: not bit-identical (float
rounding), opt-in, and its update is several times faster (docs/contrib.md measures it). Each run prints its wall
time; the last line is the batched model's evaluation return (500 is CartPole's maximum).

    python examples/contrib_swap.py [--timesteps 100000] [--seed 0]

``SB3_PPO_SCALE_SMOKE=1`` trains one or two rollouts per model (the CI smoke test).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch as th
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from sb3_contrib.common.maskable.evaluation import evaluate_policy as evaluate_masked
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.utils import LinearSchedule, set_random_seed
from stable_baselines3.common.vec_env import VecNormalize

from sb3_ppo_scale import ScalableMaskablePPO, ScalableRecurrentPPO
from sb3_ppo_scale.experiments.algorithms import register_envs

SMOKE = os.environ.get("SB3_PPO_SCALE_SMOKE") == "1"
#: rl_zoo3 2.9.2's ppo_lstm CartPoleNoVel-v1 entry (configs/contrib.yml; with 8 envs, VecNormalize, a budget of 1e5
#: steps), its lin_0.001 and lin_0.2 as SB3's linear schedules
LSTM_HYPERPARAMS: dict[str, Any] = dict(
    n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
    learning_rate=LinearSchedule(1e-3, 0.0, 1.0), clip_range=LinearSchedule(0.2, 0.0, 1.0),
    policy_kwargs=dict(ortho_init=False, activation_fn=th.nn.ReLU, lstm_hidden_size=64, enable_critic_lstm=True,
                       net_arch=dict(pi=[64], vf=[64])),
)


def timed_learn(model: Any, timesteps: int, label: str = "") -> Any:
    """``model.learn(timesteps)``, printing the class name (or ``label``) and the wall time."""
    start = time.perf_counter()
    model.learn(timesteps)
    print(f"  {label or type(model).__name__:<22s} {time.perf_counter() - start:6.1f} s")
    return model


def same_parameters(a: Any, b: Any) -> bool:
    """Every policy parameter ``torch.equal`` (and the optimizer steps taken alike)."""
    return all(th.equal(p, q) for p, q in zip(a.policy.parameters(), b.policy.parameters()))


def masking(timesteps: int, seed: int) -> None:
    """Part 1: MaskablePPO against ScalableMaskablePPO on InvalidActionEnvDiscrete (a return of 100 is every step
    right; a uniform guess among the 10 valid actions scores about 10)."""
    def masking_env() -> InvalidActionEnvDiscrete:
        return InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10)

    models = [timed_learn(cls("MlpPolicy", make_vec_env(masking_env, seed=seed), n_steps=256, seed=seed,
                              device="cpu"), timesteps)
              for cls in (MaskablePPO, ScalableMaskablePPO)]
    print(f"  parameters equal bit for bit: {same_parameters(*models)}")
    for model in models:
        set_random_seed(seed + 1000)  # the env draws its masks from NumPy's global RNG: the same episodes for both
        mean, std = evaluate_masked(model, make_vec_env(masking_env, seed=seed + 1000), n_eval_episodes=5)
        print(f"  {type(model).__name__:<22s} masked evaluation return {mean:.1f} +/- {std:.1f}")


def recurrent(timesteps: int, seed: int) -> float:
    """Part 2: RecurrentPPO against ScalableRecurrentPPO, then the batched LSTM; returns the batched model's mean
    evaluation return."""
    register_envs("CartPoleNoVel-v1")

    def build(cls: type, **extra: Any) -> Any:
        env = VecNormalize(make_vec_env("CartPoleNoVel-v1", n_envs=8, seed=seed))
        return cls("MlpLstmPolicy", env, seed=seed, device="cpu", **LSTM_HYPERPARAMS, **extra)

    contrib, scalable = (timed_learn(build(cls), timesteps) for cls in (RecurrentPPO, ScalableRecurrentPPO))
    print(f"  parameters equal bit for bit: {same_parameters(contrib, scalable)}")
    batched = timed_learn(build(ScalableRecurrentPPO, batched_sequences=True), timesteps,
                          "ScalableRecurrentPPO(batched_sequences=True)")
    print("  (batched_sequences=True: not bit-identical by design, float rounding of the batched LSTM call)")
    eval_env = VecNormalize(make_vec_env("CartPoleNoVel-v1", n_envs=1, seed=seed + 1000), training=False,
                            norm_reward=False)
    eval_env.obs_rms = batched.get_vec_normalize_env().obs_rms  # the training statistics
    mean, std = evaluate_policy(batched, eval_env, n_eval_episodes=1 if SMOKE else 10)
    print(f"batched ScalableRecurrentPPO evaluation return: {mean:.1f} +/- {std:.1f}")
    return float(mean)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=512 if SMOKE else 100_000,
                        help="env steps per model (default 100000, rl_zoo3's budget for CartPoleNoVel)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every model and env (default 0)")
    args = parser.parse_args(argv)
    th.set_num_threads(1)  # small networks on a CPU: one thread is fastest
    print(f"Part 1: MaskablePPO -> ScalableMaskablePPO, {args.timesteps} steps each")
    masking(args.timesteps, args.seed)
    print(f"Part 2: RecurrentPPO -> ScalableRecurrentPPO on CartPoleNoVel-v1, {args.timesteps} steps each")
    recurrent(args.timesteps, args.seed)


if __name__ == "__main__":
    main()
