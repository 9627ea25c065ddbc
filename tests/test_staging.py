"""RolloutStager puts the rollout on the device in SB3's env-major sample order, whatever the buffer's state.

The accelerator path (pinned host copy that reorders while copying, then one device copy) is exercised here
with CPU target tensors: ``_stage_field`` is the same code, only the final device differs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer

from sb3_ppo_scale.core.rollout import RolloutStager, rollout_arrays

N_STEPS, N_ENVS = 7, 3


def _filled(buffer_cls, observation_space: spaces.Space) -> RolloutBuffer:
    buffer = buffer_cls(N_STEPS, observation_space, spaces.Box(-1, 1, (2,)), device="cpu", n_envs=N_ENVS)
    rng = np.random.default_rng(0)
    for field in ("actions", "values", "log_probs", "advantages", "returns"):
        array = getattr(buffer, field)
        array[:] = rng.standard_normal(array.shape).astype(array.dtype)
    observations = buffer.observations if isinstance(buffer.observations, dict) else {"": buffer.observations}
    for array in observations.values():
        array[:] = rng.integers(0, 255, size=array.shape).astype(array.dtype)
    buffer.pos, buffer.full = N_STEPS, True
    return buffer


def _accelerator_path(stager: RolloutStager, buffer: RolloutBuffer, name: str):
    return stager._stage_field(buffer, name)


@pytest.mark.parametrize("flattened_by_get", [False, True])
def test_reordered_copy_equals_sb3_flatten(flattened_by_get: bool) -> None:
    buffer = _filled(RolloutBuffer, spaces.Box(0, 255, (4, 5), np.uint8))
    if flattened_by_get:
        next(buffer.get(batch_size=None))  # SB3 flattens in place
    expected = rollout_arrays(buffer)
    stager = RolloutStager(th.device("cpu"))
    for _ in range(2):  # the second call reuses the host and device storage
        for name, array in expected.items():
            staged = _accelerator_path(stager, buffer, name)
            assert staged.dtype == th.from_numpy(np.asarray(array)).dtype
            np.testing.assert_array_equal(staged.numpy(), array)
    assert stager._device["observations"].dtype == th.uint8


def test_dict_observations_reordered() -> None:
    space = spaces.Dict({"image": spaces.Box(0, 255, (2, 3), np.uint8), "vec": spaces.Box(-1, 1, (4,))})
    buffer = _filled(DictRolloutBuffer, space)
    expected = rollout_arrays(buffer)["observations"]
    staged = _accelerator_path(RolloutStager(th.device("cpu")), buffer, "observations")
    for key in ("image", "vec"):
        np.testing.assert_array_equal(staged[key].numpy(), expected[key])
