"""The learning benchmark's report (experiments/learning_report.py, its aggregate over tasks in
learning_over_tasks.py, its curves in learning_curves.py): per-task tables with IQM and mean, the aggregate over
tasks, probability of improvement, the PNGs; built from synthetic run files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sb3_ppo_scale.experiments import bench, learning_curves as curves, learning_over_tasks as across
from sb3_ppo_scale.experiments import learning_report as report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run_file(runs: Path, algo: str, seed: int, scale: float, final: float, task: str = "T",
              box: dict[str, float] | None = None) -> None:
    """One run of ``budget`` 10 steps: evaluations at 0 and 10, training time 4 x ``scale`` s."""
    curve = [{"steps": 0, "train_s": 0.0, "cpu_s": 0.0, "return": 0.0, "length": 10.0, "forward_distance": 0.0},
             {"steps": 10, "train_s": 4.0 * scale, "cpu_s": 3.0 * scale, "return": final, "length": 1000.0,
              "forward_distance": final / 1000}]
    (runs / f"{task}__{algo}__seed{seed}.json").write_text(json.dumps({
        "task": task, "algo": algo, "seed": seed, "budget": 10, "entry": f"{task}@cpu", "steps": 10,
        "train_s": 4.0 * scale, "cpu_s": 3.0 * scale, "final_return": final, "final_length": 1000.0,
        "final_forward_distance": final / 1000, "steps_per_s": 10 / (4.0 * scale), "curve": curve,
        **({"box": box} if box else {})}))


def _runs_folder(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    runs.mkdir()
    return runs


def test_threshold_floor_lies_above_the_hopper_plateau() -> None:
    standing = [{"final_return": 1000.0}] * 3
    assert report.task_threshold("Hopper-v5", standing, 0.9) == 1500.0
    assert report.task_threshold("Hopper-v5", [{"final_return": 3000.0}], 0.9) == pytest.approx(2700.0)
    assert report.task_threshold("Hopper-v5", [], 0.9) == 1500.0
    assert np.isnan(report.task_threshold("T", [], 0.9))
    assert report.task_threshold("T", standing, 0.5) == 500.0
    # Ant-v5 earns ~1000 standing still, Humanoid-v5 ~5000: a collapsed baseline does not set the bar at its return
    assert report.task_threshold("Ant-v5", [{"final_return": -2.0}], 0.9) == 1500.0
    assert report.task_threshold("Humanoid-v5", [{"final_return": 5000.0}], 0.9) == 6000.0


def test_a_baseline_that_never_reaches_the_threshold_gives_a_lower_bound(tmp_path: Path) -> None:
    runs = _runs_folder(tmp_path)
    for seed in (0, 1):
        _run_file(runs, "sb3_ppo", seed, 4.0, 1000.0 * seed)  # seed 1 reaches 900 after 16 s, seed 0 never
        _run_file(runs, "scalable_ppo@cpu", seed, 1.0, 2000.0)  # reaches it after 4 s
    summary = report.summarise(report.load_results(tmp_path), 0.9 / 0.5)  # threshold 0.9 / 0.5 x 500 = 900
    text = "\n".join(report._baseline_lines(summary))
    assert ("- T, scalable_ppo@cpu: time to threshold >= 4.00x (sb3_ppo reached it on 1 of 2 seeds; a seed that "
            "never did counts its whole training time)") in text
    assert "| 900 | reached on 1 of 2 seeds |" in "\n".join(report.time_table(summary))
    header = "\n".join(report._header(summary, 0.9, "cmd", "box"))
    assert "the task's floor above known plateaus: none for these tasks)" in header


def test_late_return_and_return_at_a_budget() -> None:
    curve = [{"steps": k * 100, "return": float(r)} for k, r in enumerate((0, 500, 900, 1700, 3000, 3300, 3100,
                                                                           3200, 3400, 3000, 1600))]
    run = {"budget": 1000, "curve": curve}
    assert report.late_return(run) == pytest.approx((3400 + 3000 + 1600) / 3)  # steps 800, 900, 1000: the last 20%
    assert report.return_at(run, 300) == 1700 and report.return_at(run, 250) == 1700
    assert np.isnan(report.return_at(run, 1001))


def test_report_separates_config_and_plugin_effects(tmp_path: Path) -> None:
    runs = _runs_folder(tmp_path)
    for seed in (0, 1):
        _run_file(runs, "sb3_ppo", seed, 4.0, 1000.0)
        _run_file(runs, "sb3_ppo@cpu", seed, 2.0, 2000.0 + seed)
        _run_file(runs, "scalable_ppo@cpu", seed, 1.0, 2010.0 + 3 * seed)
    summary = report.summarise(report.load_results(tmp_path), 0.9)
    assert list(summary["T"]["algos"]) == ["sb3_ppo", "sb3_ppo@cpu", "scalable_ppo@cpu"]
    assert summary["T"]["algos"]["sb3_ppo@cpu"]["final_forward_distance"]["mean"].point == pytest.approx(2.0005)
    text = report.write_markdown(summary, tmp_path, 0.9, "cmd").read_text()
    assert "- T, sb3_ppo@cpu: time to threshold 2.00x, training time 2.00x" in text  # the config's effect
    assert ("- T, scalable_ppo@cpu vs sb3_ppo@cpu (entry `T@cpu`): training time ratio (PPO / ScalablePPO) "
            "2.00 [2.00, 2.00], CPU time ratio 2.00 [2.00, 2.00], final return 11 [10, 12] higher (per seed); "
            "evaluation returns identical on 0 of 2 seeds") in text  # the plugin's effect
    # returns: IQM and mean (equal with 2 seeds) of final and late return (1 evaluation in the last 20%: the same),
    # forward distance; mean episode length
    assert ("| T | sb3_ppo@cpu (`T@cpu`) | 10 | 2 | 2000 [2000, 2001] | 2000 [2000, 2001] | 2000 [2000, 2001] | "
            "2000 [2000, 2001] | 2.0 [2.0, 2.0] | 2.0 [2.0, 2.0] | 1000 [1000, 1000] |") in text
    assert "at the baseline's budget" not in text  # only for runs longer than the baseline's
    # time: 0.9 x sb3_ppo's 1000; steps, s, CPU s to threshold; train s, CPU s, steps/s
    assert "| T | sb3_ppo@cpu | 900 | 10 [10, 10] | 8.0 [8.0, 8.0] | 6.0 [6.0, 6.0] | 8.0 [8.0, 8.0] |" in text
    summary = report.summarise(report.load_results(tmp_path), 1.2)  # above the baseline's own return (1000)
    assert "| 1200 | reached on 0 of 2 seeds | reached on 0 of 2 seeds |" in "\n".join(report.time_table(summary))
    args = bench.build_parser().parse_args(["--tasks", "T", "--out", "o", "--report-only"])
    assert bench.command_line("cmd", args, report.load_results(tmp_path)) == (
        "cmd --tasks T --algos sb3_ppo sb3_ppo@cpu scalable_ppo@cpu --no-pairs --seeds 0 1 --budget 10 "
        "--eval-every 10000 --eval-episodes 5 --final-episodes 10 --baseline sb3_ppo --threshold-frac 0.9 --out o")
    args = bench.build_parser().parse_args(["--config", "my.yml", "--tasks", "T", "--out", "o", "--report-only"])
    assert bench.command_line("cmd", args, report.load_results(tmp_path)).startswith("cmd --config my.yml --tasks T ")
    longer = json.loads((runs / "T__scalable_ppo@cpu__seed0.json").read_text())
    longer.update(algo="scalable_ppo@long", budget=20, curve=[*longer["curve"], {**longer["curve"][-1], "steps": 20,
                                                                                  "return": 5000.0}])
    (runs / "T__scalable_ppo@long__seed0.json").write_text(json.dumps(longer))
    text = report.write_markdown(report.summarise(report.load_results(tmp_path), 0.9), tmp_path, 0.9, "cmd").read_text()
    assert "at the baseline's budget (10 steps) its return is IQM 2010 [2010, 2010], mean 2010 [2010, 2010]" in text
    # the default random-policy score: Gymnasium does not know T, so T has no normalised score
    assert "| T | n/a | n/a | left out: Gymnasium cannot make it, so it has no random-policy score |" in text
    assert "No task normalises: no aggregate over tasks." in text


def test_returns_are_reported_as_iqm_and_mean(tmp_path: Path) -> None:
    runs = _runs_folder(tmp_path)
    for seed, final in enumerate((100.0, 200.0, 300.0, 1000.0)):
        _run_file(runs, "sb3_ppo", seed, 1.0, final)
    stats = report.summarise(report.load_results(tmp_path), 0.9)["T"]["algos"]["sb3_ppo"]
    assert stats["final_return"]["iqm"].point == pytest.approx(250.0)  # the middle two seeds
    assert stats["final_return"]["mean"].point == pytest.approx(400.0)
    row = report.returns_table({"T": {"algos": {"sb3_ppo": stats}}})[2]
    assert row.startswith("| T | sb3_ppo (`T@cpu`) | 10 | 4 | 250 [") and "| 400 [" in row


def _two_tasks(tmp_path: Path) -> Path:
    """sb3_ppo and scalable_ppo@cpu on A-v0 and B-v0, 3 seeds each, every scalable run above every sb3 run;
    scalable_ppo@gpu on A-v0 only."""
    runs = _runs_folder(tmp_path)
    for task in ("A-v0", "B-v0"):
        for seed in (0, 1, 2):
            _run_file(runs, "sb3_ppo", seed, 2.0, 100.0 + seed, task, box={"cores": 2, "workers": 1,
                                                                             "load_avg_1min": 1.0, "env_step_us": 42.0})
            _run_file(runs, "scalable_ppo@cpu", seed, 1.0, 200.0 + seed, task)
    for seed in (0, 1, 2):
        _run_file(runs, "scalable_ppo@gpu", seed, 1.0, 50.0 + seed, "A-v0")
    return tmp_path


def test_over_tasks_improvement_and_pngs(tmp_path: Path) -> None:
    out = _two_tasks(tmp_path)
    asked: list[str] = []

    def random_return(task: str) -> float:
        asked.append(task)
        return 0.0

    paths = report.write_report(report.load_results(out), out, 0.9, "sb3_ppo", "cmd", random_return=random_return)
    assert asked == ["A-v0", "B-v0"]  # one random-policy score per task
    assert [p.name for p in paths] == ["learning_summary.md", "performance_profile.png", "learning_A-v0.png",
                                       "learning_B-v0.png"]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths[1:])
    text = paths[0].read_text()
    # no reference return for these tasks: the best label's mean final return (scalable_ppo@cpu, 201) is 1
    assert "| A-v0 | 0 | 201 | the best label's mean final return (scalable_ppo@cpu) |" in text
    assert "| scalable_ppo@cpu | 3 | 1.00 [" in text and "| sb3_ppo | 3 | 0.50 [" in text
    assert "- scalable_ppo@gpu left out: no runs on B-v0." in text  # not on every task: not aggregated
    assert "| scalable_ppo@gpu |" not in text.split("## Over tasks")[1].split("Probability")[0]
    assert "- scalable_ppo@cpu over sb3_ppo (A-v0, B-v0; 3 against 3 seeds): 1.00 [1.00, 1.00]" in text
    assert "- scalable_ppo@gpu over sb3_ppo (A-v0; 3 against 3 seeds): 0.00 [0.00, 0.00]" in text
    assert "over the strongest config per task" not in text  # sb3_ppo on both tasks: the lines above say it
    over = across.over_tasks(report.summarise(report.load_results(out), 0.9), lambda task: 0.0)
    assert over.tasks == ["A-v0", "B-v0"] and sorted(over.scores) == ["sb3_ppo", "scalable_ppo@cpu"]
    np.testing.assert_allclose(over.scores["sb3_ppo"], np.array([[100.0, 100.0], [101.0, 101.0], [102.0, 102.0]]) / 201)


def test_reference_returns_and_tasks_that_do_not_normalise(tmp_path: Path) -> None:
    out = _two_tasks(tmp_path)
    summary = report.summarise(report.load_results(out), 0.9)
    hopper = across.normalisation("Hopper-v5", summary["A-v0"]["algos"], lambda task: 18.0)
    assert hopper == across.Normalisation(18.0, 3400.0, "the learning issue's target")
    assert across.normalisation("A-v0", summary["A-v0"]["algos"], lambda task: 500.0) == (
        "its reference return 201 is not above the random policy's 500")
    over = across.over_tasks(summary, lambda task: 0.0 if task == "A-v0" else None)
    assert over.tasks == ["A-v0"] and sorted(over.scores) == ["sb3_ppo", "scalable_ppo@cpu", "scalable_ppo@gpu"]


def test_random_policy_return_is_seeded_and_none_for_an_unknown_env() -> None:
    first = across.random_policy_return("CartPole-v1", episodes=3)
    assert first == across.random_policy_return("CartPole-v1", episodes=3)
    assert 8.0 <= first <= 100.0  # a random CartPole policy falls within a few dozen steps
    assert across.random_policy_return("NoSuchEnv-v0") is None


def test_box_line_and_env_step_cost() -> None:
    runs = [{"task": "T", "box": {"cores": 2, "workers": 2, "load_avg_1min": load, "env_step_us": us}}
            for load, us in ((2.1, 10.0), (2.4, 30.0))] + [{"task": "T"}]
    line = report.box_line(runs)
    assert "2 at a time on a 2-core box" in line and "2.1-2.4" in line and "T 20 us (from 10 to 30 us" in line
    assert "differ by up to 3.0x from the box alone" in line
    close = [{"task": "T", "box": {**runs[0]["box"], "env_step_us": us}} for us in (18.0, 22.0)]
    assert "T 20 us." in report.box_line(close)  # boxes within 1.5x: no range
    assert "1 older runs did not record it" in line
    assert curves.env_step_us(runs, "T") == 20.0 and curves.env_step_us(runs, "U") is None
    assert curves.step_cost_title(runs, "T").startswith("raw env step: 20 us (gym.make")
    assert curves.step_cost_title(runs, "U") == "raw env step: not recorded for these runs"
    assert "not recorded" in report.box_line([{"task": "T"}])
    dated = [{"task": "T", "box": {**run["box"], "date": day}} for run, day in zip(runs, ("2026-12-01", "2026-12-04"))]
    assert report.box_line(dated).startswith("Runs started 2026-12-01 to 2026-12-04. Each run: one process")


def test_final_returns_are_compared_without_a_misleading_ratio_when_negative() -> None:
    assert report._final_return_against(-182.0, -255.0, "recurrent_ppo") == (
        "final return -182 against recurrent_ppo's -255")
    assert report._final_return_against(8.0, 8.0, "maskable_ppo") == "final return 8 against maskable_ppo's 8 (1.00x)"


def test_improvement_over_every_config_of_the_extended_class(tmp_path: Path) -> None:
    out = _two_tasks(tmp_path)
    runs = out / "runs"
    _run_file(runs, "sb3_ppo@const", 0, 2.0, 150.0, "A-v0")  # one seed, above the baseline on A-v0 only
    _run_file(runs, "sb3_ppo@const", 0, 2.0, 90.0, "B-v0")
    summary = report.summarise(report.load_results(out), 0.9)
    assert across.strongest_extended_label(summary["A-v0"]) == "sb3_ppo@const"
    assert across.strongest_extended_label(summary["B-v0"]) == "sb3_ppo"
    assert across.strongest_extended_label({"algos": {"scalable_ppo@cpu": {}}}) is None
    text = report.write_markdown(summary, out, 0.9, "cmd", over=across.over_tasks(summary, lambda task: 0.0)
                                 ).read_text()
    assert ("per task (the highest final-return IQM among their labels): A-v0 sb3_ppo@const (1 seed, not the "
            "baseline); B-v0 sb3_ppo (3 seeds).") in text
    improvement = text.split("Probability of improvement over each config")[1]
    assert improvement.index("over sb3_ppo (") < improvement.index("over sb3_ppo@const (")  # the baseline first
    assert "- scalable_ppo@cpu over sb3_ppo@const (A-v0, B-v0; 3 against 1 seeds): 1.00 [1.00, 1.00]" in text
    assert "- scalable_ppo@gpu over sb3_ppo@const (A-v0; 3 against 1 seeds): 0.00 [0.00, 0.00]" in text
    # against each task's strongest config at once: sb3_ppo@const's seed 0 on A-v0, sb3_ppo's seed 0 on B-v0
    assert ("- scalable_ppo@cpu over the strongest config per task (A-v0 sb3_ppo@const, B-v0 sb3_ppo; 3 against 1 "
            "seeds): 1.00 [1.00, 1.00]") in text
    assert ("- scalable_ppo@gpu over the strongest config per task (A-v0 sb3_ppo@const; 3 against 1 seeds): "
            "0.00 [0.00, 0.00]") in text


def test_a_search_among_scalable_configs_gets_improvement_over_its_baseline(tmp_path: Path) -> None:
    runs = _runs_folder(tmp_path)
    for seed in (0, 1):
        _run_file(runs, "scalable_ppo@a", seed, 1.0, 1000.0 + seed)
        _run_file(runs, "scalable_ppo@b", seed, 1.0, 2000.0 + seed)
    summary = report.summarise(report.load_results(tmp_path), 0.9, baseline="scalable_ppo@a")
    text = report.write_markdown(summary, tmp_path, 0.9, "cmd").read_text()
    assert "Probability of improvement over the baseline (scalable_ppo@a): P(a run of the label" in text
    assert "- scalable_ppo@b over scalable_ppo@a (T; 2 against 2 seeds): 1.00 [1.00, 1.00]" in text
    assert "over each config of the extended classes" not in text


def test_each_curve_is_placed_against_the_baselines_band(tmp_path: Path) -> None:
    runs = _runs_folder(tmp_path)
    for seed in (0, 1):
        _run_file(runs, "sb3_ppo", seed, 1.0, 1000.0 + seed)
        _run_file(runs, "scalable_ppo@cpu", seed, 1.0, 2000.0 + seed)  # from 0 like the baseline, then above it
        _run_file(runs, "scalable_ppo@gpu", seed, 1.0, 1000.5)
    text = report.write_markdown(report.summarise(report.load_results(tmp_path), 0.9), tmp_path, 0.9, "cmd").read_text()
    assert "; IQM return curve inside sb3_ppo's 95% band at 1 of 2 evaluations (above it at 10 steps)" in text
    assert "; IQM return curve inside sb3_ppo's 95% band at 2 of 2 evaluations\n" in text  # scalable_ppo@gpu
    loaded = report.load_results(tmp_path)
    other_steps = [dict(r, curve=[dict(p, steps=p["steps"] + 1) for p in r["curve"]]) for r in loaded
                   if r["algo"] == "scalable_ppo@cpu"]
    assert curves.curve_against_band(other_steps, [r for r in loaded if r["algo"] == "sb3_ppo"]) is None
