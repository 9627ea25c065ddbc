"""Tuning: spec errors before any trial, an end-to-end study + report, two workers, SIGKILL + resume, determinism."""

from __future__ import annotations

import json
import os
import re
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
        # one rollout: every evaluation precedes the only update, so every trial scores the untrained policy
        ({"timesteps": 128}, r"spec.timesteps \(or --n-timesteps\) must be more than one rollout \(n_steps \* n_envs = "
                             r"128 env steps\), got 128"),
        ({"base": {"n_steps": 64, "learning_rat": 1e-3}}, r"spec.base: unknown key\(s\) \['learning_rat'\]"),
        ({"base": {"n_steps": 64, "policy": "MlpLstmPolicy"}}, r"spec.base.policy must be one of \('MlpPolicy', "
                                                                r"'CnnPolicy', 'MultiInputPolicy'\) \(the policies of "
                                                                r"ScalablePPO, spec.algo 'scalable_ppo'\), got 'MlpLstmPolicy'"),
        ({"algo": "ppo"}, r"spec.algo must be one of \('scalable_ppo', 'scalable_maskable_ppo', "
                          r"'scalable_recurrent_ppo'\), got 'ppo'"),
        # ScalableRecurrentPPO's argument, not ScalablePPO's
        ({"base": {"n_steps": 64, "sequence_length": 8}}, r"spec.base: unknown key\(s\) \['sequence_length'\]"),
        # values no trial can train with: errors before any trial, not a failed trial and its traceback
        ({"base": {"n_steps": 64, "n_envs": 2, "gamma": "abc"}}, r"spec.base: gamma must be a number in \[0, 1\], got 'abc'"),
        ({"base": {"n_steps": "abc", "n_envs": 2}}, r"spec.base: n_steps must be an int >= 1, got 'abc'"),
        ({"base": {"n_steps": 64, "n_envs": 2, "policy_kwargs": {"net_arch": [0]}}},
         r"spec.base: policy_kwargs\['net_arch'\] layer sizes must be ints >= 1"),
        ({"output_dir": 5}, r"spec.output_dir must be null \(default: tune_results/tiny\) or a folder path, got 5"),
        ({"seed": -1}, r"spec.seed must be an int >= 0, got -1"),  # numpy's error, after a failed trial
        ({"sampler": {"name": "sobol", "seed": -1}}, r"spec.sampler.seed must be an int >= 0, got -1"),
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
        ("n_epochs", {"type": "int", "low": 0, "high": 4}, r"spec.space.n_epochs.low: n_epochs must be an int >= 1, got 0"),
        ("gae_lambda", {"type": "float", "low": 0.9, "high": 1.5},
         r"spec.space.gae_lambda.high: gae_lambda must be a number in \[0, 1\], got 1.5"),
        ("clip_range", {"type": "categorical", "choices": [0.2, -0.1]}, r"spec.space.clip_range.choices\[1\]: clip_range "
                                                                        r"must be a number > 0"),
        # keys a type would ignore, and steps Optuna would refuse in a trial or quietly narrow the range to
        ("batch_size", {"type": "pow2", "low": 64, "high": 128, "step": 2},
         r"spec.space.batch_size: \['step'\] would be ignored for type 'pow2'"),
        ("clip_range", {"type": "float", "low": 0.1, "high": 0.3, "choices": [0.2]},
         r"spec.space.clip_range: \['choices'\] would be ignored for type 'float'"),
        ("n_epochs", {"type": "int", "low": 3, "high": 10, "step": 0}, r"spec.space.n_epochs.step must be an int > 0, got 0"),
        ("clip_range", {"type": "float", "low": 0.1, "high": 0.3, "step": "abc"},
         r"spec.space.clip_range.step must be a number > 0, got 'abc'"),
        ("learning_rate", {"type": "float", "low": 1e-4, "high": 3e-4, "log": True, "step": 1e-5},
         r"spec.space.learning_rate: step cannot be combined with log: true"),
        ("n_epochs", {"type": "int", "low": 3, "high": 10, "step": 2},
         r"spec.space.n_epochs: high - low must be a multiple of step 2, got low=3, high=10 \(Optuna would search up to 9"),
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


def test_output_dir_null_is_the_default(tmp_path: Path) -> None:
    """``output_dir: null`` (as ``storage: null``) means the default folder; it had become ./None."""
    spec = spec_from_dict(tiny_spec(tmp_path, output_dir=None))
    assert resolve_storage(spec) == str(Path("tune_results") / "tiny" / "tiny.journal")


def test_missing_database_driver_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A URL whose driver is not installed names the driver and how to install it (Optuna re-raises the driver's
    ModuleNotFoundError as a plain ImportError that names none)."""
    monkeypatch.setitem(sys.modules, "pymysql", None)  # as if not installed
    with pytest.raises(ValueError, match=r"storage 'mysql\+pymysql://user:\*\*\*@127.0.0.1:9/none' needs the Python "
                                         r"driver 'pymysql'; install it .*pip install pymysql") as error:
        open_storage("mysql+pymysql://user:secret@127.0.0.1:9/none")
    assert "secret" not in str(error.value)


def test_resuming_a_study_with_another_spec_is_refused(tmp_path: Path) -> None:
    """A study is resumed only by a spec that measures what its trials measured: another base argument, range,
    objective, seed or sampler seed is an error naming each difference (they were silently mixed into the study, and
    its stored objective overwritten); more trials or repeats, and another device, resume it."""
    import copy

    from sb3_ppo_scale.tuning.runner import open_study

    raw = tiny_spec(tmp_path, noise_repeats=1)
    storage = resolve_storage(spec_from_dict(raw))
    open_study(spec_from_dict(raw), "CartPole-v1", storage).add_trial(optuna.trial.create_trial(value=1.0))
    changed = copy.deepcopy(raw)
    changed["base"]["gamma"] = 0.9
    changed["space"]["clip_range"]["high"] = 0.4
    changed["evaluation"]["objective"] = "final"
    changed["sampler"]["seed"] = 3
    with pytest.raises(ValueError, match=r"study 'tiny:CartPole-v1' in .* was run with another spec \(base.gamma: unset "
                                         r"-> 0.9; evaluation.objective: 'auc' -> 'final'; sampler.seed: 0 -> 3; "
                                         r"space.clip_range.high: 0.3 -> 0.4\); resume it with the spec it was run with"):
        open_study(spec_from_dict(changed), "CartPole-v1", storage)
    with pytest.raises(ValueError, match=r"another spec \(seed: 0 -> 5\)"):
        open_study(spec_from_dict({**raw, "seed": 5}), "CartPole-v1", storage)
    same = copy.deepcopy(raw)
    same.update(n_trials=8, noise_repeats=2)
    same["base"]["device"] = "cpu"
    study = open_study(spec_from_dict(same), "CartPole-v1", storage)
    assert study.user_attrs["objective"] == "auc" and study.user_attrs["planned_trials"] == 8


def test_a_base_config_the_model_refuses_stops_before_any_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistake only ScalablePPO's constructor sees (an unknown policy_kwargs key) is one line and exit 2 before the
    storage is touched; it had failed the first trial of every worker, each with Optuna's traceback (exit 1 with
    --workers 2)."""
    raw = tiny_spec(tmp_path)
    raw["base"]["policy_kwargs"] = {"net_arch": [16], "colour": "red"}
    path = write_spec(tmp_path, raw)
    assert cli_main(["tune", str(path), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err == ("sb3-ppo-scale tune: error: spec (env CartPole-v1): the trials cannot start, building the envs and "
                   "model of the space's centre gave: ActorCriticPolicy.__init__() got an unexpected keyword argument "
                   "'colour'\n")
    assert not (tmp_path / "out").exists()  # no journal, no study
    raw["base"]["policy_kwargs"] = {"net_arch": [16]}
    raw["base"]["device"] = "tpu"  # torch knows no such device: SB3's RuntimeError had been an internal error
    assert cli_main(["tune", str(write_spec(tmp_path, raw))]) == 2
    assert "gave: base.device must be 'auto', 'cpu', 'cuda', 'mps'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unknown_env_in_yaml_is_reported_by_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_spec(tmp_path, tiny_spec(tmp_path, envs=["CartPole-v1", "Nope-v0"]))
    assert cli_main(["tune", str(path)]) == 2
    assert "unknown env id 'Nope-v0'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- pieces
def test_split_and_stars_rules() -> None:
    assert split(5, 2) == [3, 2] and split(1, 3) == [1] and split(0, 2) == []
    assert stars({"a": 0.5, "b": 0.3, "c": 0.15, "d": 0.05}) == {"a": 4, "b": 3, "c": 2, "d": 1}
    # the boundaries go down, as the legend (STARS_RULE) says: exactly 3/4, 1/2, 1/4 of the top -> 3, 2, 1
    assert stars({"a": 0.4, "b": 0.3, "c": 0.2, "d": 0.1}) == {"a": 4, "b": 3, "c": 2, "d": 1}
    # the dummy gets no stars and does not set the scale, even when it is the largest importance
    assert stars({"a": 0.4, "dummy": 0.5, "b": 0.1}, ["dummy"]) == {"a": 4, "b": 1}
    # verdict: median of the kept stars (0 = none, left out) against the documented stars
    assert verdict(2, [2, 2]) == "agrees" and verdict(2, [3, 1]) == "agrees"
    assert verdict(4, [1, 2]) == "overrates" and verdict(1, [4, 3]) == "underrates"
    assert verdict(3, [2, 3]) == "overrates" and verdict(2, [0, 3]) == "underrates"
    assert verdict(2, [0, 0]) == verdict(2, []) == "not distinguishable from noise"


def test_equal_values_are_refused_on_every_cpu() -> None:
    """fANOVA's own zero-variance check depends on float rounding (it raised on the CI box and ranked rounding noise
    as 0.85 / 0.15 on another), so equal values are refused before any evaluator runs."""
    from optuna.distributions import FloatDistribution
    from sb3_ppo_scale.tuning.importance import EVALUATORS, importances

    space = {"clip_range": FloatDistribution(0.1, 0.3), "gae_lambda": FloatDistribution(0.9, 0.99)}
    trials = [optuna.trial.create_trial(params={"clip_range": 0.1 + 0.04 * i, "gae_lambda": 0.9 + 0.015 * i},
                                        distributions=space, value=-735.443117) for i in range(5)]
    for evaluator in EVALUATORS:
        with pytest.raises(ValueError, match=f"{evaluator}: every trial has the same value .-735.443117."):
            importances(trials, list(space), evaluator)
    trials[2] = optuna.trial.create_trial(params=trials[2].params, distributions=space, value=-700.0)
    assert all(sum(importances(trials, list(space), e).values()) > 0 for e in EVALUATORS)


def test_noise_floor_and_star_stability_rules() -> None:
    from sb3_ppo_scale.tuning.importance import Stability
    from sb3_ppo_scale.tuning.verdicts import rate

    st = Stability(low={"a": 0.5, "b": 0.2, "c": 0.45, "d": 0.0}, high={"a": 0.7, "b": 0.5, "c": 0.6, "d": 0.4},
                   same_rank={}, same_top=1.0, n_resamples=200, same_stars={"a": 0.9, "b": 0.95, "c": 0.7})
    kept = rate("a", 4, st, ["d"])
    assert (kept.stars, kept.above_noise, kept.star_share) == (4, True, 0.9)
    overlaps = rate("b", 2, st, ["d"])  # 0.2 <= the dummy's 0.4: no stars, however stable
    assert (overlaps.stars, overlaps.above_noise) == (0, False) and "overlaps dummy <= 0.40" in overlaps.status
    unstable = rate("c", 3, st, ["d"])  # above the noise floor but its stars held in 70% < 80% of resamples
    assert (unstable.stars, unstable.above_noise) == (0, True) and "kept in 70% < 80%" in unstable.status
    assert rate("a", 4, st, []).status == "not checked (no dummy parameter)" and rate("a", 4, st, []).stars == 0
    no_bootstrap = Stability(low={}, high={}, same_rank={}, same_top=0.0, n_resamples=0)
    assert rate("a", 4, no_bootstrap, ["d"]).status == "not checked (no bootstrap)"


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
def test_three_seed_study_with_dummy_and_noise_repeats_end_to_end(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny 3-seed study with a dummy parameter and 2 noise repeats: trials, seeds and marks as stored; the dummy
    gets no stars; noise repeats are recorded and left out of importance; the report is regenerated byte for byte
    from the spec or from the journal alone; an unfinished study is marked as such."""
    from sb3_ppo_scale.tuning.importance import complete_trials, importances
    from sb3_ppo_scale.tuning.noise import DECAY_ATTR, NOISE_ATTR

    raw = tiny_spec(tmp_path, env="Pendulum-v1", timesteps=256, n_trials=5, seeds_per_trial=3, noise_repeats=2)
    raw["base"]["normalize"] = True
    raw["space"]["dummy"] = {"type": "dummy"}
    raw["space"]["learning_rate"]["schedule"] = "constant"  # what decay repeats decay, at the end
    path = write_spec(tmp_path, raw)
    assert cli_main(["tune", str(path)]) == 0
    out = capsys.readouterr().out
    assert "enqueued noise repeats [0, 1]" in out
    lines = [line for line in out.splitlines() if " trial " in line]
    assert len(lines) == 7 and sum("(noise repeat " in line for line in lines) == 2
    assert all("dummy=" not in line for line in lines)  # decoded params are what training receives
    trials = sorted(load_trials(path), key=lambda t: t.number)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 7
    centre = {"clip_range": 0.2, "log2_batch_size": 6, "n_epochs": 6, "dummy": 0.5}
    for trial in trials:
        noise = trial.user_attrs.get(NOISE_ATTR)
        assert trial.number >= 2 or noise == trial.number  # the repeats run first, marked 0 and 1
        assert trial.user_attrs["seeds"] == ([0, 1, 2] if noise in (None, 0) else [3, 4, 5])
        seed_values = trial.user_attrs["seed_values"]
        assert len(seed_values) == 3 and trial.value == pytest.approx(sum(seed_values) / 3)
        assert 0.0 <= trial.params["dummy"] <= 1.0
        if noise is not None:
            assert {k: trial.params[k] for k in centre} == pytest.approx(centre)
            assert trial.params["learning_rate"] == pytest.approx((1e-4 * 3e-4) ** 0.5)
    assert trials[0].value != trials[1].value  # the repeats differ by their seeds only
    # Re-running resumes: no trial and no noise repeat is added.
    assert cli_main(["tune", str(path)]) == 0
    assert len(load_trials(path)) == 7 and "enqueued noise repeats" not in capsys.readouterr().out

    journal = resolve_storage(load_spec(path))
    outputs = []
    for name, source in (("a", str(path)), ("b", str(path)), ("c", journal)):
        assert report_command(source, tmp_path / name, n_bootstrap=16) == 0
        outputs.append({f.name: f.read_bytes() for f in sorted((tmp_path / name).iterdir())})
    assert outputs[0] == outputs[1] == outputs[2]  # byte-identical, and the journal alone regenerates it
    files = outputs[0]
    assert set(files) == {"report.md", "importance.json", "importance.png", "slices_Pendulum-v1.png",
                          "trials_Pendulum-v1.csv"}
    assert all(files[f].startswith(b"\x89PNG") for f in files if f.endswith(".png"))
    rows = files["trials_Pendulum-v1.csv"].decode().splitlines()
    assert len(rows) == 8 and [row.split(",")[1] for row in rows[1:3]] == ["noise_repeat", "noise_repeat"]

    summary = json.loads(files["importance.json"])["tiny:Pendulum-v1"]
    assert summary["n_trials"] == 5 and summary["planned_trials"] == 5 and summary["unfinished"] is False
    assert summary["noise_repeats"]["done"] == summary["noise_repeats"]["planned"] == 2
    repeat_values = [t.value for t in trials[:2]]
    assert summary["noise_repeats"]["mean"] == pytest.approx(sum(repeat_values) / 2)
    assert summary["dummies"] == ["dummy"]
    study = optuna.load_study(study_name="tiny:Pendulum-v1", storage=open_storage(journal))
    sampled = complete_trials(study)
    assert [t.number for t in sampled] == [2, 3, 4, 5, 6]  # the noise repeats are left out of importance
    for evaluator in ("ped_anova", "fanova"):
        fitted = importances(sampled, [*PARAMS, "dummy"], evaluator)
        assert summary["importance"][evaluator] == pytest.approx(
            {("batch_size" if k == "log2_batch_size" else k): v for k, v in fitted.items()})
        assert "dummy" in summary["importance"][evaluator]
        assert "dummy" not in summary["stars"][evaluator] and "dummy" not in summary["stars_kept"][evaluator]
        dummy_high = summary["interval"][evaluator]["dummy"][1]
        for argument, kept in summary["stars_kept"][evaluator].items():
            low = summary["interval"][evaluator][argument][0]
            share = summary["star_share"][evaluator][argument]
            if kept:  # a parameter keeps stars only above the dummy's interval and with stable stars
                assert low > dummy_high and share >= 0.8 and kept == summary["stars"][evaluator][argument]
            if low <= dummy_high:
                assert kept == 0 and summary["noise_floor"][evaluator][argument] is False
    verdicts = set(summary["verdict"].values())
    assert verdicts <= {"agrees", "overrates", "underrates", "not distinguishable from noise"}
    report = files["report.md"].decode()
    assert "| `dummy` |" in report and "noise floor (dummy)" in report and "2 of 2 noise repeats" in report
    curves = [c for t in trials[:2] for c in t.user_attrs["eval_returns"]]
    assert len(curves) == 6 and all(len(c) == 2 for c in curves)  # 2 repeats x 3 seeds, evaluations at 128 and 256
    first, last = (sum(c[i] for c in curves) / 6 for i in (0, -1))
    assert f"their evaluation return went from {first:.1f} (first evaluation) to {last:.1f} (last)" in report
    assert "UNFINISHED" not in report

    # A study short of its plan (as after a session that ended) is marked unfinished.
    study.set_user_attr("planned_trials", 9)
    assert report_command(journal, tmp_path / "d", n_bootstrap=0) == 0
    assert "is flagged: unfinished (5/9 trials, 2/2 noise repeats)" in capsys.readouterr().out
    unfinished = (tmp_path / "d" / "report.md").read_text()
    assert "### Pendulum-v1 (`tiny:Pendulum-v1`) - UNFINISHED" in unfinished
    newest = max(t.datetime_complete for t in study.get_trials() if t.datetime_complete is not None)
    assert (f"Produced by `sb3-ppo-scale report SPEC_OR_STUDY ...` over the studies below (a spec, or the storage that "
            f"holds them), from trials completed up to {newest:%Y-%m-%d}.") in unfinished  # the data's day
    assert json.loads((tmp_path / "d" / "importance.json").read_text())["tiny:Pendulum-v1"]["unfinished"] is True

    # Decay repeats added to the finished study (the spec raised later): each trains its noise repeat's seeds with the
    # learning rate decayed linearly, is left out of importance, and the report pairs them seed by seed.
    raw["decay_repeats"] = 2
    write_spec(tmp_path, raw)
    assert cli_main(["tune", str(path)]) == 0
    decay_out = capsys.readouterr().out
    assert "enqueued decay repeats [0, 1]" in decay_out
    assert "(decay repeat 1: learning rate decayed linearly) " in decay_out
    decayed = sorted((t for t in load_trials(path) if DECAY_ATTR in t.user_attrs), key=lambda t: t.number)
    assert [t.user_attrs[DECAY_ATTR] for t in decayed] == [0, 1] and [t.number for t in decayed] == [7, 8]
    for repeat, twin in zip(decayed, trials[:2]):
        assert repeat.user_attrs["seeds"] == twin.user_attrs["seeds"] and repeat.params == twin.params
        assert repeat.user_attrs["seed_values"] != twin.user_attrs["seed_values"]  # the schedule changed the run
    assert [t.number for t in complete_trials(study)] == [2, 3, 4, 5, 6]
    assert report_command(str(path), tmp_path / "e", n_bootstrap=0) == 0
    report = (tmp_path / "e" / "report.md").read_text()
    assert '"use linear decay": the centre configuration' in report and "6 seed pairs (2 decay repeats" in report
    assert "2 of 2 decay repeats" in report
    csv_kinds = [row.split(",")[1] for row in (tmp_path / "e" / "trials_Pendulum-v1.csv").read_text().splitlines()[1:]]
    assert csv_kinds.count("decay_repeat") == 2 and csv_kinds.count("noise_repeat") == 2
    assert json.loads((tmp_path / "e" / "importance.json").read_text())["tiny:Pendulum-v1"]["decay_repeats"] == {
        "done": 2, "planned": 2}


def test_a_stopped_trial_is_one_line_without_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM mid-trial in a worker (Ctrl-C / kill -TERM, the documented way to end a session): the worker says in one
    line which trial it stopped and re-queued; Optuna's warnings that the trial failed, with the traceback of the
    stop, are not printed (they were, once per worker)."""
    import logging
    import signal

    from sb3_ppo_scale.checkpoint import PREEMPTED_EXIT_CODE
    from sb3_ppo_scale import stop_signals
    from sb3_ppo_scale.tuning import objective
    from sb3_ppo_scale.tuning.runner import open_study, run_worker

    def stopped_mid_trial(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)  # recorded by the worker's handler
        stop_signals.check()  # what the trial's next env step does
        raise AssertionError("the signal did not stop the trial")

    monkeypatch.setattr(objective, "train_and_evaluate", stopped_mid_trial)
    monkeypatch.setattr(stop_signals, "_received", [])  # this process's record of signals, restored afterwards
    path = write_spec(tmp_path, tiny_spec(tmp_path))
    spec = load_spec(path)
    storage = resolve_storage(spec)
    open_study(spec, "CartPole-v1", storage)
    records: list[logging.LogRecord] = []
    collector = logging.Handler()
    collector.emit = records.append  # type: ignore[method-assign]
    optuna_logger = logging.getLogger("optuna.study._optimize")  # where Optuna logs a failed trial
    optuna_logger.addHandler(collector)
    try:
        with pytest.raises(SystemExit) as stop:
            run_worker(spec, "CartPole-v1", storage, n_trials=1, total=1)
    finally:
        optuna_logger.removeHandler(collector)
    assert stop.value.code == PREEMPTED_EXIT_CODE
    assert [record.getMessage() for record in records] == []
    assert "stopped by SIGTERM: trial(s) [0] failed, re-queued [0]" in capsys.readouterr().err
    assert [t.state for t in load_trials(path)] == [TrialState.FAIL, TrialState.WAITING]  # failed, re-queued


def test_two_worker_processes_finish_exactly_n_trials(tmp_path: Path) -> None:
    path = write_spec(tmp_path, tiny_spec(tmp_path, timesteps=256))
    process = run_cli("tune", str(path), "--workers", "2", "--n-trials", "6")
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output
    trials = load_trials(path)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 6
    assert sorted(t.number for t in trials) == list(range(6))
    workers = {t.user_attrs[WORKER_ATTR] for t in trials}
    assert len(workers) == 2  # both processes ran trials
    # one line per trial; counted over the whole output, as two processes' lines can share a line of the pipe
    assert len(re.findall(r"\] trial +\d+ COMPLETE", output)) == 6, output


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


def test_search_mode_uses_tpe_reports_intermediate_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every parameter of every trial is drawn by a TPESampler (recorded as the study samples it: a reloaded study's
    ``sampler`` is a TPESampler whatever sampler ran the trials, so it proves nothing)."""
    sampled: list[tuple[int, str]] = []
    tpe_sample_independent = optuna.samplers.TPESampler.sample_independent

    def recording_sample_independent(self: optuna.samplers.TPESampler, study: optuna.Study,
                                     trial: optuna.trial.FrozenTrial, param_name: str, distribution: Any) -> Any:
        sampled.append((trial.number, param_name))
        return tpe_sample_independent(self, study, trial, param_name, distribution)

    monkeypatch.setattr(optuna.samplers.TPESampler, "sample_independent", recording_sample_independent)
    raw = tiny_spec(tmp_path, env="Pendulum-v1", mode="search", sampler={"name": "tpe", "seed": 0},
                    pruner={"name": "median"}, n_trials=3)
    spec = load_spec(write_spec(tmp_path, raw))
    assert tune(spec) == 0
    study = optuna.load_study(study_name="tiny:Pendulum-v1", storage=open_storage(resolve_storage(spec)))
    trials = study.get_trials()
    # TPE's first n_startup_trials draw through its own sample_independent (random start-up, then the model)
    assert sorted(sampled) == sorted((t.number, name) for t in trials for name in PARAMS)
    assert all(sorted(t.params) == sorted(PARAMS) for t in trials)
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


# ------------------------------------------------------------------------------------ sb3-contrib algorithms
@pytest.mark.parametrize(("algo", "env_id", "cls_name", "policy"), [
    ("scalable_maskable_ppo", "InvalidActionEnvDiscrete-v0", "ScalableMaskablePPO", "MlpPolicy"),
    ("scalable_recurrent_ppo", "PendulumNoVel-v1", "ScalableRecurrentPPO", "MlpLstmPolicy"),  # returns differ
])
def test_a_study_trains_and_reports_the_contrib_algorithm_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   algo: str, env_id: str, cls_name: str,
                                                                   policy: str) -> None:
    """``algo`` picks the class every trial trains (its default policy unless the spec sets one); the masked one is
    evaluated with the env's masks; the report names the algorithm; the study resumes only with the same algo."""
    from sb3_contrib.common.maskable import evaluation as masked_evaluation

    from sb3_ppo_scale.experiments import zoo
    from sb3_ppo_scale.tuning import objective

    built, masked = [], []
    build_model, evaluate_masked = zoo.build_model, masked_evaluation.evaluate_policy

    def recording_build(config: Any, env: Any, algo_class: type, **kwargs: Any) -> Any:
        built.append((algo_class.__name__, config.policy))
        return build_model(config, env, algo_class, **kwargs)

    def recording_evaluate_masked(*args: Any, **kwargs: Any) -> Any:
        masked.append(True)
        return evaluate_masked(*args, **kwargs)

    monkeypatch.setattr(objective.zoo, "build_model", recording_build)
    monkeypatch.setattr(masked_evaluation, "evaluate_policy", recording_evaluate_masked)
    raw = tiny_spec(tmp_path, env=env_id, algo=algo)
    raw["space"].pop("learning_rate")
    path = write_spec(tmp_path, raw)
    assert cli_main(["tune", str(path)]) == 0
    assert [t.state for t in load_trials(path)] == [TrialState.COMPLETE] * 4
    assert set(built) == {(cls_name, policy)} and len(built) == 1 + 4  # the start check, then each trial
    assert len(masked) == (4 * 2 if algo == "scalable_maskable_ppo" else 0)  # 2 evaluations per trial
    out = tmp_path / "report"
    assert cli_main(["report", str(path), "--out", str(out), "--bootstrap", "0"]) == 0
    assert f"Algorithm: {cls_name}." in (out / "report.md").read_text()
    with pytest.raises(ValueError, match=rf"another spec \(algo: '{algo}' -> 'scalable_ppo'"):
        tune(spec_from_dict({**raw, "algo": "scalable_ppo", "base": {**raw["base"], "policy": "MlpPolicy"}}))


def test_a_study_stored_before_spec_algo_existed_resumes_as_scalable_ppo(tmp_path: Path) -> None:
    from sb3_ppo_scale.tuning.runner import DEFINITION_ATTR, open_study, study_definition

    spec = spec_from_dict(tiny_spec(tmp_path))
    study = open_study(spec, "CartPole-v1", resolve_storage(spec))
    study.add_trial(optuna.trial.create_trial(value=1.0))
    old = {k: v for k, v in study_definition(spec).items() if k != "algo"}
    study.set_user_attr(DEFINITION_ATTR, old)
    open_study(spec, "CartPole-v1", resolve_storage(spec))  # no error
    with pytest.raises(ValueError, match=r"another spec \(algo: 'scalable_ppo' -> 'scalable_recurrent_ppo'"):
        open_study(spec_from_dict(tiny_spec(tmp_path, algo="scalable_recurrent_ppo")), "CartPole-v1",
                   resolve_storage(spec))


# ------------------------------------------------------------------------------------------- divergence
def test_a_diverged_trial_is_recorded_and_reported_and_the_study_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A trial whose training stops with NonFiniteError (its hyperparameters diverge) used to end the whole `tune` run
    with an internal error, and was never counted or mentioned in the report; now it is a FAIL trial saying why, the
    worker goes on, `tune` says how many diverged, and the report counts them and lists their parameters."""
    import logging

    from sb3_ppo_scale.core.update.guard import NonFiniteError
    from sb3_ppo_scale.tuning import objective
    from sb3_ppo_scale.tuning.storage import DIVERGED_ATTR

    train = objective.train_and_evaluate

    def diverging_above_0_2(spec: Any, env_id: str, values: dict[str, Any], *args: Any) -> Any:
        if values["clip_range"] > 0.2:
            raise NonFiniteError("non-finite loss or gradient in a PPO update (loss=nan); 10 optimizer step(s) ...")
        return train(spec, env_id, values, *args)

    monkeypatch.setattr(objective, "train_and_evaluate", diverging_above_0_2)
    records: list[logging.LogRecord] = []
    collector = logging.Handler()
    collector.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("optuna.study._optimize").addHandler(collector)
    raw = tiny_spec(tmp_path, n_trials=6)
    raw["space"]["dummy"] = {"type": "dummy"}
    path = write_spec(tmp_path, raw)
    try:
        assert cli_main(["tune", str(path)]) == 1  # 6 trials run, fewer complete: the plan is not met
    finally:
        logging.getLogger("optuna.study._optimize").removeHandler(collector)
    out = capsys.readouterr().out
    trials = load_trials(path)
    diverged = [t for t in trials if t.state == TrialState.FAIL]
    assert len(trials) == 6 and diverged and all(t.params["clip_range"] > 0.2 for t in diverged)
    assert {t.user_attrs[DIVERGED_ATTR] for t in diverged} == {
        "seed 0: non-finite loss or gradient in a PPO update (loss=nan)"}
    assert out.count("(diverged, seed 0: non-finite loss or gradient in a PPO update (loss=nan); left out of "
                     "importance)") == len(diverged)
    assert "trials done after" in out and f"; {len(diverged)} diverged (failed, not counted: run the same command " \
                                            "again for the rest)" in out
    assert records == []  # Optuna's warnings (with a traceback) are replaced by the progress line
    assert len(diverged) == 3  # the Sobol points of seed 0 above clip_range 0.2: 3 complete, too few for a report
    assert cli_main(["report", str(path), "--out", str(tmp_path / "early"), "--bootstrap", "0"]) == 2
    assert "has 3 complete trial(s) (3 more diverged: see tune's progress lines); a report needs >= 4" in \
        capsys.readouterr().err
    monkeypatch.setattr(objective, "train_and_evaluate", train)
    assert cli_main(["tune", str(path)]) == 0  # the rest of the plan
    report_dir = tmp_path / "report"
    assert cli_main(["report", str(path), "--out", str(report_dir), "--bootstrap", "0"]) == 0
    assert (f"{len(diverged)} trial(s) diverged (non-finite updates stopped their training) and are left out of "
            "importance") in (report_dir / "report.md").read_text()
    rows = (report_dir / "trials_CartPole-v1.csv").read_text().splitlines()
    assert sum(",diverged," in row for row in rows) == len(diverged)


def test_real_divergence_ends_the_trial_as_diverged(tmp_path: Path) -> None:
    """The guard's NonFiniteError (Pendulum at learning rate 50) becomes TrialDiverged, with the reason stored."""
    from sb3_ppo_scale.tuning.objective import TrialDiverged, make_objective
    from sb3_ppo_scale.tuning.storage import DIVERGED_ATTR

    raw = tiny_spec(tmp_path, env="Pendulum-v1", timesteps=2048)
    raw["base"].update(n_steps=256, n_envs=1)
    raw["space"] = {"learning_rate": {"type": "float", "low": 50.0, "high": 60.0}}
    spec = spec_from_dict(raw)
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    with pytest.warns(RuntimeWarning, match="skipped an optimizer step"), pytest.raises(TrialDiverged):
        make_objective(spec, "Pendulum-v1")(trial)
    assert trial.user_attrs[DIVERGED_ATTR].startswith("seed 0: non-finite loss or gradient in a PPO update (")
