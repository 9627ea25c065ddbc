"""One trial: sample ScalablePPO arguments, train ``seeds_per_trial`` agents, evaluate them, return the objective."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import optuna
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecEnv, VecNormalize, sync_envs_normalization

from sb3_ppo_scale.core.ppo import ScalablePPO
from sb3_ppo_scale.tuning.spec import ParamSpec, StudySpec, pow2_bounds

ACTIVATION_FNS: dict[str, type[th.nn.Module]] = {
    "tanh": th.nn.Tanh, "relu": th.nn.ReLU, "elu": th.nn.ELU, "leaky_relu": th.nn.LeakyReLU,
}
#: Seed offset of the evaluation env (different episodes from training, same for every trial).
EVAL_SEED_OFFSET = 10_000


def linear_schedule(initial: float) -> Callable[[float], float]:
    """SB3 schedule decaying linearly from ``initial`` (progress_remaining 1) to 0 (progress_remaining 0)."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * initial

    return schedule


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


def ppo_kwargs(spec: StudySpec, values: dict[str, Any]) -> dict[str, Any]:
    """ScalablePPO keyword arguments for one trial: the base config, the sampled values and their schedules."""
    kwargs = {k: v for k, v in spec.base.items() if k not in ("n_envs", "normalize", "policy")}
    if "policy_kwargs" in kwargs:
        policy_kwargs = dict(kwargs["policy_kwargs"])
        if "activation_fn" in policy_kwargs:
            policy_kwargs["activation_fn"] = ACTIVATION_FNS[policy_kwargs["activation_fn"]]
        kwargs["policy_kwargs"] = policy_kwargs
    schedules = {p.name: p.schedule for p in spec.space}
    for name, value in values.items():
        kwargs[name] = linear_schedule(float(value)) if schedules[name] == "linear" else value
    kwargs.setdefault("device", "cpu")
    return kwargs


class _EvalCallback(BaseCallback):
    """Evaluates every ``eval_freq`` env steps (counted over all envs) and at the end; keeps the mean returns."""

    def __init__(self, eval_env: VecEnv, spec: StudySpec, on_eval: Callable[[int, float], None] | None) -> None:
        super().__init__()
        self.eval_env, self.spec, self.on_eval = eval_env, spec, on_eval
        self.returns: list[float] = []
        self.last_eval_step = -1
        self._next = spec.evaluation.eval_freq

    def _on_step(self) -> bool:
        if self.num_timesteps >= self._next:
            self._next += self.spec.evaluation.eval_freq
            self.evaluate()
        return True

    def evaluate(self) -> None:
        if isinstance(self.training_env, VecNormalize):
            sync_envs_normalization(self.training_env, self.eval_env)
        episode_returns, _ = evaluate_policy(
            self.model, self.eval_env, n_eval_episodes=self.spec.evaluation.n_episodes,
            deterministic=self.spec.evaluation.deterministic, return_episode_rewards=True,
        )
        self.returns.append(float(np.mean(episode_returns)))
        self.last_eval_step = self.num_timesteps
        if self.on_eval is not None:
            self.on_eval(self.num_timesteps, self.returns[-1])


def _make_envs(spec: StudySpec, env_id: str, seed: int) -> tuple[VecEnv, VecEnv]:
    env = make_vec_env(env_id, n_envs=spec.n_envs, seed=seed)
    eval_env = make_vec_env(env_id, n_envs=1, seed=seed + EVAL_SEED_OFFSET)
    if spec.base.get("normalize", False):
        gamma = float(spec.base.get("gamma", 0.99))
        env = VecNormalize(env, gamma=gamma)
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False, gamma=gamma)
    return env, eval_env


def reduce_returns(returns: list[float], objective: str) -> float:
    """``auc``: mean of the evaluation returns (area under the evaluation curve / timesteps); ``final``: the last."""
    return float(np.mean(returns)) if objective == "auc" else float(returns[-1])


def train_and_evaluate(spec: StudySpec, env_id: str, values: dict[str, Any], seed: int,
                       on_eval: Callable[[int, float], None] | None = None) -> tuple[float, list[float]]:
    """Train one ScalablePPO for ``spec.timesteps`` env steps with ``values``; returns (objective, eval returns)."""
    env, eval_env = _make_envs(spec, env_id, seed)
    try:
        model = ScalablePPO(spec.base.get("policy", "MlpPolicy"), env, seed=seed, **ppo_kwargs(spec, values))
        callback = _EvalCallback(eval_env, spec, on_eval)
        model.learn(total_timesteps=spec.timesteps, callback=callback)
        if callback.last_eval_step != model.num_timesteps:
            callback.evaluate()  # the last evaluation always sees the fully trained policy
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
