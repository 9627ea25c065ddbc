"""``sb3-ppo-scale train``, ``evaluate`` and ``bench``: zoo-style experiments with ScalablePPO.

``train`` writes into its run folder (``--log-dir``, default ``logs/<entry>_seed<seed>``):

- ``model.zip``          the trained ScalablePPO model
- ``vecnormalize.pkl``   VecNormalize statistics (only when the entry normalises)
- ``config.yml``         env id, entry, seed and the hyperparameters used (after ``--set`` overrides)
- ``tensorboard/``       TensorBoard logs
- ``monitor/``           per-env episode monitor CSVs
- ``evaluations.npz``    periodic evaluations (SB3 EvalCallback format) and ``best_model.zip``
- ``final_eval.json``    the evaluation after training

``evaluate`` rebuilds the env from ``config.yml``, loads the model and statistics and reports the mean return.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sb3_ppo_scale.experiments import bench as bench_module


def register(subparsers: Any) -> None:
    """Add the ``train``, ``evaluate`` and ``bench`` sub-commands (each sets ``func``)."""
    _add_train(subparsers.add_parser("train", help="train ScalablePPO from a zoo-style config entry"))
    _add_evaluate(subparsers.add_parser("evaluate", help="load a trained run and report its mean return"))
    bench = subparsers.add_parser("bench", help="learning benchmark: ScalablePPO vs SB3 PPO, same seeds and budget")
    bench_module.build_parser(bench)
    bench.set_defaults(func=lambda args: bench_module.main(args, command="sb3-ppo-scale bench"))


# ------------------------------------------------------------------------------------------------ train
def _add_train(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", required=True, help="Gymnasium env id, e.g. HalfCheetah-v5 or PongNoFrameskip-v4")
    parser.add_argument("--config", default=None, help="zoo-style YAML (default: hyperparams/scalable_ppo.yml)")
    parser.add_argument("--variant", default=None, help="use the entry <env>@<variant>, e.g. gpu or cpu")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one hyperparameter (repeatable), e.g. --set n_envs=4 --set learning_rate=lin_1e-3")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="torch device for the policy (default auto)")
    parser.add_argument("--n-timesteps", type=int, default=None, help="env steps (default: the entry's n_timesteps)")
    parser.add_argument("--log-dir", default=None, help="run folder (default logs/<entry>_seed<seed>)")
    parser.add_argument("--eval-freq", type=int, default=10_000, help="env steps between evaluations (0: none)")
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--verbose", type=int, default=0)
    parser.set_defaults(func=train)


def train(args: argparse.Namespace) -> int:
    """Train as the entry says; writes the run folder described in the module docstring. Returns 0."""
    from stable_baselines3.common.callbacks import EvalCallback

    from sb3_ppo_scale.experiments import zoo

    config = zoo.load_config(args.config, args.env, args.variant, zoo.parse_overrides(args.overrides))
    n_timesteps = config.n_timesteps if args.n_timesteps is None else args.n_timesteps
    if n_timesteps < 1:
        raise ValueError(f"--n-timesteps must be >= 1, got {n_timesteps}")
    run_dir = Path(args.log_dir or Path("logs") / f"{config.entry.replace('/', '_')}_seed{args.seed}")
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_run_config(run_dir, config, args, n_timesteps)
    env = zoo.make_envs(config, seed=args.seed, monitor_dir=str(run_dir / "monitor"))
    model = zoo.build_model(config, env, seed=args.seed, device=args.device, verbose=args.verbose,
                            tensorboard_log=str(run_dir / "tensorboard"))
    callback = None
    if args.eval_freq > 0:
        eval_env = zoo.make_envs(config, n_envs=1, seed=args.seed + 10_000, eval_env=True)
        callback = EvalCallback(eval_env, eval_freq=max(args.eval_freq // config.n_envs, 1),
                                n_eval_episodes=args.eval_episodes, log_path=str(run_dir),
                                best_model_save_path=str(run_dir), verbose=args.verbose)
    model.learn(total_timesteps=n_timesteps, callback=callback, progress_bar=not args.no_progress,
                tb_log_name="ScalablePPO")
    model.save(run_dir / "model.zip")
    vec_normalize = model.get_vec_normalize_env()
    if vec_normalize is not None:
        vec_normalize.save(str(run_dir / "vecnormalize.pkl"))
    result = _evaluate_run(run_dir, args.eval_episodes, args.device, deterministic=True, seed=args.seed + 20_000)
    (run_dir / "final_eval.json").write_text(json.dumps(result, indent=1))
    print(f"saved {run_dir}: mean return {result['mean_return']:.2f} +/- {result['std_return']:.2f} "
          f"over {result['episodes']} episodes")
    return 0


def _write_run_config(run_dir: Path, config: Any, args: argparse.Namespace, n_timesteps: int) -> None:
    saved = {"env_id": config.env_id, "entry": config.entry, "seed": args.seed, "n_timesteps": n_timesteps,
             "config_file": str(args.config or "hyperparams/scalable_ppo.yml"), "hyperparams": config.hyperparams}
    (run_dir / "config.yml").write_text(yaml.safe_dump(saved, sort_keys=False))


# ------------------------------------------------------------------------------------------------ evaluate
def _add_evaluate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-dir", required=True, help="the run folder written by train")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the evaluation env")
    parser.add_argument("--stochastic", action="store_true", help="sample actions (default: deterministic)")
    parser.add_argument("--best", action="store_true", help="load best_model.zip instead of model.zip")
    parser.set_defaults(func=evaluate)


def evaluate(args: argparse.Namespace) -> int:
    """Print the mean return of a trained run (and a JSON line with it); returns 0."""
    if args.episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
    result = _evaluate_run(Path(args.log_dir), args.episodes, args.device, not args.stochastic, args.seed,
                           model_name="best_model.zip" if args.best else "model.zip")
    print(f"mean return {result['mean_return']:.2f} +/- {result['std_return']:.2f} over {result['episodes']} episodes")
    print(json.dumps(result))
    return 0


def _evaluate_run(run_dir: Path, episodes: int, device: str, deterministic: bool, seed: int,
                  model_name: str = "model.zip") -> dict[str, Any]:
    """Rebuild the eval env from ``config.yml`` (+ ``vecnormalize.pkl``), load the model, run ``episodes``."""
    from stable_baselines3.common.evaluation import evaluate_policy

    from sb3_ppo_scale import ScalablePPO
    from sb3_ppo_scale.experiments import zoo

    for name in ("config.yml", model_name):
        if not (run_dir / name).exists():
            raise FileNotFoundError(f"{run_dir / name} not found: --log-dir must be a run folder written by train")
    saved = yaml.safe_load((run_dir / "config.yml").read_text())
    config = zoo.config_from_hyperparams(saved["env_id"], saved["entry"], saved["hyperparams"], str(run_dir))
    stats = run_dir / "vecnormalize.pkl"
    env = zoo.make_envs(config, n_envs=1, seed=seed, eval_env=True,
                        normalize_stats=stats if stats.exists() else None)
    model = ScalablePPO.load(run_dir / model_name, device=device)  # no env: n_envs of the run is kept
    returns, lengths = evaluate_policy(model, env, n_eval_episodes=episodes, deterministic=deterministic,
                                       return_episode_rewards=True)
    env.close()
    return {"env_id": config.env_id, "entry": config.entry, "model": model_name, "episodes": len(returns),
            "mean_return": float(np.mean(returns)), "std_return": float(np.std(returns)),
            "mean_length": float(np.mean(lengths)), "deterministic": deterministic}
