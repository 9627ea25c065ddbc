"""Which tasks the EnvPool VecEnv accepts, and the EnvPool settings each one gets.

Accepted ids:

- any id in ``envpool.list_all_envs()`` (``HalfCheetah-v5``, ``Hopper-v5``, ``CartPole-v1``, ``Pong-v5``, ...);
- Gymnasium/rl-zoo Atari ids: ``<Game>NoFrameskip-v4`` (as the zoo trains them: no sticky actions, a
  400 000-frame limit, i.e. 100 000 agent steps at frame skip 4) and ``ALE/<Game>-v5`` (sticky actions 0.25,
  a 108 000-frame limit = 27 000 agent steps), both mapped to EnvPool's ``<Game>-v5``.

Atari tasks get EnvPool's own preprocessing, set to SB3's ``AtariWrapper`` defaults followed by a 4-frame stack:
noop reset (max 30), frame skip 4 with a max over the last two frames, episodic life (a lost life ends the
training episode), FIRE on reset where the game has FIRE, reward sign-clipping, 84x84 grey frames resized with
INTER_AREA, 4 frames stacked channels-first: ``uint8 (4, 84, 84)``.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

ENVPOOL_EXTRA_HINT = (
    "EnvPool is not installed: `pip install sb3-ppo-scale[envpool]` (EnvPool ships wheels for Linux x86-64 only)"
)

# SB3's AtariWrapper defaults (noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=True,
# clip_reward=True) plus the zoo's frame_stack: 4, in EnvPool's option names.
ATARI_SB3_SETTINGS: dict[str, Any] = {
    "noop_max": 30,
    "frame_skip": 4,
    "episodic_life": True,
    "reward_clip": True,
    "use_fire_reset": True,
    "img_height": 84,
    "img_width": 84,
    "gray_scale": True,
    "use_inter_area_resize": True,
    "stack_num": 4,
    "repeat_action_probability": 0.0,
    "full_action_space": False,
}

_NOFRAMESKIP_V4 = re.compile(r"^(?P<game>[A-Za-z]+)NoFrameskip-v4$")
_ALE_V5 = re.compile(r"^ALE/(?P<game>[A-Za-z]+)-v5$")


def import_envpool() -> ModuleType:
    """Import EnvPool, or raise ImportError naming the ``envpool`` extra."""
    try:
        import envpool
    except ImportError as error:
        raise ImportError(ENVPOOL_EXTRA_HINT) from error
    return envpool


def is_atari(envpool_module: ModuleType, task_id: str) -> bool:
    """True when EnvPool's ``task_id`` is an Atari game (its spec has Atari preprocessing options)."""
    return "episodic_life" in envpool_module.make_spec(task_id).config._fields


def resolve_task(env_id: str, env_kwargs: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    """Map ``env_id`` to (EnvPool task id, EnvPool options, is Atari).

    Options: the Atari settings above (for Atari tasks), then those implied by a Gymnasium id, then
    ``env_kwargs`` (which win).

    :raises ValueError: ``env_id`` is not accepted (the message says what is).
    """
    envpool = import_envpool()
    known = set(envpool.list_all_envs())
    implied: dict[str, Any] = {}
    task_id = env_id
    if env_id not in known:
        match = _NOFRAMESKIP_V4.match(env_id)
        if match is not None:
            task_id, implied = f"{match['game']}-v5", {"max_episode_steps": 100_000}
        elif (match := _ALE_V5.match(env_id)) is not None:
            task_id, implied = f"{match['game']}-v5", {"repeat_action_probability": 0.25, "max_episode_steps": 27_000}
    if task_id not in known:
        raise ValueError(
            f"env_id={env_id!r} is not an EnvPool task: use an id from envpool.list_all_envs() (e.g. 'HalfCheetah-v5',"
            " 'Hopper-v5', 'Pong-v5') or a Gymnasium Atari id '<Game>NoFrameskip-v4' / 'ALE/<Game>-v5'"
        )
    atari = is_atari(envpool, task_id)
    options = {**(ATARI_SB3_SETTINGS if atari else {}), **implied, **env_kwargs}
    return task_id, options, atari
