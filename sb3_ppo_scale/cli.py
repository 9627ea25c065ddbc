"""The ``sb3-ppo-scale`` command: one sub-command per job, each registered by the module that owns it."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

#: Modules that add sub-commands; each exposes ``register(subparsers)`` and sets ``func`` on its parsers.
COMMAND_MODULES = ("sb3_ppo_scale.experiments.commands", "sb3_ppo_scale.tuning.commands")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sb3-ppo-scale", description="PPO for Stable-Baselines3 at scale.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
