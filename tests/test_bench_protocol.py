"""The learning benchmark's protocol: labels and SB3 pairs, forward distance, threshold floors, the plugin table."""

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


def test_threshold_floor_lies_above_the_hopper_plateau() -> None:
    standing = [{"final_return": 1000.0}] * 3
    assert bench.task_threshold("Hopper-v5", standing, 0.9) == 1500.0
    assert bench.task_threshold("Hopper-v5", [{"final_return": 3000.0}], 0.9) == pytest.approx(2700.0)
    assert bench.task_threshold("Hopper-v5", [], 0.9) == 1500.0
    assert np.isnan(bench.task_threshold("T", [], 0.9))
    assert bench.task_threshold("T", standing, 0.5) == 500.0


def _run_file(runs: Path, algo: str, seed: int, scale: float, final: float) -> None:
    curve = [{"steps": 0, "train_s": 0.0, "cpu_s": 0.0, "return": 0.0, "length": 10.0, "forward_distance": 0.0},
             {"steps": 10, "train_s": 4.0 * scale, "cpu_s": 3.0 * scale, "return": final, "length": 1000.0,
              "forward_distance": final / 1000}]
    (runs / f"T__{algo}__seed{seed}.json").write_text(json.dumps({
        "task": "T", "algo": algo, "seed": seed, "budget": 10, "entry": "T@cpu", "steps": 10,
        "train_s": 4.0 * scale, "cpu_s": 3.0 * scale, "final_return": final, "final_length": 1000.0,
        "final_forward_distance": final / 1000, "steps_per_s": 10 / (4.0 * scale), "curve": curve}))


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


def test_late_return_and_return_at_a_budget() -> None:
    curve = [{"steps": k * 100, "return": float(r)} for k, r in enumerate((0, 500, 900, 1700, 3000, 3300, 3100,
                                                                           3200, 3400, 3000, 1600))]
    run = {"budget": 1000, "curve": curve}
    assert bench.late_return(run) == pytest.approx((3400 + 3000 + 1600) / 3)  # steps 800, 900, 1000: the last 20%
    assert bench.return_at(run, 300) == 1700 and bench.return_at(run, 250) == 1700
    assert np.isnan(bench.return_at(run, 1001))


def test_report_separates_config_and_plugin_effects(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    for seed in (0, 1):
        _run_file(runs, "sb3_ppo", seed, 4.0, 1000.0)
        _run_file(runs, "sb3_ppo@cpu", seed, 2.0, 2000.0 + seed)
        _run_file(runs, "scalable_ppo@cpu", seed, 1.0, 2010.0 + 3 * seed)
    summary = bench.summarise(bench.load_results(tmp_path), 0.9)
    assert list(summary["T"]["algos"]) == ["sb3_ppo", "sb3_ppo@cpu", "scalable_ppo@cpu"]
    assert summary["T"]["algos"]["sb3_ppo@cpu"]["final_forward_distance"][0] == pytest.approx(2.0005)
    text = bench.write_markdown(summary, tmp_path, 0.9, "cmd").read_text()
    assert "- T, sb3_ppo@cpu: time to threshold 2.00x, training time 2.00x" in text  # the config's effect
    assert ("- T, scalable_ppo@cpu vs sb3_ppo@cpu (entry `T@cpu`): training time ratio (PPO / ScalablePPO) "
            "2.00 [2.00, 2.00], CPU time ratio 2.00 [2.00, 2.00], final return 11 [10, 12] higher (per seed); "
            "evaluation returns identical on 0 of 2 seeds") in text  # the plugin's effect
    assert "| 1000 [1000, 1000] | 2.0 [2.0, 2.0] |" in text  # episode length and forward distance columns
    assert "| 2000 [2000, 2001] | 2000 [2000, 2001] |" in text  # sb3_ppo@cpu: final return = late return (1 point)
    assert "at the baseline's budget" not in text  # only for runs longer than the baseline's
    assert "| 900 | 10 [10, 10] | 8.0 [8.0, 8.0] | 6.0 [6.0, 6.0] |" in text  # sb3_ppo@cpu: 0.9 x sb3_ppo's 1000
    summary = bench.summarise(bench.load_results(tmp_path), 1.2)  # above the baseline's own return (1000)
    assert "| 1200 | reached on 0 of 2 seeds | reached on 0 of 2 seeds |" in "\n".join(bench._table(summary))
    args = bench.build_parser().parse_args(["--tasks", "T", "--out", "o", "--report-only"])
    assert bench.command_line("cmd", args, bench.load_results(tmp_path)) == (
        "cmd --tasks T --algos sb3_ppo sb3_ppo@cpu scalable_ppo@cpu --no-pairs --seeds 0 1 --budget 10 "
        "--eval-every 10000 --eval-episodes 5 --final-episodes 10 --baseline sb3_ppo --threshold-frac 0.9 --out o")
    longer = json.loads((runs / "T__scalable_ppo@cpu__seed0.json").read_text())
    longer.update(algo="scalable_ppo@long", budget=20, curve=[*longer["curve"], {**longer["curve"][-1], "steps": 20,
                                                                                  "return": 5000.0}])
    (runs / "T__scalable_ppo@long__seed0.json").write_text(json.dumps(longer))
    text = bench.write_markdown(bench.summarise(bench.load_results(tmp_path), 0.9), tmp_path, 0.9, "cmd").read_text()
    assert "at the baseline's budget (10 steps) its return is 2010 [2010, 2010]" in text  # per sample, not the 5000


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


def test_box_conditions_are_recorded_and_summarised() -> None:
    box = bench.box_conditions("CartPole-v1", workers=2, steps=50)
    assert box["cores"] >= 1 and box["workers"] == 2 and box["load_avg_1min"] >= 0 and box["env_step_us"] > 0
    assert bench.box_conditions("NoSuchEnv-v0", workers=1, steps=5)["env_step_us"] is None
    runs = [{"task": "T", "box": {"cores": 2, "workers": 2, "load_avg_1min": load, "env_step_us": us}}
            for load, us in ((2.1, 10.0), (2.4, 30.0))] + [{"task": "T"}]
    line = bench._box_line(runs)
    assert "2 at a time on a 2-core box" in line and "2.1-2.4" in line and "T 20 us" in line
    assert "1 older runs did not record it" in line
    assert "not recorded" in bench._box_line([{"task": "T"}])
    assert box["date"] == time.strftime("%Y-%m-%d", time.gmtime())
    dated = [{"task": "T", "box": {**run["box"], "date": day}} for run, day in zip(runs, ("2026-12-01", "2026-12-04"))]
    assert bench._box_line(dated).startswith("Runs started 2026-12-01 to 2026-12-04. Each run: one process")


def test_final_returns_are_compared_without_a_misleading_ratio_when_negative() -> None:
    assert bench._final_return_against(-182.0, -255.0, "recurrent_ppo") == "final return -182 against recurrent_ppo's -255"
    assert bench._final_return_against(8.0, 8.0, "maskable_ppo") == "final return 8 against maskable_ppo's 8 (1.00x)"
