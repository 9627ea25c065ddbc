"""sb3-contrib's slow learning-performance test (``@pytest.mark.slow``: RecurrentPPO on CartPoleNoVel, 50k steps, about
4 minutes of one core) runs when asked, as ``make test`` (and so CI) asks:

    SB3_PPO_SCALE_CONTRIB_SLOW=1 OMP_NUM_THREADS=1 python -m pytest tests/contrib -m slow

A plain ``pytest tests`` skips it and runs the rest of the vendored tests."""

from __future__ import annotations

import os

import pytest

SLOW_ENV = "SB3_PPO_SCALE_CONTRIB_SLOW"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: sb3-contrib's learning-performance tests (run with SB3_PPO_SCALE_CONTRIB_SLOW=1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(SLOW_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"sb3-contrib learning-performance test: set {SLOW_ENV}=1 to run it")
    for item in items:
        if "slow" in item.keywords and item.path.is_relative_to(os.path.dirname(__file__)):
            item.add_marker(skip)
