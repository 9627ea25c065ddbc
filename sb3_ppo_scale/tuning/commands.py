"""The ``tune`` and ``report`` sub-commands of ``sb3-ppo-scale``.

``tune`` writes under the current working directory (``tune_results/<name>/<name>.journal``) unless the spec or
``--storage`` names another storage; ``report`` writes to ``tune_results/reports/<source>`` unless ``--out`` says
otherwise, and refuses to overwrite files committed to git without ``--overwrite``.
"""

from __future__ import annotations

import argparse

from sb3_ppo_scale.experiments.commands import add_threads_argument


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``tune SPEC`` and ``report SPEC_OR_STUDY``."""
    tune = subparsers.add_parser("tune", help="run or resume the Optuna studies of a YAML spec (one per env)")
    tune.add_argument("spec", help="YAML study spec (see tuning/*.yaml)")
    tune.add_argument("--n-trials", type=int, default=None, help="completed trials per env (default: the spec's n_trials)")
    tune.add_argument("--n-timesteps", type=int, default=None,
                      help="env steps per trial instead of the spec's timesteps (evaluations scaled alike): a quick look")
    tune.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="change one spec value (repeatable; dotted keys), e.g. --set base.n_envs=2 "
                           "--set evaluation.n_episodes=1")
    tune.add_argument("--workers", type=int, default=1, help="worker processes on this machine (default 1)")
    add_threads_argument(tune)
    tune.add_argument("--storage", default=None,
                      help="journal file path or RDB URL, e.g. postgresql://user:pw@host/db (default: the spec's "
                           "storage, else ./tune_results/<name>/<name>.journal)")
    tune.set_defaults(func=_tune)

    report = subparsers.add_parser("report", help="importance table (ours beside the documented one) and PNG plots")
    report.add_argument("source", metavar="SPEC_OR_STUDY", nargs="+",
                        help="a YAML spec, or a storage (journal file / RDB URL) whose studies to report; several: one "
                             "report over all their studies")
    report.add_argument("--out", default=None,
                        help="output folder for report.md and the PNGs (default ./tune_results/reports/<source name(s), "
                             "joined by +>)")
    report.add_argument("--overwrite", action="store_true",
                        help="allow replacing report files that are committed to git")
    report.add_argument("--storage", default=None, help="with a spec: read this storage instead of the spec's")
    report.add_argument("--study", action="append", default=None, help="with a storage: only this study (repeatable)")
    report.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for rank stability (default 200; 0: off)")
    report.set_defaults(func=_report)


def _tune(args: argparse.Namespace) -> int:
    from sb3_ppo_scale.experiments.pipeline import set_threads
    from sb3_ppo_scale.experiments.zoo import parse_overrides
    from sb3_ppo_scale.tuning.runner import tune
    from sb3_ppo_scale.tuning.spec import load_spec

    set_threads(args.threads)
    spec = load_spec(args.spec, parse_overrides(args.overrides), args.n_timesteps)
    return tune(spec, n_trials=args.n_trials, workers=args.workers, storage=args.storage, threads=args.threads)


def _report(args: argparse.Namespace) -> int:
    from sb3_ppo_scale.tuning.report import report_command

    return report_command(args.source, args.out, storage=args.storage, studies=args.study, n_bootstrap=args.bootstrap,
                          overwrite=args.overwrite)
