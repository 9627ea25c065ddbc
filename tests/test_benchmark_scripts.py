"""The collection benchmark's cheap commands still run (``benchmarks/end_to_end.py``): a subprocess each, writing into a
temporary folder, checked for the table it promises. No timing is asserted; this only keeps the script in step with
the code it measures (the signatures of the lean loop and its policy step)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "end_to_end.py"


def _run(out: Path, *args: str, out_last: bool = False) -> str:
    """The script with ``--out`` before the sub-command, or after its other arguments (``out_last``)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    argv = [*args, "--out", str(out)] if out_last else ["--out", str(out), *args]
    result = subprocess.run([sys.executable, str(SCRIPT), *argv], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_profile_takes_one_step_apart(tmp_path: Path) -> None:
    _run(tmp_path, "profile", "--calls", "2", "--rollouts", "1", "--update-configs", "demo")
    table = (tmp_path / "profile.md").read_text()
    for row in ("VecNormalize(DummyVecEnv) `step`", "the lean loop's step (`vec_env_step`)", "fused policy step",
                "one collection step, lean loop", "Inside a lean collection step", "The ceiling of a bit-identical loop",
                "| demo | sb3_ppo |", "| demo | scalable_ppo |"):
        assert row in table


def test_profile_takes_a_step_of_several_envs_apart(tmp_path: Path) -> None:
    _run(tmp_path, "profile", "--n-envs", "3", "--calls", "2", "--rollouts", "1", "--update-configs")
    table = (tmp_path / "profile.md").read_text()
    assert "Hopper-v5, 3 envs (a step: each env steps once)" in table
    assert "| physics (the 3 envs' `do_simulation`, MuJoCo) |" in table and "1.5x SB3's speed" in table
    assert "| demo |" not in table  # no update split when no config is given


def test_learn_table_says_where_sbx_ran_ahead_and_in_which_phase() -> None:
    e2e = _end_to_end_module()
    base = {"steps": 1000, "wall_s": 2.0, "collect_s": 0.8, "update_s": 1.2}
    ours, sbx = {**base, "wall_s": 1.5, "update_s": 0.7}, {**base, "wall_s": 1.2, "collect_s": 0.9, "update_s": 0.3}
    rows = e2e.learn_table({"envs16": {"sb3_ppo": [base], "scalable_ppo": [ours], "sbx_ppo": [sbx]},
                            "demo": {"sb3_ppo": [base], "scalable_ppo": [sbx], "sbx_ppo": [ours]}})
    ahead = [row for row in rows if row.startswith("- `envs16`: SBX")]
    assert ahead == ["- `envs16`: SBX 1.67x, ScalablePPO 1.33x; SBX faster in: update 0.30 s / 1k steps against "
                     "ScalablePPO's 0.70."]
    assert not any(row.startswith("- `demo`: SBX") for row in rows)
    assert not any("SBX" in row for row in e2e.learn_table({"demo": {"sb3_ppo": [base], "scalable_ppo": [ours]}}))


def test_collect_checks_the_rollouts_it_times(tmp_path: Path) -> None:
    _run(tmp_path, "collect", "--envs", "Hopper-v5", "--n-envs", "8", "--repeats", "1", out_last=True)
    rows = [line for line in (tmp_path / "collect.md").read_text().splitlines() if line.startswith("| Hopper-v5 | 8 |")]
    assert len(rows) == 1 and "| yes |" in rows[0] and rows[0].count("x [") == 2, rows  # both ratios, all equal


def test_flat_adam_benchmark_writes_its_table(tmp_path: Path) -> None:
    script = SCRIPT.parent / "studies" / "flat_adam.py"
    done = subprocess.run([sys.executable, str(script), "--repeats", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "flat_adam_cpu.md").read_text()
    assert "| MlpPolicy 64x64 (SB3's default) | 11,085 |" in table and "| NO |" not in table  # equal everywhere
    assert "| CnnPolicy, Atari 4x84x84 | 1,687,719 |" in table and table.rstrip().endswith("| yes | no |")


def _end_to_end_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("end_to_end_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_learn_runs_set_their_configs_environment_and_no_other(monkeypatch) -> None:
    e2e = _end_to_end_module()
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")  # set in the shell: must not leak into the plain config's runs
    assert "THP_MEM_ALLOC_ENABLE" not in e2e.run_environment("atari_pong")
    assert e2e.run_environment("atari_pong_thp")["THP_MEM_ALLOC_ENABLE"] == "1"
    assert e2e.run_environment("atari_pong")["OMP_NUM_THREADS"] == "1"


def test_learn_runs_are_pinned_to_one_core() -> None:
    e2e = _end_to_end_module()
    core = e2e.default_core()
    assert core in os.sched_getaffinity(0)
    done = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                          capture_output=True, text=True, timeout=60, preexec_fn=e2e.pin_to(core))
    assert done.stdout.strip() == f"[{core}]", done.stdout
    assert e2e.pin_to(None) is None and e2e._core_argument("none") is None and e2e._core_argument("1") == 1


def test_learn_table_reports_page_faults_cpu_share_and_ratios() -> None:
    e2e = _end_to_end_module()
    run = {"steps": 1000, "wall_s": 2.0, "collect_s": 0.5, "update_s": 1.5, "page_faults": 3000, "cpu_s": 1.9}
    faster = {**run, "wall_s": 1.0, "page_faults": 1000, "cpu_s": 1.0}
    old = {k: v for k, v in run.items() if k not in ("page_faults", "cpu_s")}  # a run recorded before either was
    rows = e2e.learn_table({"atari_pong": {"sb3_ppo": [run], "scalable_ppo": [faster]},
                            "atari_pong_thp": {"sb3_ppo": [old], "scalable_ppo": [old]}})
    assert "| atari_pong | sb3_ppo | 500 | 0.50 | 1.50 | 3 | 0.95 | 1 |" in rows
    assert "| atari_pong | scalable_ppo | 1000 | 0.50 | 1.50 | 1 | 1.00 | 2.00x [2.00, 2.00] |" in rows
    assert "| atari_pong_thp | scalable_ppo | 500 | 0.50 | 1.50 | n/a | n/a | 1.00x [1.00, 1.00] |" in rows


def test_update_trims_benchmark_writes_its_table(tmp_path: Path) -> None:
    script = SCRIPT.parent / "studies" / "update_trims.py"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(script), "--configs", "hopper_sb3_defaults", "--repeats", "1", "--out",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "update_trims.md").read_text()
    for trim in ("flat Adam", "gradient ops", "fused evaluation"):
        assert f"| hopper_sb3_defaults | {trim} | " in table


def test_episode_capture_benchmark_writes_its_table(tmp_path: Path) -> None:
    script = SCRIPT.parent / "studies" / "episode_capture.py"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(script), "--configs", "cartpole_8envs", "--repeats", "1", "--captures",
                           "1", "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| cartpole_8envs: CartPole-v1, 8 env(s) x 256 steps | " in (tmp_path / "episode_capture.md").read_text()


def test_scale_report_rebuilds_the_committed_tables(tmp_path: Path) -> None:
    """``benchmarks/scale.py report`` rebuilds scale.md and cost_model.md from the committed JSON files."""
    import shutil

    committed = SCRIPT.parent / "results" / "scale"
    for name in ("scale.json", "cost_model.json"):
        shutil.copy(committed / name, tmp_path / name)
    result = subprocess.run([sys.executable, str(SCRIPT.parent / "scale.py"), "report", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("scale.md", "cost_model.md"):
        assert (tmp_path / name).read_text() == (committed / name).read_text(), name
    assert (tmp_path / "scale.png").stat().st_size > 10_000


def test_scale_cost_model_arithmetic() -> None:
    sys.path.insert(0, str(SCRIPT.parents[1]))
    from benchmarks.scale import gpu_update_us, predict

    stage = {"env_us": {"1": 100.0, "2": 50.0}, "policy_us": 2.0, "vec_normalize_us": {"64": {"lean": 1.0}},
             "update_us": {"1": 30.0, "2": 20.0}}
    assert predict(stage, 1, 2) == pytest.approx(1e6 / (100 + 3 + 30))
    # env threads at full efficiency (100 / 50 on 2), the update 2/3 parallel (30 -> 20 on 2: 10 + 20 / 16 on 16)
    assert predict(stage, 16, 2) == pytest.approx(1e6 / (100 / 16 + 3 + 10 + 20 / 16))
    assert predict(stage, 16, 2, gpu_update_us=1.0) == pytest.approx(1e6 / (100 / 16 + 3 + 1))
    assert 1.0 < gpu_update_us() < 10.0  # the H200's committed train() figures, 10 epochs per sample


def test_kl_vs_clip_runs_record_curves_and_the_report_names_the_setting_the_paper_lacks(tmp_path: Path) -> None:
    script = SCRIPT.parent / "kl_vs_clip.py"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    common = ["--out", str(tmp_path), "--tasks", "InvertedPendulum-v5"]
    for argv in (["run", "--steps", "2048", "--seeds", "1", "--workers", "1"], ["report"]):
        result = subprocess.run([sys.executable, str(script), *argv, *common], env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    import json

    runs = [json.loads(path.read_text()) for path in (tmp_path / "runs").glob("*.json")]
    assert len(runs) == 12 and all(run["steps"] == 2048 for run in runs)
    steps = [point[0] for point in runs[0]["curve"]]
    assert steps and steps == sorted(steps) and steps[-1] <= 2048 and all(point[2] >= 1 for point in runs[0]["curve"])
    seconds = [point[3] for point in runs[0]["curve"]]  # wall and CPU seconds since learn() started
    assert seconds == sorted(seconds) and all(len(point) == 5 for point in runs[0]["curve"])
    table = (tmp_path / "kl_vs_clip.md").read_text()
    assert "| clip eps=0.2 + adaptive KL d_targ=0.01 |" in table and "| not in the paper |" in table
    assert "**Early-learning view**" in table and "stratified bootstrap" in table
    assert (tmp_path / "kl_vs_clip_curves.png").stat().st_size > 10_000
    refused = subprocess.run([sys.executable, str(script), "run", "--claims", *common], env=env, capture_output=True,
                             text=True, timeout=600)
    assert refused.returncode == 2 and "--claims needs HalfCheetah-v5 among --tasks" in refused.stderr


def _kl_vs_clip() -> Any:
    sys.path.insert(0, str(SCRIPT.parents[1]))
    from benchmarks import kl_vs_clip

    return kl_vs_clip


def _claim_run(setting: str, seed: int, final: float, rise_at: int, steps: int = 100_000, seconds: float = 100.0,
               wall_factor: float = 1.0) -> dict:
    """A HalfCheetah-v5 run whose windows (10 000 steps, 10 episodes each) return 0 before ``rise_at`` and
    ``final`` from there on, ``seconds`` of CPU time spread evenly, and ``wall_factor`` times that of wall clock."""
    wall = wall_factor * seconds
    curve = [[s, final if s >= rise_at else 0.0, 10, wall * s / steps, seconds * s / steps]
             for s in range(10_000, steps + 1, 10_000)]
    return dict(task="HalfCheetah-v5", setting=setting, seed=seed, steps=steps, seconds=wall,
                last_returns=[final] * 100, curve=curve)


def test_kl_vs_clip_claims_reuse_and_equal_time_verdicts() -> None:
    k = _kl_vs_clip()
    runs = []
    for seed, jitter in enumerate((-10.0, 0.0, 10.0)):
        runs += [_claim_run(k.ONE_EPOCH, seed, 1000 + jitter, rise_at=100_000),  # reaches 1000 only at the end
                 # 10 epochs: from the first window; on a busy box (wall clock 3x its CPU time, which counts)
                 _claim_run(k.REFERENCE, seed, 3000 + jitter, rise_at=10_000, wall_factor=3.0),
                 # policy gradient: 3x the steps in 3x the time, 1500 until PPO's 100 s, then 9000 (too late to count)
                 _claim_run(k.PG, seed, 1500 + jitter, rise_at=10_000, steps=300_000, seconds=300.0)]
        runs[-1]["curve"] = [p if p[4] <= 100.0 else [*p[:1], 9000.0, *p[2:]] for p in runs[-1]["curve"]]
    text = "\n".join(k.claim_lines(runs))
    assert "| 1 | 1000 [990, 1010] | 100,000 | 1.0 [1.0, 1.0] |" in text
    assert "| 10 | 3000 [2990, 3010] | 10,000 | 10.0 [10.0, 10.0] |" in text
    assert "Verdict: **holds** at the best epoch count" in text
    assert "policy gradient 1500 [1490, 1510]" in text and "(100,000 env steps on average)" in text
    assert "verdict: **does not hold (below 2.3x)**" in text  # 3000 / 1500 = 2.0
    without_cpu = [dict(run, curve=[p[:4] for p in run["curve"]]) for run in runs]  # recorded before CPU seconds
    with pytest.raises(ValueError, match="has no CPU seconds in its curve; delete its file"):
        k.claim_lines(without_cpu)


def test_kl_vs_clip_verdicts() -> None:
    k = _kl_vs_clip()
    from sb3_ppo_scale.experiments.intervals import Estimate

    assert k.verdict(Estimate(2.5, 2.2, 2.8), 2.3) == "holds"
    assert k.verdict(Estimate(1.5, 1.2, 1.8), 2.3) == "does not hold (below 2.3x)"
    assert k.verdict(Estimate(1.1, 0.9, 1.3), 2.3) == "not distinguishable"
    assert k.verdict(Estimate(0.5, 0.4, 0.6), 2.3) == "does not hold (the other side is better)"
