"""Learning benchmark: ScalablePPO's config variants against SB3 PPO, the same config on both sides.

This module runs the benchmark; :mod:`sb3_ppo_scale.experiments.learning_report` reads its run files and writes the
report, and :mod:`sb3_ppo_scale.experiments.algorithms` parses the labels both use.

Protocol (docs/benchmarks.md states it in full):

- A run is labelled ``<algo>[@<variant>]``: ``algo`` is ``sb3_ppo`` (SB3's ``PPO``) or ``scalable_ppo``
  (``ScalablePPO``), and the config is the entry ``<task>[@<variant>]`` of ``--config``. Every ScalablePPO label
  is paired with SB3 PPO under the same entry (``scalable_ppo@cpu`` adds ``sb3_ppo@cpu``; ``--no-pairs`` turns
  this off), so the table shows the config's effect (``sb3_ppo@cpu`` vs the baseline) apart from the plugin's
  (``scalable_ppo@cpu`` vs ``sb3_ppo@cpu``). SB3 PPO gets the entry without ScalablePPO's execution-only keys
  (:data:`EXECUTION_ONLY_KEYS`, which do not change the maths); an entry with other ScalablePPO-only keys has no
  SB3 pair (the run is skipped and said so).
- sb3-contrib's classes the same way: ``scalable_maskable_ppo`` / ``scalable_recurrent_ppo`` labels pair with
  ``maskable_ppo`` / ``recurrent_ppo`` (MaskablePPO, RecurrentPPO) under the same entry of ``configs/contrib.yml``
  (``batched_sequences`` is execution-only: dropped for RecurrentPPO), e.g.
  ``sb3-ppo-scale bench --tasks CartPoleNoVel-v1 --algos scalable_recurrent_ppo@batched`` (the baseline is then
  ``recurrent_ppo``).
- Labels of earlier results (``scalable_ppo`` = ``@cpu``, ``scalable_ppo_gpu``, ...) stay valid
  (``algorithms.LEGACY_LABELS``).
- Each run is one single-threaded process; at most ``--workers`` (default 1) run at once. Every run writes
  ``<out>/runs/<task>__<label>__seed<k>.json``; existing files are skipped (resumable) when they hold the run the
  command asks for (same budget, evaluation settings and entry hyperparameters; else an error names the difference);
  ``--report-only`` only rebuilds the tables and plots.
- Within a run, a checkpoint every ``--checkpoint-every`` env steps (default 100 000; 0: none) and on
  SIGTERM/SIGINT, in ``<out>/checkpoints/`` (:mod:`sb3_ppo_scale.experiments.bench_resume`): the same command resumes
  the run from it, exactly, and its run JSON is that of the uninterrupted run but for the clocks and ``resumed_at``.
  SIGTERM/SIGINT to bench reach its workers; bench exits with code 75 once their checkpoints are written.
- Per evaluation (every ``--eval-every`` env steps, ``--eval-episodes`` deterministic episodes, VecNormalize
  statistics frozen, rewards unnormalised) the run JSON records the mean return, mean episode length, mean
  forward distance (x position at the episode's end minus at its start, MuJoCo envs; ``null`` elsewhere), the
  mean length of the last 100 training episodes, and the training wall-clock and CPU seconds (evaluation and
  checkpoints excluded). The final evaluation (``--final-episodes`` episodes) follows the last update. Evaluation
  runs on Gymnasium's envs in one process, also for entries with ``vec_env: envpool`` / ``scale``.
- Threshold per task: ``max(--threshold-frac x the baseline label's mean final return, floor)``, with the floors
  of ``learning_report.THRESHOLD_FLOORS`` set above what standing still earns (Hopper-v5 and Ant-v5: 1500,
  Humanoid-v5: 6000). Steps / seconds / CPU seconds to threshold: at the first evaluation whose mean return reaches it.
- Reported (rliable, 95% stratified bootstrap intervals): per task and label, IQM and mean over seeds of the returns
  and forward distance, mean of times and steps/s; over tasks, IQM and mean of normalised final returns (random
  policy 0, a reference return 1), the probability of improvement of each Scalable label over each label of the
  classes they extend (the baseline first; per task the strongest of them named, and over those at once), a
  performance profile PNG, and per task the curves (IQM and band) against env steps and wall-clock seconds, and for
  each label the evaluations where its IQM return curve leaves the baseline's band.

    sb3-ppo-scale bench --tasks Hopper-v5 --algos sb3_ppo scalable_ppo@cpu --budget 300000 --seeds 0 1 2
    python -m sb3_ppo_scale.experiments.bench --tasks Hopper-v5 --budget 20000 --seeds 0   # the same module
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from sb3_ppo_scale import stop_signals
from sb3_ppo_scale.checkpoint import PREEMPTED_EXIT_CODE, TrainingPreempted, learn_resumable
from sb3_ppo_scale.core.update.lr import KLAdaptiveLR
from sb3_ppo_scale.experiments import learning_report
from sb3_ppo_scale.experiments.algorithms import ALGO_CLASSES, BASELINES, family, label_order, parse_label, with_pairs
from sb3_ppo_scale.experiments.bench_resume import (
    DEFAULT_CHECKPOINT_EVERY,
    UNCHECKPOINTED,
    RunCheckpoint,
    read_sidecar,
    remove_checkpoint,
    resume,
    run_in_workers,
    sidecar_path,
    stop_requested,
)
from sb3_ppo_scale.experiments.pipeline import EVAL_SEED_OFFSET, path_part, seed_argument

#: results land under the working directory unless ``--out`` says otherwise
DEFAULT_OUT = Path("bench_results")
#: the labels a benchmark runs without ``--algos``
DEFAULT_ALGOS = ["sb3_ppo", "scalable_ppo@cpu"]
#: Scalable arguments that change how an update is computed, not what it computes: dropped for the baseline classes
EXECUTION_ONLY_KEYS = ("grad_accum_steps", "buffer_device", "cuda_graphs", "compile_loss", "batched_sequences",
                       "update_threads")


# ------------------------------------------------------------------------------------------------ evaluation
class ForwardDistance(gym.Wrapper):
    """Adds ``info["forward_distance"]``: x position now minus at the last reset (MuJoCo: ``data.qpos[0]``, in
    metres), or ``info["x_position"]`` where the env reports it; absent for envs with neither. Its episode state (the
    x at the reset) is captured and restored with the env's (:mod:`sb3_ppo_scale.envs.episodes`)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._start: float | None = None

    def _x(self, info: dict[str, Any]) -> float | None:
        data = getattr(self.env.unwrapped, "data", None)
        if data is not None and hasattr(data, "qpos"):
            return float(data.qpos[0])
        return float(info["x_position"]) if "x_position" in info else None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._start = self._x(info)
        return obs, info

    def get_episode_state(self) -> float | None:
        return self._start

    def set_episode_state(self, state: float | None) -> None:
        self._start = state

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        x = self._x(info)
        if x is not None and self._start is not None:
            info["forward_distance"] = x - self._start
        return obs, reward, terminated, truncated, info


def _make_callback(eval_env: Any, eval_every: int, episodes: int) -> Any:
    """The experiments' one evaluation callback: at the start, then at the first rollout start after every
    ``eval_every`` steps; forward distance recorded; evaluation time excluded from the clocks."""
    from sb3_ppo_scale.experiments.pipeline import PeriodicEvalCallback

    return PeriodicEvalCallback(eval_env, eval_every, n_episodes=episodes, eval_at_start=True, eval_at_end=False,
                                info_keys=("forward_distance",), at_rollout_start=True)


def _curve(callback: Any) -> list[dict[str, Any]]:
    """The callback's evaluations as the run JSON's ``curve`` points."""
    return [{"steps": e.timesteps, "train_s": e.train_s, "cpu_s": e.cpu_s, "return": e.mean_return,
             "length": e.mean_length, "forward_distance": e.episode_info.get("forward_distance"),
             "train_length": e.train_length} for e in callback.evaluations]


# ------------------------------------------------------------------------------------------------ one run
def _config_for(config: Any, algo: str) -> tuple[Any, list[str]]:
    """The config a baseline class (SB3 PPO, MaskablePPO, RecurrentPPO) runs: execution-only keys dropped
    (returned); other Scalable-only keys: ValueError."""
    import dataclasses

    if algo not in BASELINES:
        return config, []
    if isinstance(config.model_kwargs.get("learning_rate"), KLAdaptiveLR):  # SB3 would keep it constant, silently
        name = ALGO_CLASSES[algo].rpartition(".")[2]
        raise ValueError(f"{name} does not take learning_rate kl_adaptive (entry {config.entry!r}; Scalable-only)")
    dropped = sorted(k for k in config.model_kwargs if k in EXECUTION_ONLY_KEYS)
    kwargs = {k: v for k, v in config.model_kwargs.items() if k not in EXECUTION_ONLY_KEYS}
    return dataclasses.replace(config, model_kwargs=kwargs), dropped


def run_one(task: str, label: str, seed: int, budget: int, eval_every: int, eval_episodes: int, final_episodes: int,
            config_path: str | None, out_file: str, workers: int = 1, checkpoint: str | None = None,
            checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY) -> str:
    """Train one (task, label, seed) for ``budget`` env steps and write its JSON result; returns the file path.
    ``config_path`` None: the label's algorithm's config (``configs/scalable_ppo.yml`` or ``configs/contrib.yml``).
    ``workers``: how many runs the benchmark runs at once (recorded with the box's load, :func:`box_conditions`).
    ``checkpoint``: the run's checkpoint file (None: no mid-run checkpoints; so too for the labels of
    :data:`~sb3_ppo_scale.experiments.bench_resume.UNCHECKPOINTED`): resumed from when it exists, written every
    ``checkpoint_every`` env steps (>= 1; default 100 000) and on SIGTERM/SIGINT (then
    :class:`~sb3_ppo_scale.checkpoint.TrainingPreempted` is raised and no JSON is written), deleted with its sidecar
    once the JSON is written."""
    import importlib

    import torch as th

    from sb3_ppo_scale.experiments import zoo

    th.set_num_threads(1)
    algo, variant = parse_label(label)
    config, dropped = _config_for(zoo.load_config(config_path, task, variant, algo=family(algo).name), algo)
    module, _, name = ALGO_CLASSES[algo].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    settings = {"budget": budget, "eval_every": eval_every, "eval_episodes": eval_episodes,
                "final_episodes": final_episodes, "hyperparams": recorded_hyperparams(config, dropped)}
    path = None if checkpoint is None or algo in UNCHECKPOINTED else Path(checkpoint)
    box = None if path is not None and path.is_file() else box_conditions(task, workers)  # after the config (envs)
    env = zoo.make_envs(config, seed=seed)
    eval_env = evaluation_envs(config, eval_episodes, seed)
    check_same_observations(env, eval_env, config)
    timer = _make_callback(eval_env, eval_every, eval_episodes)
    if box is None:
        model, run, on_disk = _resumed(path, env, cls, timer, settings)
    else:
        model = zoo.build_model(config, env, algo=cls, seed=seed, device="cpu")
        run, on_disk = {"settings": settings, "box": box, "resumed_at": []}, None
    if path is None:
        model.learn(total_timesteps=budget, callback=[stop_signals.StopOnSignal(), timer])
    else:
        learn_resumable(model, budget, RunCheckpoint(path, checkpoint_every, timer, run, on_disk), callback=timer)
    timer.evaluate(final_episodes)
    _write_json(Path(out_file), _result(task, label, algo, seed, config, dropped, model, timer, run))
    if path is not None:
        remove_checkpoint(path)
    return out_file


def _resumed(path: Path, env: Any, cls: type, timer: Any, settings: dict[str, Any]) -> tuple[Any, dict[str, Any], Any]:
    """:func:`~sb3_ppo_scale.experiments.bench_resume.resume`, and ValueError if the checkpoint's run was made with
    other ``settings`` (budget, evaluation settings, hyperparameters) than these."""
    model, run, on_disk = resume(path, env, cls, timer)
    if run["settings"] != settings:
        raise ValueError(f"{path} holds a run with other settings ({run['settings']}) than these ({settings}): delete "
                         f"it and {sidecar_path(path).name} to start the run anew")
    return model, run, on_disk


def _result(task: str, label: str, algo: str, seed: int, config: Any, dropped: list[str], model: Any, timer: Any,
            run: dict[str, Any]) -> dict[str, Any]:
    """The run JSON of a finished run (``run``: its settings, box and ``resumed_at``)."""
    curve = _curve(timer)
    last = curve[-1]
    settings = run["settings"]
    return {
        "task": task, "algo": label, "algo_class": ALGO_CLASSES[algo], "seed": seed, "budget": settings["budget"],
        "entry": config.entry, "dropped_for_sb3": dropped, "hyperparams": settings["hyperparams"],
        "steps": int(model.num_timesteps), "train_s": last["train_s"], "cpu_s": last["cpu_s"],
        "final_return": last["return"], "final_length": last["length"],
        "final_forward_distance": last["forward_distance"], "steps_per_s": model.num_timesteps / last["train_s"],
        "torch_threads": 1, "eval_every": settings["eval_every"], "eval_episodes": settings["eval_episodes"],
        "final_episodes": settings["final_episodes"], "curve": curve, "box": run["box"],
        "resumed_at": run["resumed_at"],
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented JSON in ``path``, replacing it whole (a kill while writing leaves no partial run file,
    which bench would take for a finished run)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=1))
    os.replace(temporary, path)


def evaluation_envs(config: Any, n_episodes: int, seed: int) -> Any:
    """A run's evaluation envs: ``min(n_episodes, 5)`` Gymnasium envs in this process (DummyVecEnv, whatever the
    entry's ``vec_env``: EnvPool's and the scale backends' envs take no wrappers), env ``i`` seeded
    ``seed + EVAL_SEED_OFFSET + i``, with the entry's wrappers and :class:`ForwardDistance`, VecNormalize frozen.
    An Atari entry on EnvPool or the scale backends gets SB3's ``AtariWrapper`` and 4 stacked frames, the
    preprocessing EnvPool's Atari envs reproduce (:mod:`sb3_ppo_scale.envs.tasks`). An EnvPool entry's ``env_kwargs``
    are EnvPool's options (``num_threads``, ...), which Gymnasium's env does not take: its evaluation envs get none."""
    import dataclasses

    from stable_baselines3.common.atari_wrappers import AtariWrapper
    from stable_baselines3.common.vec_env import DummyVecEnv

    from sb3_ppo_scale.experiments import zoo

    wrappers, frame_stack = list(config.env_wrappers), config.frame_stack
    if config.vec_env in ("envpool", "scale") and zoo.is_atari(config.env_id):
        wrappers, frame_stack = [(AtariWrapper, {}), *wrappers], 4
    env_kwargs = {} if config.vec_env == "envpool" else config.env_kwargs
    eval_config = dataclasses.replace(config, env_wrappers=[*wrappers, (ForwardDistance, {})],
                                      frame_stack=frame_stack, env_kwargs=env_kwargs)
    return zoo.make_envs(eval_config, n_envs=min(n_episodes, 5), seed=seed + EVAL_SEED_OFFSET, eval_env=True,
                         vec_env_cls=DummyVecEnv)


def check_same_observations(env: Any, eval_env: Any, config: Any) -> None:
    """ValueError naming the entry unless the evaluation envs' observations have the training envs' kind and shape
    (their dtypes may differ: EnvPool's MuJoCo envs give float32 where Gymnasium's give float64)."""
    train, evaluation = env.observation_space, eval_env.observation_space
    if type(train) is not type(evaluation) or train.shape != evaluation.shape:
        raise ValueError(f"entry {config.entry!r} (vec_env {config.vec_env}): the evaluation env's observations "
                         f"({evaluation}) are not laid out as the training env's ({train}); bench evaluates on "
                         f"Gymnasium's {config.env_id} in one process")


def recorded_hyperparams(config: Any, dropped: list[str]) -> dict[str, Any]:
    """The entry's hyperparameters as a run's JSON records them (without ``dropped``; non-scalars as strings)."""
    return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
            for k, v in config.hyperparams.items() if k not in dropped}


def box_conditions(task: str, workers: int, steps: int = 2000) -> dict[str, Any]:
    """What the box was doing when a run started: the day (UTC), its cores, the runs at once (``workers``), the
    1-minute load average, and the task's raw env step cost (``gym.make(task)``, one env, random actions, mean over ``steps``
    steps, in microseconds; None where Gymnasium does not know ``task``), so absolute times from different boxes
    can be compared."""
    import os

    try:
        env = gym.make(task)
        env.reset(seed=0)
        env.action_space.seed(0)
        start = time.perf_counter()
        for _ in range(steps):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        step_us = (time.perf_counter() - start) / steps * 1e6
        env.close()
    except gym.error.Error:
        step_us = None
    return {"cores": os.cpu_count(), "workers": workers, "load_avg_1min": os.getloadavg()[0], "env_step_us": step_us,
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def _try_run(*args: Any) -> str:
    """:func:`run_one` in a worker, with a config SB3 PPO cannot take reported instead of raised (no file is
    written), and a stop signal reported: the run stopped with its checkpoint (or without one: it starts anew next
    time), or was not started."""
    run = f"{args[0]} {args[1]} seed {args[2]}"
    if stop_requested():
        return f"not started {run}: bench is stopping"
    try:
        return run_one(*args)
    except TrainingPreempted as stopped:  # its checkpoint's handler caught the signal: this worker starts no more runs
        stop_signals.remember(getattr(signal, stopped.signal_name, signal.SIGTERM))
        return f"stopped {run}: {stopped}"
    except stop_signals.StopSignalled as stopped:
        return f"stopped {run}: {stopped}, without a checkpoint (it starts anew next time)"
    except ValueError as error:
        if "does not take" not in str(error):
            raise
        return f"skipped {run}: {error}"


# ------------------------------------------------------------------------------------------------ driver
def _label(text: str) -> str:
    parse_label(text)
    return text


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["HalfCheetah-v5", "Hopper-v5"])
    parser.add_argument("--algos", nargs="+", type=_label, default=DEFAULT_ALGOS,
                        help="labels <algo>[@<variant>], algo one of " + ", ".join(ALGO_CLASSES) + "; @plain: the "
                             "plain entry (default: sb3_ppo scalable_ppo@cpu)")
    parser.add_argument("--no-pairs", action="store_true", help="do not add sb3_ppo@<v> for each scalable_ppo@<v> "
                        "(maskable_ppo@<v> / recurrent_ppo@<v> for the contrib classes)")
    parser.add_argument("--baseline", type=_label, default="sb3_ppo",
                        help="label the ratios and the threshold refer to (default sb3_ppo: the plain entry; when "
                             "every label is of one contrib algorithm: the first label's maskable_ppo / recurrent_ppo "
                             "pair)")
    parser.add_argument("--seeds", nargs="+", type=seed_argument, default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=50_000, help="env steps per run (default 50000)")
    parser.add_argument("--eval-every", type=int, default=10_000, help="env steps between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--final-episodes", type=int, default=10)
    parser.add_argument("--threshold-frac", type=float, default=0.9,
                        help="threshold = max(this x the baseline's mean final return, the task's floor) (default 0.9)")
    parser.add_argument("--workers", type=int, default=1, help="parallel single-threaded runs (default 1)")
    parser.add_argument("--config", default=None, help="zoo-style YAML (default: each label's algorithm's config, "
                        "configs/scalable_ppo.yml or configs/contrib.yml)")
    parser.add_argument("--checkpoint-every", type=int, default=DEFAULT_CHECKPOINT_EVERY, metavar="N",
                        help="each run writes <out>/checkpoints/<run>.pt every N env steps and on SIGTERM/SIGINT; the "
                             f"same command resumes from it (default {DEFAULT_CHECKPOINT_EVERY}; 0: no checkpoints)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="results folder (runs/ inside, resumable)")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the tables and plots")
    return parser


def _jobs(args: argparse.Namespace, out: Path) -> list[tuple[Any, ...]]:
    """The runs still to do; ValueError (or FileNotFoundError) for a config, entry or env id that cannot load, and for
    a finished run that is not the one asked for."""
    from sb3_ppo_scale.experiments import zoo

    labels = args.algos if args.no_pairs else with_pairs(args.algos)
    if args.report_only:
        return []
    for task in args.tasks:  # before any run starts or any folder is made: a wrong --config or variant is one error
        for label in labels:
            algo, variant = parse_label(label)
            zoo.load_config(args.config, task, variant, algo=family(algo).name)
    jobs = []
    for seed in args.seeds:  # seed-major: a partial (interrupted) benchmark still pairs the labels on every task
        for task in args.tasks:
            for label in labels:
                stem = f"{path_part(task)}__{label}__seed{seed}"
                path, checkpoint = out / "runs" / f"{stem}.json", out / "checkpoints" / f"{stem}.pt"
                if not path.exists():
                    if args.checkpoint_every:
                        _check_checkpoint(checkpoint, args, task, label)
                    jobs.append((task, label, seed, args.budget, args.eval_every, args.eval_episodes,
                                 args.final_episodes, args.config, str(path), args.workers,
                                 str(checkpoint) if args.checkpoint_every else None, args.checkpoint_every))
                elif (different := _differs_from(json.loads(path.read_text()), args, task, label)) is not None:
                    raise ValueError(f"{path} holds a finished run with {different}: bench skips finished runs only "
                                     "for the same command; use another --out, or delete that file to run it again")
    return jobs


def _check_checkpoint(checkpoint: Path, args: argparse.Namespace, task: str, label: str) -> None:
    """ValueError when ``checkpoint`` (if it exists) holds another run than the one ``args`` asks for."""
    if checkpoint.is_file() and (different := _differs_from(read_sidecar(checkpoint)["run"]["settings"], args, task,
                                                             label)) is not None:
        raise ValueError(f"{checkpoint} holds an interrupted run with {different}: bench resumes a run only for the "
                         f"same command; use another --out, or delete it and {sidecar_path(checkpoint).name} to start "
                         "that run anew")


def _differs_from(run: dict[str, Any], args: argparse.Namespace, task: str, label: str) -> str | None:
    """What of a finished run differs from the run ``args`` asks for (budget, evaluation settings, the entry's
    hyperparameters), or None. Settings a run did not record yet are not compared."""
    asked = {"budget": args.budget, "eval_every": args.eval_every, "eval_episodes": args.eval_episodes,
             "final_episodes": args.final_episodes}
    for key, value in asked.items():
        if key in run and run[key] != value:
            return f"--{key.replace('_', '-')} {run[key]} (this command: {value})"
    from sb3_ppo_scale.experiments import zoo

    algo, variant = parse_label(label)
    try:
        config, dropped = _config_for(zoo.load_config(args.config, task, variant, algo=family(algo).name), algo)
    except ValueError as error:  # the entry no longer loads for this label
        return f"an entry this command cannot run ({error})"
    if "hyperparams" in run and run["hyperparams"] != recorded_hyperparams(config, dropped):
        return f"other hyperparameters than entry {config.entry!r} of {args.config or 'the default config'} has now"
    return None


def command_line(command: str, args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    """The commands that rerun (resumably) the runs in ``results``, one per group of runs with the same budget and
    evaluation settings (joined by ``; ``): their tasks, labels and seeds, the config file (``--config``, where one was
    given) and the report options of ``args``. Evaluation settings come from the runs (:func:`evaluation_settings`),
    else from ``args``."""
    groups: dict[tuple[int, int, int, int], list[dict[str, Any]]] = {}
    for run in results:
        groups.setdefault((run["budget"], *evaluation_settings(run, args)), []).append(run)
    if not groups:
        groups[(args.budget, args.eval_every, args.eval_episodes, args.final_episodes)] = []
    commands = []
    for (budget, eval_every, eval_episodes, final_episodes), runs in sorted(groups.items()):
        def unique(key: str, runs: list[dict[str, Any]] = runs) -> list[Any]:
            return sorted({r[key] for r in runs}, key=lambda v: (label_order(v, args.baseline) if key == "algo" else v))

        commands.append(" ".join([
            command, *(["--config", str(args.config)] if args.config else []),
            "--tasks", *(unique("task") or args.tasks), "--algos", *(unique("algo") or args.algos),
            "--no-pairs", "--seeds", *map(str, unique("seed") or args.seeds), "--budget", str(budget),
            "--eval-every", str(eval_every), "--eval-episodes", str(eval_episodes), "--final-episodes",
            str(final_episodes), "--baseline", args.baseline, "--threshold-frac", f"{args.threshold_frac:g}",
            "--out", str(args.out)]))
    return "; ".join(commands)


def evaluation_settings(run: dict[str, Any], args: argparse.Namespace) -> tuple[int, int, int]:
    """``(eval_every, eval_episodes, final_episodes)`` of a run: as recorded; runs made before they were recorded
    get ``args``' episode counts and the roundest ``eval_every`` consistent with their first evaluation after the
    start (made at the first rollout boundary at or after it): e.g. 50 000 for a first evaluation at 50 176 steps
    with 512-step rollouts."""
    if "eval_every" in run:
        return run["eval_every"], run["eval_episodes"], run["final_episodes"]
    return _inferred_eval_every(run, args.eval_every), args.eval_episodes, args.final_episodes


def _inferred_eval_every(run: dict[str, Any], default: int) -> int:
    steps = [p["steps"] for p in run["curve"] if p["steps"] > 0]
    if len(steps) < 2:  # only the final evaluation: no periodic one happened
        return default
    hyperparams = run.get("hyperparams", {})
    rollout = hyperparams.get("n_steps", 2048) * hyperparams.get("n_envs", 1)
    low, high = max(steps[0] - rollout + 1, 1), steps[0]
    return max(range(low, high + 1), key=lambda v: (len(str(v)) - len(str(v).rstrip("0")), -v))


def default_baseline(labels: list[str], baseline: str) -> str:
    """``baseline``, except the default ``sb3_ppo`` when every label is of one contrib algorithm: the first baseline
    label among them and their pairs (``recurrent_ppo@batched`` for ``scalable_recurrent_ppo@batched``)."""
    families = {family(parse_label(label)[0]).name for label in labels}
    if baseline != "sb3_ppo" or len(families) != 1 or families == {"scalable_ppo"}:
        return baseline
    return next(label for label in with_pairs(labels) if parse_label(label)[0] in BASELINES)


#: bench's count arguments: each must be an int >= 1
COUNT_ARGUMENTS = ("budget", "eval_every", "eval_episodes", "final_episodes", "workers")


def check_arguments(args: argparse.Namespace) -> None:
    """ValueError naming the first argument no benchmark can run with."""
    for name in COUNT_ARGUMENTS:
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.checkpoint_every < 0:
        raise ValueError(f"--checkpoint-every must be >= 0 env steps (0: no checkpoints), got {args.checkpoint_every}")
    if not args.threshold_frac > 0:
        raise ValueError(f"--threshold-frac must be > 0, got {args.threshold_frac}")
    labels = with_pairs(args.algos)
    if parse_label(args.baseline)[0] not in {parse_label(label)[0] for label in labels}:
        raise ValueError(f"--baseline {args.baseline} is not one of the benchmark's algorithms: its labels (with their "
                         f"pairs) are {', '.join(labels)}")


def main(args: argparse.Namespace, command: str = "sb3-ppo-scale bench") -> int:
    check_arguments(args)
    args.baseline = default_baseline(args.algos, args.baseline)
    out = Path(args.out)
    if args.report_only and not any((out / "runs").glob("*.json")):
        raise FileNotFoundError(f"--report-only: no runs in {out / 'runs'}; run bench without --report-only first")
    jobs = _jobs(args, out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    resumed = sum(job[10] is not None and Path(job[10]).is_file() for job in jobs)
    print(f"{len(jobs)} runs to do ({resumed} resumed from their checkpoints), {args.workers} at a time", flush=True)
    if run_in_workers(_try_run, jobs, args.workers):
        print(f"bench stopped by a signal: each run in progress stopped (with its checkpoint in {out / 'checkpoints'}, "
              f"see above); run the same command to continue (exit code {PREEMPTED_EXIT_CODE})", file=sys.stderr,
              flush=True)
        return PREEMPTED_EXIT_CODE
    if (out / "checkpoints").is_dir() and not any((out / "checkpoints").iterdir()):
        (out / "checkpoints").rmdir()  # every run finished: nothing to resume
    results = [r for r in learning_report.load_results(out) if r["task"] in args.tasks]
    markdown, *plots = learning_report.write_report(results, out, args.threshold_frac, args.baseline,
                                                    command_line(command, args, results))
    print(markdown.read_text())
    for path in plots:
        print("plot:", path)
    return 0

if __name__ == "__main__":
    raise SystemExit(main(build_parser().parse_args(), command="python -m sb3_ppo_scale.experiments.bench"))
