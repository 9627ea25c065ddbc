"""Vectorised environments beyond SB3's: an SB3 ``VecEnv`` over an EnvPool batch (C++ threads stepping the envs),
the scale plan that picks a backend, env count, threads and device for this machine (:mod:`sb3_ppo_scale.envs.scale`),
the episode state checkpoints keep (:mod:`sb3_ppo_scale.envs.episodes`, :class:`EpisodeState` for a ``SubprocVecEnv``).

EnvPool is an optional dependency (``pip install sb3-ppo-scale[envpool]``, Linux x86-64): importing this package
works without it, building an env raises ImportError naming the extra.

:class:`ProcessVecEnv` (:mod:`sb3_ppo_scale.envs.processes`) runs any Gymnasium env in worker processes, several envs
per process, observations in shared memory, with SB3's episode contract.
"""

from sb3_ppo_scale.envs.envpool import EnvPoolVecEnv, make_envpool_vec_env
from sb3_ppo_scale.envs.episodes import EpisodeState
from sb3_ppo_scale.envs.processes import EnvWorkerError, ProcessVecEnv, default_workers, make_process_vec_env
from sb3_ppo_scale.envs.scale import ScalePlan, make_scale_vec_env, plan_scale
from sb3_ppo_scale.envs.tasks import ATARI_SB3_SETTINGS, ENVPOOL_EXTRA_HINT, resolve_task

__all__ = [
    "ATARI_SB3_SETTINGS",
    "ENVPOOL_EXTRA_HINT",
    "EnvPoolVecEnv",
    "EnvWorkerError",
    "EpisodeState",
    "ProcessVecEnv",
    "ScalePlan",
    "default_workers",
    "make_envpool_vec_env",
    "make_process_vec_env",
    "make_scale_vec_env",
    "plan_scale",
    "resolve_task",
]
