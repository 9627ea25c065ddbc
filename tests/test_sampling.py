"""MinibatchLoader: SB3's sample order, logical minibatches and micro-batch splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch as th

from sb3_ppo_scale.core.update.rollout import DeviceRollout
from sb3_ppo_scale.core.update.sampling import MinibatchLoader


def rollout(n: int) -> DeviceRollout:
    ramp = th.arange(n, dtype=th.float32)
    return DeviceRollout(ramp[:, None].clone(), ramp[:, None].clone(), ramp.clone(), ramp.clone(), ramp.clone(), ramp.clone())


@pytest.mark.parametrize(("n", "batch", "k"), [(100, 32, 3), (64, 64, 7), (10, 3, 3), (7, 7, 7)])
def test_batches_cover_each_sample_once_and_micro_sizes_differ_by_at_most_one(n, batch, k) -> None:
    loader = MinibatchLoader(rollout(n), batch, grad_accum_steps=k)
    seen = []
    batches = list(loader)
    assert len(batches) == len(loader) == -(-n // batch)
    for logical in batches:
        micro = list(logical.micro_batches())
        sizes = [m.samples.actions.shape[0] for m in micro]
        assert sum(sizes) == len(logical) and max(sizes) - min(sizes) <= 1
        assert len(micro) == min(k, len(logical))
        assert sum(m.share for m in micro) == pytest.approx(1.0)
        seen += [int(v) for m in micro for v in m.samples.observations[:, 0]]
    assert sorted(seen) == list(range(n))


def test_order_is_sb3s_numpy_permutation() -> None:
    np.random.seed(5)
    expected = np.random.permutation(50)
    np.random.seed(5)
    first = next(iter(MinibatchLoader(rollout(50), 50)))
    np.testing.assert_array_equal(first.indices.numpy(), expected)


def test_drop_last_and_no_shuffle() -> None:
    loader = MinibatchLoader(rollout(10), 4, shuffle=False, drop_last=True)
    batches = [b.indices.tolist() for b in loader]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(loader) == 2


def test_gather_keeps_dtype_and_goes_to_target_device() -> None:
    frames = th.randint(0, 255, (6, 4, 8, 8), dtype=th.uint8)
    data = DeviceRollout(frames, *(th.zeros(6) for _ in range(5)))
    micro = next(next(iter(MinibatchLoader(data, 6, target_device=th.device("cpu")))).micro_batches())
    assert micro.samples.observations.dtype == th.uint8
    assert micro.weights is None
