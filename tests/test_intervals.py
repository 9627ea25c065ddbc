"""experiments/intervals.py: rliable's interval estimates as the learning reports use them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sb3_ppo_scale.experiments import intervals


def test_one_task_mean_and_iqm_with_a_bootstrap_interval() -> None:
    estimates = intervals.aggregates([1.0, 2.0, 3.0, 10.0])
    assert estimates["mean"].point == pytest.approx(4.0)
    assert estimates["iqm"].point == pytest.approx(2.5)  # the middle half: 2 and 3
    mean = estimates["mean"]
    assert 1.0 <= mean.low < mean.point < mean.high <= 10.0
    assert intervals.aggregates([1.0, 2.0, 3.0, 10.0]) == estimates  # seeded: a rebuilt report prints the same


def test_constant_infinite_and_missing_scores() -> None:
    assert intervals.mean([5.0, 5.0]) == intervals.Estimate(5.0, 5.0, 5.0)
    assert intervals.mean([1.0, float("inf")]).text() == "not reached (some seeds)"
    assert intervals.mean([]).text() == "n/a"
    assert intervals.Estimate(3412.4, 3150.0, 3590.2).text() == "3412 [3150, 3590]"


def test_the_interval_resamples_seeds_within_each_task() -> None:
    """Stratified: every resample keeps 3 runs of each task, so a task whose seeds agree adds no width; the
    aggregate's interval is that of the other task's seeds, halved (the mean of two tasks)."""
    scores = np.array([[0.0, 1.0], [0.0, 2.0], [0.0, 3.0]])
    both = intervals.aggregates(scores)["mean"]
    second = intervals.aggregates(scores[:, 1])["mean"]
    assert both.point == pytest.approx(1.0)
    assert both.low == pytest.approx(second.low / 2, rel=0.1) and both.high == pytest.approx(second.high / 2, rel=0.1)


def test_probability_of_improvement() -> None:
    better = np.array([[2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])
    worse = better - 100.0  # every run of better beats every run of worse on both tasks
    assert intervals.probability_of_improvement(better, worse).point == pytest.approx(1.0)
    assert intervals.probability_of_improvement(worse, better).point == pytest.approx(0.0)
    assert intervals.probability_of_improvement(better, better).point == pytest.approx(0.5)  # ties count half
    with pytest.raises(ValueError, match="x has 2 tasks, y 1"):
        intervals.probability_of_improvement(better, worse[:, :1])


def test_normalised_scores_and_a_bad_reference() -> None:
    scores = intervals.normalised(np.array([[10.0, 0.0], [110.0, 50.0]]), zero=[10.0, -50.0], one=[110.0, 50.0])
    np.testing.assert_allclose(scores, [[0.0, 0.5], [1.0, 1.0]])
    with pytest.raises(ValueError, match="every reference must be above its zero"):
        intervals.normalised(np.zeros((2, 1)), zero=[1.0], one=[1.0])


def test_performance_profile_png(tmp_path: Path) -> None:
    scores = {"ours": np.array([[0.9, 0.8], [1.0, 0.7]]), "theirs": np.array([[0.5, 0.4], [0.6, 0.2]])}
    path = intervals.performance_profile_png(scores, tmp_path / "profile.png", "normalised score", "a test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_ratio_of_means_resamples_each_group() -> None:
    ratio = intervals.ratio_of_means([2.0, 2.2, 1.8], [1.0, 1.1, 0.9])
    assert ratio.point == pytest.approx(2.0)
    assert 1.5 < ratio.low < 2.0 < ratio.high < 2.5
    assert intervals.ratio_of_means([1.0], [0.0]).text() == "n/a"  # no ratio to a zero mean
