"""A study on PostgreSQL (the many-machines storage): the test starts its own throw-away server on a loopback port.

Needs the server binaries (Debian: ``apt-get install postgresql``; found on PATH or under /usr/lib/postgresql/*/bin)
and the driver (``pip install "psycopg[binary]"``, in the ``test`` extra). Skipped, with the reason, when either is
missing or the server cannot start. As root the server runs as the ``postgres`` user (initdb refuses root).
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
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from sb3_ppo_scale.tuning import spec_from_dict
from sb3_ppo_scale.tuning.report import report_command
from sb3_ppo_scale.tuning.runner import tune
from sb3_ppo_scale.tuning.storage import HEARTBEAT_INTERVAL_S, WORKER_ATTR, open_storage

pytest.importorskip("psycopg", reason="PostgreSQL driver missing: pip install 'psycopg[binary]'")


def _server_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    return next((c for c in candidates if (c / "initdb").exists() and (c / "pg_ctl").exists()), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """Start a PostgreSQL server in a temp dir (trust auth, loopback only, fsync off); yield its URL; stop it."""
    bin_dir = _server_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql")
    as_user: dict[str, Any] = {}
    root = Path(tempfile.mkdtemp(prefix="sb3ppo-pg-"))
    if os.geteuid() == 0:
        try:
            entry = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            pytest.skip("running as root and there is no 'postgres' user to run the server as (initdb refuses root)")
        os.chown(root, entry.pw_uid, entry.pw_gid)
        as_user = {"user": entry.pw_uid, "group": entry.pw_gid}
    data, port = root / "data", _free_port()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(bin_dir / args[0]), *args[1:]], capture_output=True, text=True, cwd=root,
                              timeout=120, **as_user)

    init = run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
    start = run("pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-o", options, "-w", "-t", "60", "start") \
        if init.returncode == 0 else init
    if start.returncode != 0:
        log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"PostgreSQL could not start: {(start.stderr or start.stdout).strip()[-300:]} {log[-300:]}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        run("pg_ctl", "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def test_study_on_postgres_with_two_workers(postgres_url: str, tmp_path: Path) -> None:
    spec = spec_from_dict({
        "name": "pg",
        "envs": ["Pendulum-v1"],  # continuous returns: every trial has a different value
        "timesteps": 128,
        "evaluation": {"eval_freq": 128, "n_episodes": 1},
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
    # Resuming against the database runs nothing more; the report reads the study straight from the URL.
    assert tune(spec, n_trials=5, workers=2, storage=postgres_url) == 0
    assert len(optuna.load_study(study_name="pg:Pendulum-v1", storage=storage).get_trials()) == 5
    assert report_command(postgres_url, tmp_path / "report", n_bootstrap=0) == 0
    assert "| clip epsilon" in (tmp_path / "report" / "report.md").read_text()
    assert tmp_path.joinpath("unused").exists() is False
