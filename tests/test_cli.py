"""The CLI's answers to a user's mistakes: one line on stderr, exit code 2, nothing left behind; --debug; --threads."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch as th
import yaml

from sb3_ppo_scale import cli
from sb3_ppo_scale.experiments import zoo
from sb3_ppo_scale.experiments.pipeline import path_part


@pytest.fixture(autouse=True)
def _keep_threads() -> Iterator[None]:
    """The CLI sets torch's threads for the whole process; give the other tests theirs back."""
    threads = th.get_num_threads()
    yield
    th.set_num_threads(threads)


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI in-process, assert exit code 2 (returned, or argparse's SystemExit) and a one-line stderr; return
    that line."""
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_typo_in_env_id_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "sb3_ppo_scale", "train", "--env", "CartPole-v1-typo"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "sb3-ppo-scale train: error: unknown env id 'CartPole-v1-typo': Environment `CartPole-v1-typo` doesn't "
        "exist. Did you mean: `CartPole`?"
    ]
    assert done.stdout == "" and list(tmp_path.iterdir()) == []  # no logs/ folder


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "learning_rat=1e-3"], "unknown key 'learning_rat' in entry 'CartPole-v1'"),
        (["--set", "n_envs=0"], "n_envs in entry 'CartPole-v1' must be a positive integer, got 0"),
        (["--set", "learning_rate=fast"], "learning_rate: expected a number, 'lin_<number>'"),
        (["--set", "vec_env=threads"], "vec_env in entry 'CartPole-v1' must be one of ('dummy', 'subproc', 'processes', 'envpool', 'scale')"),
        (["--variant", "nope"], "no entry 'CartPole-v1@nope'"),
        (["--n-timesteps", "0"], "--n-timesteps must be >= 1, got 0"),
        (["--threads", "0"], "--threads must be an int >= 1, got 0"),
        (["--eval-episodes", "0"], "--eval-episodes must be >= 1, got 0"),
        (["--config", "missing.yml"], "No such file or directory: 'missing.yml'"),
        (["--seed", "-1"], "argument --seed: must be an int >= 0, got '-1'"),
        (["--device", "tpu"], "argument --device: must be 'auto', 'cpu', 'cuda', 'mps', 'cuda:<index>'"),
        (["--device", "cuda:99"], "argument --device: 'cuda:99'"),  # no CUDA here, or not 100 GPUs: never a CPU run
        (["--set", "n_steps=1.5"], "n_steps must be an int >= 1, got 1.5"),
        (["--set", "clip_range=lin_-0.2"], "clip_range: 'lin_<number>' decays from the number to 0, so the number "
                                           "must be > 0, got 'lin_-0.2'"),
        (["--set", "policy_kwargs=dict(net_arch=[64, 0])"], "policy_kwargs['net_arch'] layer sizes must be ints >= 1"),
        (["--set", "seed=5"], "'seed' in entry 'CartPole-v1' of "),
        (["--set", "device=cuda"], "each run sets it; use --device"),
        (["--set", "tensorboard_log=tb"], "use --log-dir (TensorBoard logs go to <log-dir>/tensorboard)"),
        (["--set", "n_timesteps=abc"], "n_timesteps in entry 'CartPole-v1' must be a number >= 1, got 'abc'"),
        (["--set", "n_timesteps=-5"], "n_timesteps in entry 'CartPole-v1' must be a number >= 1, got -5"),
        (["--set", "env_kwargs=5"], "env_kwargs must be a mapping or a dict(...) string, got 5"),
        (["--set", "rollout_buffer_class=str"], "rollout_buffer_class 'str' must be the class path of a RolloutBuffer"),
        (["--set", "rollout_buffer_class=sb3_ppo_scale.Nope"], "rollout_buffer_class 'sb3_ppo_scale.Nope' must be"),
        (["--set", "target_kl=None", "--set", "n_envs=None"], "n_envs in entry 'CartPole-v1' must be a positive "
                                                              "integer, got None"),
    ],
)
def test_train_mistakes_are_one_line_errors(argv: list[str], message: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    line = _error(["train", "--env", "CartPole-v1", *argv], capsys)
    assert line.startswith("sb3-ppo-scale train: error: ") and message in line
    assert list(tmp_path.iterdir()) == []


def test_bad_yaml_and_bad_option_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("CartPole-v1: {policy: [unclosed\n")
    assert "while parsing a flow" in _error(["train", "--env", "CartPole-v1", "--config", str(bad)], capsys)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--env", "CartPole-v1", "--vec-env", "threads"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["sb3-ppo-scale train: error: argument --vec-env: invalid choice: 'threads' (choose from "
                   "'dummy', 'subproc', 'processes', 'envpool', 'scale') (see sb3-ppo-scale train --help)"]


def test_failure_while_building_the_model_leaves_no_run_folder(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    line = _error(["train", "--env", "CartPole-v1", "--set", "batch_size=1", "--log-dir", str(run)], capsys)
    assert "batch_size" in line
    assert not run.exists()  # make_envs had created run/monitor; it is removed again
    kept = tmp_path / "kept"
    (kept / "notes").mkdir(parents=True)
    _error(["train", "--env", "CartPole-v1", "--set", "batch_size=1", "--log-dir", str(kept)], capsys)
    assert sorted(p.name for p in kept.iterdir()) == ["monitor", "notes"]  # a folder that existed stays


def test_a_new_run_in_an_earlier_runs_folder_starts_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --resume, the earlier run's model, statistics, evaluations, checkpoint and surplus Monitor CSVs go, so
    that evaluate reads this run's files (it had read the earlier run's normalisation)."""
    run = tmp_path / "run"
    common = ["train", "--env", "CartPole-v1", "--eval-episodes", "1", "--log-dir", str(run), "--no-progress",
              "--threads", "1", "--device", "cpu"]
    assert cli.main([*common, "--n-timesteps", "512", "--eval-freq", "256", "--checkpoint-every", "256",
                     "--set", "normalize=True"]) == 0  # the entry's 8 envs
    earlier = sorted(p.name for p in run.iterdir())
    assert {"best_model.zip", "evaluations.npz", "vecnormalize.pkl", "checkpoint.pt"} <= set(earlier)
    capsys.readouterr()
    assert cli.main([*common, "--n-timesteps", "256", "--eval-freq", "0", "--set", "n_envs=6",
                     "--set", "batch_size=64"]) == 0
    err = capsys.readouterr().err
    assert (f"warning: {run} held an earlier run; this run starts over and removed its model.zip, vecnormalize.pkl, "
            "best_model.zip, evaluations.npz, final_eval.json, checkpoint.pt, monitor/6.monitor.csv, monitor/7.monitor.csv"
            ) in err
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.yml", "final_eval.json", "model.zip",
                                                     "monitor", "tensorboard"]  # this run's checkpoint, at its end
    assert sorted(p.name for p in (run / "monitor").iterdir()) == [f"{i}.monitor.csv" for i in range(6)]
    assert cli.main(["evaluate", "--log-dir", str(run), "--episodes", "1"]) == 0  # no stale statistics to apply


def test_a_mistake_in_a_short_run_is_still_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The warning that a budget below --eval-freq runs no evaluation comes after the arguments are checked."""
    line = _error(["train", "--env", "CartPole-v1", "--n-timesteps", "64", "--set", "batch_size=abc",
                   "--log-dir", str(tmp_path / "run")], capsys)
    assert "batch_size" in line


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="unknown env id 'Nope-v0'"):
        cli.main(["--debug", "train", "--env", "Nope-v0"])
    with pytest.raises(ValueError, match="unknown env id 'Nope-v0'"):
        cli.main(["train", "--env", "Nope-v0", "--debug"])


def test_envpool_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sb3_ppo_scale.envs", None)  # import fails as if EnvPool were not installed
    config = zoo.load_config(None, "CartPole-v1", overrides={"vec_env": "envpool"})
    with pytest.raises(ValueError, match=r"pip install 'sb3-ppo-scale\[envpool\]'"):
        zoo.make_envs(config, seed=0)


def test_short_train_warns_records_threads_and_evaluate_best_explains(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert cli.main(["train", "--env", "CartPole-v1", "--n-timesteps", "256", "--eval-freq", "1000",
                     "--eval-episodes", "1", "--log-dir", str(run), "--no-progress", "--threads", "1",
                     "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "warning: --n-timesteps 256 < --eval-freq 1000: no evaluation will run" in err
    assert th.get_num_threads() == 1
    saved = yaml.safe_load((run / "config.yml").read_text())
    assert saved["threads"] == 1 and saved["vec_env"] == "dummy" and saved["eval_freq"] == 1000
    assert saved["n_timesteps"] == 256 and saved["hyperparams"]["n_timesteps"] == 256  # not the entry's 1e5
    assert not (run / "best_model.zip").exists() and (run / "model.zip").is_file()
    line = _error(["evaluate", "--log-dir", str(run), "--best", "--episodes", "1"], capsys)
    assert ("no best_model.zip in " in line and "training ran 256 steps with --eval-freq 1000, so no evaluation ran"
            in line and "drop --best" in line)
    assert "must be a run folder written by sb3-ppo-scale train" in _error(
        ["evaluate", "--log-dir", str(tmp_path / "missing")], capsys)
    assert "--episodes must be >= 1, got 0" in _error(["evaluate", "--log-dir", str(run), "--episodes", "0"], capsys)


#: a user's own env, as Gymnasium's ``make`` names it: the module that registers it, then its id
USER_ENV = "tests.user_envs:UserCartPole-v0"


def test_users_own_env_trains_and_evaluates_by_module_id(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``module:EnvId`` imports the module that registers the env, as ``gymnasium.make`` does; the entry is the
    user's config, named by the same id; the default run folder's name has the colon replaced."""
    config = tmp_path / "mine.yml"
    config.write_text(yaml.safe_dump({USER_ENV: {"policy": "MlpPolicy", "n_timesteps": 256, "n_steps": 64}}))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--env", USER_ENV, "--config", str(config), "--eval-freq", "1000", "--eval-episodes",
                     "1", "--no-progress", "--threads", "1", "--device", "cpu"]) == 0
    run = tmp_path / "logs" / "tests.user_envs_UserCartPole-v0_seed0"
    assert yaml.safe_load((run / "config.yml").read_text())["env_id"] == USER_ENV
    assert cli.main(["evaluate", "--log-dir", str(run), "--episodes", "1"]) == 0
    assert f'"env_id": "{USER_ENV}"' in capsys.readouterr().out


def test_path_part_makes_ids_file_names() -> None:
    assert [path_part(n) for n in ("ALE/Pong-v5", USER_ENV, "HalfCheetah-v5@cpu", 'a\\b*c?d"e<f>g|h')] == [
        "ALE_Pong-v5", "tests.user_envs_UserCartPole-v0", "HalfCheetah-v5@cpu", "a_b_c_d_e_f_g_h"]


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("tests.no_such_module:UserCartPole-v0", "env id 'tests.no_such_module:UserCartPole-v0': cannot import module "
                                                 "'tests.no_such_module', which should register 'UserCartPole-v0'"),
        ("tests.user_envs:Missing-v0",
         "unknown env id 'tests.user_envs:Missing-v0': Environment `Missing` doesn't exist"),
    ],
)
def test_module_env_id_mistakes_are_one_line(env_id: str, message: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    line = _error(["train", "--env", env_id, "--log-dir", str(tmp_path / "run")], capsys)
    assert line.startswith("sb3-ppo-scale train: error: ") and message in line, line
    assert not (tmp_path / "run").exists()


def test_tune_and_report_mistakes_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "spec file" in _error(["tune", str(tmp_path / "missing.yaml")], capsys)
    assert "SPEC_OR_STUDY" in _error(["report", str(tmp_path / "missing.journal"), "--out", str(tmp_path / "r")],
                                     capsys)
    assert "--threads must be an int >= 1" in _error(["tune", str(tmp_path / "missing.yaml"), "--threads", "0"], capsys)
