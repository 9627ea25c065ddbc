"""Tuning: spec errors before any trial, an end-to-end study + report, two workers, SIGKILL + resume, determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from sb3_ppo_scale.cli import main as cli_main
from sb3_ppo_scale.tuning import load_spec, spec_from_dict
from sb3_ppo_scale.tuning.importance import stars
from sb3_ppo_scale.tuning.report import report_command, verdict
from sb3_ppo_scale.tuning.runner import resolve_storage, split, tune
from sb3_ppo_scale.tuning.storage import RETRY_ATTR, WORKER_ATTR, open_storage, recover_stale_trials
from tests.helpers import kill_mid_trial, skip_or_fail_in_ci, start_gated_tune

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ["clip_range", "learning_rate", "gae_lambda", "log2_batch_size", "n_epochs"]


def tiny_spec(tmp_path: Path, env: str = "CartPole-v1", timesteps: int = 256, **overrides: Any) -> dict[str, Any]:
    """The documented space at toy scale: rollout 2 x 64 = 128 samples, batch 64..128."""
    raw: dict[str, Any] = {
        "name": "tiny",
        "envs": [env],
        "timesteps": timesteps,
        "evaluation": {"eval_freq": 128, "n_episodes": 1, "deterministic": True, "objective": "auc"},
        "base": {"n_steps": 64, "n_envs": 2, "policy_kwargs": {"net_arch": [16]}},
        "space": {
            "clip_range": {"type": "float", "low": 0.1, "high": 0.3},
            "learning_rate": {"type": "float", "low": 1e-4, "high": 3e-4, "log": True, "schedule": "linear"},
            "gae_lambda": {"type": "float", "low": 0.9, "high": 0.99},
            "batch_size": {"type": "pow2", "low": 64, "high": 128},
            "n_epochs": {"type": "int", "low": 3, "high": 10},
        },
        "sampler": {"name": "sobol", "seed": 0},
        "n_trials": 4,
        "output_dir": str(tmp_path / "out"),
    }
    raw.update(overrides)
    return raw


def write_spec(tmp_path: Path, raw: dict[str, Any], name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def load_trials(spec_path: Path) -> list[optuna.trial.FrozenTrial]:
    spec = load_spec(spec_path)
    study = optuna.load_study(study_name=spec.study_name(spec.envs[0]), storage=open_storage(resolve_storage(spec)))
    return study.get_trials(deepcopy=False)


def run_cli(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    code = "import sys; from sb3_ppo_scale.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)


# ------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "red"}, r"unknown key\(s\) \['colour'\]"),
        ({"envs": ["NoSuchEnv-v9"]}, "unknown env id 'NoSuchEnv-v9'"),
        ({"sampler": {"name": "tpe"}}, "TPE concentrates samples"),
        ({"pruner": {"name": "median"}}, "pruned trials are left out"),
        ({"evaluation": {"objective": "max"}}, r"objective must be one of \('auc', 'final'\)"),
        ({"base": {"n_steps": 16, "n_envs": 2}}, "batch_size reaches 128 but a rollout holds"),
        ({"base": {"n_steps": 64, "learning_rat": 1e-3}}, r"spec.base: unknown key\(s\) \['learning_rat'\]"),
    ],
)
def test_bad_spec_is_a_value_error(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec_from_dict(tiny_spec(tmp_path, **change))


@pytest.mark.parametrize(
    ("param", "entry", "message"),
    [
        ("clip_range", {"type": "float", "low": 0.3, "high": 0.1}, r"low must be <= high, got low=0.3 > high=0.1"),
        ("clip_range", {"type": "float", "low": 0.1, "high": 0.3, "lo": 1}, r"unknown key\(s\) \['lo'\]"),
        ("n_epochs", {"type": "int", "low": 3, "high": 10, "schedule": "linear"}, "needs type float"),
        ("batch_size", {"type": "pow2", "low": 48, "high": 128}, "must be a power of two"),
        ("not_an_arg", {"type": "float", "low": 0, "high": 1}, r"spec.space: unknown key\(s\) \['not_an_arg'\]"),
    ],
)
def test_bad_search_space_is_a_value_error(tmp_path: Path, param: str, entry: dict[str, Any], message: str) -> None:
    raw = tiny_spec(tmp_path)
    raw["space"][param] = entry
    with pytest.raises(ValueError, match=message):
        spec_from_dict(raw)


def test_unreachable_storage_fails_before_any_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        skip_or_fail_in_ci("PostgreSQL driver missing: pip install 'psycopg[binary]' (in the test extra)")
    path = write_spec(tmp_path, tiny_spec(tmp_path))
    url = "postgresql://nobody:secret@127.0.0.1:9/none"  # port 9 (discard): nothing listens
    with pytest.raises(ValueError, match=r"cannot be reached") as error:
        tune(load_spec(path), storage=url)
    assert "secret" not in str(error.value)  # the password is not printed
    assert cli_main(["tune", str(path), "--storage", url]) == 2
    assert "cannot be reached" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing was trained or written


def test_unknown_env_in_yaml_is_reported_by_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_spec(tmp_path, tiny_spec(tmp_path, envs=["CartPole-v1", "Nope-v0"]))
    assert cli_main(["tune", str(path)]) == 2
    assert "unknown env id 'Nope-v0'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- pieces
def test_split_and_stars_rules() -> None:
    assert split(5, 2) == [3, 2] and split(1, 3) == [1] and split(0, 2) == []
    assert stars({"a": 0.5, "b": 0.3, "c": 0.15, "d": 0.05}) == {"a": 4, "b": 3, "c": 2, "d": 1}
    assert verdict(2, [2, 2]) == "agrees" and verdict(2, [3, 1]) == "agrees within 1 star"
    assert verdict(4, [1, 2]) == "documented overrates it" and verdict(1, [4, 3]) == "documented underrates it"
    assert verdict(2, [4, 2, 1]) == "mixed"


def test_stale_journal_trial_is_failed_and_requeued(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "s.journal"))
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    trial.set_user_attr(WORKER_ATTR, f"{os.uname().nodename}:{dead.pid}")
    alive = study.ask()
    alive.set_user_attr(WORKER_ATTR, f"{os.uname().nodename}:{os.getpid()}")
    assert recover_stale_trials(study) == [trial.number]
    states = {t.number: t.state for t in study.get_trials()}
    assert states[trial.number] == TrialState.FAIL and states[alive.number] == TrialState.RUNNING
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs[RETRY_ATTR] == trial.number
    assert waiting[0].system_attrs["fixed_params"] == trial.params


# ------------------------------------------------------------------------------------------- end to end
def test_study_end_to_end_and_report_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = tiny_spec(tmp_path, env="Pendulum-v1", timesteps=256, n_trials=5)
    raw["base"]["normalize"] = True
    path = write_spec(tmp_path, raw)
    assert cli_main(["tune", str(path), "--n-trials", "5"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if " trial " in line]
    assert len(lines) == 5 and all("COMPLETE value=" in line and "elapsed=" in line and "batch_size=" in line for line in lines)
    trials = load_trials(path)
    assert sorted(t.number for t in trials) == list(range(5)) and all(t.state == TrialState.COMPLETE for t in trials)
    assert all(t.params["log2_batch_size"] in (6, 7) and 3 <= t.params["n_epochs"] <= 10 for t in trials)
    # Re-running the same command resumes: nothing left to do, no new trial.
    assert cli_main(["tune", str(path), "--n-trials", "5"]) == 0
    assert len(load_trials(path)) == 5

    outputs = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert report_command(str(path), out, n_bootstrap=8) == 0
        outputs.append({f.name: f.read_bytes() for f in sorted(out.iterdir())})
    assert outputs[0] == outputs[1]  # byte-identical report for a fixed study
    files = outputs[0]
    assert set(files) == {"report.md", "importance.json", "importance.png", "slices_Pendulum-v1.png"}
    assert all(files[f].startswith(b"\x89PNG") for f in files if f.endswith(".png"))
    report = files["report.md"].decode()
    for label in ("clip epsilon", "learning rate", "GAE lambda", "batch size", "update epochs"):
        assert any(line.startswith(f"| {label}") and line.count("★") + line.count("☆") == 12
                   for line in report.splitlines())  # documented 4 + ours 2 x 4
    summary = json.loads(files["importance.json"])["tiny:Pendulum-v1"]
    assert summary["n_trials"] == 5
    for evaluator in ("ped_anova", "fanova"):
        assert sum(summary["importance"][evaluator].values()) == pytest.approx(1.0)
        assert set(summary["stars"][evaluator]) == {"clip_range", "learning_rate", "gae_lambda", "batch_size", "n_epochs"}
        assert max(summary["stars"][evaluator].values()) == 4


def test_two_worker_processes_finish_exactly_n_trials(tmp_path: Path) -> None:
    path = write_spec(tmp_path, tiny_spec(tmp_path, timesteps=128))
    process = run_cli("tune", str(path), "--workers", "2", "--n-trials", "6")
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output
    trials = load_trials(path)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 6
    assert sorted(t.number for t in trials) == list(range(6))
    workers = {t.user_attrs[WORKER_ATTR] for t in trials}
    assert len(workers) == 2  # both processes ran trials
    assert sum(" trial " in line for line in output.splitlines()) == 6


def test_sigkill_mid_trial_then_resume_loses_no_completed_trial(tmp_path: Path) -> None:
    path = write_spec(tmp_path, tiny_spec(tmp_path, timesteps=256, n_trials=3))
    journal = Path(resolve_storage(load_spec(path)))
    process = start_gated_tune(["tune", str(path)], free_trainings=1)  # trial 0 completes, trial 1 hangs
    victim = kill_mid_trial(process, lambda: load_trials(path) if journal.exists() else [], len(PARAMS))
    before = {t.number: t.value for t in load_trials(path) if t.state == TrialState.COMPLETE}
    assert list(before) == [0] and victim.number == 1  # trial 0 completed; trial 1 was killed mid-trial

    resumed = run_cli("tune", str(path))
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output
    assert f"failed stale trials [{victim.number}]" in output
    after = {t.number: t for t in load_trials(path)}
    assert all(after[n].state == TrialState.COMPLETE and after[n].value == v for n, v in before.items())
    assert after[victim.number].state == TrialState.FAIL
    complete = [t for t in after.values() if t.state == TrialState.COMPLETE]
    assert len(complete) == 3
    retry = [t for t in complete if t.user_attrs.get(RETRY_ATTR) == victim.number]
    assert len(retry) == 1 and retry[0].params == victim.params  # the killed trial ran again with its parameters


def test_search_mode_uses_tpe_reports_intermediate_values(tmp_path: Path) -> None:
    raw = tiny_spec(tmp_path, env="Pendulum-v1", mode="search", sampler={"name": "tpe", "seed": 0},
                    pruner={"name": "median"}, n_trials=3)
    spec = load_spec(write_spec(tmp_path, raw))
    assert tune(spec) == 0
    study = optuna.load_study(study_name="tiny:Pendulum-v1", storage=open_storage(resolve_storage(spec)))
    assert isinstance(study.sampler, optuna.samplers.TPESampler)
    trials = study.get_trials()
    assert len(trials) == 3 and all(t.state == TrialState.COMPLETE for t in trials)
    for trial in trials:  # one report per evaluation (128, 256 steps); the value is their mean (objective auc)
        assert sorted(trial.intermediate_values) == [128, 256]
        curve = trial.user_attrs["eval_returns"][0]
        assert trial.value == pytest.approx(sum(curve) / len(curve))
        assert trial.intermediate_values[256] == pytest.approx(trial.value)


def test_studies_on_the_same_env_get_distinct_labels() -> None:
    """Two studies of one env (e.g. two base configs) must not share a column, a bar or a slice-plot file."""
    from dataclasses import replace

    from sb3_ppo_scale.tuning.report import StudyResult, unique_labels

    base = StudyResult(name="a:HalfCheetah-v5", label="HalfCheetah-v5", objective="auc", n_trials=0, params=[],
                       arguments={}, importance={}, stars={}, stability={}, split_half={}, top={}, best_value=0.0,
                       trials=[], budget={})
    results = [base, replace(base, name="b:HalfCheetah-v5"), replace(base, name="c:Hopper-v5", label="Hopper-v5")]
    labels = [r.label for r in unique_labels(results)]
    assert labels == ["HalfCheetah-v5 [a]", "HalfCheetah-v5 [b]", "Hopper-v5"]
