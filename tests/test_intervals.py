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
    assert intervals.Estimate(-0.004, -0.4, 0.3).text(2) == "0.00 [-0.40, 0.30]"  # no "-0.00"


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


def test_iqm_curve_and_its_band() -> None:
    returns = np.array([[1.0, 5.0, 500.0], [2.0, 6.0, 500.0], [3.0, 7.0, 500.0], [10.0, 8.0, 500.0]])
    iqm, low, high = intervals.iqm_curve(returns)
    np.testing.assert_allclose(iqm, [2.5, 6.5, 500.0])  # each evaluation's middle two seeds
    assert np.all(low <= iqm) and np.all(iqm <= high) and low[0] >= 1.0 and high[0] <= 10.0 and low[0] < high[0]
    assert low[2] == high[2] == 500.0  # the seeds agree: no width
    single = intervals.iqm_curve(returns[:1])
    for curve in single:
        np.testing.assert_allclose(curve, returns[0])


def test_named_lists_in_one_bootstrap_match_one_call_each() -> None:
    seeds = {"return": [1.0, 2.0, 3.0, 10.0], "seconds": [4.0, 4.0, 4.0, 4.0], "old": [1.0, None, 2.0, 3.0],
             "reached": [5.0, float("inf"), 6.0, 7.0]}
    estimates = intervals.aggregates_by_name(seeds)
    alone = intervals.aggregates(seeds["return"])
    for kind in ("iqm", "mean"):
        assert estimates["return"][kind].point == pytest.approx(alone[kind].point)
        assert estimates["return"][kind].low == pytest.approx(alone[kind].low, abs=0.3)
        assert estimates["return"][kind].high == pytest.approx(alone[kind].high, abs=0.3)
    assert estimates["return"]["iqm"].point == pytest.approx(2.5)
    assert estimates["seconds"]["mean"] == intervals.Estimate(4.0, 4.0, 4.0)
    assert estimates["old"]["mean"].text() == "n/a" and estimates["reached"]["iqm"].text() == "not reached (some seeds)"
    one_seed = intervals.aggregates_by_name({"x": [3.0]})["x"]["mean"]
    assert one_seed == intervals.Estimate(3.0, 3.0, 3.0)


def test_iqm_columns_is_rliables_aggregate_iqm() -> None:
    from rliable import metrics

    rng = np.random.default_rng(0)
    for runs in (1, 2, 3, 4, 5, 7, 10):
        x = rng.normal(size=(runs, 3))
        np.testing.assert_allclose(intervals.iqm_columns(x), [metrics.aggregate_iqm(x[:, k]) for k in range(3)])


def test_intervals_do_not_depend_on_numpys_global_rng() -> None:
    """rliable's stratified bootstraps draw from NumPy's global RNG: intervals seed it per call and restore it."""
    values = list(np.random.default_rng(1).normal(size=10))
    np.random.seed(1)
    first = intervals.aggregates(values)
    after = np.random.random()
    np.random.seed(2)
    assert intervals.aggregates(values) == first
    np.random.seed(1)
    intervals.aggregates(values)
    assert np.random.random() == after  # the caller's global RNG stream is left as it was
