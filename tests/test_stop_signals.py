"""sb3_ppo_scale.stop_signals: a stop signal is recorded instead of killing the process, forwarded to workers, ends
learn() at the next env step, and the previous handlers come back after the block."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from sb3_ppo_scale import stop_signals


@pytest.fixture(autouse=True)
def no_signal_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stop_signals, "_received", [])  # this process's record, restored afterwards


def test_a_signal_in_the_block_is_recorded_and_the_old_handler_comes_back(capfd: pytest.CaptureFixture[str]) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with stop_signals.handling(what="the test"):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop_signals.received() == signal.SIGTERM
        with pytest.raises(stop_signals.StopSignalled, match="stopped by SIGTERM") as stopped:
            stop_signals.check()
        assert stopped.value.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    assert capfd.readouterr().err == "received SIGTERM: stopping the test\n"  # one line, no traceback


def test_no_signal_no_stop() -> None:
    stop_signals.check()
    assert stop_signals.received() is None


def test_a_signal_is_forwarded_to_the_workers_as_asked() -> None:
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with stop_signals.handling(forward_to=lambda: [worker.pid], forward_as=signal.SIGTERM):
            os.kill(os.getpid(), signal.SIGINT)
        assert worker.wait(timeout=30) == -signal.SIGTERM
        assert stop_signals.received() == signal.SIGINT
    finally:
        worker.kill()


def test_learn_stops_at_the_next_env_step_after_a_signal() -> None:
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
    stop_signals.remember(signal.SIGTERM)  # as a handler does when the signal arrives
    with pytest.raises(stop_signals.StopSignalled):
        model.learn(total_timesteps=128, callback=stop_signals.StopOnSignal())
    assert model.num_timesteps == 1  # the env step during which it arrived, no more
