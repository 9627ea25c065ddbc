"""The pieces every experiment shares: zoo configs, tuning trials and the learning benchmark use these, once.

- :data:`ACTIVATIONS`: activation names a config may use (``tanh`` ... and the ``nn.<Class>`` names the zoo's
  ``policy_kwargs`` strings use are derived from it);
- :class:`LinearSchedule`: the zoo's ``lin_<x>`` schedule (a spec's ``schedule: linear``);
- :data:`MODEL_KEYS`: ScalablePPO's constructor arguments (PPO's plus the ones ScalablePPO adds);
- :data:`VEC_ENV_KINDS`: how envs are vectorised (``dummy``, ``subproc``, ``envpool``, ``scale``: the backend
  :func:`sb3_ppo_scale.envs.plan_scale` picks for this machine);
- :data:`EVAL_SEED_OFFSET`: the evaluation env's seed is the run's seed plus this;
- :class:`PeriodicEvalCallback`: deterministic evaluation every ``eval_freq`` env steps with frozen VecNormalize
  statistics, recording :class:`Evaluation` rows (the evaluation callback of ``train``, ``tune`` and ``bench``); its
  :meth:`~PeriodicEvalCallback.state` / :meth:`~PeriodicEvalCallback.restore` carry it over an interruption;
- :data:`DEFAULT_THREADS` and :func:`set_threads`: torch's intra-op threads for small policies;
- :func:`path_part`: an env id or config entry as a file or folder name;
- :func:`seed_argument` and :func:`device_argument`: argparse types of the commands' ``--seed`` and ``--device``.

:mod:`sb3_ppo_scale.experiments.zoo` turns a config into envs and a model with these.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecNormalize, sync_envs_normalization

from sb3_ppo_scale.checkpoint import env_rng_states, set_env_rng_states
from sb3_ppo_scale.core.checks import resolve_device
from sb3_ppo_scale.core.ppo import ScalablePPO
from sb3_ppo_scale.envs.episodes import capture_episodes, restore_episodes
from sb3_ppo_scale.experiments.algorithms import constructor_keys
from sb3_ppo_scale.experiments.algorithms import evaluate_policy  # sb3-contrib's masked one for a maskable model

#: Seed offset of evaluation envs: different episodes from training, the same for every run with that seed.
EVAL_SEED_OFFSET = 10_000

#: torch intra-op threads the CLI uses unless ``--threads`` says otherwise. Measured by benchmarks/studies/threads.py
#: (results in benchmarks/results/threads.md): for the zoo's small MLPs one thread beats torch's default.
DEFAULT_THREADS = 1

#: How a config's envs are vectorised (the ``vec_env`` key, ``train --vec-env``): SB3's ``DummyVecEnv`` or
#: ``SubprocVecEnv``, :class:`sb3_ppo_scale.envs.ProcessVecEnv` (worker processes, several envs each, observations
#: in shared memory), EnvPool, or the backend :func:`sb3_ppo_scale.envs.plan_scale` picks for the machine.
VEC_ENV_KINDS = ("dummy", "subproc", "processes", "envpool", "scale")

#: Activation names -> classes. Configs name them in lower case (``tanh``); zoo ``policy_kwargs`` strings use the
#: class names (``nn.Tanh``), see :data:`sb3_ppo_scale.experiments.zoo.SAFE_NAMES`.
ACTIVATIONS: dict[str, type[th.nn.Module]] = {
    "tanh": th.nn.Tanh, "relu": th.nn.ReLU, "elu": th.nn.ELU, "leaky_relu": th.nn.LeakyReLU, "silu": th.nn.SiLU,
    "gelu": th.nn.GELU, "sigmoid": th.nn.Sigmoid, "identity": th.nn.Identity, "softplus": th.nn.Softplus,
    "mish": th.nn.Mish, "selu": th.nn.SELU,
}


def activation(name: str) -> type[th.nn.Module]:
    """The activation class for ``name`` (a key of :data:`ACTIVATIONS`); ValueError naming the allowed ones."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation_fn must be one of {tuple(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


@dataclass(frozen=True)
class LinearSchedule:
    """Linear decay from ``initial_value`` (progress_remaining 1) to 0 (end of training), as the zoo's ``lin_<x>``."""

    initial_value: float

    def __call__(self, progress_remaining: float) -> float:
        return progress_remaining * self.initial_value


#: Constructor arguments of ScalablePPO (PPO's plus those ScalablePPO adds), without ``policy`` and ``env``.
MODEL_KEYS = constructor_keys(ScalablePPO)


#: characters that cannot be part of a file name on some system (``/`` nowhere; ``:`` on Windows, and in the
#: ``module:EnvId`` form of a user's env id)
_PATH_UNSAFE = str.maketrans({c: "_" for c in '/\\:*?"<>|'})


def path_part(name: str) -> str:
    """``name`` (an env id or config entry) as one file or folder name: each of ``/ \\ : * ? " < > |`` becomes ``_``
    (``ALE/Pong-v5`` -> ``ALE_Pong-v5``, ``my_envs:MyEnv-v0`` -> ``my_envs_MyEnv-v0``); anything else is kept."""
    return name.translate(_PATH_UNSAFE)


def set_threads(threads: int) -> int:
    """``torch.set_num_threads(threads)``; ValueError unless ``threads`` is an int >= 1. Returns ``threads``."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"--threads must be an int >= 1, got {threads!r}")
    th.set_num_threads(threads)
    return threads


def seed_argument(text: str) -> int:
    """argparse type of a seed: an int >= 0 (gymnasium and NumPy refuse negative seeds, deep inside env creation)."""
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if seed < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}")
    return seed


def device_argument(text: str) -> str:
    """argparse type of a policy device: 'auto', or a device of a kind SB3 trains on that exists on this machine
    (SB3 itself would fall back to the CPU without a word when CUDA is missing); returned as given."""
    try:
        resolve_device(text, "--device", th.device("cpu"))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--device ").removeprefix("--device=")) from error
    return text


# ------------------------------------------------------------------------------------------------ evaluation
@dataclass(frozen=True)
class Evaluation:
    """One evaluation: env steps trained so far, mean return and mean episode length over the episodes, and the
    training time so far in wall-clock and process-CPU seconds (evaluation time excluded)."""

    timesteps: int
    mean_return: float
    mean_length: float
    train_s: float
    cpu_s: float
    #: per ``info_keys`` of the callback: the mean over episodes of that key in each episode's last info (None when
    #: an episode lacked it), e.g. MuJoCo's forward distance
    episode_info: dict[str, float | None] = field(default_factory=dict)
    #: mean length of the last (up to 100) *training* episodes, None before the first one ends
    train_length: float | None = None


class PeriodicEvalCallback(BaseCallback):
    """Evaluate every ``eval_freq`` env steps (counted over all envs) and, by default, once more at the end.

    The evaluation env should be built with ``eval_env=True`` (:func:`sb3_ppo_scale.experiments.zoo.make_envs`):
    its VecNormalize statistics are copied from the training env before each evaluation and never updated, and
    rewards are not normalised. Each evaluation appends an :class:`Evaluation` to ``evaluations``.

    :param eval_env: the evaluation env.
    :param eval_freq: env steps between evaluations (> 0).
    :param n_episodes: episodes per evaluation (default 5).
    :param deterministic: deterministic actions (default True).
    :param eval_at_start: also evaluate before the first step (the untrained policy; default False).
    :param eval_at_end: evaluate after training unless the last evaluation saw the final policy (default True).
    :param on_eval: called with each :class:`Evaluation` (e.g. to report to Optuna; may raise to stop training).
    :param save_dir: if set, write ``evaluations.npz`` (SB3 EvalCallback's format: timesteps, results, ep_lengths)
        and ``best_model.zip`` (the policy with the best mean return so far) into this folder.
    :param info_keys: keys of the evaluation episodes' final ``info`` to average into ``Evaluation.episode_info``
        (default none).
    :param at_rollout_start: check the schedule when a rollout starts instead of at every env step (default False),
        so each evaluation sees a new policy and ``timesteps`` is a rollout boundary.

    The training clocks (:meth:`clocks`) leave out evaluation and whatever :meth:`exclude` is told; a run resumed in
    another process continues them (and the evaluations, and the evaluation env's state) from :meth:`state`.
    """

    def __init__(self, eval_env: VecEnv, eval_freq: int, n_episodes: int = 5, deterministic: bool = True,
                 eval_at_start: bool = False, eval_at_end: bool = True,
                 on_eval: Callable[[Evaluation], None] | None = None, save_dir: str | Path | None = None,
                 info_keys: tuple[str, ...] = (), at_rollout_start: bool = False) -> None:
        super().__init__()
        self.info_keys, self.at_rollout_start = info_keys, at_rollout_start
        if eval_freq < 1 or n_episodes < 1:
            raise ValueError(f"eval_freq and n_episodes must be >= 1, got {eval_freq}, {n_episodes}")
        self.eval_env, self.eval_freq, self.n_episodes = eval_env, eval_freq, n_episodes
        self.deterministic, self.eval_at_start, self.eval_at_end = deterministic, eval_at_start, eval_at_end
        self.on_eval, self.save_dir = on_eval, None if save_dir is None else Path(save_dir)
        self.evaluations: list[Evaluation] = []
        self._episodes: list[tuple[list[float], list[int]]] = []
        self._next = eval_freq
        self._excluded = self._cpu_excluded = 0.0
        self._start = self._cpu_start = 0.0
        self._clocks_before = (0.0, 0.0)  # training (wall, CPU) seconds of the run before this process resumed it
        self._eval_env_state: dict[str, Any] | None = None  # after the last evaluation (None: none yet)

    @property
    def returns(self) -> list[float]:
        """Mean return of each evaluation so far."""
        return [e.mean_return for e in self.evaluations]

    def continue_run(self, num_timesteps: int) -> None:
        """Continue a resumed run at ``num_timesteps`` env steps: the evaluations up to then in ``save_dir``'s
        ``evaluations.npz`` are kept (their clocks are NaN: another process measured them), and the next one is due
        at the next multiple of ``eval_freq``, as in the uninterrupted run."""
        saved = None if self.save_dir is None else self.save_dir / "evaluations.npz"
        if saved is not None and saved.is_file():
            data = np.load(saved)
            for steps, returns, lengths in zip(data["timesteps"], data["results"], data["ep_lengths"]):
                if steps <= num_timesteps:
                    self.evaluations.append(Evaluation(int(steps), float(np.mean(returns)), float(np.mean(lengths)),
                                                       float("nan"), float("nan")))
                    self._episodes.append((list(map(float, returns)), list(map(int, lengths))))
        self._next = (num_timesteps // self.eval_freq + 1) * self.eval_freq

    def clocks(self) -> tuple[float, float]:
        """The training time so far: (wall-clock s, process CPU s), evaluation and :meth:`exclude`-d time left out,
        a resumed run's earlier training included (0 before training starts)."""
        return (time.perf_counter() - self._start - self._excluded + self._clocks_before[0],
                time.process_time() - self._cpu_start - self._cpu_excluded + self._clocks_before[1])

    def exclude(self, wall_s: float, cpu_s: float) -> None:
        """Leave ``wall_s`` wall-clock and ``cpu_s`` CPU seconds (e.g. spent writing a checkpoint) out of the
        training clocks."""
        self._excluded += wall_s
        self._cpu_excluded += cpu_s

    def state(self) -> dict[str, Any]:
        """What :meth:`restore` needs to continue this callback in another process (picklable), as it is now: the
        :class:`Evaluation` rows (with each episode's return and length), the env steps at which the next one is
        due, the training clocks (:meth:`clocks`, seconds) and the evaluation env's state after the last evaluation
        (:meth:`_capture_eval_env`). The lists are copied, not their items (never changed): cheap at every rollout."""
        train_s, cpu_s = self.clocks()
        return {"evaluations": list(self.evaluations), "episodes": list(self._episodes), "next_eval": self._next,
                "train_s": train_s, "cpu_s": cpu_s, "eval_env": self._eval_env_state}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` (before ``learn()``): the evaluations so far (no evaluation at the start
        again), the next one when the interrupted run would have made it, the clocks from the saved totals, and the
        evaluation env (built as the saved one was) as it was after the last evaluation: so the next evaluations are
        the uninterrupted run's where its state could be captured (its RNG, and the episode state of each env layer
        that :mod:`sb3_ppo_scale.envs.episodes` knows)."""
        self.evaluations, self._episodes = list(state["evaluations"]), list(state["episodes"])
        self._next = int(state["next_eval"])
        self._clocks_before = (float(state["train_s"]), float(state["cpu_s"]))
        self._eval_env_state = saved = state["eval_env"]
        if saved is not None:
            self.eval_env.reset()  # uses up a pending seed(), which would reseed the envs at the next evaluation
            if saved["rng"] is not None:
                set_env_rng_states(self.eval_env, saved["rng"])
            if saved["episodes"] is not None:
                restore_episodes(self.eval_env, saved["episodes"])

    def _capture_eval_env(self) -> dict[str, Any]:
        """The evaluation env's state between evaluations: each env's RNG state and the episode state of its layers
        (each None where it cannot be read)."""
        return {"rng": env_rng_states(self.eval_env)[0], "episodes": capture_episodes(self.eval_env)[0]}

    def _on_training_start(self) -> None:
        self._start, self._cpu_start = time.perf_counter(), time.process_time()
        if self.eval_at_start and not self.evaluations:  # a resumed run has its start evaluation
            self.evaluate()

    def _on_step(self) -> bool:
        if not self.at_rollout_start:
            self._evaluate_if_due()
        return True

    def _on_rollout_start(self) -> None:
        if self.at_rollout_start:
            self._evaluate_if_due()

    def _evaluate_if_due(self) -> None:
        if self.num_timesteps >= self._next:
            self._next += self.eval_freq
            self.evaluate()

    def _on_training_end(self) -> None:
        if self.eval_at_end and (not self.evaluations or self.evaluations[-1].timesteps != self.num_timesteps):
            self.evaluate()

    def evaluate(self, n_episodes: int | None = None) -> Evaluation:
        """Run ``n_episodes`` (default: the callback's) episodes now, record and return the result."""
        paused, cpu_paused = time.perf_counter(), time.process_time()
        train_s, cpu_s = self.clocks()
        training_env = self.model.get_env()
        if isinstance(training_env, VecNormalize):
            sync_envs_normalization(training_env, self.eval_env)
        final_infos: list[dict[str, Any]] = []

        def record(local: dict[str, Any], _: dict[str, Any]) -> None:  # evaluate_policy's per-step hook
            if local["done"] and "episode" in local["info"]:
                final_infos.append(local["info"])

        returns, lengths = evaluate_policy(self.model, self.eval_env, n_eval_episodes=n_episodes or self.n_episodes,
                                           deterministic=self.deterministic, return_episode_rewards=True,
                                           callback=record if self.info_keys else None)
        training = [episode["l"] for episode in (self.model.ep_info_buffer or [])]
        result = Evaluation(
            timesteps=int(self.num_timesteps), mean_return=float(np.mean(returns)), mean_length=float(np.mean(lengths)),
            train_s=train_s, cpu_s=cpu_s,
            episode_info={key: _mean_info(final_infos, key, len(returns)) for key in self.info_keys},
            train_length=float(np.mean(training)) if training else None,
        )
        self.evaluations.append(result)
        self._episodes.append((list(map(float, returns)), list(map(int, lengths))))
        self._eval_env_state = self._capture_eval_env()
        if self.save_dir is not None:
            self._save(result)
        self.exclude(time.perf_counter() - paused, time.process_time() - cpu_paused)
        if self.on_eval is not None:
            self.on_eval(result)
        return result

    def _save(self, result: Evaluation) -> None:
        assert self.save_dir is not None
        self.save_dir.mkdir(parents=True, exist_ok=True)
        np.savez(self.save_dir / "evaluations.npz", timesteps=[e.timesteps for e in self.evaluations],
                 results=[r for r, _ in self._episodes], ep_lengths=[n for _, n in self._episodes])
        if result.mean_return >= max(self.returns):
            self.model.save(self.save_dir / "best_model.zip")

    def as_dicts(self) -> list[dict[str, Any]]:
        """The evaluations as plain dicts (for JSON)."""
        return [asdict(e) for e in self.evaluations]


def _mean_info(infos: list[dict[str, Any]], key: str, n_episodes: int) -> float | None:
    """Mean of ``key`` over the episodes' final infos; None unless every episode had it."""
    values = [float(info[key]) for info in infos if key in info]
    return float(np.mean(values)) if values and len(values) == n_episodes else None
