"""Silence the third-party deprecation warnings a user of the demo and the CLI can do nothing about, by message.

MuJoCo 3.x prints ``WARNING: compiler attribute 'settotalmass' is deprecated ...`` from C once per model compiled,
because gymnasium's v5 MuJoCo XML files still set that attribute: the demo printed it five times before its first
line. Only the messages listed here are dropped; every other MuJoCo warning is still printed (to stderr, as MuJoCo
prints it) and Python's warning filters are untouched apart from :data:`PYTHON_MESSAGES`.
"""

from __future__ import annotations

import re
import sys
import warnings

#: MuJoCo C-level warnings dropped (start of the message).
MUJOCO_MESSAGES = ("compiler attribute 'settotalmass' is deprecated",)
#: Python warnings dropped (regular expressions matched at the start of the message).
PYTHON_MESSAGES: tuple[str, ...] = ()


def _mujoco_warning(message: str) -> None:
    if not message.startswith(MUJOCO_MESSAGES):
        print(f"WARNING: {message}", file=sys.stderr, flush=True)


def filter_known_warnings() -> None:
    """Drop the known third-party messages in this process (subprocess envs keep MuJoCo's default handler)."""
    for pattern in PYTHON_MESSAGES:
        warnings.filterwarnings("ignore", message=re.escape(pattern))
    try:
        import mujoco
    except ImportError:  # no MuJoCo, nothing to quiet
        return
    mujoco.set_mju_user_warning(_mujoco_warning)
