"""Value-target normalisation (opt-in ``normalize_value=True``): the critic regresses returns scaled to zero mean and
unit variance, while everything that calls ``policy.value_net`` still gets values in return units.

:class:`NormalizedValueHead` takes the place of the policy's ``value_net`` (a ``Linear``, kept as ``head``) and
returns ``std * head(latent) + mean``, where ``mean`` and ``std`` are running statistics of the rollout returns.
Collection, GAE and the bootstrap of truncated episodes see values in return units as before. At the start of each
``train()`` :func:`fold_returns` folds the new rollout's returns into the statistics and rescales ``head`` so that
every value it predicts in return units is unchanged (PopArt: van Hasselt et al. 2016, "Learning values across many
orders of magnitude"). The loss then measures the value error in units of ``std``
(:func:`~sb3_ppo_scale.core.update.objectives.ppo_loss`): the critic's target has unit scale whatever the task's
reward scale. rl_games' ``normalize_value`` does the same without the rescaling (its values jump when the
statistics move).

Before the first update ``mean`` is 0 and ``std`` 1: the head computes what the plain ``Linear`` computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch as th
from stable_baselines3.common.running_mean_std import RunningMeanStd
from torch import nn

#: added to the running variance before the square root (VecNormalize's epsilon)
EPSILON = 1e-8


class NormalizedValueHead(nn.Module):
    """``std * head(latent) + mean``: a value head predicting normalised returns, answering in return units.

    :param head: the policy's value layer (its parameters stay the same objects, so the optimizer keeps them).
    """

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        if not isinstance(head, nn.Linear) or head.out_features != 1:
            raise ValueError(f"normalize_value=True needs the policy's value_net to be a Linear layer with one output "
                             f"(SB3's), got {head!r}")
        self.head = head
        like = head.weight
        self.register_buffer("mean", th.zeros(1, dtype=like.dtype, device=like.device))
        self.register_buffer("std", th.ones(1, dtype=like.dtype, device=like.device))
        #: running moments of every return folded in so far: mean, variance, count (float64; in the state dict, so
        #: saved, loaded and checkpointed with the policy)
        self.register_buffer("moments", th.tensor([0.0, 1.0, 0.0], dtype=th.float64, device=like.device))

    def forward(self, latent: th.Tensor) -> th.Tensor:
        return self.head(latent) * self.std + self.mean

    def update(self, batch_mean: float, batch_var: float, batch_count: float) -> None:
        """Fold a batch's moments (``batch_count`` > 0) into the running moments with SB3's
        ``RunningMeanStd.update_from_moments`` (the parallel rule; from a count of 0 the first batch replaces the
        initial mean 0 / variance 1), then rescale ``head`` so that the output in return units is unchanged."""
        running = RunningMeanStd(shape=())
        running.mean, running.var, running.count = self.moments.tolist()
        running.update_from_moments(batch_mean, batch_var, batch_count)
        new_mean, new_var, total = float(running.mean), float(running.var), float(running.count)
        old_std, old_mean = float(self.std), float(self.mean)
        new_std = math.sqrt(new_var + EPSILON)
        with th.no_grad():
            self.head.weight.mul_(old_std / new_std)
            self.head.bias.mul_(old_std).add_(old_mean - new_mean).div_(new_std)
            self.mean.fill_(new_mean)
            self.std.fill_(new_std)
            self.moments.copy_(th.tensor([new_mean, new_var, total], dtype=th.float64))


def normalize_value_head(policy: nn.Module) -> None:
    """Put a :class:`NormalizedValueHead` in place of ``policy.value_net`` (once; a head already there is kept)."""
    if not isinstance(policy.value_net, NormalizedValueHead):
        policy.value_net = NormalizedValueHead(policy.value_net)


def fold_returns(head: NormalizedValueHead, returns: np.ndarray, sum_over_ranks: Callable[[th.Tensor], th.Tensor],
                 device: th.device) -> None:
    """Fold a rollout's returns into ``head``'s statistics; under data parallelism every rank folds the moments of
    the union of the ranks' rollouts (``sum_over_ranks``: a :class:`~sb3_ppo_scale.core.update.step.Reducer`'s
    ``sum_``), so the heads stay equal."""
    local = np.asarray(returns, dtype=np.float64).ravel()
    sums = th.tensor([local.size, local.sum(), np.square(local).sum()], dtype=th.float64, device=device)
    count, total, total_sq = sum_over_ranks(sums).tolist()
    if count <= 0:
        return
    mean = total / count
    head.update(mean, max(total_sq / count - mean * mean, 0.0), count)
