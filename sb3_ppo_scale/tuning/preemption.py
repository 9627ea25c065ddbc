"""Preemption of a tuning worker: SIGTERM or SIGINT fails the running trial, re-queues its parameters and exits.

A worker that receives SIGTERM or SIGINT stops its trial at the next env step of the training in progress (or
between trials): Optuna records the trial as FAIL (user attribute ``preempted``: the signal's name; Optuna's warning
with the traceback of that stop is not printed, see :func:`quiet_after_stop`), its parameters
are enqueued again (``retry_of``: its number, as for a killed worker's trial, at most
:data:`~sb3_ppo_scale.tuning.storage.MAX_RETRY` times) and the worker exits with
:data:`~sb3_ppo_scale.checkpoint.PREEMPTED_EXIT_CODE` (75). Re-running the same ``tune`` command continues the study:
the re-queued trial runs first, from scratch (a trial's training is not checkpointed: trials are short).

``tune --workers N`` forwards a signal it receives to its worker processes and exits with the same code once they
have stopped. A worker killed outright (SIGKILL, or a signal before its handler is installed) is still recovered by
:func:`~sb3_ppo_scale.tuning.storage.recover_stale_trials` when ``tune`` runs again.

``sb3-ppo-scale bench`` records and forwards signals with the same functions (:func:`install` in its worker
processes, :func:`handling` with ``forward_as=SIGTERM`` in the parent); its runs stop with a checkpoint instead.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

#: signals that stop a worker
SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: user attribute of a trial stopped by a signal: the signal's name
PREEMPTED_ATTR = "preempted"

_received: list[int] = []  #: signals this process received while :func:`handling` was active
#: Optuna's logger of failed trials: it warns with the full traceback of the exception that failed a trial
OPTUNA_TRIAL_LOGGER = "optuna.study._optimize"


class TrialPreempted(Exception):
    """A signal stopped the running trial (Optuna marks it FAIL; the worker re-queues it)."""

    def __init__(self, signum: int) -> None:
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


def received() -> int | None:
    """The first stop signal received while :func:`handling` was active (None: none)."""
    return _received[0] if _received else None


def remember(signum: int) -> None:
    """Count ``signum`` as received (for :func:`received`) when another handler caught it, e.g. a run's
    :class:`~sb3_ppo_scale.checkpoint.ResumableCheckpoint`."""
    _received.append(signum)


def install(forward_to: Callable[[], list[int]] | None = None, forward_as: int | None = None,
            what: str = "the tuning worker(s)") -> dict[int, Any]:
    """From now on record SIGTERM/SIGINT instead of dying (main thread only): the first one prints one line
    (``received SIGTERM: stopping <what>``), and each is sent on to ``forward_to()``'s pids, as ``forward_as`` (a
    signal number; default: the signal received). Returns the previous handlers ({} off the main thread: signals
    are then the caller's business)."""

    def record(signum: int, frame: Any) -> None:
        first = not _received
        remember(signum)
        if first:
            os.write(2, f"received {signal.Signals(signum).name}: stopping {what}\n".encode())
        for pid in forward_to() if forward_to is not None else []:
            try:
                os.kill(pid, signum if forward_as is None else forward_as)
            except ProcessLookupError:
                pass

    previous = {}
    try:
        for signum in SIGNALS:
            previous[signum] = signal.signal(signum, record)
    except ValueError:  # not the main thread
        pass
    return previous


@contextmanager
def handling(forward_to: Callable[[], list[int]] | None = None, forward_as: int | None = None,
             what: str = "the tuning worker(s)") -> Iterator[None]:
    """:func:`install` for the duration of the block (the previous handlers come back after it); Optuna's warnings
    about the trial a signal stopped are dropped meanwhile (:func:`quiet_after_stop`)."""
    previous = install(forward_to, forward_as, what)
    optuna_logger = logging.getLogger(OPTUNA_TRIAL_LOGGER)
    optuna_logger.addFilter(quiet_after_stop)
    try:
        yield
    finally:
        optuna_logger.removeFilter(quiet_after_stop)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def quiet_after_stop(record: logging.LogRecord) -> bool:
    """Logging filter on Optuna's trial logger while :func:`handling` is active: once a stop signal arrived, its
    warnings (the trial the signal stopped "failed", with the traceback of :class:`TrialPreempted`) are dropped; the
    worker says in one line which trial it stopped and re-queued."""
    return received() is None


def check() -> None:
    """Raise :class:`TrialPreempted` if a stop signal arrived."""
    signum = received()
    if signum is not None:
        raise TrialPreempted(signum)


class PreemptionCheck(BaseCallback):
    """Stops a trial's training at the next env step after a stop signal (raises :class:`TrialPreempted`)."""

    def _on_step(self) -> bool:
        check()
        return True


def between_trials(study: Any, trial: Any) -> None:
    """Optuna callback: no new trial after a stop signal."""
    check()
