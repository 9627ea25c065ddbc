"""The train / evaluate / bench commands and the rl_zoo3 route."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml
from stable_baselines3.common.vec_env import VecNormalize

from sb3_ppo_scale import ScalablePPO, cli
from sb3_ppo_scale.experiments import bench as bench_module, commands as experiment, learning_report, rl_zoo as zoo_main
from sb3_ppo_scale.experiments import zoo
from sb3_ppo_scale.experiments.pipeline import EVAL_SEED_OFFSET, Evaluation, PeriodicEvalCallback

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def test_train_writes_model_logs_and_evaluate_loads_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _run(["train", "--env", "CartPole-v1", "--n-timesteps", "3000", "--seed", "3", "--log-dir", str(run),
          "--eval-freq", "1024", "--eval-episodes", "2", "--no-progress", "--device", "cpu"], capsys)
    for name in ("model.zip", "best_model.zip", "config.yml", "evaluations.npz", "final_eval.json"):
        assert (run / name).is_file(), name
    assert list((run / "tensorboard").rglob("events.out.tfevents.*"))
    assert len(list((run / "monitor").glob("*.monitor.csv"))) == 8  # the entry's n_envs
    saved = yaml.safe_load((run / "config.yml").read_text())
    assert saved["entry"] == "CartPole-v1" and saved["seed"] == 3 and saved["n_timesteps"] == 3000
    evaluations = np.load(run / "evaluations.npz")
    assert evaluations["results"].shape[1] == 2 and evaluations["timesteps"][0] == 1024
    model = ScalablePPO.load(run / "model.zip", device="cpu")
    assert model.num_timesteps >= 3000 and model.n_envs == 8 and model.batch_size == 256

    out = _run(["evaluate", "--log-dir", str(run), "--episodes", "3", "--seed", "7", "--device", "cpu"], capsys)
    first = json.loads(out.strip().splitlines()[-1])
    assert first["episodes"] == 3 and first["deterministic"] and first["mean_return"] >= 50
    # 3000 steps train this seed to 64; a uniformly random CartPole policy averages ~22 per episode
    again = json.loads(_run(["evaluate", "--log-dir", str(run), "--episodes", "3", "--seed", "7"],
                            capsys).strip().splitlines()[-1])
    assert again["mean_return"] == first["mean_return"]  # same seed, deterministic policy: same episodes
    assert cli.main(["evaluate", "--log-dir", str(tmp_path / "missing")]) == 2  # a user's mistake: one line, exit 2
    assert "run folder" in capsys.readouterr().err


def test_train_with_normalize_saves_and_reloads_statistics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "norm"
    _run(["train", "--env", "Pendulum-v1", "--set", "normalize=true", "--set", "n_envs=2", "--set", "n_steps=256",
          "--n-timesteps", "1024", "--log-dir", str(run), "--eval-freq", "0", "--eval-episodes", "1",
          "--no-progress"], capsys)
    assert (run / "vecnormalize.pkl").is_file() and not (run / "evaluations.npz").exists()
    saved = VecNormalize.load(str(run / "vecnormalize.pkl"), zoo.make_envs(
        zoo.load_config(None, "Pendulum-v1", None, {"normalize": True}), n_envs=1).venv)
    assert saved.obs_rms.count > 1000 and saved.gamma == pytest.approx(0.9)  # the entry's gamma
    config = zoo.config_from_hyperparams("Pendulum-v1", "Pendulum-v1",
                                         yaml.safe_load((run / "config.yml").read_text())["hyperparams"])
    env = zoo.make_envs(config, n_envs=1, eval_env=True, normalize_stats=run / "vecnormalize.pkl")
    assert isinstance(env, VecNormalize) and not env.training and not env.norm_reward
    np.testing.assert_array_equal(env.obs_rms.mean, saved.obs_rms.mean)
    result = json.loads((run / "final_eval.json").read_text())
    assert result["mean_length"] == 200 and -2000 < result["mean_return"] < 0


def test_periodic_eval_callback_records_with_frozen_statistics(tmp_path: Path) -> None:
    config = zoo.load_config(None, "Pendulum-v1", None, {"normalize": True, "n_envs": 2, "n_steps": 64})
    env = zoo.make_envs(config, seed=0)
    eval_env = zoo.make_envs(config, n_envs=1, seed=EVAL_SEED_OFFSET, eval_env=True)
    seen: list[Evaluation] = []
    callback = PeriodicEvalCallback(eval_env, eval_freq=128, n_episodes=2, on_eval=seen.append, save_dir=tmp_path)
    model = zoo.build_model(config, env, seed=0, device="cpu")
    model.learn(total_timesteps=300, callback=callback)
    # every 128 steps (counted over both envs), plus once after training (the last rollout ends at 384 steps)
    assert [e.timesteps for e in callback.evaluations] == [128, 256, 384] and seen == callback.evaluations
    assert all(e.mean_length == 200 and -2000 < e.mean_return < 0 for e in callback.evaluations)
    assert callback.returns == [e.mean_return for e in callback.evaluations]
    assert all(0 < a.train_s <= b.train_s for a, b in zip(callback.evaluations, callback.evaluations[1:]))
    assert not eval_env.training and not eval_env.norm_reward  # statistics frozen, returns unnormalised
    np.testing.assert_array_equal(eval_env.obs_rms.mean, env.obs_rms.mean)  # copied before the last evaluation
    saved = np.load(tmp_path / "evaluations.npz")
    assert saved["timesteps"].tolist() == [128, 256, 384] and saved["results"].shape == (3, 2)
    assert (tmp_path / "best_model.zip").is_file()
    again = PeriodicEvalCallback(eval_env, eval_freq=128, n_episodes=2)
    again.init_callback(model)
    eval_env.seed(EVAL_SEED_OFFSET)
    first = again.evaluate().mean_return
    eval_env.seed(EVAL_SEED_OFFSET)
    assert again.evaluate().mean_return == first  # deterministic actions, same episodes
    with pytest.raises(ValueError, match="eval_freq and n_episodes must be >= 1"):
        PeriodicEvalCallback(eval_env, eval_freq=0)


def test_rl_zoo3_route_trains_cartpole(tmp_path: Path) -> None:
    logs = tmp_path / "zoo"
    subprocess.run([sys.executable, "-m", "sb3_ppo_scale.experiments.rl_zoo", "--algo", "scalable_ppo", "--env", "CartPole-v1",
                    "-conf", str(zoo.DEFAULT_CONFIG), "-n", "2000", "-f", str(logs),
                    "--eval-freq", "-1", "--seed", "1"], check=True, capture_output=True, text=True, timeout=300)
    model_file = logs / "scalable_ppo" / "CartPole-v1_1" / "CartPole-v1.zip"
    model = ScalablePPO.load(model_file, device="cpu")
    assert model.num_timesteps >= 2000 and model.n_epochs == 20 and model.gae_lambda == pytest.approx(0.8)
    zoo_config = yaml.safe_load((model_file.parent / "CartPole-v1" / "config.yml").read_text().replace(
        "!!python/object/apply:collections.OrderedDict", ""))
    assert zoo_config  # rl_zoo3 wrote its record of the hyperparameters


def test_rl_zoo3_route_checks_the_entry_before_the_zoo_evals_it(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump({"CartPole-v1": {"policy": "MlpPolicy", "n_timesteps": 100,
                                                   "policy_kwargs": f"__import__('os').system('touch {marker}')"}}))
    with pytest.raises(ValueError, match="unsupported expression"):
        zoo_main.prepare_argv(["--algo", "scalable_ppo", "--env", "CartPole-v1", "-conf", str(bad)])
    assert not marker.exists()
    with pytest.raises(ValueError, match="Python configs run code"):
        zoo_main.prepare_argv(["--algo", "scalable_ppo", "--env", "CartPole-v1", "-conf", "evil.py"])
    with pytest.raises(ValueError, match="'HalfCheetah-v5@gpu_kl' is KL-adaptive.*sb3-ppo-scale train"):
        zoo_main.prepare_argv(["--algo", "scalable_ppo", "--env", "HalfCheetah-v5", "--variant", "gpu_kl"])
    argv = zoo_main.prepare_argv(["--algo", "scalable_ppo", "--env", "Hopper-v5", "--variant", "cpu", "-n", "5"])
    assert "--variant" not in argv and argv[:4] == ["--algo", "scalable_ppo", "--env", "Hopper-v5"]
    written = zoo.read_entries(argv[argv.index("-conf") + 1])
    assert written == {"Hopper-v5": zoo.read_entries(zoo.DEFAULT_CONFIG)["Hopper-v5@cpu"]}
    zoo_main._remove_temporary_config(argv)
    assert not Path(argv[argv.index("-conf") + 1]).exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--algo", "scalable_ppo", "--env", "CartPole-v1-typo"], "unknown env id 'CartPole-v1-typo'"),
    (["--algo", "scalable_ppo", "--env", "CartPole-v1", "--variant", "nope"], "no entry 'CartPole-v1@nope'"),
    (["--algo", "scalable_maskable_ppo", "--env", "InvalidActionEnvDiscrete-v0"], "is not available through rl_zoo3"),
])
def test_rl_zoo3_route_mistakes_are_one_line(argv: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert zoo_main.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m sb3_ppo_scale.experiments.rl_zoo: error: ")
    assert message in err[0]


def test_optuna_sampler_keeps_minibatches_inside_the_rollout() -> None:
    zoo_main.register_algorithm()
    from rl_zoo3 import hyperparams_opt, utils

    assert utils.ALGOS["scalable_ppo"] is ScalablePPO
    assert hyperparams_opt.HYPERPARAMS_SAMPLER["scalable_ppo"] is zoo_main.sample_scalable_ppo_params
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(30):
        params = zoo_main.sample_scalable_ppo_params(study.ask(), n_actions=1, n_envs=4, additional_args={})
        assert 32 <= params["batch_size"] <= min(65536, params["n_steps"] * 4)
        zoo.check_keys(params, "sampled", "optuna")  # every sampled key is a ScalablePPO argument


def test_bench_statistics_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    curve = [{"steps": 0, "train_s": 0.0, "cpu_s": 0.0, "return": 0.0},
             {"steps": 10, "train_s": 4.0, "cpu_s": 3.0, "return": 50.0},
             {"steps": 20, "train_s": 9.0, "cpu_s": 7.0, "return": 100.0}]
    assert learning_report.time_to_threshold(curve, 50.0) == 4.0
    assert learning_report.time_to_threshold(curve, 101.0) == float("inf")
    runs = tmp_path / "runs"
    runs.mkdir()
    for algo, scale in (("sb3_ppo", 2.0), ("scalable_ppo", 1.0)):
        for seed in (0, 1):
            timed = [{**p, "train_s": p["train_s"] * scale, "cpu_s": p["cpu_s"] * scale} for p in curve]
            (runs / f"T__{algo}__seed{seed}.json").write_text(json.dumps({
                "task": "T", "algo": algo, "seed": seed, "budget": 20, "entry": "T", "steps": 20,
                "train_s": timed[-1]["train_s"], "cpu_s": timed[-1]["cpu_s"], "final_return": 100.0,
                "steps_per_s": 20 / timed[-1]["train_s"], "curve": timed}))
    out = _run(["bench", "--tasks", "T", "--out", str(tmp_path), "--report-only"], capsys)
    assert ("T, scalable_ppo: time to threshold 2.00x, training time 2.00x, CPU time 2.00x, steps/s 2.00x, "
            "final return 100 against sb3_ppo's 100 (1.00x)") in out
    assert (tmp_path / "learning_summary.md").is_file() and (tmp_path / "learning_T.png").stat().st_size > 1000
    assert "| T | n/a | n/a | left out: Gymnasium cannot make it, so it has no random-policy score |" in out
    assert "- scalable_ppo over sb3_ppo (T; 2 against 2 seeds): 0.50 [0.50, 0.50]" in out  # equal final returns


def test_bench_report_without_baseline_runs_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    curve = [{"steps": 0, "train_s": 0.0, "cpu_s": 0.0, "return": 0.0},
             {"steps": 10, "train_s": 4.0, "cpu_s": 3.0, "return": 50.0}]
    (runs / "T__scalable_ppo_gpu__seed0.json").write_text(json.dumps({
        "task": "T", "algo": "scalable_ppo_gpu", "seed": 0, "budget": 10, "entry": "T@gpu", "steps": 10,
        "train_s": 4.0, "cpu_s": 3.0, "final_return": 50.0, "steps_per_s": 2.5, "curve": curve}))
    out = _run(["bench", "--tasks", "T", "--out", str(tmp_path), "--report-only"], capsys)
    assert "| n/a (no baseline runs) | n/a |" in out and "nan" not in out
    assert "T, scalable_ppo_gpu: no sb3_ppo runs to compare with" in out


def test_bench_skips_a_finished_run_only_for_the_same_command(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A finished run is reused when budget, evaluation settings and the entry's hyperparameters are the ones asked
    for; otherwise bench names the difference (it had reported the old run as the new command's)."""
    args = bench_module.build_parser().parse_args(["--tasks", "CartPole-v1", "--algos", "scalable_ppo", "--no-pairs",
                                                   "--seeds", "0", "--budget", "2048", "--out", str(tmp_path)])
    config, dropped = bench_module._config_for(zoo.load_config(None, "CartPole-v1", algo="scalable_ppo"),
                                               "scalable_ppo")
    finished = {"budget": 2048, "eval_every": args.eval_every, "eval_episodes": args.eval_episodes,
                "final_episodes": args.final_episodes, "hyperparams": bench_module.recorded_hyperparams(config, dropped)}
    path = tmp_path / "runs" / "CartPole-v1__scalable_ppo__seed0.json"
    path.parent.mkdir()
    path.write_text(json.dumps(finished))
    assert bench_module._jobs(args, tmp_path) == []  # the same run: skipped
    args.budget = 4096
    with pytest.raises(ValueError, match=r"holds a finished run with --budget 2048 \(this command: 4096\)"):
        bench_module._jobs(args, tmp_path)
    args.budget = 2048
    path.write_text(json.dumps({**finished, "hyperparams": {**finished["hyperparams"], "n_envs": 99}}))
    with pytest.raises(ValueError, match="other hyperparameters than entry 'CartPole-v1@cpu'"):  # the label's entry
        bench_module._jobs(args, tmp_path)


@pytest.mark.parametrize(("argv", "message"), [
    (["--report-only"], "--report-only: no runs in "),
    (["--config", "missing.yml"], "No such file or directory: 'missing.yml'"),
    (["--eval-every", "0"], "--eval-every must be >= 1, got 0"),
    (["--threshold-frac", "-0.5"], "--threshold-frac must be > 0, got -0.5"),
    (["--seeds", "0", "-2"], "argument --seeds: must be an int >= 0, got '-2'"),
])
def test_bench_mistakes_are_one_line_errors(argv: list[str], message: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = cli.main(["bench", "--tasks", "CartPole-v1", "--out", str(tmp_path / "out"), *argv])
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sb3-ppo-scale bench: error: ") and message in lines[0]
    assert not (tmp_path / "out").exists()
