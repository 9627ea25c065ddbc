"""One trial: sample the arguments of ``spec.algo`` (default ScalablePPO), train ``seeds_per_trial`` agents, evaluate
them, return the objective.

Dummy parameters (``type: dummy``) are sampled like the others and never reach training. The per-seed objectives
are stored on the trial (``seed_values``; their spread is what the report shows per trial).

A trial whose training diverges (non-finite updates stop it with :class:`~sb3_ppo_scale.core.update.guard.NonFiniteError`,
an outcome of its hyperparameters, e.g. a learning rate too large) raises :class:`TrialDiverged`: Optuna records it
as FAIL with :data:`DIVERGED_ATTR` saying why, the worker goes on with the next trial, and the report counts it and
lists its parameters. Any other exception still stops the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import optuna
import torch as th

from sb3_ppo_scale.core.checks import resolve_device
from sb3_ppo_scale.core.update.guard import NonFiniteError
from sb3_ppo_scale.envs.known_warnings import filter_known_warnings
from sb3_ppo_scale.experiments import zoo
from sb3_ppo_scale.experiments.algorithms import algorithm
from sb3_ppo_scale.experiments.pipeline import EVAL_SEED_OFFSET, PeriodicEvalCallback
from sb3_ppo_scale.stop_signals import StopOnSignal
from sb3_ppo_scale.tuning.noise import inherit_repeat_mark, is_decay_trial, repeat_index
from sb3_ppo_scale.tuning.spec import DECAYED_ARGUMENT, ParamSpec, StudySpec, centre_values, pow2_bounds
from sb3_ppo_scale.tuning.storage import DIVERGED_ATTR


class TrialDiverged(Exception):
    """A trial's training diverged (see the module docstring); the runner lets Optuna record it as FAIL and goes on."""


def suggest(trial: optuna.Trial, param: ParamSpec) -> Any:
    """Ask ``trial`` for one parameter and return the value the model receives (before any schedule); a dummy's
    value is only recorded on the trial."""
    if param.type == "dummy":
        return trial.suggest_float(param.name, float(param.low), float(param.high))  # type: ignore[arg-type]
    if param.type == "categorical":
        return trial.suggest_categorical(param.name, list(param.choices))
    if param.type == "pow2":
        low, high = pow2_bounds(param)
        return 2 ** trial.suggest_int(param.optuna_name, low, high)
    if param.type == "int":
        return trial.suggest_int(param.name, int(param.low), int(param.high), log=param.log, step=param.step or 1)  # type: ignore[arg-type]
    return trial.suggest_float(param.name, float(param.low), float(param.high), log=param.log, step=param.step)  # type: ignore[arg-type]


def decode_params(spec: StudySpec, optuna_params: dict[str, Any]) -> dict[str, Any]:
    """Optuna's stored params -> ScalablePPO argument values (``log2_batch_size: 6`` -> ``batch_size: 64``); dummy
    parameters are left out."""
    values = {}
    for param in spec.trained_space:
        raw = optuna_params[param.optuna_name]
        values[param.name] = 2 ** int(raw) if param.type == "pow2" else raw
    return values


def trial_config(spec: StudySpec, env_id: str, values: dict[str, Any], decayed: bool = False) -> zoo.ZooConfig:
    """One trial as a zoo config entry: the spec's base, the sampled values (``schedule: linear`` -> ``lin_<x>``)
    and the spec's budget; envs and model are then built as for ``train`` (:mod:`sb3_ppo_scale.experiments.zoo`).
    ``decayed`` (a decay repeat): the learning rate decays linearly to 0 whatever its schedule in the spec."""
    raw: dict[str, Any] = {"device": "cpu", **spec.base, "n_timesteps": spec.timesteps}
    schedules = {p.name: p.schedule for p in spec.space}
    if decayed:
        schedules[DECAYED_ARGUMENT] = "linear"
    for name, value in values.items():
        raw[name] = f"lin_{float(value)!r}" if schedules[name] == "linear" else value
    return zoo.config_from_hyperparams(env_id, spec.study_name(env_id), raw, source=str(spec.path or "<spec>"),
                                       algo=spec.algo)


def check_trials_can_start(spec: StudySpec, env_id: str) -> None:
    """Build (not train) the envs and the model of the space's centre configuration for ``env_id``, as each trial
    builds them: a mistake only the env or ScalablePPO can see (an unknown ``policy_kwargs`` key, a ``device`` this
    machine lacks or torch does not know, an env that cannot be made) is one ValueError now, naming the env,
    instead of a failed trial (per worker) with its traceback. MuJoCo's known deprecation messages are dropped here
    as in the workers (:func:`~sb3_ppo_scale.envs.known_warnings.filter_known_warnings`)."""
    import gymnasium as gym

    filter_known_warnings()
    config = trial_config(spec, env_id, decode_params(spec, centre_values(spec)))
    try:
        # SB3 would train on the CPU for a device CUDA lacks, and fail on one torch does not know
        resolve_device(config.model_kwargs.get("device", "cpu"), "base.device", th.device("cpu"))
        env = zoo.make_envs(config, seed=spec.seed)
        try:
            zoo.build_model(config, env, algorithm(spec.algo).cls, seed=spec.seed)
        finally:
            env.close()
    except (ValueError, TypeError, AssertionError, gym.error.Error) as error:
        text = " ".join(str(error).split()) or type(error).__name__
        raise ValueError(f"spec (env {env_id}): the trials cannot start, building the envs and model of the space's "
                         f"centre gave: {text}") from None


def reduce_returns(returns: list[float], objective: str) -> float:
    """``auc``: mean of the evaluation returns (area under the evaluation curve / timesteps); ``final``: the last."""
    return float(np.mean(returns)) if objective == "auc" else float(returns[-1])


def train_and_evaluate(spec: StudySpec, env_id: str, values: dict[str, Any], seed: int,
                       on_eval: Callable[[int, float], None] | None = None,
                       decayed: bool = False) -> tuple[float, list[float]]:
    """Train one model of ``spec.algo`` for ``spec.timesteps`` env steps with ``values`` (``decayed``: learning rate
    decayed linearly, see :func:`trial_config`); returns (objective, eval returns).

    Evaluations run every ``eval_freq`` steps, at the env step where one falls due (during a rollout: before that
    rollout's update), and once more after training unless one fell due at the last env step (that one ran before
    the last update, which is then not evaluated); ``on_eval(timesteps, mean_return)`` is called after each.
    """
    config = trial_config(spec, env_id, values, decayed)
    env = zoo.make_envs(config, seed=seed)
    eval_env = zoo.make_envs(config, n_envs=1, seed=seed + EVAL_SEED_OFFSET, eval_env=True)
    hook = None if on_eval is None else (lambda result: on_eval(result.timesteps, result.mean_return))
    try:
        model = zoo.build_model(config, env, algorithm(spec.algo).cls, seed=seed)
        callback = PeriodicEvalCallback(eval_env, spec.evaluation.eval_freq, spec.evaluation.n_episodes,
                                        spec.evaluation.deterministic, on_eval=hook)
        model.learn(total_timesteps=config.n_timesteps, callback=[callback, StopOnSignal()])  # SIGTERM: stop
        return reduce_returns(callback.returns, spec.evaluation.objective), callback.returns
    finally:
        env.close()
        eval_env.close()


def trial_seeds(spec: StudySpec, repeat: int | None = None) -> list[int]:
    """The seeds a trial trains with: ``seed, seed + 1, ...`` (``seeds_per_trial`` of them) for every sampled trial;
    noise (or decay) repeat ``k`` shifts them by ``k * seeds_per_trial``, so that noise repeats differ by their seeds
    only (repeat 0 shares the sampled trials' seeds) and decay repeat k by its schedule only from noise repeat k."""
    offset = 0 if repeat is None else int(repeat) * spec.seeds_per_trial
    return [spec.seed + offset + index for index in range(spec.seeds_per_trial)]


def make_objective(spec: StudySpec, env_id: str) -> Callable[[optuna.Trial], float]:
    """The Optuna objective: mean over the trial's seeds (:func:`trial_seeds`) of the evaluation objective; stores
    ``seeds``, ``seed_values`` and ``eval_returns`` on the trial. Search mode reports and prunes on the first seed.
    A seed whose training diverges ends the trial with :class:`TrialDiverged`."""

    def objective(trial: optuna.Trial) -> float:
        inherit_repeat_mark(trial)
        sampled = {p.name: suggest(trial, p) for p in spec.space}  # dummies too: same sampling for all
        values = {p.name: sampled[p.name] for p in spec.trained_space}
        results, curves, seeds = [], [], trial_seeds(spec, repeat_index(trial))
        decayed = is_decay_trial(trial)
        for index, seed in enumerate(seeds):
            on_eval = _pruning_hook(trial, spec) if index == 0 and spec.pruner.get("name") == "median" else None
            try:
                value, curve = train_and_evaluate(spec, env_id, values, seed, on_eval, decayed)
            except NonFiniteError as error:
                reason = f"seed {seed}: {str(error).split(';')[0]}"
                trial.set_user_attr(DIVERGED_ATTR, reason)
                raise TrialDiverged(reason) from None
            results.append(value)
            curves.append(curve)
        trial.set_user_attr("seeds", seeds)
        trial.set_user_attr("seed_values", results)
        trial.set_user_attr("eval_returns", curves)  # per seed: mean return of each evaluation
        return float(np.mean(results))

    return objective


def _pruning_hook(trial: optuna.Trial, spec: StudySpec) -> Callable[[int, float], None]:
    returns: list[float] = []

    def hook(timesteps: int, mean_return: float) -> None:
        returns.append(mean_return)
        trial.report(reduce_returns(returns, spec.evaluation.objective), step=timesteps)
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned at {timesteps} steps")

    return hook
