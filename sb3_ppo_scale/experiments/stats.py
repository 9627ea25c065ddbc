"""Statistics shared by the learning benchmarks (NumPy only, so scripts loaded by path can import it cheaply)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bootstrap_ci(values: Sequence[float], n_resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Mean and 95% percentile bootstrap interval of the mean (resampling seeds); infinite values propagate
    as ``(inf, nan, nan)`` (e.g. a threshold some seed never reached)."""
    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        return float("nan"), float("nan"), float("nan")
    if not np.all(np.isfinite(data)):
        return float("inf"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(n_resamples, len(data)))].mean(axis=1)
    return float(data.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))
