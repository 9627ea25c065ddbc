"""``sb3-ppo-scale train``, ``evaluate`` and ``bench``: zoo-style experiments with ScalablePPO, or with the
sb3-contrib classes (``train --algo scalable_maskable_ppo|scalable_recurrent_ppo``, see
:mod:`sb3_ppo_scale.experiments.algorithms`).

``train`` writes into its run folder (``--log-dir``, default ``logs/<entry>_seed<seed>``), created once the model
is built (a run that fails before training leaves no folder behind):

- ``model.zip``          the trained model (of the ``--algo`` class)
- ``vecnormalize.pkl``   VecNormalize statistics (only when the entry normalises)
- ``config.yml``         env id, entry, seed, the run's budget (``n_timesteps``), torch threads, evaluation
                         settings and the hyperparameters used (after ``--set`` overrides; their ``n_timesteps`` is
                         the run's budget too)
- ``tensorboard/``       TensorBoard logs
- ``monitor/``           per-env episode monitor CSVs
- ``evaluations.npz``    periodic evaluations (SB3 EvalCallback format) and ``best_model.zip``; only when at least
                         one evaluation ran (``--n-timesteps`` >= ``--eval-freq`` > 0)
- ``final_eval.json``    the evaluation after training
- ``checkpoint.pt``      the exact-resume checkpoint (``--checkpoint-every N``, SIGTERM/SIGINT, end of training;
                         ``--resume`` continues from it, see docs/checkpoints.md and sb3_ppo_scale.checkpoint)

A new run (no ``--resume``, or no checkpoint to resume) in the folder of an earlier run removes that run's files
above, except ``config.yml`` (rewritten) and ``tensorboard/`` (a subfolder per run), once its model is built.

``evaluate`` rebuilds the env from ``config.yml``, loads the model and statistics and reports the mean return.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sb3_ppo_scale import distributed as data_parallel
from sb3_ppo_scale.distributed import is_main_process
from sb3_ppo_scale import checkpoint as checkpointing
from sb3_ppo_scale.envs.processes import EnvWorkerError
from sb3_ppo_scale.experiments import bench as bench_module
from sb3_ppo_scale.experiments.algorithms import ALGORITHMS, DEFAULT_ALGO, algorithm, evaluate_policy
from sb3_ppo_scale.experiments.pipeline import (
    DEFAULT_THREADS,
    EVAL_SEED_OFFSET,
    VEC_ENV_KINDS,
    device_argument,
    path_part,
    seed_argument,
    set_threads,
)

#: What a ``train`` run writes into its folder besides ``config.yml``, ``monitor/`` and ``tensorboard/``
RUN_OUTPUTS = ("model.zip", "vecnormalize.pkl", "best_model.zip", "evaluations.npz", "final_eval.json",
               checkpointing.CHECKPOINT_NAME)
#: ``train``'s exit code when an env worker process died (:class:`~sb3_ppo_scale.envs.EnvWorkerError`): not a
#: usage error (2) and not a preemption (:data:`~sb3_ppo_scale.checkpoint.PREEMPTED_EXIT_CODE`, 75).
ENV_FAILURE_EXIT_CODE = 1
#: Seed offset of ``train``'s final evaluation (episodes differ from the periodic evaluations').
FINAL_EVAL_SEED_OFFSET = 2 * EVAL_SEED_OFFSET


def register(subparsers: Any) -> None:
    """Add the ``train``, ``evaluate`` and ``bench`` sub-commands (each sets ``func``)."""
    _add_train(subparsers.add_parser("train", help="train ScalablePPO from a zoo-style config entry"))
    _add_evaluate(subparsers.add_parser("evaluate", help="load a trained run and report its mean return"))
    bench = subparsers.add_parser("bench", help="learning benchmark: ScalablePPO vs SB3 PPO, same seeds and budget")
    bench_module.build_parser(bench)
    bench.set_defaults(func=lambda args: bench_module.main(args, command="sb3-ppo-scale bench"))


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads N``: torch's intra-op threads (default :data:`DEFAULT_THREADS`, measured for small MLPs)."""
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help=f"torch threads (default {DEFAULT_THREADS}: fastest for small MLPs, see "
                             "benchmarks/results/threads.md; raise it for CNNs or large networks)")


# ------------------------------------------------------------------------------------------------ train
def add_algo_argument(parser: argparse.ArgumentParser) -> None:
    """``--algo NAME``: which Scalable class to train (default scalable_ppo); a bad name is a one-line usage error
    listing the allowed ones."""
    parser.add_argument("--algo", choices=tuple(ALGORITHMS), default=DEFAULT_ALGO,
                        help=f"the algorithm (default {DEFAULT_ALGO}); its default config: scalable_ppo -> "
                             "configs/scalable_ppo.yml, scalable_maskable_ppo and scalable_recurrent_ppo -> "
                             "configs/contrib.yml")


def _add_train(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", required=True, help="Gymnasium env id, e.g. HalfCheetah-v5 or PongNoFrameskip-v4")
    add_algo_argument(parser)
    parser.add_argument("--config", default=None, help="zoo-style YAML (default: the --algo's config in the package's "
                                                       "configs/)")
    parser.add_argument("--variant", default=None, help="use the entry <env>@<variant>, e.g. gpu or cpu")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one hyperparameter (repeatable), e.g. --set n_envs=4 --set learning_rate=lin_1e-3")
    parser.add_argument("--seed", type=seed_argument, default=0)
    parser.add_argument("--device", type=device_argument, default="auto",
                        help="torch device for the policy: auto (default), cpu, cuda, cuda:<index> or mps")
    parser.add_argument("--n-timesteps", type=int, default=None, help="env steps (default: the entry's n_timesteps)")
    parser.add_argument("--vec-env", choices=VEC_ENV_KINDS, default=None,
                        help="how envs are vectorised (default: the entry's vec_env, else dummy): processes = worker "
                             "processes with several envs each; scale = the scale plan's pick; envpool needs "
                             "pip install 'sb3-ppo-scale[envpool]'")
    add_threads_argument(parser)
    parser.add_argument("--log-dir", default=None, help="run folder (default logs/<entry>_seed<seed>)")
    parser.add_argument("--eval-freq", type=int, default=10_000, help="env steps between evaluations (0: none)")
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--verbose", type=int, default=0)
    checkpointing.add_train_arguments(parser)
    parser.set_defaults(func=train)


def train(args: argparse.Namespace) -> int:
    """Train as the entry says; writes the run folder described in the module docstring. Returns 0, or
    :data:`~sb3_ppo_scale.checkpoint.PREEMPTED_EXIT_CODE` when SIGTERM/SIGINT stopped it after its checkpoint."""
    from sb3_ppo_scale.experiments import zoo

    set_threads(args.threads)
    for name in ("eval_freq", "eval_episodes"):
        if getattr(args, name) < (0 if name == "eval_freq" else 1):
            raise ValueError(f"--{name.replace('_', '-')} must be >= {0 if name == 'eval_freq' else 1}, "
                             f"got {getattr(args, name)}")
    overrides = zoo.parse_overrides(args.overrides)
    if args.vec_env is not None:
        overrides["vec_env"] = args.vec_env
    config = zoo.load_config(args.config, args.env, args.variant, overrides, algo=args.algo)
    if args.n_timesteps is not None and args.n_timesteps < 1:  # the entry's own is checked with the entry
        raise ValueError(f"--n-timesteps must be >= 1, got {args.n_timesteps}")
    n_timesteps = config.n_timesteps if args.n_timesteps is None else args.n_timesteps
    run_dir = Path(args.log_dir or Path("logs") / f"{path_part(config.entry)}_seed{args.seed}")
    checkpoint = checkpointing.train_checkpoint(run_dir, args.checkpoint_every)
    resume_from = checkpointing.checkpoint_to_resume(run_dir, args.resume)
    if resume_from is not None:
        _check_same_run(run_dir, config, args.seed)
    model, callback = _build_run(config, args, run_dir, n_timesteps, resume_from)
    main = is_main_process()  # under torchrun every rank trains; rank 0 alone evaluates and writes the run folder
    if main and resume_from is None:
        _clear_earlier_run(run_dir, model.n_envs)
    if main and 0 < n_timesteps < args.eval_freq:  # after the checks of the arguments, which are errors
        print(f"warning: --n-timesteps {n_timesteps} < --eval-freq {args.eval_freq}: no evaluation will run during "
              "training, so no best_model.zip or evaluations.npz (final_eval.json is still written); lower "
              "--eval-freq to evaluate", file=sys.stderr)
    try:
        checkpointing.learn_resumable(model, n_timesteps, checkpoint, callback=callback,
                                      tb_log_name=type(model).__name__,
                                      progress_bar=not args.no_progress and main)
    except checkpointing.TrainingPreempted as stopped:
        if main:  # every rank stops alike; one line says so
            print(f"sb3-ppo-scale train: {stopped}; run the same command with --resume to continue", file=sys.stderr,
                  flush=True)
        return checkpointing.PREEMPTED_EXIT_CODE
    except EnvWorkerError as died:
        print(f"sb3-ppo-scale train: {died}; {_where_to_resume(checkpoint.path)}", file=sys.stderr, flush=True)
        return ENV_FAILURE_EXIT_CODE
    if not main:
        return 0
    model.save(run_dir / "model.zip")
    vec_normalize = model.get_vec_normalize_env()
    if vec_normalize is not None:
        vec_normalize.save(str(run_dir / "vecnormalize.pkl"))
    result = _evaluate_run(run_dir, args.eval_episodes, args.device, deterministic=True,
                           seed=args.seed + FINAL_EVAL_SEED_OFFSET)
    (run_dir / "final_eval.json").write_text(json.dumps(result, indent=1))
    print(f"saved {run_dir}: mean return {result['mean_return']:.2f} +/- {result['std_return']:.2f} "
          f"over {result['episodes']} episodes")
    return 0


def _where_to_resume(checkpoint: Path) -> str:
    """What a run stopped by a dead env worker can resume from: its checkpoint (and at how many env steps), or
    nothing."""
    if not checkpoint.is_file():
        return "no checkpoint was written (--checkpoint-every N writes one every N env steps); the run starts anew"
    steps = checkpointing.read_checkpoint(checkpoint)["counters"]["num_timesteps"]
    return f"run the same command with --resume to continue from checkpoint {checkpoint} at {steps} env steps"


def _build_run(config: Any, args: argparse.Namespace, run_dir: Path, n_timesteps: int,
               resume_from: Path | None = None) -> tuple[Any, Any]:
    """Envs, model (from ``resume_from``, a checkpoint, if given), evaluation callback and ``config.yml`` of a run;
    the run folder (and any parent folder this created) is removed again when any of them fails."""
    from sb3_ppo_scale.experiments import zoo
    from sb3_ppo_scale.experiments.pipeline import PeriodicEvalCallback

    main = is_main_process()
    created = _first_missing(run_dir) if main else None
    try:
        env = zoo.make_envs(config, seed=args.seed, monitor_dir=str(run_dir / "monitor") if main else None)
        cls = algorithm(args.algo).cls
        if resume_from is not None:
            model = checkpointing.resume_train_model(resume_from, env, args.device, n_timesteps)
            if type(model) is not cls:
                raise ValueError(f"--algo {args.algo} trains {cls.__name__}, but checkpoint {resume_from} was written "
                                 f"by {type(model).__name__}: resume with the run's --algo")
        else:
            model = zoo.build_model(config, env, algo=cls, seed=args.seed, verbose=args.verbose,
                                    tensorboard_log=str(run_dir / "tensorboard"), **_placement(config, args))
        world = data_parallel.world_size()
        if world > 1:  # what learn() checks when the ranks meet, here already: a mistake leaves no run folder
            data_parallel.check_data_parallel(model, world, data_parallel.backend_for(model.device))
        callback = None
        if args.eval_freq > 0 and main:
            eval_env = zoo.make_envs(config, n_envs=1, seed=args.seed + EVAL_SEED_OFFSET, eval_env=True,
                                     vec_env_cls=_evaluation_vec_env(config))
            callback = PeriodicEvalCallback(eval_env, args.eval_freq, args.eval_episodes, eval_at_end=False,
                                            on_eval=_print_evaluation if args.verbose else None, save_dir=run_dir)
            if resume_from is not None:
                callback.continue_run(model.num_timesteps)
        if main:
            _write_run_config(run_dir, config, args, n_timesteps)
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    return model, callback


def _placement(config: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Where the model runs: ``--device``; with ``vec_env: scale`` (``--variant scale``) also the scale plan's
    collection device, update threads and CUDA graphs, unless the entry sets them itself. The plan is printed, and
    torch's threads for collection are the plan's (whatever ``--threads`` says)."""
    if config.vec_env != "scale":
        return {"device": args.device}
    from sb3_ppo_scale.envs import plan_scale

    kind = args.device.split(":")[0]
    if kind not in ("auto", "cpu", "cuda"):
        raise ValueError(f"vec_env: scale plans for the CPU and CUDA: --device must be auto, cpu, cuda or "
                         f"cuda:<index>, got {args.device!r}")
    plan = plan_scale(config.env_id, config.n_envs, device=kind)
    plan.apply_threads()
    args.threads = plan.torch_threads
    if is_main_process():
        print(plan.describe(), flush=True)
    placement = {**plan.model_kwargs(), "device": args.device if args.device.startswith("cuda:") else plan.device}
    return {key: value for key, value in placement.items() if key == "device" or key not in config.model_kwargs}


def _check_same_run(run_dir: Path, config: Any, seed: int) -> None:
    """``--resume`` continues the run its folder records (``config.yml``): the same env id, seed and hyperparameters
    (``--set``, ``--config``, ``--variant``), else ValueError naming what differs (the checkpoint's model would keep
    its own values while ``config.yml`` recorded the new ones). The budget and ``--algo`` are checked against the
    checkpoint itself; options that do not change training (``--device``, ``--threads``, evaluation) may change."""
    path = run_dir / "config.yml"
    if not path.is_file():  # a checkpoint written through the Python API: nothing recorded to compare with
        return
    saved = yaml.safe_load(path.read_text())
    differs = [f"{key} {saved.get(key)!r} -> {value!r}" for key, value in (("env_id", config.env_id), ("seed", seed))
               if key in saved and saved[key] != value]
    recorded, asked = saved.get("hyperparams", {}), config.hyperparams
    differs += [f"{key} {recorded.get(key)!r} -> {asked.get(key)!r}" for key in sorted(set(recorded) | set(asked))
                if key != "n_timesteps" and recorded.get(key) != asked.get(key)]
    if differs:
        raise ValueError(f"--resume continues the run in {run_dir} as recorded in its config.yml, but this command "
                         f"differs: {'; '.join(differs)}; resume with the run's own settings, or start a new run in "
                         "another --log-dir")


def _clear_earlier_run(run_dir: Path, n_envs: int) -> None:
    """A new run in a folder that holds an earlier one starts over: the earlier run's model, statistics, evaluations,
    checkpoint and Monitor CSVs go (``evaluate`` and ``--resume`` would read them as this run's), with one warning
    line. ``config.yml`` is already this run's; the Monitor CSVs of this run's ``n_envs`` envs and ``tensorboard/``
    (where each run gets a subfolder of its own) stay."""
    current = {f"{index}.monitor.csv" for index in range(n_envs)}
    stale = [run_dir / name for name in RUN_OUTPUTS if (run_dir / name).is_file()]
    stale += sorted(path for path in (run_dir / "monitor").glob("*.monitor.csv") if path.name not in current)
    if not stale:
        return
    print(f"warning: {run_dir} held an earlier run; this run starts over and removed its "
          f"{', '.join(str(path.relative_to(run_dir)) for path in stale)}", file=sys.stderr, flush=True)
    for path in stale:
        path.unlink()


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` (itself or a parent) that does not exist yet: what creating ``path`` creates
    (``logs/`` too when it is missing); None when ``path`` exists."""
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def _print_evaluation(result: Any) -> None:
    print(f"eval at {result.timesteps} steps: mean return {result.mean_return:.2f}, "
          f"mean episode length {result.mean_length:.1f}", flush=True)


def _evaluation_vec_env(config: Any) -> type | None:
    """One evaluation env needs no worker process; EnvPool envs stay EnvPool (their observations differ), and so do
    the scale plan's (one env: the same backend choice)."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    return DummyVecEnv if config.vec_env in ("subproc", "processes") else None


def _write_run_config(run_dir: Path, config: Any, args: argparse.Namespace, n_timesteps: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = {"algo": args.algo, "env_id": config.env_id, "entry": config.entry, "seed": args.seed,
             "n_timesteps": n_timesteps,
             "threads": args.threads, "vec_env": config.vec_env, "device": args.device,
             "eval_freq": args.eval_freq, "eval_episodes": args.eval_episodes,
             "config_file": str(args.config or algorithm(args.algo).config),
             "hyperparams": {**config.hyperparams, "n_timesteps": n_timesteps}}
    (run_dir / "config.yml").write_text(yaml.safe_dump(saved, sort_keys=False))


# ------------------------------------------------------------------------------------------------ evaluate
def _add_evaluate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-dir", required=True, help="the run folder written by train")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--device", type=device_argument, default="auto",
                        help="torch device for the policy: auto (default), cpu, cuda, cuda:<index> or mps")
    parser.add_argument("--seed", type=seed_argument, default=12345, help="seed of the evaluation env")
    parser.add_argument("--stochastic", action="store_true", help="sample actions (default: deterministic)")
    parser.add_argument("--best", action="store_true", help="load best_model.zip instead of model.zip")
    add_threads_argument(parser)
    parser.set_defaults(func=evaluate)


def evaluate(args: argparse.Namespace) -> int:
    """Print the mean return of a trained run (and a JSON line with it); returns 0."""
    set_threads(args.threads)
    if args.episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
    result = _evaluate_run(Path(args.log_dir), args.episodes, args.device, not args.stochastic, args.seed,
                           model_name="best_model.zip" if args.best else "model.zip")
    print(f"mean return {result['mean_return']:.2f} +/- {result['std_return']:.2f} over {result['episodes']} episodes")
    print(json.dumps(result))
    return 0


def _evaluate_run(run_dir: Path, episodes: int, device: str, deterministic: bool, seed: int,
                  model_name: str = "model.zip") -> dict[str, Any]:
    """Rebuild the eval env from ``config.yml`` (+ ``vecnormalize.pkl``), load the model (the class of the run's
    ``algo``; runs written before it was recorded are ScalablePPO's), run ``episodes``."""
    from sb3_ppo_scale.experiments import zoo

    saved = _read_run_config(run_dir)
    if not (run_dir / model_name).exists():
        raise FileNotFoundError(_missing_model(run_dir, model_name, saved))
    algo = saved.get("algo", DEFAULT_ALGO)
    config = zoo.config_from_hyperparams(saved["env_id"], saved["entry"], saved["hyperparams"], str(run_dir), algo)
    stats = run_dir / "vecnormalize.pkl"
    env = zoo.make_envs(config, n_envs=1, seed=seed, eval_env=True, vec_env_cls=_evaluation_vec_env(config),
                        normalize_stats=stats if stats.exists() else None)
    model = algorithm(algo).cls.load(run_dir / model_name, device=device)  # no env: n_envs of the run is kept
    returns, lengths = evaluate_policy(model, env, n_eval_episodes=episodes, deterministic=deterministic,
                                       return_episode_rewards=True)
    env.close()
    return {"env_id": config.env_id, "entry": config.entry, "model": model_name, "episodes": len(returns),
            "mean_return": float(np.mean(returns)), "std_return": float(np.std(returns)),
            "mean_length": float(np.mean(lengths)), "deterministic": deterministic}


def _read_run_config(run_dir: Path) -> dict[str, Any]:
    """``config.yml`` of a run folder; FileNotFoundError saying what a run folder is."""
    if not (run_dir / "config.yml").is_file():
        raise FileNotFoundError(f"{run_dir / 'config.yml'} not found: --log-dir must be a run folder written by "
                                "sb3-ppo-scale train")
    return yaml.safe_load((run_dir / "config.yml").read_text())


def _missing_model(run_dir: Path, model_name: str, saved: dict[str, Any]) -> str:
    """Why ``model_name`` is absent from a run folder."""
    if model_name != "best_model.zip":
        return f"{run_dir / model_name} not found: the run in {run_dir} did not finish training"
    eval_freq, budget = saved.get("eval_freq"), saved.get("n_timesteps")
    why = ("no evaluation ran during training" if eval_freq is None
           else f"training ran {budget} steps with --eval-freq {eval_freq}, so no evaluation ran" if eval_freq
           else "training ran with --eval-freq 0 (no evaluations)")
    return (f"no best_model.zip in {run_dir}: train saves it at each evaluation and {why}; evaluate the final "
            "model (drop --best) or train with --eval-freq below --n-timesteps")
