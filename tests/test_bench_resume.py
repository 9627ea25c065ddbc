"""bench runs survive an interruption: a run stopped by SIGTERM after its first checkpoint and resumed writes the
run JSON of the uninterrupted run (clocks and ``resumed_at`` aside), in-process and through a real ``bench`` process
signalled from outside; and bench evaluates entries on EnvPool on Gymnasium's envs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_ppo_scale.checkpoint import PREEMPTED_EXIT_CODE, TrainingPreempted, atomic_write
from sb3_ppo_scale.experiments import bench, bench_resume, zoo
from tests.helpers import ROOT, import_envpool, wait_for

TINY = {"policy": "MlpPolicy", "n_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 2, "n_timesteps": 1000,
        "policy_kwargs": "dict(net_arch=[16])"}
#: entries of a few seconds each: discrete actions; continuous with VecNormalize; sb3-contrib's masking and LSTM
CONFIG = {"CartPole-v1": TINY, "Pendulum-v1": {**TINY, "normalize": True},
          "InvalidActionEnvDiscrete-v0": TINY,
          "CartPoleNoVel-v1": {**TINY, "policy": "MlpLstmPolicy",
                               "policy_kwargs": "dict(net_arch=[16], lstm_hidden_size=16)"}}
BUDGET, EVAL_EVERY, EPISODES = 1024, 256, 2  # rollouts of 128 env steps
CLOCKS = ("train_s", "cpu_s", "steps_per_s", "box", "resumed_at")  # what may differ between two runs of the same


def write_config(folder: Path, entries: dict[str, Any]) -> str:
    path = folder / "config.yml"
    path.write_text(yaml.safe_dump(entries))
    return str(path)


def run(task: str, label: str, config: str, out: Path, checkpoint: Path | None, every: int = 384) -> dict[str, Any]:
    bench.run_one(task, label, 0, BUDGET, EVAL_EVERY, EPISODES, 3, config, str(out), 1,
                  None if checkpoint is None else str(checkpoint), every)
    return json.loads(out.read_text())


def without_clocks(result: dict[str, Any]) -> dict[str, Any]:
    curve = [{k: v for k, v in point.items() if k not in ("train_s", "cpu_s")} for point in result["curve"]]
    return {**{k: v for k, v in result.items() if k not in CLOCKS}, "curve": curve}


class InterruptAfterFirstCheckpoint(bench_resume.RunCheckpoint):
    """Sends this process SIGTERM at the start of the first rollout after its first checkpoint: with checkpoints
    every 384 env steps, at 512 (a boundary with an evaluation due, not checkpointed before the signal)."""

    def _on_rollout_start(self) -> None:
        super()._on_rollout_start()
        if self.written and self.model.num_timesteps > self.written[0] and not self.stop_requested:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize(("task", "label"), [("CartPole-v1", "scalable_ppo@plain"), ("CartPole-v1", "sb3_ppo"),
                                             ("Pendulum-v1", "sb3_ppo"), ("Pendulum-v1", "scalable_ppo@plain"),
                                             ("InvalidActionEnvDiscrete-v0", "maskable_ppo")])
def test_an_interrupted_run_resumes_to_the_run_json_of_the_uninterrupted_run(task: str, label: str, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(tmp_path, CONFIG)
    reference = run(task, label, config, tmp_path / "reference.json", None)  # no checkpoints at all
    checkpoint, out = tmp_path / "checkpoints" / "run.pt", tmp_path / "run.json"
    monkeypatch.setattr(bench, "RunCheckpoint", InterruptAfterFirstCheckpoint)
    with pytest.raises(TrainingPreempted) as stopped:
        run(task, label, config, out, checkpoint)
    at = stopped.value.num_timesteps
    assert at == 512 and not out.exists()  # a checkpoint at 384, then the signal in the rollout from 512
    assert sorted(bench_resume.read_sidecar(checkpoint)["timer_at"]) == [384, 512]  # this one's and the one before
    monkeypatch.setattr(bench, "RunCheckpoint", bench_resume.RunCheckpoint)
    resumed = run(task, label, config, out, checkpoint)
    assert without_clocks(resumed) == without_clocks(reference)  # every evaluation's return, length, distance, steps
    assert [p["steps"] for p in resumed["curve"]] == [0, 256, 512, 768, 1024]  # the last: the final evaluation
    assert resumed["resumed_at"] == [at] and reference["resumed_at"] == []
    assert sorted(resumed) == sorted(reference) and resumed["box"]["workers"] == 1  # the box where it started
    clocks = [p["train_s"] for p in resumed["curve"]]
    assert clocks == sorted(clocks) and clocks[-1] == resumed["train_s"]  # continued from the checkpoint's totals
    assert not checkpoint.exists() and not bench_resume.sidecar_path(checkpoint).exists()


def test_a_checkpoint_whose_sidecar_does_not_match_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(tmp_path, CONFIG)
    checkpoint, out = tmp_path / "checkpoints" / "run.pt", tmp_path / "run.json"
    monkeypatch.setattr(bench, "RunCheckpoint", InterruptAfterFirstCheckpoint)
    with pytest.raises(TrainingPreempted):
        run("CartPole-v1", "sb3_ppo", config, out, checkpoint)
    sidecar = bench_resume.read_sidecar(checkpoint)
    atomic_write({**sidecar, "timer_at": {384: sidecar["timer_at"][384]}}, bench_resume.sidecar_path(checkpoint))
    with pytest.raises(ValueError, match=r"holds no evaluations for the 512 env steps of .*run\.pt \(it has \[384\]\)"):
        run("CartPole-v1", "sb3_ppo", config, out, checkpoint)
    bench_resume.sidecar_path(checkpoint).unlink()
    with pytest.raises(FileNotFoundError, match=r"has no run\.evaluations\.pt beside it"):
        run("CartPole-v1", "sb3_ppo", config, out, checkpoint)


def test_recurrent_ppo_runs_without_checkpoints(tmp_path: Path) -> None:
    """sb3-contrib's RecurrentPPO leaves its LSTM states out of its checkpoint: its runs take none."""
    config = write_config(tmp_path, CONFIG)
    checkpoint = tmp_path / "checkpoints" / "run.pt"
    result = run("CartPoleNoVel-v1", "recurrent_ppo", config, tmp_path / "run.json", checkpoint, every=64)
    assert result["steps"] == BUDGET and not checkpoint.parent.exists()
    assert set(bench_resume.UNCHECKPOINTED) == {"recurrent_ppo"}  # ScalableRecurrentPPO carries its LSTM states


def test_bench_resumes_a_checkpoint_only_for_the_same_command(tmp_path: Path) -> None:
    args = bench.build_parser().parse_args(["--tasks", "CartPole-v1", "--algos", "sb3_ppo", "--seeds", "0", "--budget",
                                            "2048", "--out", str(tmp_path)])
    checkpoint = tmp_path / "checkpoints" / "CartPole-v1__sb3_ppo__seed0.pt"
    config, dropped = bench._config_for(zoo.load_config(None, "CartPole-v1", algo="scalable_ppo"), "sb3_ppo")
    settings = {"budget": 2048, "eval_every": args.eval_every, "eval_episodes": args.eval_episodes,
                "final_episodes": args.final_episodes, "hyperparams": bench.recorded_hyperparams(config, dropped)}
    atomic_write({"run": {"settings": settings}, "timer_at": {}}, bench_resume.sidecar_path(checkpoint))
    checkpoint.write_bytes(b"")
    assert [job[10:] for job in bench._jobs(args, tmp_path)] == [(str(checkpoint), bench.DEFAULT_CHECKPOINT_EVERY)]
    args.budget = 4096
    with pytest.raises(ValueError, match=r"CartPole-v1__sb3_ppo__seed0\.pt holds an interrupted run with --budget "
                                         r"2048 \(this command: 4096\)"):
        bench._jobs(args, tmp_path)
    args.checkpoint_every = 0  # no checkpoints: none is read either
    assert [job[10:] for job in bench._jobs(args, tmp_path)] == [(None, 0)]
    args.checkpoint_every = -1
    with pytest.raises(ValueError, match="--checkpoint-every must be >= 0 env steps"):
        bench.check_arguments(args)


def test_sigterm_to_bench_leaves_a_checkpoint_and_the_same_command_completes_the_run(tmp_path: Path) -> None:
    """SIGTERM to the bench process alone (not its worker): bench sends it on, the worker's run writes its
    checkpoint, bench exits with code 75; the same command resumes the run and writes the uninterrupted run's JSON."""
    config = write_config(tmp_path, CONFIG)
    budget = 8 * BUDGET
    command = [sys.executable, "-m", "sb3_ppo_scale.experiments.bench", "--tasks", "CartPole-v1", "--algos", "sb3_ppo",
               "--seeds", "0", "--budget", str(budget), "--eval-every", "2048", "--eval-episodes", "2",
               "--final-episodes", "2", "--checkpoint-every", "256", "--config", config, "--out", str(tmp_path / "out")]
    checkpoint = tmp_path / "out" / "checkpoints" / "CartPole-v1__sb3_ppo__seed0.pt"
    process = subprocess.Popen(command, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_for(checkpoint.exists, "the run's first checkpoint", process, timeout_s=120, poll_s=0.05)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == PREEMPTED_EXIT_CODE, output
    assert "stopped CartPole-v1 sb3_ppo seed 0: stopped by SIGTERM; checkpoint" in output
    assert checkpoint.exists() and not list((tmp_path / "out" / "runs").glob("*.json"))
    finished = subprocess.run(command, cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "1 runs to do (1 resumed from their checkpoints)" in finished.stdout
    result = json.loads((tmp_path / "out" / "runs" / "CartPole-v1__sb3_ppo__seed0.json").read_text())
    assert len(result["resumed_at"]) == 1 and 256 <= result["resumed_at"][0] < budget
    assert not checkpoint.parent.exists()  # the run's checkpoint and sidecar deleted, then their empty folder
    reference = tmp_path / "reference.json"
    bench.run_one("CartPole-v1", "sb3_ppo", 0, budget, 2048, 2, 2, config, str(reference), 1, None)
    assert without_clocks(result) == without_clocks(json.loads(reference.read_text()))


def test_an_envpool_entry_is_evaluated_on_gymnasium_envs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """EnvPool's envs take no wrappers: bench evaluates on Gymnasium's Hopper-v5 (with the forward distance) with the
    training env's VecNormalize statistics; the observation layouts agree."""
    import_envpool()
    from sb3_ppo_scale import cli

    # env_kwargs are EnvPool's options: the Gymnasium evaluation envs do not get them
    entry = {**TINY, "vec_env": "envpool", "normalize": True, "n_epochs": 1, "env_kwargs": {"num_threads": 1}}
    config = write_config(tmp_path, {"Hopper-v5@envpool": entry})
    code = cli.main(["bench", "--tasks", "Hopper-v5", "--algos", "scalable_ppo@envpool", "--no-pairs", "--seeds", "0",
                     "--budget", "512", "--eval-every", "256", "--eval-episodes", "2", "--final-episodes", "2",
                     "--baseline", "scalable_ppo@envpool", "--config", config, "--out", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr()
    result = json.loads((tmp_path / "out" / "runs" / "Hopper-v5__scalable_ppo@envpool__seed0.json").read_text())
    assert [p["steps"] for p in result["curve"]] == [0, 256, 512] and result["steps"] == 512
    assert all(p["length"] >= 1 and isinstance(p["forward_distance"], float) for p in result["curve"])


def test_atari_on_envpool_is_evaluated_with_the_preprocessing_envpool_reproduces() -> None:
    import_envpool()
    config = zoo.load_config(None, "BreakoutNoFrameskip-v4", "envpool")
    train = zoo.make_envs(config, n_envs=1, seed=0)
    evaluation = bench.evaluation_envs(config, 2, 0)
    assert evaluation.observation_space == train.observation_space  # uint8 (4, 84, 84)
    bench.check_same_observations(train, evaluation, config)
    raw = zoo.make_envs(config, n_envs=1, seed=0, vec_env_cls=DummyVecEnv)  # Gymnasium's, no Atari preprocessing
    with pytest.raises(ValueError, match=r"entry 'atari@envpool' \(vec_env envpool\): the evaluation env's "
                                         r"observations \(Box\(0, 255, \(3, 210, 160\), uint8\)\) are not laid out"):
        bench.check_same_observations(train, raw, config)
