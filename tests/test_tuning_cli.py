"""tune/report as a user meets them: results under the working directory, quick studies, the terminal table,
flags for studies too small for their verdicts, committed results left alone."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from sb3_ppo_scale import cli
from sb3_ppo_scale.tuning import load_spec
from sb3_ppo_scale.tuning.importance import Stability
from sb3_ppo_scale.tuning.report import MIN_VERDICT_TRIALS, StudyResult, too_small
from sb3_ppo_scale.tuning.runner import resolve_storage
from sb3_ppo_scale.tuning.storage import open_storage

ROOT = Path(__file__).resolve().parents[1]


def _spec(folder: Path) -> Path:
    """A tiny CartPole study without storage/output_dir keys, as the committed specs are written."""
    raw: dict[str, Any] = {
        "name": "quick", "envs": ["CartPole-v1"], "timesteps": 1024,
        "evaluation": {"eval_freq": 512, "n_episodes": 1},
        "base": {"n_steps": 64, "n_envs": 2, "policy_kwargs": {"net_arch": [16], "activation_fn": "relu"}},
        "space": {"clip_range": {"type": "float", "low": 0.1, "high": 0.3},
                  "learning_rate": {"type": "float", "low": 1e-4, "high": 1e-3, "log": True, "schedule": "linear"},
                  "n_epochs": {"type": "int", "low": 1, "high": 4}},
        "n_trials": 4,
    }
    folder.mkdir(parents=True)
    path = folder / "quick.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


#: Specs whose studies are appended to across sessions: their journal is committed under tuning/results/<name>/.
APPENDED_STUDIES = {"ppo-sensitivity-300k-halfcheetah", "ppo-sensitivity-300k-hopper"}


def test_committed_specs_write_under_the_working_directory() -> None:
    """Every committed spec writes under ./tune_results/ except the long studies meant to be continued, which name
    their journal under tuning/results/<name>/."""
    names = set()
    for path in sorted((ROOT / "tuning").glob("*.yaml")):
        spec = load_spec(path)
        storage = resolve_storage(spec)
        names.add(spec.name)
        if spec.name in APPENDED_STUDIES:
            assert storage == f"tuning/results/{spec.name}/{spec.name}.journal", (path.name, storage)
        else:
            assert "://" in storage or Path(storage).parts[0] == "tune_results", (path.name, storage)
    assert APPENDED_STUDIES <= names


def test_committed_specs_can_start_their_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each committed spec's envs and model (the space's centre) build, as the first trial would build them: the
    check raises for none of them, and it did build each env's model with the spec's algorithm."""
    from sb3_ppo_scale.experiments.algorithms import algorithm
    from sb3_ppo_scale.tuning import objective

    built: list[tuple[str, str]] = []
    build_model = objective.zoo.build_model

    def recording_build(config: Any, env: Any, algo_class: type, **kwargs: Any) -> Any:
        model = build_model(config, env, algo_class, **kwargs)
        built.append((config.env_id, type(model).__name__))
        return model

    monkeypatch.setattr(objective.zoo, "build_model", recording_build)
    expected = []
    specs = sorted((ROOT / "tuning").glob("*.yaml"))
    assert specs, "no committed specs found"
    for path in specs:
        spec = load_spec(path)
        for env_id in spec.envs:
            objective.check_trials_can_start(spec, env_id)
            expected.append((env_id, algorithm(spec.algo).cls.__name__))
    assert built == expected


def test_quick_study_then_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    spec_path = _spec(tmp_path / "specs")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert cli.main(["tune", str(spec_path), "--n-timesteps", "256", "--set", "evaluation.n_episodes=2",
                     "--n-trials", "4"]) == 0
    journal = work / "tune_results" / "quick" / "quick.journal"
    assert journal.is_file() and sorted(p.name for p in (tmp_path / "specs").iterdir()) == ["quick.yaml"]
    study = optuna.load_study(study_name="quick:CartPole-v1", storage=open_storage(str(journal)))
    trials = study.get_trials()
    assert len(trials) == 4 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    budget = study.user_attrs["budget"]
    assert (budget["timesteps"], budget["eval_freq"], budget["n_episodes"]) == (256, 128, 2)  # evaluations scaled
    assert all(len(t.user_attrs["eval_returns"][0]) == 2 for t in trials)
    capsys.readouterr()

    # The same folder with another budget is not mixed into the study.
    assert cli.main(["tune", str(spec_path), "--n-timesteps", "512", "--n-trials", "4"]) == 2
    assert "was run with another budget" in capsys.readouterr().err
    # ... nor with another search space (a dummy added to a running study would mix two designs).
    assert cli.main(["tune", str(spec_path), "--n-timesteps", "256", "--set", "evaluation.n_episodes=2",
                     "--set", "space.dummy.type=dummy", "--n-trials", "4"]) == 2
    assert "searched other parameters (stored: ['clip_range', 'learning_rate', 'n_epochs'], asked: ['clip_range', " \
           "'dummy', 'learning_rate', 'n_epochs'])" in capsys.readouterr().err

    assert cli.main(["report", str(spec_path), "--bootstrap", "4"]) == 0
    out = capsys.readouterr().out
    report_dir = work / "tune_results" / "reports" / "quick"
    assert (report_dir / "report.md").is_file() and f"written to {Path('tune_results/reports/quick')}/report.md" in out
    lines = out.splitlines()
    assert lines[0].split() == ["parameter", "documented", "CartPole-v1", "verdict"]
    clip = next(line for line in lines if line.startswith("clip_range "))
    # No dummy parameter in this spec: no noise floor, so no stars are kept and the verdict says so.
    assert clip.split()[1:5] == ["★★★★", "–", "/", "–"] and clip.endswith("not distinguishable from noise")
    assert any(line.startswith("batch_size ") and "not searched" in line and "not measured" in line for line in lines)
    assert f"warning: CartPole-v1 is flagged: small study (4 complete trials < {MIN_VERDICT_TRIALS})" in out
    report = (report_dir / "report.md").read_text()
    assert "Flagged here: CartPole-v1: small study (4 complete trials" in report
    assert report.count("not checked (no dummy parameter)") == 2 * 3  # 3 real parameters x 2 evaluators


def test_study_of_a_users_own_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A spec may name a user's env as ``module:EnvId`` (the module registers it): the spec check imports it, and
    so does each worker process that builds it."""
    spec_path = _spec(tmp_path / "specs")
    monkeypatch.chdir(tmp_path)
    env_id = "tests.user_envs:UserCartPole-v0"
    assert cli.main(["tune", str(spec_path), "--n-timesteps", "256", "--set", f"envs=[{env_id}]", "--n-trials", "2",
                     "--workers", "2"]) == 0
    study = optuna.load_study(study_name=f"quick:{env_id}",
                              storage=open_storage(str(tmp_path / "tune_results" / "quick" / "quick.journal")))
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.COMPLETE] * 2
    capsys.readouterr()
    assert cli.main(["tune", str(spec_path), "--set", "envs=[tests.user_envs:Missing-v0]"]) == 2
    assert "spec.envs: unknown env id 'tests.user_envs:Missing-v0'" in capsys.readouterr().err


def test_report_keeps_committed_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = tmp_path / "s.journal"
    study = optuna.create_study(storage=open_storage(str(journal)), study_name="s:CartPole-v1", direction="maximize")
    study.optimize(lambda t: t.suggest_float("clip_range", 0.1, 0.3) + t.suggest_int("n_epochs", 1, 9), n_trials=6)
    out = tmp_path / "committed"
    out.mkdir()
    (out / "report.md").write_text("committed\n")
    git = ["git", "-C", str(out), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(out)], check=True)
    subprocess.run([*git, "add", "report.md"], check=True)
    subprocess.run([*git, "commit", "-qm", "results"], check=True)
    assert cli.main(["report", str(journal), "--out", str(out), "--bootstrap", "0"]) == 2
    assert "holds committed results (report.md)" in capsys.readouterr().err
    assert (out / "report.md").read_text() == "committed\n"
    assert cli.main(["report", str(journal), "--out", str(out), "--bootstrap", "0", "--overwrite"]) == 0
    assert (out / "report.md").read_text().startswith("# PPO hyperparameter sensitivity")
    capsys.readouterr()
    # --storage replaces a spec's storage; beside a journal it would be ignored (it was, silently): an error
    assert cli.main(["report", str(journal), "--storage", str(tmp_path / "other.journal"), "--out", str(tmp_path / "o"),
                     "--bootstrap", "0"]) == 2
    assert capsys.readouterr().err == (f"sb3-ppo-scale report: error: --storage replaces a spec's storage, so it needs "
                                       f"spec sources (.yaml); got the storage(s) {[str(journal)]}: name the storage to "
                                       "read as SPEC_OR_STUDY instead\n")
    assert not (tmp_path / "o").exists()


def test_small_study_rule() -> None:
    def result(n_trials: int, same_top: float, n_resamples: int = 200) -> StudyResult:
        stability = Stability(low={}, high={}, same_rank={}, same_top=same_top, n_resamples=n_resamples)
        return StudyResult(name="s:E", label="E", objective="auc", n_trials=n_trials, params=[], arguments={},
                           importance={}, stars={}, stability={"ped_anova": stability, "fanova": stability},
                           split_half={}, top={}, best_value=0.0, trials=[], budget={})

    assert too_small(result(MIN_VERDICT_TRIALS - 1, 1.0)) == f"{MIN_VERDICT_TRIALS - 1} complete trials < 32"
    assert too_small(result(64, 0.9)) is None
    assert too_small(result(64, 0.34)) == ("PED-ANOVA top parameter kept in 34% of resamples, fANOVA top parameter "
                                           "kept in 34% of resamples < 50%")
    assert too_small(result(64, 0.0, n_resamples=0)) is None  # bootstrap off: only the trial count counts


def test_trial_config_is_a_zoo_config(tmp_path: Path) -> None:
    from sb3_ppo_scale.experiments.pipeline import LinearSchedule
    from sb3_ppo_scale.tuning.objective import trial_config

    spec = load_spec(_spec(tmp_path / "specs"))
    config = trial_config(spec, "CartPole-v1", {"clip_range": 0.25, "learning_rate": 3e-4, "n_epochs": 2})
    assert config.entry == "quick:CartPole-v1" and config.n_timesteps == 1024 and config.n_envs == 2
    kwargs = config.model_kwargs
    assert kwargs["learning_rate"] == LinearSchedule(3e-4) and kwargs["clip_range"] == 0.25 and kwargs["n_epochs"] == 2
    assert kwargs["policy_kwargs"]["activation_fn"] is __import__("torch").nn.ReLU and kwargs["device"] == "cpu"
    assert config.normalize is None and config.vec_env == "dummy"


def _synthetic_study(journal: Path, env_id: str, clip_effect: float, n_trials: int = 24) -> None:
    """A study as `tune` records it, without training: objective = clip_effect * clip_range + a little of n_epochs;
    the dummy does nothing; two noise repeats at the centre."""
    study = optuna.create_study(storage=open_storage(str(journal)), study_name=f"syn:{env_id}", direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    for key, value in {"env_id": env_id, "objective": "auc", "planned_trials": n_trials, "noise_repeats": 2,
                       "dummies": ["dummy"], "space": {"clip_range": "clip_range", "n_epochs": "n_epochs", "dummy": "dummy"},
                       "schedules": {"clip_range": "constant"}}.items():
        study.set_user_attr(key, value)
    for index in range(2):
        study.enqueue_trial({"clip_range": 0.2, "n_epochs": 6, "dummy": 0.5}, user_attrs={"noise_repeat": index})

    def objective(trial: optuna.Trial) -> float:
        clip, epochs = trial.suggest_float("clip_range", 0.1, 0.3), trial.suggest_int("n_epochs", 3, 10)
        trial.suggest_float("dummy", 0.0, 1.0)
        seeds = [clip_effect * clip + 0.01 * epochs + 0.001 * k + 0.0001 * trial.number for k in range(3)]
        trial.set_user_attr("seed_values", seeds)
        return sum(seeds) / 3

    study.optimize(objective, n_trials=n_trials + 2)


def test_report_over_two_journals_rates_a_real_effect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One report over two journals: a parameter with a real effect clears the dummy and keeps 4 stars (agrees with
    the documented 4 for clip epsilon); the noise repeats are counted apart; the dummy gets no stars."""
    import json

    first, second = tmp_path / "a.journal", tmp_path / "b.journal"
    _synthetic_study(first, "Pendulum-v1", 10.0)
    _synthetic_study(second, "MountainCarContinuous-v0", 5.0)
    out = tmp_path / "both"
    assert cli.main(["report", str(first), str(second), "--out", str(out), "--bootstrap", "20"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["parameter", "documented", "Pendulum-v1", "MountainCarContinuous-v0",
                                               "verdict"]
    clip = next(line for line in printed.splitlines() if line.startswith("clip_range ")).split()
    # fANOVA separates the effect from the dummy at 24 trials; PED-ANOVA (top 5 trials) may not: its dummy's
    # interval is wide at this size, so there it keeps 4 stars or none, never other stars
    assert clip[:2] == ["clip_range", "★★★★"] and clip[3::3] == ["/", "/"] and clip[4::3] == ["★★★★", "★★★★"]
    assert set(clip[2:8:3]) <= {"★★★★", "–"} and clip[-1] == "agrees"
    summary = json.loads((out / "importance.json").read_text())
    assert summary["all studies"]["verdict"]["clip_range"] == "agrees"
    for name in ("syn:Pendulum-v1", "syn:MountainCarContinuous-v0"):
        study = summary[name]
        assert study["n_trials"] == 24 and study["noise_repeats"]["done"] == 2 and study["unfinished"] is False
        assert study["stars_kept"]["fanova"]["clip_range"] == 4 and study["star_share"]["fanova"]["clip_range"] == 1.0
        assert study["noise_floor"]["fanova"]["clip_range"] is True
        assert study["stars_kept"]["ped_anova"]["clip_range"] in (0, 4)
        assert study["stars_kept"]["fanova"]["n_epochs"] == 0  # 0.01 per epoch is inside the noise floor
        for evaluator in ("ped_anova", "fanova"):
            assert "dummy" not in study["stars_kept"][evaluator] and study["stars"][evaluator]["clip_range"] == 4
    report = (out / "report.md").read_text()
    assert "\"small epsilon for continuous control\" (continuous actions): Spearman rho(`clip_range`, objective) = " \
           "+1.00" in report and "contradicts the advice" in report
    assert sorted(p.name for p in out.iterdir()) == [
        "importance.json", "importance.png", "report.md", "slices_MountainCarContinuous-v0.png", "slices_Pendulum-v1.png",
        "trials_MountainCarContinuous-v0.csv", "trials_Pendulum-v1.csv"]


def test_report_before_the_study_started_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`report` on a spec whose journal does not exist yet says so and leaves no empty journal behind."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", str(ROOT / "tuning" / "ppo-sensitivity-300k-hopper.yaml"), "--bootstrap", "0"]) == 2
    assert "no journal 'tuning/results/ppo-sensitivity-300k-hopper/ppo-sensitivity-300k-hopper.journal'" in \
        capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
