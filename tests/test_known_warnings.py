"""The demo and the CLI drop MuJoCo's known 'settotalmass is deprecated' warning, and only that one."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from sb3_ppo_scale.envs.known_warnings import filter_known_warnings, _mujoco_warning
import gymnasium as gym
if sys.argv[1] == "filtered":
    filter_known_warnings()
gym.make("HalfCheetah-v5").close()
_mujoco_warning("another MuJoCo warning")
"""


def _stderr(mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_known_mujoco_warning_is_dropped_and_others_are_printed() -> None:
    assert "settotalmass" in _stderr("plain")  # the warning exists: the filter has something to do
    filtered = _stderr("filtered")
    assert "settotalmass" not in filtered
    assert "WARNING: another MuJoCo warning" in filtered


TUNE = """
import sys
from sb3_ppo_scale.tuning import spec_from_dict
from sb3_ppo_scale.tuning.runner import tune
spec = spec_from_dict({"name": "warn", "envs": ["HalfCheetah-v5"], "timesteps": 128,
                       "evaluation": {"eval_freq": 64, "n_episodes": 1},
                       "base": {"n_steps": 32, "n_envs": 2, "n_epochs": 1, "policy_kwargs": {"net_arch": [8]}},
                       "space": {"clip_range": {"type": "float", "low": 0.1, "high": 0.3}},
                       "sampler": {"name": "random", "seed": 0}, "output_dir": sys.argv[1]})
assert tune(spec, n_trials=2, workers=2, storage="sqlite:///" + sys.argv[1] + "/s.db") == 0
"""


def test_tune_workers_drop_the_known_warning(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Spawned tune workers install the filter themselves (they do not inherit the CLI's handler)."""
    done = subprocess.run([sys.executable, "-c", TUNE, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "trial    1 COMPLETE" in done.stdout + done.stderr and "settotalmass" not in done.stderr
