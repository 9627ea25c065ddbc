"""``collect_device``: run collection's per-step policy inference on another device than training.

On a GPU box a small MLP policy can be slower to run one env step at a time on the GPU than on the CPU: each step
pays kernel-launch and host-device copy latency for a few thousand multiply-adds. The default ("auto") keeps
collection on the policy's device, exactly as SB3's PPO: the CPU copy samples its actions from the CPU generator,
not CUDA's, so its rollouts are another sample than PPO's on the GPU (docs/known-limits.md). Measured on the H200
box (collection only, Hopper-v5; ``COLLECT=1 benchmarks/gpu_checks.sh``): 2.24x SB3's GPU loop at 1 env, 1.82x at 8,
0.85x at 64, so the scale plan (:func:`sb3_ppo_scale.envs.plan_scale`) picks it at 8 envs or fewer, and "auto" stays
PPO's. With ``collect_device="cpu"`` the model keeps
a CPU copy of its policy, copies the trained parameters into it once per rollout, and SB3's own
``collect_rollouts`` runs with that copy as ``model.policy`` (and ``model.device``) for the duration of the
rollout. Callbacks called during collection see the copy: it has the same parameters, and its ``optimizer`` is the
training policy's, so a callback that saves the model saves the real state.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch as th

from sb3_ppo_scale.core.checks import resolve_device

def resolve_collect_device(collect_device: object, policy_device: th.device) -> th.device:
    """``"auto"``: the policy's device (collection exactly as SB3's PPO collects); else a CPU or CUDA device that
    exists here."""
    return resolve_device(collect_device, "collect_device", policy_device, types=("cpu", "cuda"))


class CollectionPolicy:
    """A copy of the training policy on the collection device, refreshed once per rollout.

    :param policy: the training policy (its ``optimizer`` stays the one the copy exposes).
    :param device: the collection device.
    """

    def __init__(self, policy: th.nn.Module, device: th.device) -> None:
        optimizer = policy.optimizer  # type: ignore[union-attr]
        policy.optimizer = None  # type: ignore[assignment,union-attr]  # not deep-copied
        try:
            self.policy = copy.deepcopy(policy).to(device)
        finally:
            policy.optimizer = optimizer  # type: ignore[union-attr]
        self.policy.optimizer = optimizer  # type: ignore[assignment]
        self.device = device

    def refresh(self, policy: th.nn.Module) -> None:
        """Copy ``policy``'s parameters and buffers in (one host-device transfer per rollout)."""
        with th.no_grad():
            for target, source in zip(self.policy.state_dict().values(), policy.state_dict().values()):
                target.copy_(source, non_blocking=False)


@contextmanager
def collecting_on(model: Any, collection: CollectionPolicy) -> Iterator[None]:
    """Within the block ``model.policy`` and ``model.device`` are the collection copy and its device."""
    policy, device = model.policy, model.device
    collection.refresh(policy)
    model.policy, model.device = collection.policy, collection.device
    try:
        yield
    finally:
        model.policy, model.device = policy, device
