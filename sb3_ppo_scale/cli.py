"""The ``sb3-ppo-scale`` command: one sub-command per job, each registered by the module that owns it.

A user's mistake (unknown env id or config key, bad value, missing file) ends the command with one line on
stderr, ``sb3-ppo-scale <command>: error: ...``, and exit code 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

import yaml

from sb3_ppo_scale.envs.known_warnings import filter_known_warnings

#: Modules that add sub-commands; each exposes ``register(subparsers)`` and sets ``func`` on its parsers.
COMMAND_MODULES = ("sb3_ppo_scale.experiments.commands", "sb3_ppo_scale.tuning.commands")
#: Exit code for a user's mistake (argparse's convention).
USAGE_ERROR = 2


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean a mistake in the command line, a config or a file (not a bug)."""
    import gymnasium as gym

    return ValueError, OSError, AssertionError, TypeError, KeyError, gym.error.Error, yaml.YAMLError


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (``prog: error: message; see prog --help``), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="sb3-ppo-scale", description="PPO for Stable-Baselines3 at scale.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error (any position)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def one_line(error: BaseException) -> str:
    """The error as one line: its message's lines joined (the type name if the message is empty)."""
    text = " ".join(line.strip() for line in str(error).strip().splitlines() if line.strip())
    if isinstance(error, KeyError) and error.args:
        text = f"unknown key {error.args[0]!r}"
    return text or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run one sub-command; returns its exit code (2 for a user's mistake, printed as one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    filter_known_warnings()
    debug = "--debug" in argv
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    if debug:
        return int(args.func(args) or 0)
    try:
        return int(args.func(args) or 0)
    except user_errors() as error:
        print(f"sb3-ppo-scale {args.command}: error: {one_line(error)}", file=sys.stderr)
        return USAGE_ERROR
    except Exception as error:  # a bug, not a mistake: still one line, with where to look
        where = traceback.extract_tb(error.__traceback__)[-1]
        print(f"sb3-ppo-scale {args.command}: internal error: {type(error).__name__}: {one_line(error)} "
              f"({where.filename}:{where.lineno}; rerun with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
