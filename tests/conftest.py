import os
import sys

import pytest
import torch as th

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
th.set_num_threads(1)

#: The one reason every ``@pytest.mark.cuda`` test gives when it skips (``pytest -m cuda tests`` selects them all;
#: benchmarks/gpu_checks.sh runs them on a GPU machine).
CUDA_SKIP_REASON = "needs a CUDA device"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if th.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=CUDA_SKIP_REASON)
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
