"""One trial: sample ScalablePPO arguments, train ``seeds_per_trial`` agents, evaluate them, return the objective."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import optuna

from sb3_ppo_scale.experiments import zoo
from sb3_ppo_scale.experiments.pipeline import EVAL_SEED_OFFSET, PeriodicEvalCallback
from sb3_ppo_scale.tuning.preemption import PreemptionCheck
from sb3_ppo_scale.tuning.spec import ParamSpec, StudySpec, pow2_bounds


def suggest(trial: optuna.Trial, param: ParamSpec) -> Any:
    """Ask ``trial`` for one parameter and return the value ScalablePPO receives (before any schedule)."""
    if param.type == "categorical":
        return trial.suggest_categorical(param.name, list(param.choices))
    if param.type == "pow2":
        low, high = pow2_bounds(param)
        return 2 ** trial.suggest_int(param.optuna_name, low, high)
    if param.type == "int":
        return trial.suggest_int(param.name, int(param.low), int(param.high), log=param.log, step=param.step or 1)  # type: ignore[arg-type]
    return trial.suggest_float(param.name, float(param.low), float(param.high), log=param.log, step=param.step)  # type: ignore[arg-type]


def decode_params(spec: StudySpec, optuna_params: dict[str, Any]) -> dict[str, Any]:
    """Optuna's stored params -> ScalablePPO argument values (``log2_batch_size: 6`` -> ``batch_size: 64``)."""
    values = {}
    for param in spec.space:
        raw = optuna_params[param.optuna_name]
        values[param.name] = 2 ** int(raw) if param.type == "pow2" else raw
    return values


def trial_config(spec: StudySpec, env_id: str, values: dict[str, Any]) -> zoo.ZooConfig:
    """One trial as a zoo config entry: the spec's base, the sampled values (``schedule: linear`` -> ``lin_<x>``)
    and the spec's budget; envs and model are then built as for ``train`` (:mod:`sb3_ppo_scale.experiments.zoo`)."""
    raw: dict[str, Any] = {"device": "cpu", **spec.base, "n_timesteps": spec.timesteps}
    schedules = {p.name: p.schedule for p in spec.space}
    for name, value in values.items():
        raw[name] = f"lin_{float(value)!r}" if schedules[name] == "linear" else value
    return zoo.config_from_hyperparams(env_id, spec.study_name(env_id), raw, source=str(spec.path or "<spec>"))


def reduce_returns(returns: list[float], objective: str) -> float:
    """``auc``: mean of the evaluation returns (area under the evaluation curve / timesteps); ``final``: the last."""
    return float(np.mean(returns)) if objective == "auc" else float(returns[-1])


def train_and_evaluate(spec: StudySpec, env_id: str, values: dict[str, Any], seed: int,
                       on_eval: Callable[[int, float], None] | None = None) -> tuple[float, list[float]]:
    """Train one ScalablePPO for ``spec.timesteps`` env steps with ``values``; returns (objective, eval returns).

    Evaluations run every ``eval_freq`` steps and once more at the end if the last one did not see the final
    policy; ``on_eval(timesteps, mean_return)`` is called after each.
    """
    config = trial_config(spec, env_id, values)
    env = zoo.make_envs(config, seed=seed)
    eval_env = zoo.make_envs(config, n_envs=1, seed=seed + EVAL_SEED_OFFSET, eval_env=True)
    hook = None if on_eval is None else (lambda result: on_eval(result.timesteps, result.mean_return))
    try:
        model = zoo.build_model(config, env, seed=seed)
        callback = PeriodicEvalCallback(eval_env, spec.evaluation.eval_freq, spec.evaluation.n_episodes,
                                        spec.evaluation.deterministic, on_eval=hook)
        model.learn(total_timesteps=config.n_timesteps, callback=[callback, PreemptionCheck()])  # SIGTERM: stop
        return reduce_returns(callback.returns, spec.evaluation.objective), callback.returns
    finally:
        env.close()
        eval_env.close()


def make_objective(spec: StudySpec, env_id: str) -> Callable[[optuna.Trial], float]:
    """The Optuna objective: mean over seeds of the evaluation objective. Search mode reports and prunes on seed 0."""

    def objective(trial: optuna.Trial) -> float:
        values = {p.name: suggest(trial, p) for p in spec.space}
        results, curves = [], []
        for index in range(spec.seeds_per_trial):
            on_eval = _pruning_hook(trial, spec) if index == 0 and spec.pruner.get("name") == "median" else None
            value, curve = train_and_evaluate(spec, env_id, values, spec.seed + index, on_eval)
            results.append(value)
            curves.append(curve)
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
