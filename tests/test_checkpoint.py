"""Exact resume from checkpoints (sb3_ppo_scale.checkpoint): a run preempted in rollout k+1 and resumed from its
checkpoint ends bit-identical to an uninterrupted run; atomic writes; non-finite parameters refused; a real
``sb3-ppo-scale train`` subprocess stopped by SIGTERM exits with PREEMPTED_EXIT_CODE and its resume completes the
budget in the same TensorBoard run without a gap or a restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from gymnasium.envs.classic_control import PendulumEnv
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    SubprocVecEnv,
    VecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
)

from sb3_ppo_scale import PrioritizedRolloutBuffer, ScalablePPO
from sb3_ppo_scale.envs import EpisodeState
from sb3_ppo_scale.checkpoint import (
    PREEMPTED_EXIT_CODE,
    NonFiniteCheckpointError,
    ResumableCheckpoint,
    TrainingPreempted,
    learn_resumable,
    load_checkpoint,
    read_checkpoint,
    resume_notes,
    save_checkpoint,
)
from tests.helpers import assert_identical, import_envpool

EPISODE = 16  #: FixedLengthEnv's episode length: rollouts of N_STEPS end exactly at episode ends
N_STEPS, N_ENVS = 2 * EPISODE, 2
ROLLOUT = N_STEPS * N_ENVS
TOTAL = 6 * ROLLOUT
#: the interruption falls inside rollout STOP_ROLLOUT + 1; the checkpoint is then the state after STOP_ROLLOUT updates
STOP_ROLLOUT = 3


class FixedLengthEnv(gym.Env):
    """Episodes of exactly :data:`EPISODE` steps (truncated); a fixed reset observation; every step adds noise from
    the env's ``np_random``, so an exact resume needs each env's RNG restored."""

    observation_space = spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t, self.x = 0, np.array([0.5, -0.5, 0.0], dtype=np.float32)
        return self.x.copy(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        noise = self.np_random.normal(0.0, 0.1, size=3).astype(np.float32)
        drive = np.array([action[0], action[1], action[0] * action[1]], dtype=np.float32)
        self.x = np.clip(0.9 * self.x + 0.5 * drive + noise, -10, 10).astype(np.float32)
        return self.x.copy(), float(-np.sum(self.x**2)), False, self.t >= EPISODE, {}


def make_env(normalize: bool = False) -> VecEnv:
    env = make_vec_env(FixedLengthEnv, n_envs=N_ENVS, seed=3)
    return VecNormalize(env, gamma=0.9) if normalize else env


CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "vec_normalize": {"normalize": True},
    "lr_schedule": {"learning_rate": lambda progress: 1e-3 * progress, "clip_range": lambda progress: 0.1 + 0.1 * progress},
    "kl_penalty": {"objective": "kl_penalty", "kl_coef": 0.5},
    "prioritized": {"rollout_buffer_class": PrioritizedRolloutBuffer,
                    "rollout_buffer_kwargs": {"priority": "reward", "capacity": 2 * ROLLOUT, "high_fraction": 0.5}},
    "gsde": {"use_sde": True, "sde_sample_freq": 8},
    "recipe_terms": {"normalize_value": True, "mean_bound_coef": 0.01, "clip_range_vf": 0.2},
}


def make_model(case: str) -> ScalablePPO:
    kwargs = dict(CASES[case])
    env = make_env(kwargs.pop("normalize", False))
    return ScalablePPO("MlpPolicy", env, n_steps=N_STEPS, batch_size=32, n_epochs=2, seed=1, device="cpu",
                       policy_kwargs={"net_arch": [16]}, **kwargs)


class StopAt(BaseCallback):
    """Delivers SIGTERM to ``checkpoint`` (its handler, as the signal would) once ``num_timesteps`` reaches ``at``."""

    def __init__(self, checkpoint: ResumableCheckpoint, at: int) -> None:
        super().__init__()
        self.checkpoint, self.at = checkpoint, at

    def _on_step(self) -> bool:
        if self.num_timesteps == self.at:
            self.checkpoint._handle(signal.SIGTERM, None)
        return True


def preempt_and_resume(case: str, path: Path) -> ScalablePPO:
    """Train, preempted in the middle of rollout STOP_ROLLOUT + 1, then resume from the checkpoint to the end."""
    model = make_model(case)
    checkpoint = ResumableCheckpoint(path, every_steps=ROLLOUT, signals=())
    with pytest.raises(TrainingPreempted) as stopped:
        learn_resumable(model, TOTAL, checkpoint, callback=StopAt(checkpoint, STOP_ROLLOUT * ROLLOUT + 10))
    assert stopped.value.code == PREEMPTED_EXIT_CODE
    assert stopped.value.num_timesteps == STOP_ROLLOUT * ROLLOUT
    assert read_checkpoint(path)["counters"]["num_timesteps"] == STOP_ROLLOUT * ROLLOUT
    del model
    resumed = ScalablePPO.load_checkpoint(path, make_env(CASES[case].get("normalize", False)), device="cpu")
    assert resume_notes(resumed) == []  # every env at an episode start, env RNGs readable: exact
    assert resumed.num_timesteps == STOP_ROLLOUT * ROLLOUT
    learn_resumable(resumed, None, ResumableCheckpoint(path, signals=()))
    return resumed


@pytest.mark.parametrize("case", list(CASES))
def test_preempted_and_resumed_run_is_bit_identical(case: str, tmp_path: Path) -> None:
    reference = make_model(case)
    reference.learn(TOTAL)
    resumed = preempt_and_resume(case, tmp_path / "checkpoint.pt")
    assert_identical(reference, resumed)  # every parameter and Adam state tensor, torch.equal
    for name in ("num_timesteps", "_n_updates", "_n_grad_steps", "_total_timesteps", "kl_beta"):
        assert getattr(resumed, name) == getattr(reference, name), name
    assert resumed.num_timesteps == TOTAL
    assert [info["r"] for info in resumed.ep_info_buffer] == [info["r"] for info in reference.ep_info_buffer]
    if case == "vec_normalize":
        for name in ("mean", "var", "count"):
            assert np.array_equal(getattr(resumed.get_vec_normalize_env().obs_rms, name),
                                  getattr(reference.get_vec_normalize_env().obs_rms, name))
    if case == "prioritized":
        assert resumed.rollout_buffer.n_retained == reference.rollout_buffer.n_retained > 0
    if case == "lr_schedule":
        lr = resumed.policy.optimizer.param_groups[0]["lr"]
        assert lr == reference.policy.optimizer.param_groups[0]["lr"] < 1e-3


def test_without_env_rng_the_resume_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: the env noise matters, so restoring each env's np_random is what makes the resume exact."""
    import sb3_ppo_scale.checkpoint as checkpoint_module

    reference = make_model("plain")
    reference.learn(TOTAL)
    monkeypatch.setattr(checkpoint_module, "set_env_rng_states", lambda env, states: None)
    resumed = preempt_and_resume("plain", tmp_path / "checkpoint.pt")
    assert not th.equal(th.cat([p.flatten() for p in reference.policy.parameters()]),
                        th.cat([p.flatten() for p in resumed.policy.parameters()]))


def test_gsde_noise_is_put_back_at_the_first_rollout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: SB3 resamples gSDE's exploration matrix before the first resumed rollout; without putting
    the checkpoint's matrix and RNG back at that rollout's start the resume differs."""
    import sb3_ppo_scale.checkpoint as checkpoint_module

    reference = make_model("gsde")
    reference.learn(TOTAL)
    monkeypatch.setattr(checkpoint_module, "_reapply_resume", lambda model: None)
    resumed = preempt_and_resume("gsde", tmp_path / "checkpoint.pt")
    assert not th.equal(th.cat([p.flatten() for p in reference.policy.parameters()]),
                        th.cat([p.flatten() for p in resumed.policy.parameters()]))


def test_mid_episode_resume_is_reported(tmp_path: Path) -> None:
    """A checkpoint taken with episodes in progress resumes with new episodes, and says so."""
    model = ScalablePPO("MlpPolicy", make_env(), n_steps=EPISODE // 2 + 1, batch_size=18, n_epochs=1, seed=0,
                        device="cpu", policy_kwargs={"net_arch": [8]})
    model.learn(2 * model.n_steps * N_ENVS)
    path = save_checkpoint(model, tmp_path / "mid.pt")
    resumed = load_checkpoint(path, make_env(), device="cpu")
    assert resume_notes(resumed) == [f"{N_ENVS} env(s) restart their episode (mid-episode at the checkpoint, or a "
                                     "random reset; episodes in progress not restored: test_checkpoint.FixedLengthEnv "
                                     "is not a layer whose episode state is known)"]
    assert resumed._last_episode_starts.all()


class CopyFirstCheckpoint(BaseCallback):
    """Keeps a copy of the first checkpoint written (what a run killed later with SIGKILL would resume from)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path, self.copy = path, path.with_name("first.pt")

    def _on_step(self) -> bool:
        if self.path.exists() and not self.copy.exists():
            self.copy.write_bytes(self.path.read_bytes())
        return True


def test_resume_from_an_older_checkpoint_drops_the_later_tensorboard_events(tmp_path: Path) -> None:
    """A run that went on after its checkpoint (then died, SIGKILL-style) and is resumed from it: TensorBoard keeps
    one point per step, the resumed run's, with no duplicate and no gap."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = ScalablePPO("MlpPolicy", make_env(), n_steps=N_STEPS, batch_size=32, n_epochs=1, seed=0, device="cpu",
                        tensorboard_log=str(tmp_path / "tb"), policy_kwargs={"net_arch": [8]})
    path = tmp_path / "checkpoint.pt"
    copier = CopyFirstCheckpoint(path)
    learn_resumable(model, TOTAL, ResumableCheckpoint(path, every_steps=2 * ROLLOUT, signals=()), callback=copier,
                    tb_log_name="run")
    resumed = load_checkpoint(copier.copy, make_env(), device="cpu")
    assert resumed.num_timesteps == 2 * ROLLOUT
    learn_resumable(resumed, None, ResumableCheckpoint(path, signals=()), tb_log_name="run")
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["run_1"]
    events = EventAccumulator(str(tmp_path / "tb" / "run_1"))
    events.Reload()
    assert [e.step for e in events.Scalars("time/fps")] == list(range(ROLLOUT, TOTAL + 1, ROLLOUT))
    assert [e.step for e in events.Scalars("train/loss")] == list(range(2 * ROLLOUT, TOTAL + 1, ROLLOUT))


def test_only_rank_0_writes_tensorboard_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun (RANK=1 before learn() builds the group) a resumed rank other than 0 gets a silent logger:
    a TensorBoard writer there would add a purge event that hides rank 0's resumed curves."""
    import sb3_ppo_scale.checkpoint as checkpoint_module

    model = ScalablePPO("MlpPolicy", make_env(), n_steps=N_STEPS, batch_size=32, n_epochs=1, seed=0, device="cpu",
                        tensorboard_log=str(tmp_path / "tb"), policy_kwargs={"net_arch": [8]})
    model.learn(ROLLOUT, tb_log_name="run")
    path = save_checkpoint(model, tmp_path / "checkpoint.pt")
    resumed = load_checkpoint(path, make_env(), device="cpu")
    entry = checkpoint_module._RESUMED[resumed]
    monkeypatch.setenv("RANK", "1")
    checkpoint_module._continue_logger(resumed, entry)
    assert resumed.logger.output_formats == []
    monkeypatch.setenv("RANK", "0")
    checkpoint_module._continue_logger(resumed, entry)
    assert [type(f).__name__ for f in resumed.logger.output_formats] == ["TensorBoardOutputFormat"]
    assert resumed.logger.get_dir() == str(tmp_path / "tb" / "run_1")


def test_write_is_atomic_and_non_finite_parameters_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model("plain")
    model.learn(ROLLOUT)
    path = save_checkpoint(model, tmp_path / "checkpoint.pt")
    before = path.read_bytes()

    def crash(obj: Any, file: Any) -> None:  # a crash half-way through the write
        file.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(th, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(model, path)
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]

    with th.no_grad():
        next(model.policy.parameters())[0] = float("nan")
    with pytest.raises(NonFiniteCheckpointError, match="parameter 'log_std' holds NaN or inf"):
        save_checkpoint(model, path)
    assert path.read_bytes() == before
    read_checkpoint(path)  # still a valid checkpoint


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="every_steps must be None or an int >= 1, got 0"):
        ResumableCheckpoint("x.pt", every_steps=0)
    with pytest.raises(ValueError, match="total_timesteps must be given"):
        learn_resumable(make_model("plain"), None, ResumableCheckpoint("x.pt"))


def test_resume_on_another_number_of_envs_is_refused(tmp_path: Path) -> None:
    model = make_model("plain")
    model.learn(ROLLOUT)
    path = save_checkpoint(model, tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match=f"env has 3 envs, checkpoint {path} was written with {N_ENVS}"):
        load_checkpoint(path, make_vec_env(FixedLengthEnv, n_envs=3), device="cpu")


def test_a_checkpoint_loads_only_as_its_own_kind_of_algorithm(tmp_path: Path) -> None:
    from sb3_ppo_scale import ScalableRecurrentPPO

    recurrent = ScalableRecurrentPPO("MlpLstmPolicy", make_vec_env("CartPole-v1", n_envs=2), n_steps=32, batch_size=64,
                                     policy_kwargs={"lstm_hidden_size": 8}, device="cpu")
    recurrent.learn(64)
    path = save_checkpoint(recurrent, tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match="was written by ScalableRecurrentPPO; load it with "
                                         "ScalableRecurrentPPO.load_checkpoint"):
        ScalablePPO.load_checkpoint(path, make_vec_env("CartPole-v1", n_envs=2), device="cpu")
    assert type(load_checkpoint(path, make_vec_env("CartPole-v1", n_envs=2), device="cpu")) is ScalableRecurrentPPO


def test_resuming_on_an_env_without_rng_access_says_so(tmp_path: Path) -> None:
    """A DummyVecEnv run resumed on an EnvPool VecEnv (whose envs expose no np_random): a note, not a crash."""
    import_envpool()
    from sb3_ppo_scale.envs import make_envpool_vec_env

    model = ScalablePPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2), n_steps=32, batch_size=64, device="cpu")
    model.learn(64)
    path = save_checkpoint(model, tmp_path / "checkpoint.pt")
    resumed = load_checkpoint(path, make_envpool_vec_env("CartPole-v1", 2, seed=0), device="cpu")
    assert any(note.startswith("env RNG not restored (EnvPoolVecEnv.get_attr('np_random') failed")
               for note in resume_notes(resumed))
    resumed.learn(64, reset_num_timesteps=False)


def test_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        read_checkpoint(tmp_path / "missing.pt")
    th.save({"version": 99}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a sb3_ppo_scale checkpoint of version 1"):
        read_checkpoint(tmp_path / "other.pt")


# ------------------------------------------------------------------------------------------------ the train command
CLI_ROLLOUT = 64  # 2 envs x 32 steps
CLI_BUDGET = 100 * CLI_ROLLOUT
TRAIN_ARGS = ["train", "--env", "CartPole-v1", "--set", "n_envs=2", "--set", "n_steps=32", "--set", "batch_size=64",
              "--set", "n_epochs=1", "--n-timesteps", str(CLI_BUDGET), "--checkpoint-every", str(10 * CLI_ROLLOUT),
              "--eval-freq", "0", "--no-progress"]


def sigterm_when(process: subprocess.Popen[str], condition: Any) -> tuple[str, str]:
    """SIGTERM to ``process`` as soon as ``condition()`` holds (it must hold before the process ends); its output."""
    while not condition():
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    return process.communicate(timeout=300)


def _scalar_steps(run: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folders = sorted(p.name for p in (run / "tensorboard").iterdir())
    assert folders == ["ScalablePPO_1"]  # the resumed run wrote into the same TensorBoard run
    events = EventAccumulator(str(run / "tensorboard" / "ScalablePPO_1"))
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def test_sigterm_stops_train_with_a_checkpoint_and_resume_completes_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    command = [sys.executable, "-m", "sb3_ppo_scale", *TRAIN_ARGS, "--log-dir", str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # the first periodic checkpoint: training is under way
    out, err = sigterm_when(process, lambda: (run / "checkpoint.pt").exists())
    assert process.returncode == PREEMPTED_EXIT_CODE, err
    stopped_at = read_checkpoint(run / "checkpoint.pt")["counters"]["num_timesteps"]
    assert (f"sb3-ppo-scale train: stopped by SIGTERM; checkpoint {run / 'checkpoint.pt'} at {stopped_at} env steps "
            "(exit code 75); run the same command with --resume to continue") in err

    assert 0 < stopped_at < CLI_BUDGET and stopped_at % CLI_ROLLOUT == 0
    loaded = load_checkpoint(run / "checkpoint.pt", make_vec_env("CartPole-v1", n_envs=2), device="cpu")
    assert loaded.num_timesteps == stopped_at and loaded._total_timesteps == CLI_BUDGET
    assert not (run / "model.zip").exists()

    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {run / 'checkpoint.pt'} at {stopped_at} of {CLI_BUDGET} env steps" in resumed.stdout
    assert ScalablePPO.load(run / "model.zip").num_timesteps == CLI_BUDGET
    # one point per rollout, from the first to the budget: no gap and no restart at the resume
    assert _scalar_steps(run, "time/fps") == list(range(CLI_ROLLOUT, CLI_BUDGET + 1, CLI_ROLLOUT))
    assert _scalar_steps(run, "train/loss") == list(range(2 * CLI_ROLLOUT, CLI_BUDGET + 1, CLI_ROLLOUT))
    assert sorted(p.name for p in (run / "monitor").iterdir()) == [
        "0.monitor.csv", "0.part1.monitor.csv", "1.monitor.csv", "1.part1.monitor.csv"]


def test_a_signal_to_the_whole_process_group_of_a_subproc_run_resumes_exactly(tmp_path: Path) -> None:
    """Ctrl-C or a scheduler signals every process of the group, the SubprocVecEnv workers too, which die. A signal
    landing in an update (long updates here) had paired the updated parameters with the previous boundary's env
    state; the checkpoint now takes the env state read at that rollout's end, and the resumed run ends equal to the
    uninterrupted one."""
    args = ["train", "--env", "CartPole-v1", "--set", "n_envs=4", "--set", "batch_size=128", "--set", "n_epochs=200",
            "--vec-env", "subproc", "--n-timesteps", "2048", "--checkpoint-every", "512", "--eval-freq", "0",
            "--no-progress", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    reference, run = tmp_path / "reference", tmp_path / "run"
    subprocess.run([sys.executable, "-m", "sb3_ppo_scale", *args, "--log-dir", str(reference)], check=True, env=env,
                   capture_output=True, timeout=300)
    command = [sys.executable, "-m", "sb3_ppo_scale", *args, "--log-dir", str(run)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)  # its own process group, with its workers
    while not (run / "checkpoint.pt").exists():
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    time.sleep(0.5)  # into the run: its updates are about 95% of it
    os.killpg(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=300)
    assert process.returncode == PREEMPTED_EXIT_CODE, err
    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert_identical(ScalablePPO.load(reference / "model.zip"), ScalablePPO.load(run / "model.zip"))


def test_resume_with_other_settings_than_the_run_is_refused(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """--resume with another --set or --seed: one line naming each difference (the checkpoint's model would keep its
    values while config.yml recorded the new ones); the same command, with another --device or --threads, resumes."""
    from sb3_ppo_scale.cli import main

    run = tmp_path / "run"
    args = ["train", "--env", "CartPole-v1", "--set", "n_envs=2", "--set", "n_steps=32", "--set", "batch_size=64",
            "--n-timesteps", "128", "--checkpoint-every", "64", "--eval-freq", "0", "--no-progress", "--log-dir",
            str(run)]
    assert main(args) == 0 and (run / "checkpoint.pt").is_file()
    capsys.readouterr()
    assert main([*args, "--resume", "--set", "n_epochs=5", "--seed", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"sb3-ppo-scale train: error: --resume continues the run in {run} as recorded in its config.yml, "
                   "but this command differs: seed 0 -> 7; n_epochs 20 -> 5; resume with the run's own settings, or "
                   "start a new run in another --log-dir"]
    assert main([*args, "--resume", "--threads", "1", "--device", "cpu"]) == 0


def test_resume_with_another_budget_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sb3_ppo_scale.cli import main

    run = tmp_path / "run"
    model = ScalablePPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2), n_steps=32, batch_size=64, device="cpu")
    model.learn(CLI_ROLLOUT)
    save_checkpoint(model, run / "checkpoint.pt")
    args = [*TRAIN_ARGS, "--log-dir", str(run), "--resume"]
    assert main(args) == 2  # a user's mistake: one line, exit code 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"sb3-ppo-scale train: error: --n-timesteps {CLI_BUDGET} differs from the budget of the checkpointed run "
        f"({CLI_ROLLOUT}); resume with the same budget")
    assert main([a for a in args if a != "--resume"] + ["--checkpoint-every", "0"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "sb3-ppo-scale train: error: --checkpoint-every must be >= 1 env step, got 0")


# ------------------------------------------------------------------------------------------------ tuning workers
def test_sigterm_fails_and_requeues_the_running_trial_and_the_study_continues(tmp_path: Path) -> None:
    """``tune`` stopped by SIGTERM mid-trial: that trial is FAIL (user attribute preempted=SIGTERM), its parameters
    are enqueued again, the exit code is 75; the same command then completes the study with the retry."""
    from optuna.trial import TrialState

    from sb3_ppo_scale.tuning.preemption import PREEMPTED_ATTR
    from sb3_ppo_scale.tuning.storage import RETRY_ATTR
    from tests.test_tuning import load_trials, run_cli, tiny_spec, write_spec

    path = write_spec(tmp_path, tiny_spec(tmp_path, timesteps=1024, n_trials=2))
    journal = tmp_path / "out" / "tiny.journal"
    process = run_cli("tune", str(path))
    output, _ = sigterm_when(process, lambda: journal.exists() and any(
        t.state == TrialState.RUNNING and t.params for t in load_trials(path)))
    assert process.returncode == PREEMPTED_EXIT_CODE, output
    assert "stopped by SIGTERM: trial(s) [0] failed, re-queued [0]" in output
    trials = load_trials(path)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[0].user_attrs[PREEMPTED_ATTR] == "SIGTERM"
    assert trials[1].user_attrs[RETRY_ATTR] == 0 and trials[1].system_attrs["fixed_params"] == trials[0].params

    resumed = run_cli("tune", str(path))
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output
    trials = load_trials(path)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert trials[1].params == trials[0].params


# ------------------------------------------------------------------------------------------------ data-parallel
def _data_parallel_worker(rank: int, out: Path, mode: str) -> dict[str, Any]:
    """One gloo rank (tests.test_distributed._spawn): ``full`` trains TOTAL global steps; ``preempt`` is stopped by
    a SIGTERM that only rank 1 receives, mid-rollout; ``resume`` continues from the checkpoint rank 0 wrote. With a
    ``:hopper`` suffix the envs are Hopper-v5's, whose episodes run across the checkpoint."""
    mode, _, env_name = mode.partition(":")
    env = make_vec_env("Hopper-v5" if env_name else FixedLengthEnv, n_envs=N_ENVS, seed=3 + 100 * rank)
    path = out / "checkpoint.pt"
    if mode == "resume":
        model = ScalablePPO.load_checkpoint(path, env, device="cpu")
        notes = resume_notes(model)
        learn_resumable(model, None, ResumableCheckpoint(path, signals=()))
        return {"params": [p.detach().clone() for p in model.policy.parameters()], "notes": notes,
                "num_timesteps": model.num_timesteps}
    model = ScalablePPO("MlpPolicy", env, n_steps=N_STEPS, batch_size=32, n_epochs=2, seed=1, device="cpu",
                        policy_kwargs={"net_arch": [16]})
    if mode == "full":
        model.learn(2 * TOTAL)
        return {"params": [p.detach().clone() for p in model.policy.parameters()], "num_timesteps": model.num_timesteps}
    checkpoint = ResumableCheckpoint(path, every_steps=2 * ROLLOUT, signals=())
    stop = StopAt(checkpoint, 2 * STOP_ROLLOUT * ROLLOUT + 10) if rank == 1 else None
    try:
        learn_resumable(model, 2 * TOTAL, checkpoint, callback=stop)
    except TrainingPreempted as stopped:
        return {"preempted": stopped.signal_name, "at": stopped.num_timesteps}
    return {"preempted": None}


@pytest.mark.parametrize("envs", ["", ":hopper"])
def test_data_parallel_preemption_on_one_rank_and_resume_is_exact(envs: str, tmp_path: Path) -> None:
    """2 gloo ranks: SIGTERM reaches rank 1 only; every rank stops, rank 0 writes both ranks' states; the resumed
    2-rank run ends bit-identical to an uninterrupted one (Hopper: with each rank's episodes in progress put back)."""
    from tests.test_distributed import _spawn

    (tmp_path / "full").mkdir()
    full = _spawn(_data_parallel_worker, tmp_path / "full", "full" + envs)
    preempted = _spawn(_data_parallel_worker, tmp_path, "preempt" + envs)
    assert preempted == [{"preempted": "a signal on another rank", "at": 2 * STOP_ROLLOUT * ROLLOUT},
                         {"preempted": "SIGTERM", "at": 2 * STOP_ROLLOUT * ROLLOUT}]
    state = read_checkpoint(tmp_path / "checkpoint.pt")
    assert len(state["ranks"]) == 2 and state["counters"]["num_timesteps"] == 2 * STOP_ROLLOUT * ROLLOUT
    if envs:
        assert all(not rank["last_episode_starts"].all() and rank["episodes"] is not None for rank in state["ranks"])
    resumed = _spawn(_data_parallel_worker, tmp_path, "resume" + envs)
    for rank in range(2):
        assert resumed[rank]["notes"] == [] and resumed[rank]["num_timesteps"] == full[rank]["num_timesteps"]
        assert all(th.equal(a, b) for a, b in zip(resumed[rank]["params"], full[rank]["params"]))


class RecordedScalablePPO(ScalablePPO):
    """A subclass, to show that a checkpoint loads as the class that wrote it."""


def test_checkpoint_loads_as_the_class_that_wrote_it(tmp_path: Path) -> None:
    model = RecordedScalablePPO("MlpPolicy", make_env(), n_steps=EPISODE, batch_size=16, n_epochs=1, seed=0,
                                device="cpu", policy_kwargs={"net_arch": [8]})
    model.learn(model.n_steps * N_ENVS)
    path = save_checkpoint(model, tmp_path / "sub.pt")
    assert read_checkpoint(path)["algorithm_class"] == f"{__name__}:RecordedScalablePPO"
    resumed = load_checkpoint(path, make_env(), device="cpu")
    assert type(resumed) is RecordedScalablePPO
    assert_identical(model, resumed)
    state = read_checkpoint(path)
    del state["algorithm_class"]  # a checkpoint written before the class was recorded loads as ScalablePPO
    th.save(state, tmp_path / "old.pt")
    assert type(load_checkpoint(tmp_path / "old.pt", make_env(), device="cpu")) is ScalablePPO


# ------------------------------------------------------------------------------------------------ episodes in progress
class OptedInEnv(FixedLengthEnv):
    """FixedLengthEnv that hands its episode state to the checkpoint (``get_episode_state`` / ``set_episode_state``)."""

    def get_episode_state(self) -> tuple[int, np.ndarray]:
        return self.t, self.x.copy()

    def set_episode_state(self, state: tuple[int, np.ndarray]) -> None:
        self.t, self.x = state[0], state[1].copy()


def _atari(env_id: str) -> VecEnv:
    """An Atari game with SB3's Atari wrappers and 4 stacked frames (the zoo's Atari setting)."""
    import ale_py

    gym.register_envs(ale_py)
    return VecFrameStack(make_atari_env(env_id, n_envs=2, seed=5), n_stack=4)


#: name -> (env factory, PPO keyword arguments); n_steps never divides an episode: every checkpoint is mid-episode
MID_EPISODE_CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "hopper_vec_normalize": (lambda: VecNormalize(make_vec_env("Hopper-v5", n_envs=2, seed=5)), {}),
    "ant": (lambda: make_vec_env("Ant-v5", n_envs=1, seed=5), {}),  # its reward reads positions mj_step left stale
    "cartpole": (lambda: make_vec_env("CartPole-v1", n_envs=2, seed=5), {}),
    "pendulum_gsde": (lambda: make_vec_env("Pendulum-v1", n_envs=2, seed=5), {"use_sde": True, "sde_sample_freq": 4}),
    "own_env": (lambda: make_vec_env(OptedInEnv, n_envs=2, seed=5), {}),
    # Breakout: lives (EpisodicLifeEnv ends a training episode at each one lost; here at steps 67, 88 and 111 of env 0)
    "atari_frame_stack": (lambda: _atari("BreakoutNoFrameskip-v4"), {"policy": "CnnPolicy"}),
    "rl_zoo3_time_limit": (lambda: _with_rl_zoo3_time_limit(), {}),
    "gymnasium_time_limit": (lambda: make_vec_env(lambda: _gymnasium_time_limit()(PendulumEnv(), TIME_LIMIT), n_envs=2,
                                                  seed=5), {}),
    "gymnasium_wrappers": (lambda: make_vec_env("Pendulum-v1", n_envs=2, seed=5, wrapper_class=_gymnasium_wrappers), {}),
    "vec_monitor": (lambda: VecMonitor(DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2)), {}),
    "subproc_hopper": (lambda: VecNormalize(make_vec_env("Hopper-v5", n_envs=2, seed=5, vec_env_cls=SubprocVecEnv,
                                                         wrapper_class=EpisodeState)), {}),
}


def _gymnasium_wrappers(env: gym.Env) -> gym.Env:
    """Gymnasium's common wrappers, stateful ones among them (running statistics, a time feature, stacked frames)."""
    env = gym.wrappers.RecordEpisodeStatistics(gym.wrappers.RescaleAction(env, -1.0, 1.0))
    env = gym.wrappers.NormalizeReward(gym.wrappers.NormalizeObservation(gym.wrappers.TimeAwareObservation(env)))
    return gym.wrappers.FlattenObservation(gym.wrappers.FrameStackObservation(env, 2))


#: the time-limit cases' episode length: their episodes are at step 46 at the checkpoint (2 rollouts of 23 steps) and
#: truncated at step 60, after the resume (a resumed step counter that restarted at 0 would truncate them at 106)
TIME_LIMIT = 60


def _with_rl_zoo3_time_limit() -> VecEnv:
    """Pendulum after rl_zoo3 has replaced Gymnasium's TimeLimit with its subclass (it does so on import)."""
    import rl_zoo3.gym_patches  # noqa: F401

    env = make_vec_env("Pendulum-v1", n_envs=2, seed=5, env_kwargs={"max_episode_steps": TIME_LIMIT})
    assert type(env.envs[0].env).__name__ == "PatchedTimeLimit"
    return env


def _gymnasium_time_limit() -> type[gym.Wrapper]:
    """Gymnasium's own TimeLimit, also once rl_zoo3 has put its subclass in its place (importing rl_zoo3 does so for
    the whole process, and test modules that import it are collected before this test runs)."""
    return next(cls for cls in gym.wrappers.TimeLimit.__mro__
                if f"{cls.__module__}.{cls.__qualname__}" == "gymnasium.wrappers.common.TimeLimit")


def _mid_episode_model(case: str) -> ScalablePPO:
    make, kwargs = MID_EPISODE_CASES[case]
    kwargs = dict(kwargs)
    return ScalablePPO(kwargs.pop("policy", "MlpPolicy"), make(), n_steps=23, batch_size=23, n_epochs=1, seed=2,
                       device="cpu", policy_kwargs={"net_arch": [8]}, **kwargs)


@pytest.mark.parametrize("case", list(MID_EPISODE_CASES))
def test_episodes_in_progress_continue_and_the_run_stays_bit_identical(case: str, tmp_path: Path) -> None:
    make, _ = MID_EPISODE_CASES[case]
    reference = _mid_episode_model(case)
    rollout = reference.n_steps * reference.n_envs
    total = 5 * rollout
    reference.learn(total)
    model, path = _mid_episode_model(case), tmp_path / "checkpoint.pt"
    checkpoint = ResumableCheckpoint(path, every_steps=rollout, signals=())
    with pytest.raises(TrainingPreempted):
        learn_resumable(model, total, checkpoint, callback=StopAt(checkpoint, 2 * rollout + 3 * reference.n_envs))
    assert not read_checkpoint(path)["ranks"][0]["last_episode_starts"].all()  # a checkpoint mid-episode
    resumed = ScalablePPO.load_checkpoint(path, make(), device="cpu")
    assert resume_notes(resumed) == []
    learn_resumable(resumed, None, ResumableCheckpoint(path, signals=()))
    assert_identical(reference, resumed)
    assert [info["r"] for info in resumed.ep_info_buffer] == [info["r"] for info in reference.ep_info_buffer]
    assert np.array_equal(resumed._last_obs, reference._last_obs)
    if case.endswith("time_limit"):  # the limit fell after the resume: a truncation the resumed run had to reproduce
        assert [info["l"] for info in reference.ep_info_buffer] == [TIME_LIMIT] * 2
    for env in (reference.env, resumed.env, model.env):
        env.close()


class HalvedReward(gym.RewardWrapper):
    """A user's wrapper: stateless, but the checkpoint cannot know that."""

    def reward(self, reward: float) -> float:
        return reward / 2


def test_an_env_layer_without_known_state_restarts_and_says_which(tmp_path: Path) -> None:
    def make() -> VecEnv:
        return make_vec_env("CartPole-v1", n_envs=2, seed=5, wrapper_class=HalvedReward)

    model = ScalablePPO("MlpPolicy", make(), n_steps=23, batch_size=23, n_epochs=1, seed=2, device="cpu")
    model.learn(46)
    path = save_checkpoint(model, tmp_path / "mid.pt")
    resumed = load_checkpoint(path, make(), device="cpu")
    assert resume_notes(resumed) == ["2 env(s) restart their episode (mid-episode at the checkpoint, or a random "
                                     "reset; episodes in progress not restored: test_checkpoint.HalvedReward is not "
                                     "a layer whose episode state is known)"]
    assert resumed._last_episode_starts.all()


def test_sticky_actions_restart_and_say_why(tmp_path: Path) -> None:
    """ALE's state does not hold the previous action a sticky step repeats: v5 ids (repeat_action_probability 0.25)
    restart their episodes."""
    model = ScalablePPO("CnnPolicy", _atari("ALE/Pong-v5"), n_steps=23, batch_size=23, n_epochs=1, seed=2, device="cpu",
                        policy_kwargs={"net_arch": [8]})
    model.learn(46)
    resumed = load_checkpoint(save_checkpoint(model, tmp_path / "mid.pt"), _atari("ALE/Pong-v5"), device="cpu")
    assert resume_notes(resumed) == ["2 env(s) restart their episode (mid-episode at the checkpoint, or a random "
                                     "reset; episodes in progress not restored: ale_py.env.AtariEnv repeats actions "
                                     "(sticky actions), and the emulator's previous action is not part of ALE's "
                                     "state)"]


def test_subproc_envs_without_episode_state_restart_and_say_how_to_keep_them(tmp_path: Path) -> None:
    def make() -> VecEnv:
        return make_vec_env("CartPole-v1", n_envs=2, seed=5, vec_env_cls=SubprocVecEnv)

    model = ScalablePPO("MlpPolicy", make(), n_steps=23, batch_size=23, n_epochs=1, seed=2, device="cpu")
    model.learn(46)
    resumed = load_checkpoint(save_checkpoint(model, tmp_path / "mid.pt"), make(), device="cpu")
    assert resume_notes(resumed) == ["2 env(s) restart their episode (mid-episode at the checkpoint, or a random "
                                     "reset; episodes in progress not restored: SubprocVecEnv: its envs are in other "
                                     "processes; wrap each, outermost, in EpisodeState)"]
    model.env.close()
    resumed.env.close()


def test_signal_handlers_are_put_back_when_learn_raises(tmp_path: Path) -> None:
    """A run that fails (an env worker died, a callback raised) leaves the process's own SIGTERM handler in place; a
    forked env worker inherited the checkpoint's handler and survived SIGTERM before."""

    class Boom(BaseCallback):
        def _on_step(self) -> bool:
            raise RuntimeError("boom")

    before = signal.getsignal(signal.SIGTERM)
    model = ScalablePPO("MlpPolicy", make_env(), n_steps=EPISODE, batch_size=16, n_epochs=1, seed=0, device="cpu",
                        policy_kwargs={"net_arch": [8]})
    with pytest.raises(RuntimeError, match="boom"):
        learn_resumable(model, 256, ResumableCheckpoint(tmp_path / "c.pt", signals=(signal.SIGTERM,)), callback=Boom())
    assert signal.getsignal(signal.SIGTERM) is before
