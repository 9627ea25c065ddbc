"""The ``tune`` and ``report`` sub-commands of ``sb3-ppo-scale``."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``tune SPEC`` and ``report SPEC_OR_STUDY --out DIR``."""
    tune = subparsers.add_parser("tune", help="run or resume the Optuna studies of a YAML spec (one per env)")
    tune.add_argument("spec", help="YAML study spec (see tuning/*.yaml)")
    tune.add_argument("--n-trials", type=int, default=None, help="completed trials per env (default: the spec's n_trials)")
    tune.add_argument("--workers", type=int, default=1, help="worker processes on this machine (default 1)")
    tune.add_argument("--storage", default=None,
                      help="journal file path or RDB URL, e.g. postgresql://user:pw@host/db (default: the spec's "
                           "storage, else <output_dir>/<name>.journal)")
    tune.set_defaults(func=_tune)

    report = subparsers.add_parser("report", help="importance table (ours beside the documented one) and PNG plots")
    report.add_argument("source", metavar="SPEC_OR_STUDY",
                        help="a YAML spec, or a storage (journal file / RDB URL) whose studies to report")
    report.add_argument("--out", required=True, help="output folder for report.md and the PNGs")
    report.add_argument("--storage", default=None, help="with a spec: read this storage instead of the spec's")
    report.add_argument("--study", action="append", default=None, help="with a storage: only this study (repeatable)")
    report.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for rank stability (default 200; 0: off)")
    report.set_defaults(func=_report)


def _tune(args: argparse.Namespace) -> int:
    from sb3_ppo_scale.tuning.runner import tune
    from sb3_ppo_scale.tuning.spec import load_spec

    try:
        spec = load_spec(args.spec)
        return tune(spec, n_trials=args.n_trials, workers=args.workers, storage=args.storage)
    except ValueError as error:
        print(f"sb3-ppo-scale tune: error: {error}", file=sys.stderr)
        return 2


def _report(args: argparse.Namespace) -> int:
    from sb3_ppo_scale.tuning.report import report_command

    try:
        return report_command(args.source, args.out, storage=args.storage, studies=args.study, n_bootstrap=args.bootstrap)
    except ValueError as error:
        print(f"sb3-ppo-scale report: error: {error}", file=sys.stderr)
        return 2
