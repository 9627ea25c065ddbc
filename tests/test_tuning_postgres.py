"""A study on PostgreSQL (the many-machines storage): the test starts its own throw-away server on a loopback port.

Needs the server binaries (Debian: ``apt-get install postgresql``; found on PATH or under /usr/lib/postgresql/*/bin)
and the driver (``pip install "psycopg[binary]"``, in the ``test`` extra). Skipped, with the reason, when either is
missing or the server cannot start, except with ``CI=true``, where that is a failure (.ci/run installs both, and a
CI run must not pass without these tests). As root the server runs as the ``postgres`` user (initdb refuses root).

Heartbeat and retry: a worker is SIGKILLed while its trial is RUNNING (it hangs there on purpose, see
``tests.helpers.start_gated_tune``); once the trial's last heartbeat is older than the grace period, the next
``tune`` fails it and Optuna's ``RetryHeartbeatStaleTrialCallback`` re-runs its parameters. The heartbeat interval
and grace period are shortened (1 s, 3 s instead of 10 s, 60 s) so the test does not wait a minute.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from sb3_ppo_scale.tuning import spec_from_dict, storage as storage_module
from sb3_ppo_scale.tuning.report import report_command
from sb3_ppo_scale.tuning.runner import tune
from sb3_ppo_scale.tuning.storage import HEARTBEAT_INTERVAL_S, WORKER_ATTR, open_storage, recover_stale_trials, worker_id
from tests.helpers import kill_mid_trial, skip_or_fail_in_ci, start_gated_tune, wait_for

#: shortened heartbeat settings of the kill-and-retry test (seconds)
TEST_HEARTBEAT_S, TEST_GRACE_S = 1, 3


def _server_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    return next((c for c in candidates if (c / "initdb").exists() and (c / "pg_ctl").exists()), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _postgres_server(max_connections: int) -> Iterator[str]:
    """Start a PostgreSQL server in a temp dir (trust auth, loopback only, fsync off); yield its URL; stop it."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        skip_or_fail_in_ci("PostgreSQL driver missing: pip install 'psycopg[binary]' (in the test extra)")
    bin_dir = _server_bin()
    if bin_dir is None:
        skip_or_fail_in_ci("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql")
    as_user: dict[str, Any] = {}
    root = Path(tempfile.mkdtemp(prefix="sb3ppo-pg-"))
    if os.geteuid() == 0:
        try:
            entry = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            skip_or_fail_in_ci("running as root and there is no 'postgres' user to run the server as (initdb refuses root)")
        os.chown(root, entry.pw_uid, entry.pw_gid)
        as_user = {"user": entry.pw_uid, "group": entry.pw_gid}
    data, port = root / "data", _free_port()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(bin_dir / args[0]), *args[1:]], capture_output=True, text=True, cwd=root,
                              timeout=120, **as_user)

    init = run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
    options = (f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections={max_connections}"
               " -c superuser_reserved_connections=0")
    start = run("pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-o", options, "-w", "-t", "60", "start") \
        if init.returncode == 0 else init
    if start.returncode != 0:
        log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        skip_or_fail_in_ci(f"PostgreSQL could not start: {(start.stderr or start.stdout).strip()[-300:]} {log[-300:]}")
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        yield url
    finally:
        storage_module.close_storages()  # this process's connections to the server, before it goes
        run("pg_ctl", "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A server for the module's tests (50 connections, PostgreSQL's default is 100)."""
    with _postgres_server(max_connections=50) as url:
        yield url


def _client_connections(url: str) -> int:
    """Client connections the server holds now, apart from the one asking."""
    import psycopg

    with psycopg.connect(url) as connection:
        query = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        return int(connection.execute(query).fetchone()[0])


def _tiny_spec(name: str, tmp_path: Path, seed: int) -> Any:
    return spec_from_dict({
        "name": name,
        "envs": ["Pendulum-v1"],
        "timesteps": 128,  # two rollouts, evaluated after the first update: the parameters change the values
        "evaluation": {"eval_freq": 128, "n_episodes": 1},
        "base": {"n_steps": 32, "n_envs": 2, "n_epochs": 1, "policy_kwargs": {"net_arch": [8]}},
        "space": {"clip_range": {"type": "float", "low": 0.1, "high": 0.3},
                  "gae_lambda": {"type": "float", "low": 0.9, "high": 0.99}},
        "sampler": {"name": "random", "seed": seed},
        "output_dir": str(tmp_path / "unused"),
    })


def test_connections_do_not_grow_with_trials_reports_or_resumed_studies(postgres_url: str, tmp_path: Path) -> None:
    """One engine per process and URL: N more trials, M reports and a resumed study open no new connections."""
    spec = _tiny_spec("conn", tmp_path, seed=3)
    assert tune(spec, n_trials=1, storage=postgres_url) == 0  # this process's storage is open from here on
    base = _client_connections(postgres_url)
    assert tune(spec, n_trials=5, storage=postgres_url) == 0  # N = 4 more trials in this process
    after_trials = _client_connections(postgres_url)
    for m in range(3):  # M = 3 reports
        assert report_command(postgres_url, tmp_path / f"report{m}", studies=["conn:Pendulum-v1"], n_bootstrap=0) == 0
    after_reports = _client_connections(postgres_url)
    assert tune(spec, n_trials=5, storage=postgres_url) == 0  # resumed: nothing left to run
    assert (after_trials, after_reports, _client_connections(postgres_url)) == (base, base, base)
    storage_module.close_storages()
    assert _client_connections(postgres_url) == 0  # disposed: the connections are closed, not left to the GC
    trials = optuna.load_study(study_name="conn:Pendulum-v1", storage=open_storage(postgres_url)).trials
    assert len(trials) == 5 and len({t.value for t in trials}) > 1  # the report ranked real differences


def test_eight_workers_complete_every_trial_on_a_server_with_few_connections(tmp_path: Path) -> None:
    """8 worker processes against max_connections=20 (each worker needs its trial's and its heartbeat's)."""
    with _postgres_server(max_connections=20) as url:
        spec = _tiny_spec("eight", tmp_path, seed=4)
        assert tune(spec, n_trials=8, workers=8, storage=url) == 0
        trials = optuna.load_study(study_name="eight:Pendulum-v1", storage=open_storage(url)).get_trials()
        assert [t.state for t in trials] == [TrialState.COMPLETE] * 8
        assert len({t.user_attrs[WORKER_ATTR] for t in trials}) == 8


def test_study_on_postgres_with_two_workers(postgres_url: str, tmp_path: Path) -> None:
    spec = spec_from_dict({
        "name": "pg",
        "envs": ["Pendulum-v1"],
        "timesteps": 256,  # two rollouts, evaluated after the first update: the parameters change the values
        "evaluation": {"eval_freq": 256, "n_episodes": 1},
        "base": {"n_steps": 64, "n_envs": 2, "policy_kwargs": {"net_arch": [16]}},
        "space": {"clip_range": {"type": "float", "low": 0.1, "high": 0.3},
                  "gae_lambda": {"type": "float", "low": 0.9, "high": 0.99},
                  "n_epochs": {"type": "int", "low": 3, "high": 10},
                  "batch_size": {"type": "pow2", "low": 64, "high": 128}},
        "sampler": {"name": "random", "seed": 1},
        "output_dir": str(tmp_path / "unused"),
    })
    assert tune(spec, n_trials=5, workers=2, storage=postgres_url) == 0
    storage = open_storage(postgres_url)
    assert isinstance(storage, RDBStorage) and storage.get_heartbeat_interval() == HEARTBEAT_INTERVAL_S
    trials = optuna.load_study(study_name="pg:Pendulum-v1", storage=storage).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 5
    assert sorted(t.number for t in trials) == list(range(5))
    assert len({t.user_attrs[WORKER_ATTR] for t in trials}) == 2
    assert len({(t.params["clip_range"], t.params["gae_lambda"]) for t in trials}) == 5  # workers drew distinct points
    assert len({t.value for t in trials}) > 1
    # Resuming against the database runs nothing more; the report reads the study straight from the URL.
    assert tune(spec, n_trials=5, workers=2, storage=postgres_url) == 0
    assert len(optuna.load_study(study_name="pg:Pendulum-v1", storage=storage).get_trials()) == 5
    # the module's server holds the other tests' studies too (their order is pytest-xdist's): report this one
    assert report_command(postgres_url, tmp_path / "report", studies=["pg:Pendulum-v1"], n_bootstrap=0) == 0
    assert "| clip epsilon" in (tmp_path / "report" / "report.md").read_text()
    assert tmp_path.joinpath("unused").exists() is False


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # retried_trial_number
def test_killed_worker_on_another_machine_is_failed_by_heartbeat_and_retried(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the heartbeat can tell that a worker on another machine died (its pid means nothing here)."""
    raw = {
        "name": "hb",
        "envs": ["Pendulum-v1"],
        "timesteps": 256,  # two rollouts (one is refused: its evaluations would precede its only update)
        "evaluation": {"eval_freq": 128, "n_episodes": 1},
        "base": {"n_steps": 64, "n_envs": 2, "policy_kwargs": {"net_arch": [16]}},
        "space": {"clip_range": {"type": "float", "low": 0.1, "high": 0.3},
                  "n_epochs": {"type": "int", "low": 3, "high": 10}},
        "sampler": {"name": "random", "seed": 2},
        "n_trials": 2,
        "output_dir": str(tmp_path / "unused"),
    }
    path = tmp_path / "hb.yaml"
    path.write_text(yaml.safe_dump(raw))
    # the worker: trial 0 completes, trial 1 hangs RUNNING while its heartbeat thread beats every second
    worker = start_gated_tune(["tune", str(path), "--storage", postgres_url], free_trainings=1,
                              heartbeat_interval_s=TEST_HEARTBEAT_S, host="another-machine")
    monkeypatch.setattr(storage_module, "HEARTBEAT_INTERVAL_S", TEST_HEARTBEAT_S)
    monkeypatch.setattr(storage_module, "GRACE_PERIOD_S", TEST_GRACE_S)

    def trials() -> list[optuna.trial.FrozenTrial]:
        try:
            return optuna.load_study(study_name="hb:Pendulum-v1", storage=open_storage(postgres_url)).get_trials()
        except KeyError:  # the worker has not created the study yet
            return []

    victim = kill_mid_trial(worker, trials, n_params=2)
    assert victim.number == 1
    assert victim.user_attrs.get(WORKER_ATTR, "").startswith("another-machine:"), victim.user_attrs

    # The trial stays RUNNING in the database; it is stale once its last heartbeat is TEST_GRACE_S old.
    rdb = open_storage(postgres_url)
    assert isinstance(rdb, RDBStorage) and rdb.get_heartbeat_interval() == TEST_HEARTBEAT_S
    study_id = rdb.get_study_id_from_name("hb:Pendulum-v1")
    wait_for(lambda: victim._trial_id in rdb._get_stale_trial_ids(study_id), "the killed trial's heartbeat to go stale")
    assert trials()[victim.number].state == TrialState.RUNNING  # nothing failed it before the next run

    assert tune(spec_from_dict(raw), storage=postgres_url) == 0
    after = trials()
    assert after[victim.number].state == TrialState.FAIL
    complete = [t for t in after if t.state == TrialState.COMPLETE]
    assert len(complete) == 2 and 0 in {t.number for t in complete}
    retry = [t for t in complete if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == victim.number]
    assert len(retry) == 1 and retry[0].params == victim.params  # the killed trial ran again with its parameters
    assert retry[0].user_attrs[WORKER_ATTR] == worker_id()  # ... in this process


def test_recover_stale_trials_fails_heartbeat_stale_rdb_trials(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tune`` reports the trials it failed before starting workers; for an RDB that is the heartbeat check."""
    monkeypatch.setattr(storage_module, "HEARTBEAT_INTERVAL_S", TEST_HEARTBEAT_S)
    monkeypatch.setattr(storage_module, "GRACE_PERIOD_S", TEST_GRACE_S)
    study = optuna.create_study(storage=open_storage(postgres_url), study_name="stale")
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    trial.set_user_attr(WORKER_ATTR, "another-machine:1")
    rdb = open_storage(postgres_url)
    rdb.record_heartbeat(trial._trial_id)  # one beat, then silence
    wait_for(lambda: trial._trial_id in rdb._get_stale_trial_ids(study._study_id), "the trial's heartbeat to go stale")
    assert recover_stale_trials(study) == [trial.number]
