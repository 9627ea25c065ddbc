"""Preemption of a tuning worker: SIGTERM or SIGINT fails the running trial, re-queues its parameters and exits.

A worker that receives SIGTERM or SIGINT stops its trial at the next env step of the training in progress (or
between trials; the signal handling is :mod:`sb3_ppo_scale.stop_signals`'): Optuna records the trial as FAIL (user
attribute ``preempted``: the signal's name; Optuna's warning with the traceback of that stop is not printed, see
:func:`quiet_after_stop`), its parameters are enqueued again (``retry_of``: its number, as for a killed worker's
trial, at most :data:`~sb3_ppo_scale.tuning.storage.MAX_RETRY` times) and the worker exits with
:data:`~sb3_ppo_scale.checkpoint.PREEMPTED_EXIT_CODE` (75). Re-running the same ``tune`` command continues the study:
the re-queued trial runs first, from scratch (a trial's training is not checkpointed: trials are short).

``tune --workers N`` forwards a signal it receives to its worker processes and exits with the same code once they
have stopped. A worker killed outright (SIGKILL, or a signal before its handler is installed) is still recovered by
:func:`~sb3_ppo_scale.tuning.storage.recover_stale_trials` when ``tune`` runs again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sb3_ppo_scale import stop_signals

#: user attribute of a trial stopped by a signal: the signal's name
PREEMPTED_ATTR = "preempted"
#: Optuna's logger of failed trials: it warns with the full traceback of the exception that failed a trial
OPTUNA_TRIAL_LOGGER = "optuna.study._optimize"


@contextmanager
def handling(forward_to: Callable[[], list[int]] | None = None) -> Iterator[None]:
    """:func:`sb3_ppo_scale.stop_signals.handling` for the tuning worker(s), with Optuna's warnings about the trial a
    signal stopped dropped meanwhile (:func:`quiet_after_stop`)."""
    optuna_logger = logging.getLogger(OPTUNA_TRIAL_LOGGER)
    optuna_logger.addFilter(quiet_after_stop)
    try:
        with stop_signals.handling(forward_to, what="the tuning worker(s)"):
            yield
    finally:
        optuna_logger.removeFilter(quiet_after_stop)


def quiet_after_stop(record: logging.LogRecord) -> bool:
    """Logging filter on Optuna's trial logger while :func:`handling` is active: once a stop signal arrived, its
    warnings (the trial the signal stopped "failed", with the traceback of
    :class:`~sb3_ppo_scale.stop_signals.StopSignalled`) are dropped; the worker says in one line which trial it stopped
    and re-queued."""
    return stop_signals.received() is None


def between_trials(study: Any, trial: Any) -> None:
    """Optuna callback: no new trial after a stop signal."""
    stop_signals.check()
