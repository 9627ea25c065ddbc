"""ProcessVecEnv: SB3's episode contract against DummyVecEnv over the same envs (observations, rewards, dones, terminal
observations, time-limit bootstraps, episode records, infos), the same learning, per-env attributes, and faults: a
worker killed on purpose (between steps, during learn()) stops the run with an error naming it, and the last
checkpoint resumes it."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.checkpoint import ResumableCheckpoint, learn_resumable, load_checkpoint, resume_notes
from sb3_ppo_scale.envs import EnvWorkerError, ProcessVecEnv, default_workers, make_process_vec_env

from tests.helpers import max_param_diff

CARTPOLE_20 = {"max_episode_steps": 20}  # CartPole with a 20-step limit: both terminations and truncations


class DictObservation(gym.ObservationWrapper):
    """CartPole's observation as a Dict (the state, and the cart position alone): Dict spaces in shared memory."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = spaces.Dict({"state": env.observation_space,
                                              "x": spaces.Box(-5.0, 5.0, (1,), np.float32)})

    def observation(self, observation: np.ndarray) -> dict[str, np.ndarray]:
        return {"state": observation, "x": observation[:1].copy()}


class ExplodesOnRequest(gym.Wrapper):
    """Raises RuntimeError in ``step`` once ``explode`` is set (through ``set_attr``)."""

    explode = False

    def step(self, action: Any) -> Any:
        if self.explode:
            raise RuntimeError("boom")
        return self.env.step(action)


def assert_same(ours: Any, reference: Any, where: str = "info") -> None:
    """Equal values of the same types (dicts key by key in the same order, lists item by item); an episode record's
    time is skipped."""
    if isinstance(reference, dict):
        assert isinstance(ours, dict) and list(ours) == list(reference), where
        for key in reference:
            if not (where.endswith("['episode']") and key == "t"):
                assert_same(ours[key], reference[key], f"{where}[{key!r}]")
    elif isinstance(reference, (list, tuple)):
        assert type(ours) is type(reference) and len(ours) == len(reference), where
        for index, (a, b) in enumerate(zip(ours, reference)):
            assert_same(a, b, f"{where}[{index}]")
    elif isinstance(reference, np.ndarray):
        assert isinstance(ours, np.ndarray) and ours.dtype == reference.dtype, where
        np.testing.assert_array_equal(ours, reference, err_msg=where)
    else:
        assert type(ours) is type(reference) and ours == reference, where


def both(env_id: str, n_envs: int, n_workers: int, seed: int, **kwargs: Any) -> tuple[ProcessVecEnv, VecEnv]:
    """A ProcessVecEnv and SB3's DummyVecEnv built by make_vec_env with the same arguments."""
    return (make_process_vec_env(env_id, n_envs, n_workers=n_workers, seed=seed, **kwargs),
            make_vec_env(env_id, n_envs, seed=seed, vec_env_cls=DummyVecEnv, **kwargs))


CASES = {
    "CartPole-v1": ("CartPole-v1", 4, 2, {"env_kwargs": CARTPOLE_20}, 120),
    "Pendulum-v1": ("Pendulum-v1", 2, 2, {"env_kwargs": {"max_episode_steps": 15}}, 40),
    "Hopper-v5": ("Hopper-v5", 3, 1, {"env_kwargs": {"max_episode_steps": 40}}, 120),
    "Dict observations": ("CartPole-v1", 2, 1, {"env_kwargs": CARTPOLE_20, "wrapper_class": DictObservation}, 60),
}


@pytest.mark.parametrize("case", list(CASES))
def test_episode_contract_equals_dummy_vec_env(case: str) -> None:
    """Same seeds, same actions: every step's observations, float32 rewards, dones and infos (terminal observations,
    TimeLimit.truncated, Monitor's episode records, the envs' own info entries) and the reset infos are those of
    SB3's DummyVecEnv, through episodes ended by terminations and by time limits."""
    env_id, n_envs, n_workers, kwargs, n_steps = CASES[case]
    ours, reference = both(env_id, n_envs, n_workers, seed=7, **kwargs)
    assert (ours.observation_space, ours.action_space) == (reference.observation_space, reference.action_space)
    assert_same(ours.reset(), reference.reset(), "reset observations")
    assert_same(ours.reset_infos, reference.reset_infos, "reset infos")
    reference.action_space.seed(0)
    ends = {"terminated": 0, "truncated": 0}
    for step in range(n_steps):
        actions = np.stack([reference.action_space.sample() for _ in range(n_envs)])
        ours_step, reference_step = ours.step(actions), reference.step(actions)
        for name, a, b in zip(("observations", "rewards", "dones", "infos"), ours_step, reference_step):
            assert_same(a, b, f"step {step} {name}")
        assert_same(ours.reset_infos, reference.reset_infos, f"step {step} reset infos")
        for done, info in zip(reference_step[2], reference_step[3]):
            if done:
                ends["truncated" if info["TimeLimit.truncated"] else "terminated"] += 1
    assert ends["truncated"] > 0 and (ends["terminated"] > 0 or env_id == "Pendulum-v1"), ends  # Pendulum never ends
    assert ours.seed(3) == reference.seed(3)  # re-seeding: env i gets 3 + i at the next reset
    assert_same(ours.reset(), reference.reset(), "re-seeded reset observations")
    ours.close()


def test_learning_equals_dummy_vec_env() -> None:
    """ScalablePPO with the same seed on both VecEnvs: identical rollout buffer (bootstrapped rewards, episode starts,
    returns, advantages), parameters after the updates, and episode records."""
    n_envs, n_steps = 4, 64
    models = []
    for env in both("CartPole-v1", n_envs, 2, seed=11, env_kwargs=CARTPOLE_20):
        model = ScalablePPO("MlpPolicy", env, n_steps=n_steps, batch_size=64, n_epochs=2, gamma=0.9, seed=3,
                            device="cpu")
        model.learn(2 * n_steps * n_envs)
        models.append(model)
    ours, reference = (m.rollout_buffer for m in models)
    for field in ("observations", "actions", "rewards", "episode_starts", "values", "returns", "advantages"):
        np.testing.assert_array_equal(getattr(ours, field), getattr(reference, field), err_msg=field)
    assert max_param_diff(*models) == 0.0
    episodes = [[(e["r"], e["l"]) for e in m.ep_info_buffer] for m in models]
    assert episodes[0] == episodes[1]
    assert 20 in [length for _, length in episodes[0]] and ours.rewards.max() > 1.0  # a truncation, bootstrapped
    models[0].get_env().close()


def test_n_workers_must_divide_n_envs() -> None:
    with pytest.raises(ValueError, match=r"n_workers must be None .* an int that divides n_envs=6: one of "
                                         r"\[1, 2, 3, 6\]; got 4"):
        make_process_vec_env("CartPole-v1", 6, n_workers=4)
    with pytest.raises(ValueError, match="n_envs must be an int >= 1, got 0"):
        make_process_vec_env("CartPole-v1", 0)
    assert [default_workers(n, cores=4) for n in (1, 3, 6, 7, 8, 16)] == [1, 3, 3, 1, 4, 4]


def test_attributes_and_methods_reach_each_env() -> None:
    """get_attr/set_attr/env_method/env_is_wrapped address env i in worker i // k, slot i % k, in the order asked;
    an env's AttributeError is raised as it is and leaves the workers running."""
    env = make_process_vec_env("CartPole-v1", 4, n_workers=2, seed=5, wrapper_class=ExplodesOnRequest)
    env.reset()
    assert env.get_attr("np_random_seed") == [5, 6, 7, 8]
    assert env.get_attr("np_random_seed", indices=[3, 0, 2]) == [8, 5, 7]
    env.set_attr("explode", "yes", indices=[2])
    assert env.get_attr("explode") == [False, False, "yes", False]
    env.set_attr("explode", False)
    env.step(np.zeros(4, dtype=np.int64))
    assert env.env_method("get_total_steps", indices=[1, 3]) == [1, 1]
    assert env.env_is_wrapped(Monitor) == [True] * 4 and env.env_is_wrapped(DictObservation) == [False] * 4
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        env.get_attr("missing")
    assert [frame.shape for frame in env.get_images()] == [(400, 600, 3)] * 4
    env.close()


def test_workers_ignore_sigint_and_die_of_sigterm() -> None:
    """Ctrl-C is the training process's alone; SIGTERM ends a worker even when it was forked with a Python handler
    for it installed (a checkpoint callback's)."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        env = make_process_vec_env("CartPole-v1", 2, n_workers=2, seed=0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    env.reset()
    for pid in env.worker_pids:
        os.kill(pid, signal.SIGINT)
    env.step(np.zeros(2, dtype=np.int64))  # the workers are still there
    os.kill(env.worker_pids[0], signal.SIGTERM)
    with pytest.raises(EnvWorkerError, match=r"^env worker 0 \(pid \d+, env 0 of CartPole-v1\) died: killed by "
                                             r"signal SIGTERM"):
        env.step(np.zeros(2, dtype=np.int64))


def test_killed_worker_raises_an_error_naming_it() -> None:
    """SIGKILL to a worker between steps: the next step raises EnvWorkerError naming the worker, its pid and its envs;
    every worker is stopped; later calls raise the same error; close() is quiet."""
    env = make_process_vec_env("CartPole-v1", 4, n_workers=2, seed=0)
    env.reset()
    pid = env.worker_pids[1]
    os.kill(pid, signal.SIGKILL)
    message = rf"^env worker 1 \(pid {pid}, envs 2-3 of CartPole-v1\) died: killed by signal SIGKILL; the other " \
              r"workers were stopped and this ProcessVecEnv is closed: resume from the last checkpoint with a new one$"
    with pytest.raises(EnvWorkerError, match=message) as error:
        env.step(np.zeros(4, dtype=np.int64))
    assert (error.value.worker, error.value.pid, error.value.env_indices) == (1, pid, range(2, 4))
    assert all(process.exitcode is not None for process in env._async.processes)
    with pytest.raises(EnvWorkerError, match=message):
        env.reset()
    env.close()

    env = make_process_vec_env("CartPole-v1", 4, n_workers=2, seed=0)  # killed while its step is in flight
    env.reset()
    env.step_async(np.zeros(4, dtype=np.int64))
    os.kill(env.worker_pids[0], signal.SIGKILL)
    with pytest.raises(EnvWorkerError, match=r"^env worker 0 \(pid \d+, envs 0-1 of CartPole-v1\) died: killed by "
                                             r"signal SIGKILL"):
        env.step_wait()  # raises, unless the worker had answered before it died: then the next step does
        env.step(np.zeros(4, dtype=np.int64))


def test_env_exception_ends_its_worker_with_an_error_naming_it() -> None:
    env = make_process_vec_env("CartPole-v1", 4, n_workers=2, seed=0, wrapper_class=ExplodesOnRequest)
    env.reset()
    env.set_attr("explode", True, indices=[3])
    pid = env.worker_pids[1]
    with pytest.raises(EnvWorkerError, match=rf"^env worker 1 \(pid {pid}, envs 2-3 of CartPole-v1\) raised "
                                             r"RuntimeError: boom; the worker has stopped; the other workers") as error:
        env.step(np.zeros(4, dtype=np.int64))
    assert isinstance(error.value.__cause__, RuntimeError)
    env.close()


class KillWorker(BaseCallback):
    """SIGKILL to worker ``worker`` of the training env once ``num_timesteps`` reaches ``at_step``."""

    def __init__(self, worker: int, at_step: int) -> None:
        super().__init__()
        self.worker, self.at_step, self.killed_pid = worker, at_step, None

    def _on_step(self) -> bool:
        if self.killed_pid is None and self.num_timesteps >= self.at_step:
            self.killed_pid = self.training_env.worker_pids[self.worker]
            os.kill(self.killed_pid, signal.SIGKILL)
        return True


def test_worker_killed_during_learn_stops_the_run() -> None:
    env = make_process_vec_env("CartPole-v1", 4, n_workers=2, seed=0)
    model = ScalablePPO("MlpPolicy", env, n_steps=32, batch_size=64, n_epochs=1, seed=0, device="cpu")
    kill = KillWorker(worker=0, at_step=200)
    with pytest.raises(EnvWorkerError, match=rf"^env worker 0 \(pid \d+, envs 0-1 of CartPole-v1\) died: killed by "
                                             r"signal SIGKILL"):
        model.learn(1024, callback=kill)
    assert f"pid {kill.killed_pid}," in str(model.get_env()._fault)
    assert 200 <= model.num_timesteps < 256  # stopped within the rollout where the worker died


def test_resume_from_the_last_checkpoint_after_a_killed_worker(tmp_path: Path) -> None:
    """A run checkpointing every rollout whose worker is killed mid-rollout resumes from its last checkpoint on a new
    ProcessVecEnv and reaches its budget; the episodes in progress restart (resume_notes says so)."""
    n_envs, n_steps, budget = 4, 32, 512
    path = tmp_path / "checkpoint.pt"
    model = ScalablePPO("MlpPolicy", make_process_vec_env("CartPole-v1", n_envs, n_workers=2, seed=0),
                        n_steps=n_steps, batch_size=64, n_epochs=1, seed=0, device="cpu")
    checkpoint = ResumableCheckpoint(path, every_steps=n_steps * n_envs, signals=())
    with pytest.raises(EnvWorkerError, match=r"env worker 1 .* died: killed by signal SIGKILL"):
        learn_resumable(model, budget, checkpoint, callback=KillWorker(worker=1, at_step=300))
    assert checkpoint.written == [128, 256]  # the third rollout (256-384) was cut short

    resumed = load_checkpoint(path, make_process_vec_env("CartPole-v1", n_envs, n_workers=2, seed=0), device="cpu")
    assert resumed.num_timesteps == 256
    notes = resume_notes(resumed)
    assert len(notes) == 1 and "restart their episode" in notes[0] and "ProcessVecEnv" in notes[0], notes
    learn_resumable(resumed, None, ResumableCheckpoint(path, every_steps=n_steps * n_envs, signals=()))
    assert resumed.num_timesteps == budget
    resumed.get_env().close()


def _worker_pids(pid: int) -> list[int]:
    """The env worker processes of process ``pid``: its forked children (same command line; Linux's /proc)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    command = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [int(child) for child in children if Path(f"/proc/{child}/cmdline").read_bytes() == command]


def test_train_stopped_by_a_killed_worker_names_it_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """``train --vec-env processes``: a worker killed mid-run ends the run with one line naming the worker and the
    checkpoint to resume from (exit code 1, no traceback); ``--resume`` completes the run to its budget."""
    import subprocess
    import sys
    import time

    from sb3_ppo_scale.checkpoint import read_checkpoint

    rollout, budget = 4 * 32, 64 * 4 * 32
    run = tmp_path / "run"
    command = [sys.executable, "-m", "sb3_ppo_scale", "train", "--env", "CartPole-v1", "--vec-env", "processes",
               "--set", "n_envs=4", "--set", "n_steps=32", "--set", "batch_size=64", "--set", "n_epochs=4",
               "--n-timesteps", str(budget), "--checkpoint-every", str(4 * rollout), "--eval-freq", "0",
               "--no-progress", "--log-dir", str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    while not (run / "checkpoint.pt").exists():  # the first periodic checkpoint: training is under way
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)
    workers = _worker_pids(process.pid)
    assert len(workers) == default_workers(4), workers
    last, per_worker = len(workers) - 1, 4 // len(workers)
    hosted = f"env {last}" if per_worker == 1 else f"envs {last * per_worker}-3"
    os.kill(workers[last], signal.SIGKILL)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 1, err
    steps = read_checkpoint(run / "checkpoint.pt")["counters"]["num_timesteps"]
    assert 0 < steps < budget and steps % rollout == 0
    assert "Traceback" not in err
    assert re.fullmatch(
        rf"sb3-ppo-scale train: env worker {last} \(pid {workers[last]}, {hosted} of CartPole-v1\) died: killed by "
        rf"signal SIGKILL.*; run the same command with --resume to continue from checkpoint "
        rf"{re.escape(str(run / 'checkpoint.pt'))} at {steps} env steps", err.strip().splitlines()[-1]), err

    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {run / 'checkpoint.pt'} at {steps} of {budget} env steps" in resumed.stdout
    assert ScalablePPO.load(run / "model.zip").num_timesteps == budget


def test_a_run_without_a_checkpoint_says_it_starts_anew(tmp_path: Path) -> None:
    from sb3_ppo_scale.experiments.commands import _where_to_resume

    assert _where_to_resume(tmp_path / "checkpoint.pt") == (
        "no checkpoint was written (--checkpoint-every N writes one every N env steps); the run starts anew")
