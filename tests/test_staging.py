"""The staged rollout and its minibatch order are SB3's: checked against ``RolloutBuffer.get()`` on the same rollout.

A rollout is collected by SB3's own ``collect_rollouts`` into SB3's buffer. It is staged by ``RolloutStager`` (the
CPU path, which wraps the flattened arrays; the accelerator path, which reorders while copying into pinned host
memory, exercised here with CPU target tensors: ``_stage_field`` is the same code, only the final device differs;
and CUDA itself when a GPU is present). Then NumPy's global RNG is seeded identically before SB3's ``get(batch_size)``
and before the package's ``MinibatchLoader`` over the staged rollout, for two epochs: every minibatch must hold the
same tensors (``torch.equal``) with the same dtypes and shapes, field by field, in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv, IdentityEnvMultiBinary, IdentityEnvMultiDiscrete, SimpleMultiObsEnv

from sb3_ppo_scale.core.update.rollout import DeviceRollout, RolloutStager
from sb3_ppo_scale.core.update.sampling import MinibatchLoader

N_STEPS, N_ENVS = 7, 3
BATCH = 8  # 21 samples: minibatches of 8, 8 and a short 5 (on purpose: SB3's warning about it is silenced)
pytestmark = pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")
EPOCHS = 2
FIELDS = ("observations", "actions", "old_values", "old_log_prob", "advantages", "returns")

ENVS: dict[str, tuple[Callable[[], Any] | str, str]] = {
    "box_obs_box_actions": ("Pendulum-v1", "MlpPolicy"),
    "discrete_actions": ("CartPole-v1", "MlpPolicy"),  # int64 actions, handed to the policy as float32
    "multidiscrete_actions": (lambda: IdentityEnvMultiDiscrete(3), "MlpPolicy"),
    "multibinary_actions": (lambda: IdentityEnvMultiBinary(3), "MlpPolicy"),
    "uint8_images": (lambda: FakeImageEnv(screen_height=36, screen_width=36, n_channels=1), "CnnPolicy"),
    "dict_observations": (lambda: SimpleMultiObsEnv(random_start=False), "MultiInputPolicy"),
}

DEVICES = ["cpu", "pinned_copy", pytest.param("cuda", marks=pytest.mark.cuda)]  # tests/conftest.py skips it without CUDA


def collected_rollout(name: str) -> RolloutBuffer:
    """One rollout collected by SB3's PPO into its own (Dict)RolloutBuffer, GAE computed, not yet read."""
    env, policy = ENVS[name]
    kwargs = dict(net_arch=[8], features_extractor_kwargs=dict(features_dim=8)) if policy == "CnnPolicy" else None
    model = PPO(policy, make_vec_env(env, n_envs=N_ENVS, seed=0), n_steps=N_STEPS, batch_size=BATCH, seed=0,
                device="cpu", policy_kwargs=kwargs)
    _, callback = model._setup_learn(N_STEPS * N_ENVS, callback=None)
    callback.on_training_start(locals(), globals())
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=N_STEPS)
    assert model.rollout_buffer.full and not model.rollout_buffer.generator_ready
    return model.rollout_buffer


def stage(buffer: RolloutBuffer, device: str) -> DeviceRollout:
    if device == "pinned_copy":
        stager = RolloutStager(th.device("cpu"))
        return DeviceRollout(**{name: stager._stage_field(buffer, name) for name in FIELDS})
    return RolloutStager(th.device(device)).stage(buffer)


def host_copy(value: th.Tensor | dict[str, th.Tensor]) -> th.Tensor | dict[str, th.Tensor]:
    """A CPU copy (the stager reuses its storage, and SB3 flattens its arrays in place)."""
    if isinstance(value, dict):
        return {key: tensor.detach().cpu().clone() for key, tensor in value.items()}
    return value.detach().cpu().clone()


def assert_same_tensor(ours: th.Tensor, theirs: th.Tensor, where: str) -> None:
    assert ours.dtype == theirs.dtype, f"{where}: dtype {ours.dtype} != SB3's {theirs.dtype}"
    assert ours.shape == theirs.shape, f"{where}: shape {tuple(ours.shape)} != SB3's {tuple(theirs.shape)}"
    assert th.equal(ours, theirs), f"{where}: values differ"


def sb3_minibatches(buffer: RolloutBuffer, seed: int) -> list[list[Any]]:
    np.random.seed(seed)
    return [[host_copy(getattr(samples, field)) for field in FIELDS] for _ in range(EPOCHS) for samples in buffer.get(BATCH)]


def loader_minibatches(rollout: DeviceRollout, seed: int, grad_accum_steps: int) -> list[list[Any]]:
    """The loader's logical minibatches, each re-assembled from its micro-batches."""
    loader = MinibatchLoader(rollout, BATCH, grad_accum_steps)
    np.random.seed(seed)
    batches = []
    for _ in range(EPOCHS):
        for logical in loader:
            parts = [[host_copy(getattr(micro.samples, field)) for field in FIELDS] for micro in logical.micro_batches()]
            batches.append([_concat([part[i] for part in parts]) for i in range(len(FIELDS))])
    return batches


def _concat(parts: list[Any]) -> Any:
    if isinstance(parts[0], dict):
        return {key: th.cat([part[key] for part in parts]) for key in parts[0]}
    return th.cat(parts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(ENVS))
def test_minibatches_equal_sb3_rollout_buffer_get(name: str, device: str) -> None:
    buffer = collected_rollout(name)
    rollout = stage(buffer, device)
    ours = {k: loader_minibatches(rollout, seed=3, grad_accum_steps=k) for k in (1, 3)}
    theirs = sb3_minibatches(buffer, seed=3)  # SB3 flattens the buffer in place here
    assert [len(batch[1]) for batch in theirs] == [8, 8, 5] * EPOCHS
    for k, batches in ours.items():
        assert len(batches) == len(theirs)
        for index, (mine, sb3) in enumerate(zip(batches, theirs)):
            for field, a, b in zip(FIELDS, mine, sb3):
                where = f"grad_accum_steps={k}, minibatch {index}, {field}"
                if isinstance(b, dict):
                    assert isinstance(a, dict) and a.keys() == b.keys(), where
                    for key in b:
                        assert_same_tensor(a[key], b[key], f"{where}[{key}]")
                else:
                    assert_same_tensor(a, b, where)
    if name == "uint8_images":
        assert rollout.observations.dtype == th.uint8  # frames stay uint8 on the device, as in SB3's samples


@pytest.mark.parametrize("device", DEVICES)
def test_staging_after_sb3_get_flattened_the_buffer(device: str) -> None:
    """A buffer that SB3's get() already flattened in place stages to the same rollout, also on a second call that
    reuses the stager's storage."""
    fresh = stage(collected_rollout("box_obs_box_actions"), device)
    expected = {field: host_copy(getattr(fresh, field)) for field in FIELDS}
    buffer = collected_rollout("box_obs_box_actions")
    next(buffer.get(batch_size=None))
    assert buffer.generator_ready
    stager = RolloutStager(th.device("cpu" if device == "pinned_copy" else device))
    for _ in range(2):
        if device == "pinned_copy":
            staged = {field: stager._stage_field(buffer, field) for field in FIELDS}
        else:
            staged = vars(stager.stage(buffer))
        for field in FIELDS:
            assert_same_tensor(host_copy(staged[field]), expected[field], field)
