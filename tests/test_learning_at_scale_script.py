"""``benchmarks/learning_at_scale.sh`` schedules its runs as promised: every run once, in its own single-threaded
``bench`` process, WORKERS at a time, the longest budget first and per task the recipe, its config alone, then the
plain entry; the report only when every run is in; a stopped run (exit code 75, or SIGTERM to the script) ends the
script with that code. ``sb3-ppo-scale`` is replaced on PATH by a stub that records its arguments, so nothing
trains."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "learning_at_scale.sh"

#: the stub: one line per call ("start <args>"; "term <args>" when it gets SIGTERM); exits STUB_EXIT for the call
#: whose arguments contain STUB_MATCH, and sleeps STUB_SLEEP seconds (interruptible) before exiting
STUB = """#!/usr/bin/env bash
echo "start $*" >> "$STUB_LOG"
trap 'kill "$nap" 2>/dev/null; echo "term $*" >> "$STUB_LOG"; exit 75' TERM
sleep "${STUB_SLEEP:-0}" & nap=$!
wait "$nap"
if [ -n "${STUB_MATCH:-}" ] && [[ "$*" == *"$STUB_MATCH"* ]]; then exit "${STUB_EXIT:-1}"; fi
"""


def _start(tmp_path: Path, *tasks: str, **stub_env: str) -> tuple[subprocess.Popen, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "sb3-ppo-scale"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "calls.log"
    env = dict(os.environ, PATH=f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}", STUB_LOG=str(log),
               OUT=str(tmp_path / "out"), WORKERS="2", **stub_env)
    process = subprocess.Popen(["bash", str(SCRIPT), *tasks], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    return process, log


def _calls(log: Path, kind: str = "start") -> list[str]:
    return [line.split(" ", 1)[1] for line in log.read_text().splitlines() if line.startswith(kind + " ")]


def _run_key(call: str) -> tuple[str, str, str, str]:
    args = call.split()
    return tuple(args[args.index(flag) + 1] for flag in ("--tasks", "--algos", "--seeds", "--budget"))


def test_every_run_once_in_its_own_process_longest_first_then_the_report(tmp_path: Path) -> None:
    process, log = _start(tmp_path, "Hopper-v5", "Ant-v5")
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    calls = _calls(log)
    runs, report = calls[:-1], calls[-1]
    expected = {(task, algo, seed, budget)
                for task, budget in (("Hopper-v5", "5000000"), ("Ant-v5", "10000000"))
                for algo, seeds in (("sb3_ppo@plain", "012"), ("scalable_ppo@recipe", "012"),
                                    ("sb3_ppo@recipe_const", "012" if task == "Ant-v5" else "0"))
                for seed in seeds}
    assert sorted(map(_run_key, runs)) == sorted(expected)  # each exactly once
    assert all("--workers 1" in call for call in runs)
    budgets = [_run_key(call)[3] for call in runs]
    assert budgets[:2] == ["10000000"] * 2 and budgets[-2:] == ["5000000"] * 2  # Ant's 10M runs start first
    ant_algos = [_run_key(call)[1] for call in runs if _run_key(call)[0] == "Ant-v5"]
    starts = {algo: [i for i, a in enumerate(ant_algos) if a == algo] for algo in set(ant_algos)}
    # the lanes log their starts in either order, but three runs of @recipe_const stand between these two
    assert max(starts["scalable_ppo@recipe"]) < min(starts["sb3_ppo@plain"])
    assert "--report-only" in report and "--tasks Hopper-v5 HalfCheetah-v5 Ant-v5 Humanoid-v5" in report


def test_a_stopped_run_ends_the_script_with_its_code_and_no_report(tmp_path: Path) -> None:
    process, log = _start(tmp_path, "Hopper-v5", STUB_MATCH="--algos sb3_ppo@plain --seeds 1", STUB_EXIT="75")
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 75, stderr
    assert "the same command continues" in stderr
    calls = _calls(log)
    assert not any("--report-only" in call for call in calls)
    assert len(calls) == 7  # the other lane took the stopped lane's remaining runs


def test_sigterm_to_the_script_stops_each_run_in_progress(tmp_path: Path) -> None:
    process, log = _start(tmp_path, "Hopper-v5", STUB_SLEEP="60")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.is_file() and len(_calls(log)) == 2):
        time.sleep(0.2)
    assert len(_calls(log)) == 2, "two runs should be in progress, one per lane"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 75, stderr
    assert sorted(_calls(log, "term")) == sorted(_calls(log))  # both runs got the signal
    assert len(_calls(log)) == 2  # and no further run started
