"""An SB3 ``VecEnv`` over an EnvPool batch, with SB3's episode-end contract.

EnvPool resets a finished env on the *next* step it receives for that env and ignores that step's action.
SB3's VecEnvs reset in the same step: the step that ends an episode returns the next episode's first
observation, with the last one in ``infos[i]["terminal_observation"]`` and ``infos[i]["TimeLimit.truncated"]``
set when a time limit (not a terminal state) ended it. :class:`EnvPoolVecEnv` honours SB3's contract: right after
a step in which some envs finished, it steps only those envs once more through EnvPool's ``send(action, env_id)``
/ ``recv()`` (a reset step; its dummy action is ignored by EnvPool and its output is the reset observation).
Every action SB3 sends is therefore applied, and no transition whose action EnvPool ignored reaches a rollout.

Episode statistics: ``infos[i]["episode"] = {"r", "l", "t"}`` as SB3's ``Monitor`` writes them (return rounded to
6 decimals, length in agent steps, seconds since the VecEnv was built). For Atari tasks, as with SB3's
``make_atari_env`` (Monitor below ``AtariWrapper``), an episode is a whole game: raw (unclipped) rewards, summed
over lives, reported when the game is over or the time limit hits; a lost life ends a *training* episode
(``dones[i]`` True, no ``"episode"`` key).

Seeding: EnvPool's rule, env ``i`` seeded with ``seed + i`` (also SB3's ``make_vec_env`` rule; the random streams
are EnvPool's, not Gymnasium's, so trajectories differ from Gymnasium envs with the same seeds). ``seed(s)``
rebuilds the pool with seed ``s`` at the next ``reset()``.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from sb3_ppo_scale.core.checks import is_int
from sb3_ppo_scale.envs.tasks import import_envpool, resolve_task


def _float32_space(space: spaces.Space) -> spaces.Space:
    """Box spaces as float32 (EnvPool's MuJoCo spaces are float64, SB3's policies and Gymnasium's are float32)."""
    if isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), space.shape, np.float32)
    return space


class EpisodeStats:
    """Per-env running return and length; SB3 Monitor's ``{"r", "l", "t"}`` when an episode ends."""

    def __init__(self, n_envs: int) -> None:
        self.returns = np.zeros(n_envs, dtype=np.float64)
        self.lengths = np.zeros(n_envs, dtype=np.int64)
        self.t_start = time.time()

    def add(self, ids: np.ndarray, rewards: np.ndarray) -> None:
        """Count one step of reward ``rewards`` (raw, unclipped) for envs ``ids``."""
        self.returns[ids] += rewards
        self.lengths[ids] += 1

    def close(self, env: int) -> dict[str, float | int]:
        """End env ``env``'s episode: its Monitor record, and zeroed counters."""
        record = {
            "r": round(float(self.returns[env]), 6),
            "l": int(self.lengths[env]),
            "t": round(time.time() - self.t_start, 6),
        }
        self.returns[env], self.lengths[env] = 0.0, 0
        return record


class EnvPoolVecEnv(VecEnv):
    """SB3 ``VecEnv`` over one synchronous EnvPool batch (``num_envs == batch_size``).

    Build it with :func:`make_envpool_vec_env`. Observations: float32 for float tasks (MuJoCo), uint8
    ``(4, 84, 84)`` for Atari. Besides SB3's ``step_async``/``step_wait``, :meth:`send` / :meth:`recv` step any
    subset of envs (for collectors that overlap env stepping with inference); at most one subset may be in flight.
    """

    def __init__(self, env_id: str, n_envs: int, seed: int = 0, **env_kwargs: Any) -> None:
        if not is_int(n_envs) or n_envs < 1:  # type: ignore[operator]  # a bool is no count
            raise ValueError(f"n_envs must be an int >= 1, got {n_envs!r}")
        _check_seed(seed)
        self.env_id = env_id
        self.task_id, self.envpool_options, self.atari = resolve_task(env_id, env_kwargs)
        self._seed = int(seed)
        self._pending_seed: int | None = None
        self.render_mode = None
        pool = self._make_pool(int(n_envs), self._seed)
        super().__init__(int(n_envs), _float32_space(pool.observation_space), _float32_space(pool.action_space))
        self._pool = pool
        self._all_ids = np.arange(self.num_envs, dtype=np.int32)
        self._pool_action_dtype = pool.action_space.dtype
        self._reset_actions = np.zeros((self.num_envs, *pool.action_space.shape), dtype=self._pool_action_dtype)
        self._obs_dtype = self.observation_space.dtype
        self._actions: np.ndarray | None = None
        self._in_flight = False
        self.episodes = EpisodeStats(self.num_envs)
        self.reset_steps = 0  # reset steps issued (each one an extra EnvPool step for a finished env)

    # ------------------------------------------------------------------------------------------------ pool
    def _make_pool(self, n_envs: int, seed: int) -> Any:
        envpool = import_envpool()
        return envpool.make(
            self.task_id, env_type="gymnasium", num_envs=n_envs, batch_size=n_envs, seed=seed, **self.envpool_options
        )

    def _as_obs(self, obs: np.ndarray) -> np.ndarray:
        return obs.astype(self._obs_dtype, copy=False) if obs.dtype != self._obs_dtype else obs

    # ----------------------------------------------------------------------------------------- VecEnv API
    def reset(self) -> VecEnvObs:
        """Reset every env (rebuilding the pool first if :meth:`seed` was called); zero the episode counters."""
        if self._in_flight:
            self._pool.recv()
            self._in_flight = False
        if self._pending_seed is not None:
            self._pool.close()
            self._seed, self._pending_seed = self._pending_seed, None
            self._pool = self._make_pool(self.num_envs, self._seed)
        obs, info = self._pool.reset(self._all_ids)
        self.episodes = EpisodeStats(self.num_envs)
        self.reset_infos = [{} for _ in range(self.num_envs)]
        return self._as_obs(obs)

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        assert self._actions is not None, "step_async() must come before step_wait()"
        self.send(self._actions, self._all_ids)
        self._actions = None
        obs, rewards, dones, infos, _ = self.recv()
        return obs, rewards, dones, infos

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        """Start stepping envs ``env_ids`` (int32, distinct) with ``actions`` (one row per id)."""
        if self._in_flight:
            raise RuntimeError("EnvPoolVecEnv.send(): a step is already in flight, recv() it first")
        self._pool.send(np.asarray(actions, dtype=self._pool_action_dtype), env_ids)
        self._in_flight = True

    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]], np.ndarray]:
        """Finish the step started by :meth:`send`, in SB3's VecEnv semantics.

        :return: (observations, float32 rewards, bool dones, infos, env ids), rows in the order of the ids sent.
            A finished env's row holds its next episode's first observation.
        """
        obs, rewards, terminated, truncated, info = self._pool.recv()
        self._in_flight = False
        ids = info["env_id"]
        obs = self._as_obs(obs)
        self.episodes.add(ids, info["reward"] if self.atari else rewards)
        dones = np.logical_or(terminated, truncated)
        infos: list[dict[str, Any]] = [{} for _ in range(len(ids))]
        if dones.any():
            game_over = np.logical_or(truncated, info["terminated"].astype(bool)) if self.atari else dones
            rows = np.flatnonzero(dones)
            for row in rows:
                infos[row]["terminal_observation"] = obs[row].copy()
                infos[row]["TimeLimit.truncated"] = bool(truncated[row] and not terminated[row])
                if game_over[row]:
                    infos[row]["episode"] = self.episodes.close(int(ids[row]))
            obs = obs.copy() if not obs.flags.writeable else obs
            obs[rows] = self._reset_observations(ids[rows])
        return obs, rewards.astype(np.float32), dones, infos, ids

    def _reset_observations(self, env_ids: np.ndarray) -> np.ndarray:
        """One EnvPool step for finished envs ``env_ids``: EnvPool resets them (ignoring the action)."""
        self._pool.send(self._reset_actions[: len(env_ids)], env_ids)
        obs, _, _, _, info = self._pool.recv()
        assert np.array_equal(info["env_id"], env_ids), "EnvPool returned other envs than the reset step's"
        self.reset_steps += len(env_ids)
        return self._as_obs(obs)

    def seed(self, seed: int | None = None) -> Sequence[None | int]:
        """Re-seed: the pool is rebuilt with ``seed`` (env i: ``seed + i``) at the next ``reset()``."""
        if seed is None:
            return [None] * self.num_envs
        _check_seed(seed)
        self._pending_seed = int(seed)
        return [int(seed) + i for i in range(self.num_envs)]

    def close(self) -> None:
        self._pool.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """The VecEnv's own attribute, once per selected env (EnvPool envs are not Python objects)."""
        value = getattr(self, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        setattr(self, attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any) -> list[Any]:
        raise NotImplementedError(f"EnvPoolVecEnv has no per-env Python objects to call {method_name!r} on")

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """True for ``Monitor`` (this VecEnv writes Monitor's episode records), False for anything else."""
        return [issubclass(Monitor, wrapper_class) for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        raise NotImplementedError("EnvPoolVecEnv does not render")


def _check_seed(seed: object) -> None:
    """EnvPool seeds env i with ``seed + i``: an int (``int()`` would silently cut 1.7 to 1 and read "1")."""
    if not is_int(seed):
        raise ValueError(f"seed must be an int (env i is seeded with seed + i), got {seed!r}")


def make_envpool_vec_env(env_id: str, n_envs: int, seed: int = 0, **env_kwargs: Any) -> EnvPoolVecEnv:
    """An SB3 VecEnv of ``n_envs`` EnvPool envs of task ``env_id``, env ``i`` seeded with ``seed + i``.

    :param env_id: an EnvPool task id (``HalfCheetah-v5``, ``Hopper-v5``, ``Pong-v5``, ...) or a Gymnasium Atari
        id (``PongNoFrameskip-v4``, ``ALE/Pong-v5``); see :mod:`sb3_ppo_scale.envs.tasks`.
    :param env_kwargs: EnvPool options (``max_episode_steps``, ``num_threads``, Atari ``episodic_life``, ...);
        they override the SB3-matching Atari settings.
    :raises ImportError: EnvPool is missing (the message names ``pip install sb3-ppo-scale[envpool]``).
    :raises ValueError: unknown ``env_id``, ``n_envs`` not an int >= 1, or ``seed`` not an int.
    """
    return EnvPoolVecEnv(env_id, n_envs, seed, **env_kwargs)
