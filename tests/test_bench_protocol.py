"""The learning benchmark's protocol: labels and SB3 pairs, forward distance, rerun commands, what a run records
(the report that reads the runs: tests/test_learning_report.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

from sb3_ppo_scale.experiments import bench


def test_labels_pairs_and_errors() -> None:
    assert bench.parse_label("sb3_ppo") == ("sb3_ppo", None)
    assert bench.parse_label("scalable_ppo@gpu") == ("scalable_ppo", "gpu")
    assert bench.parse_label("scalable_ppo") == ("scalable_ppo", "cpu")  # the earlier results' label
    assert bench.parse_label("scalable_ppo@plain") == ("scalable_ppo", None)  # the plain entry, as sb3_ppo's
    assert bench.with_pairs(["scalable_ppo@plain"]) == ["scalable_ppo@plain", "sb3_ppo"]
    assert bench.with_pairs(["sb3_ppo", "scalable_ppo@cpu", "sb3_ppo@cpu", "scalable_ppo_gpu"]) == [
        "sb3_ppo", "scalable_ppo@cpu", "sb3_ppo@cpu", "scalable_ppo_gpu", "sb3_ppo@gpu"]
    for bad in ("ppo@cpu", "sb3_ppo@", "scalable"):
        with pytest.raises(ValueError, match="--algos"):
            bench.parse_label(bad)


def test_forward_distance_is_x_now_minus_x_at_reset() -> None:
    env = bench.ForwardDistance(gym.make("Hopper-v5"))
    _, reset_info = env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        *_, info = env.step(rng.uniform(-1, 1, size=3).astype(np.float32))
        assert info["forward_distance"] == pytest.approx(info["x_position"] - reset_info["x_position"], abs=1e-12)
    _, reset_info = env.reset(seed=4)
    *_, info = env.step(np.zeros(3, dtype=np.float32))
    assert info["forward_distance"] == pytest.approx(info["x_position"] - reset_info["x_position"], abs=1e-12)
    cartpole = bench.ForwardDistance(gym.make("CartPole-v1"))  # no MuJoCo data, no x_position: nothing added
    cartpole.reset(seed=0)
    assert "forward_distance" not in cartpole.step(0)[-1]


def test_rerun_commands_group_runs_by_budget_and_evaluation_settings() -> None:
    args = bench.build_parser().parse_args(["--out", "o", "--report-only"])
    old = {"task": "T", "algo": "sb3_ppo", "seed": 0, "budget": 1000, "hyperparams": {"n_steps": 512, "n_envs": 1},
           "curve": [{"steps": s} for s in (0, 50176, 100352, 1000)]}  # evaluation settings not recorded
    new = {"task": "T", "algo": "scalable_ppo@gpu_kl", "seed": 1, "budget": 3000, "eval_every": 100, "eval_episodes": 2,
           "final_episodes": 3, "curve": []}
    assert bench.evaluation_settings(old, args) == (50000, 5, 10)  # the roundest eval_every in (49664, 50176]
    commands = bench.command_line("cmd", args, [old, new]).split("; ")
    assert commands[0].startswith("cmd --tasks T --algos sb3_ppo --no-pairs --seeds 0 --budget 1000 --eval-every 50000 ")
    assert "--seeds 1 --budget 3000 --eval-every 100 --eval-episodes 2 --final-episodes 3 " in commands[1]


def test_sb3_pair_drops_execution_only_keys_and_skips_other_plugin_keys(tmp_path: Path) -> None:
    entry = {"policy": "MlpPolicy", "n_timesteps": 256, "n_envs": 2, "n_steps": 64, "batch_size": 64,
             "n_epochs": 1, "grad_accum_steps": 2}
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump({"Hopper-v5@x": entry, "Hopper-v5@kl": {**entry, "objective": "kl"},
                                      "Hopper-v5@kl_lr": {**entry, "learning_rate": "kl_adaptive_1e-3"}}))
    out = tmp_path / "r.json"
    assert bench.run_one("Hopper-v5", "sb3_ppo@x", 0, 128, 64, 1, 1, str(config), str(out)) == str(out)
    result = json.loads(out.read_text())
    assert result["dropped_for_sb3"] == ["grad_accum_steps"] and "grad_accum_steps" not in result["hyperparams"]
    assert result["steps"] == 128 and [p["steps"] for p in result["curve"]] == [0, 128]
    assert 1 <= result["final_length"] <= 1000 and isinstance(result["final_forward_distance"], float)
    assert result["final_return"] == result["curve"][-1]["return"] and result["curve"][-1]["train_length"] > 0
    skipped = bench._try_run("Hopper-v5", "sb3_ppo@kl", 0, 128, 64, 1, 1, str(config), str(tmp_path / "kl.json"))
    assert skipped.startswith("skipped Hopper-v5 sb3_ppo@kl seed 0") and "objective" in skipped
    assert not (tmp_path / "kl.json").exists()
    # SB3 PPO would take a KLAdaptiveLR as a constant schedule: refused, not run with another config
    skipped = bench._try_run("Hopper-v5", "sb3_ppo@kl_lr", 0, 128, 64, 1, 1, str(config), str(tmp_path / "lr.json"))
    assert skipped.startswith("skipped Hopper-v5 sb3_ppo@kl_lr seed 0") and "kl_adaptive" in skipped
    assert not (tmp_path / "lr.json").exists()


def test_box_conditions_are_recorded() -> None:
    box = bench.box_conditions("CartPole-v1", workers=2, steps=50)
    assert box["cores"] >= 1 and box["workers"] == 2 and box["load_avg_1min"] >= 0 and box["env_step_us"] > 0
    assert bench.box_conditions("NoSuchEnv-v0", workers=1, steps=5)["env_step_us"] is None
    assert box["date"] == time.strftime("%Y-%m-%d", time.gmtime())
