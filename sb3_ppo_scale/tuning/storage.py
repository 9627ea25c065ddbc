"""Where studies live: a journal file (one machine, many processes; the default) or an RDB URL (many machines).

- Journal file (``JournalStorage(JournalFileBackend)``): no server. A worker killed mid-trial leaves that trial
  RUNNING; :func:`recover_stale_trials` (run by ``tune`` before it starts workers) fails the RUNNING trials whose
  worker process on this host is gone and enqueues their parameters again, so the study is completed.
- RDB (``postgresql://``, ``mysql+pymysql://``, ``sqlite:///``): workers send a heartbeat every
  ``HEARTBEAT_INTERVAL_S`` seconds; a trial silent for ``GRACE_PERIOD_S`` seconds is failed and retried by any
  worker on any machine (``RetryHeartbeatStaleTrialCallback``). SQLite is not for parallel writers.
"""

from __future__ import annotations

import atexit
import os
import socket
import warnings
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 60
#: How many times a trial whose worker died is re-enqueued (RDB heartbeat retries use the same count).
MAX_RETRY = 2
#: User attribute naming the process that runs a trial: "host:pid".
WORKER_ATTR = "worker"
RETRY_ATTR = "retry_of"
#: Trial user attribute of a FAIL trial whose training diverged: ``"seed <s>: <why>"`` (see
#: :mod:`sb3_ppo_scale.tuning.objective`); it ran to its end, so it is not re-queued.
DIVERGED_ATTR = "diverged"


def is_rdb_url(storage: str) -> bool:
    """True for a database URL (``dialect[+driver]://...``); anything else is a journal file path."""
    return "://" in storage


#: The RDB storages this process opened, by (pid, URL, heartbeat settings): one SQLAlchemy engine and pool each.
_RDB_STORAGES: dict[tuple[int, str, int, int], RDBStorage] = {}


def open_storage(storage: str) -> BaseStorage:
    """Open (creating if needed) a journal file or connect to an RDB; raise ValueError if it cannot be reached.

    An RDB storage is opened once per process and URL: later calls return the same :class:`RDBStorage`, so a
    process holds one engine (one connection pool) per database however often it asks, and
    :func:`close_storages` disposes them at exit. A journal file holds no connections and is opened anew.
    """
    if not is_rdb_url(storage):
        return _open_journal(storage)
    key = (os.getpid(), storage, HEARTBEAT_INTERVAL_S, GRACE_PERIOD_S)  # a forked child opens its own
    if key not in _RDB_STORAGES:
        _RDB_STORAGES[key] = _open_rdb(storage)
    return _RDB_STORAGES[key]


def close_storages() -> None:
    """Dispose the engines of the RDB storages this process opened (their connections close now, not at garbage
    collection); registered to run at exit. A later :func:`open_storage` connects again."""
    for key in [key for key in _RDB_STORAGES if key[0] == os.getpid()]:
        _RDB_STORAGES.pop(key).engine.dispose()


atexit.register(close_storages)


def _open_journal(path: str) -> JournalStorage:
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(path))
    except OSError as error:
        raise ValueError(f"storage: cannot open journal file {path!r}: {error}") from None


def _open_rdb(storage: str) -> RDBStorage:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return RDBStorage(
                storage,
                engine_kwargs=_engine_kwargs(storage),
                heartbeat_interval=HEARTBEAT_INTERVAL_S,
                grace_period=GRACE_PERIOD_S,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY),
            )
    except ImportError as error:  # Optuna re-raises the driver's ModuleNotFoundError as a plain ImportError
        missing = error if isinstance(error, ModuleNotFoundError) else error.__cause__
        name = getattr(missing, "name", None)
        driver = f"the Python driver {name!r}" if name else "a Python driver it lacks"
        raise ValueError(
            f"storage {_redact(storage)!r} needs {driver}; install it "
            "(PostgreSQL: pip install 'psycopg[binary]' and use postgresql+psycopg://, MySQL: pip install pymysql "
            "and use mysql+pymysql://)"
        ) from None
    except Exception as error:  # SQLAlchemy wraps driver errors in many classes
        raise ValueError(f"storage {_redact(storage)!r} cannot be reached: {str(error).splitlines()[0]}") from None


def _engine_kwargs(url: str) -> dict[str, object]:
    if url.startswith(("postgresql", "mysql")):
        return {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    return {}


def _redact(url: str) -> str:
    """The URL without its password."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else url


def worker_id() -> str:
    """This process as stored on its trials: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_orphan(trial: optuna.trial.FrozenTrial) -> bool:
    """A RUNNING trial whose worker on this host is gone (or that died before naming its worker)."""
    owner = trial.user_attrs.get(WORKER_ATTR)
    if owner is None:
        return True
    host, _, pid = str(owner).rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not _process_alive(int(pid))


def recover_stale_trials(study: optuna.Study) -> list[int]:
    """Fail RUNNING trials whose worker died, then enqueue their parameters again; returns the failed numbers.

    With an RDB storage this is Optuna's heartbeat check (it retries the trial itself). With a journal file, run it
    only while no other ``tune`` command works on the same file: a RUNNING trial without a worker attribute counts
    as orphaned.
    """
    storage = study._storage
    if is_heartbeat_enabled(storage):  # an RDB storage (Optuna wraps it in a cache, so no isinstance check)
        before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        optuna.storages.fail_stale_trials(study)
        after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        return sorted(before - after)
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _is_orphan(trial):
            continue
        if storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
            failed.append(trial.number)
            requeue(study, trial)
    return failed


def requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
    """Enqueue a failed trial's parameters again (``retry_of`` its number) unless it was retried MAX_RETRY times;
    returns whether it was enqueued."""
    retries = int(trial.user_attrs.get("retries", 0))
    if retries >= MAX_RETRY or not trial.params:
        return False
    study.enqueue_trial(trial.params, user_attrs={RETRY_ATTR: trial.number, "retries": retries + 1})
    return True
