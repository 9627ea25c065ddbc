"""Shared test utilities: build a PPO and a ScalablePPO the same way and compare what they learned; CI-aware skips."""

from __future__ import annotations

import copy
import importlib
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn, TypeVar

import numpy as np
import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.envs import SimpleMultiObsEnv
from stable_baselines3.common.logger import Logger, configure

from sb3_ppo_scale import ScalablePPO

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def flat_params(model: PPO) -> th.Tensor:
    return th.cat([p.detach().flatten() for p in model.policy.parameters()])


def max_param_diff(a: PPO, b: PPO) -> float:
    return (flat_params(a) - flat_params(b)).abs().max().item()


#: Tolerance for parameters trained with ``grad_accum_steps > 1`` against one big-batch step (PPO, or
#: ScalablePPO with ``grad_accum_steps=1``). Exact equality cannot hold there: the micro-batch gradients are
#: computed by the same eager kernels on fewer rows and then summed, so the float32 summation order of every
#: gradient differs (rounding differences of about one ulp per gradient entry, which Adam carries into the
#: parameters). On this suite's cases (up to 3 rollouts, 36 Adam steps) the parameters end one or two float32 ulps
#: apart (ulp(0.5) = 6e-8). 1e-6 is about 16 ulps at |p| ~ 0.5, room for other CPUs' BLAS kernels, and 300x below
#: one Adam step (lr = 3e-4): a skipped, repeated or mis-weighted micro-batch moves parameters by ~lr and fails.
ACCUMULATION_ATOL = 1e-6


def assert_identical(a: PPO, b: PPO) -> None:
    """Every policy parameter and buffer (by name) and every optimizer state tensor are bit-identical."""
    assert_same_state(a.policy.state_dict(), b.policy.state_dict())
    assert_same_state(a.policy.optimizer.state_dict(), b.policy.optimizer.state_dict())


def assert_same_state(a: Any, b: Any, path: str = "") -> None:
    """Recursively compare two (optimizer or module) state dicts, or what a callback reads from ``locals``: tensors
    with torch.equal, numpy arrays with array_equal (dtypes equal too), the rest with ==. Monitor's episode info
    ``t`` (wall-clock time) is skipped."""
    if isinstance(a, th.Tensor):
        assert isinstance(b, th.Tensor) and a.dtype == b.dtype and th.equal(a, b), f"{path}: tensors differ"
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), f"{path}: arrays differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys differ"
        for key in a:
            if key == "t" and {"r", "l"} <= a.keys():  # Monitor's episode info: "t" is wall-clock time
                continue
            assert_same_state(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: lengths differ"
        for index, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{path}/{index}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


class LocalsRecorder(BaseCallback):
    """Keeps a copy of ``keys`` from what SB3 callbacks read in ``locals`` at every step (and the env they see)."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.keys = keys
        self.steps: list[dict[str, Any]] = []
        self.envs: list[Any] = []

    def _on_step(self) -> bool:
        self.steps.append({key: copy.deepcopy(self.locals[key]) for key in self.keys})
        self.envs.append(self.locals["env"])
        assert self.locals["self"] is self.model
        return True


def assert_params_close(a: PPO, b: PPO, atol: float) -> None:
    """Every named policy parameter within ``atol`` (absolute); callers justify ``atol`` where they choose it."""
    params_a, params_b = dict(a.policy.named_parameters()), dict(b.policy.named_parameters())
    assert params_a.keys() == params_b.keys()
    for name, value in params_a.items():
        diff = (value.detach() - params_b[name].detach()).abs().max().item()
        assert diff <= atol, f"{name}: max |diff| {diff:.3g} > {atol:.3g}"


class GivenOrderHooks:
    """RolloutHooks for a test buffer that trains in a given order: set ``orders`` to an iterator of index tensors,
    one per epoch (the rollout as staged, nothing extra logged). Put it before the buffer class in the bases."""

    orders: Any

    def prepare_rollout(self, rollout: Any) -> Any:
        return rollout

    def epoch_order(self, n: int) -> th.Tensor:
        return next(self.orders)

    def train_log(self) -> dict[str, float]:
        return {}


def in_ci() -> bool:
    """True when the environment says this is a CI run (``CI=true``, as CI services and .ci/run set it)."""
    return os.environ.get("CI", "").lower() == "true"


def skip_or_fail_in_ci(reason: str) -> NoReturn:
    """Skip a test whose prerequisite is missing, except in CI, where the prerequisite is installed on purpose and
    its absence must fail the run instead of letting it pass without that test."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: this test must run in CI, not be skipped)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_envpool() -> ModuleType:
    """``pytest.importorskip("envpool")``, except in CI on Linux x86-64, where the test extra installs EnvPool (its
    only platform), so a missing or broken EnvPool fails the run instead of skipping every EnvPool test. Works at
    module level too (a failure there is a collection error)."""
    try:
        return importlib.import_module("envpool")
    except ImportError as error:
        reason = f"EnvPool not importable ({error}): pip install 'sb3-ppo-scale[envpool]' (in the test extra)"
        if platform.system() == "Linux" and platform.machine() == "x86_64":
            skip_or_fail_in_ci(reason)
        pytest.skip(f"{reason}; EnvPool has no wheel for this platform", allow_module_level=True)


class RecordingLogger(Logger):
    """An SB3 logger that also remembers every value recorded (last value per key)."""

    def __init__(self) -> None:
        super().__init__(folder=None, output_formats=[])
        self.seen: dict[str, Any] = {}

    def record(self, key: str, value: Any, exclude: Any = None) -> None:
        self.seen[key] = value
        super().record(key, value, exclude)


class HistoryLogger(Logger):
    """An SB3 logger that keeps every value recorded, per key, in order."""

    def __init__(self) -> None:
        super().__init__(folder=None, output_formats=[])
        self.history: dict[str, list] = {}

    def record(self, key: str, value: Any, exclude: Any = None) -> None:
        self.history.setdefault(key, []).append(value)
        super().record(key, value, exclude)


def seeded_dict_env() -> SimpleMultiObsEnv:
    """SB3's Dict-observation env, built from NumPy's global RNG seeded to 0: it draws its state images and vectors
    from that RNG when it is built, so two runs compared in a test must build it from the same state (whatever
    tests ran before in the same worker)."""
    np.random.seed(0)
    return SimpleMultiObsEnv(random_start=False)


def train_pair(
    make_env: Callable[[], Any] | str,
    total_timesteps: int,
    policy: str = "MlpPolicy",
    scalable_kwargs: dict[str, Any] | None = None,
    device: str = "cpu",
    baseline_kwargs: dict[str, Any] | None = None,
    baseline_cls: type[PPO] = PPO,
    **common: Any,
) -> tuple[PPO, ScalablePPO]:
    """Train a baseline (default: PPO) and ScalablePPO with identical seeds/hyperparameters, one after the other;
    returns both, each with a RecordingLogger."""
    baseline = train_one(baseline_cls, make_env, total_timesteps, policy, device, **common, **(baseline_kwargs or {}))
    scalable = train_one(ScalablePPO, make_env, total_timesteps, policy, device, **common, **(scalable_kwargs or {}))
    return baseline, scalable  # type: ignore[return-value]


def train_one(
    cls: type[PPO], make_env: Callable[[], Any] | str, total_timesteps: int, policy: str, device: str, **kwargs: Any
) -> PPO:
    env = make_env if isinstance(make_env, str) else make_env()
    model = cls(policy, env, seed=0, device=device, **kwargs)
    model.set_logger(RecordingLogger())
    model.learn(total_timesteps)
    return model


def unused_logger() -> Logger:
    return configure(None, [])


#: ``python -c`` program: the ``sb3-ppo-scale`` CLI (argv[4:]), except that after ``argv[1]`` calls of the trial
#: training function the next trial blocks inside its objective (its parameters already suggested and stored, its
#: state RUNNING) until the process is killed; ``argv[2]`` (if not "-") sets the RDB heartbeat interval in seconds;
#: ``argv[3]`` (if not "-") is the host name the worker writes into its trials (a worker on another machine).
#: The kill then lands mid-trial by construction, not by catching a timing window.
_GATED_TUNE = """
import os, sys, threading
from sb3_ppo_scale.tuning import objective, runner, storage
n_free, heartbeat, host = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if heartbeat != "-":
    storage.HEARTBEAT_INTERVAL_S = int(heartbeat)
if host != "-":
    runner.worker_id = lambda: f"{host}:{os.getpid()}"
train_and_evaluate, calls = objective.train_and_evaluate, []
def gated(*args, **kwargs):
    calls.append(None)
    if len(calls) > n_free:
        print("gate: trial blocked until killed", flush=True)
        threading.Event().wait()
    return train_and_evaluate(*args, **kwargs)
objective.train_and_evaluate = gated
from sb3_ppo_scale.cli import main
sys.exit(main(sys.argv[4:]))
"""


def start_gated_tune(
    args: Sequence[str], free_trainings: int, heartbeat_interval_s: int | None = None, host: str | None = None
) -> subprocess.Popen[str]:
    """Start ``sb3-ppo-scale <args>`` in its own process group (kill it with ``os.killpg``): the first
    ``free_trainings`` trainings run, the next trial hangs mid-trial (see ``_GATED_TUNE``)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    options = ["-" if value is None else str(value) for value in (heartbeat_interval_s, host)]
    return subprocess.Popen([sys.executable, "-c", _GATED_TUNE, str(free_trainings), *options, *args], cwd=ROOT,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(condition: Callable[[], T | None], what: str, process: subprocess.Popen[str] | None = None,
             timeout_s: float = 600.0, poll_s: float = 0.2) -> T:
    """Poll ``condition()`` until it returns a truthy value and return it. Fails if ``process`` exits first, or
    after ``timeout_s`` (a safety net for a hung run, not a timing window the test depends on)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            output = process.communicate()[0]
            pytest.fail(f"the process exited ({process.returncode}) before {what}:\n{output[-3000:]}")
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def kill_mid_trial(process: subprocess.Popen[str], trials: Callable[[], list[Any]], n_params: int) -> Any:
    """Wait until the storage read by ``trials()`` holds a COMPLETE trial and a RUNNING one with all ``n_params``
    parameters (the trial a ``start_gated_tune`` process hangs in), SIGKILL the process group, reap it, and return
    that trial as the storage holds it once the process is dead: every write the worker made before the kill is in
    it (one CI run's read while the worker was writing showed the trial's parameters without the user attribute the
    worker writes before them; never reproduced in isolation)."""
    from optuna.trial import TrialState

    def running_after_a_complete_one() -> Any:
        current = trials()
        running = [t for t in current if t.state == TrialState.RUNNING and len(t.params) == n_params]
        return running[0] if running and any(t.state == TrialState.COMPLETE for t in current) else None

    try:
        victim = wait_for(running_after_a_complete_one, "a RUNNING trial with all its parameters", process)
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    assert process.returncode == -signal.SIGKILL
    after = {t.number: t for t in trials()}[victim.number]
    assert after.state == TrialState.RUNNING and after.params == victim.params  # killed mid-trial, nothing after
    return after
