"""Stop signals for long jobs: SIGTERM or SIGINT is recorded, forwarded to worker processes, and ends the work in
progress at its next env step instead of killing the process.

``sb3-ppo-scale tune`` (:mod:`sb3_ppo_scale.tuning.preemption` adds what Optuna needs: the stopped trial is failed and
re-queued) and ``sb3-ppo-scale bench`` (:mod:`sb3_ppo_scale.experiments.bench_resume`: a run stops with its checkpoint)
both use these functions. A run's own :class:`~sb3_ppo_scale.checkpoint.ResumableCheckpoint` installs its handler
for the duration of ``learn()``; what it caught is counted here with :func:`remember`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

#: signals that stop a job
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[int] = []  #: signals this process received while a handler of :func:`install` was active


class StopSignalled(Exception):
    """A stop signal ended the work in progress (``signal_name``: e.g. ``"SIGTERM"``)."""

    def __init__(self, signum: int) -> None:
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


def received() -> int | None:
    """The first stop signal this process received (None: none)."""
    return _received[0] if _received else None


def remember(signum: int) -> None:
    """Count ``signum`` as received (for :func:`received`) when another handler caught it, e.g. a run's
    :class:`~sb3_ppo_scale.checkpoint.ResumableCheckpoint`."""
    _received.append(signum)


def install(forward_to: Callable[[], list[int]] | None = None, forward_as: int | None = None,
            what: str = "the worker(s)") -> dict[int, Any]:
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
             what: str = "the worker(s)") -> Iterator[None]:
    """:func:`install` for the duration of the block; the previous handlers come back after it."""
    previous = install(forward_to, forward_as, what)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def check() -> None:
    """Raise :class:`StopSignalled` if a stop signal arrived."""
    signum = received()
    if signum is not None:
        raise StopSignalled(signum)


class StopOnSignal(BaseCallback):
    """Ends ``learn()`` at the next env step after a stop signal (raises :class:`StopSignalled`)."""

    def _on_step(self) -> bool:
        check()
        return True
