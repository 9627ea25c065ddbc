"""Reward-prioritized rollout buffer for :class:`~sb3_ppo_scale.ScalablePPO` (the seed's "optimised experience pool").

Usage, the SB3 way::

    ScalablePPO("MlpPolicy", env, rollout_buffer_class=PrioritizedRolloutBuffer,
                rollout_buffer_kwargs=dict(priority="reward", high_fraction=0.7, capacity=None))

Sampling. Each epoch draws as many samples as the pool holds (``M``), *with replacement*, on the buffer's
device. Every draw independently comes, with probability ``high_fraction`` (``h``), from the *high set*
``H`` (samples whose priority is strictly above the pool's mean priority) uniformly, and otherwise uniformly
from all ``M`` samples. So ``P(i) = h * [i in H] / |H| + (1 - h) / M``. With ``h = 0``, or when no sample is
above the mean, the order is SB3's uniform permutation (exactly the default ScalablePPO update).

Importance correction (default on). Each sample gets the loss weight ``w_i = 1 / (M * P(i))``, applied to every
per-sample loss term (policy, value, entropy and any penalty that uses the micro-batch weights). The weights are
*not* self-normalised per minibatch: ``E[w_I f(I)] = (1/M) sum_i f(i)`` exactly, so the expected minibatch loss
(and gradient) equals uniform sampling's, and the expected weight is 1. Samples that can never be drawn
(``P(i) = 0``, only when ``h = 1``) get weight 0 and the low set is then not represented: ``h = 1`` cannot be
corrected. Advantage normalisation still uses the drawn minibatch's plain mean and std (as SB3), which is a
per-minibatch rescaling, not an importance-weighted one. ``importance_correction=False`` gives the seed's biased
rule (all weights 1).

Retention (``capacity``). ``None`` keeps PPO on-policy: only the current rollout is trained on. An int
``capacity >= n_steps * n_envs`` keeps a pool: each update trains on the current rollout *plus* samples retained
from earlier rollouts. When inserting a rollout would exceed ``capacity``, the lowest-priority
``max(ceil(evict_fraction * (r + n)), r + n - capacity)`` of the ``r`` retained samples are evicted (the current
rollout is always trained on at least once before it competes for retention). Eviction is a partial selection
(``torch.kthvalue``, O(r)), never a full sort. Retained samples keep what they were collected with: the
collecting policy's log-prob (PPO's ratio is taken against it), the value estimate, the advantage, the return
target and the priority. They are therefore **off-policy and stale**; PPO's clipping bounds how far a step moves
on them, nothing corrects their bias. Every update logs ``train/retained_fraction`` (retained / trained-on pool)
and ``train/high_set_fraction`` (``|H| / M``).

Save/load. The retained pool is **not** part of ``model.save()`` (SB3 never saves rollout buffers; a pool can
be gigabytes of frames): a loaded model starts with an empty pool and the same buffer settings. To carry a pool
across, use :meth:`PrioritizedRolloutBuffer.state_dict` / :meth:`~PrioritizedRolloutBuffer.load_state_dict`
with ``torch.save``/``torch.load``.

This buffer only works with :class:`~sb3_ppo_scale.ScalablePPO`, which asks it for the rollout, the weights and
the epoch order; SB3's own ``PPO.train()`` would sample uniformly, so :meth:`get` raises.

Action masks. :class:`MaskablePrioritizedRolloutBuffer` is the same buffer for
:class:`~sb3_ppo_scale.ScalableMaskablePPO`: it stores each step's action mask as sb3-contrib's
``MaskableRolloutBuffer`` does, and a sample's mask travels with it (into the pool, through eviction and
``state_dict``), so a retained sample is trained on under the mask it was collected with.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator
from typing import Any

import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer
from stable_baselines3.common.buffers import RolloutBuffer

from sb3_ppo_scale.core.checks import is_int, is_number
from sb3_ppo_scale.core.update.rollout import DeviceRollout
from sb3_ppo_scale.core.update.sampling import uniform_order

#: Allowed values of ``priority``.
PRIORITIES = ("reward", "return", "advantage", "abs_advantage")
_OBS_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
_ACTION_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
_FIELDS = DeviceRollout.SAMPLE_FIELDS
#: prefix of an algorithm's per-sample extras (action masks) in the pool, apart from the sample fields
_EXTRA = "extra:"


# ------------------------------------------------------------------------------------------------ validation
def check_prioritized_args(
    priority: object, high_fraction: object, importance_correction: object, capacity: object, evict_fraction: object, rollout_size: int
) -> None:
    """Raise ValueError naming the first bad argument and what is allowed."""
    if not isinstance(priority, str) or priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
    if not is_number(high_fraction) or not 0.0 <= high_fraction <= 1.0:  # type: ignore[operator]  # NumPy numbers too
        raise ValueError(f"high_fraction must be a number in [0, 1], got {high_fraction!r}")
    if not isinstance(importance_correction, bool):
        raise ValueError(f"importance_correction must be True or False, got {importance_correction!r}")
    if capacity is not None:
        if not is_int(capacity) or capacity < rollout_size:  # type: ignore[operator]
            raise ValueError(
                f"capacity must be None or an int >= the rollout size n_steps * n_envs = {rollout_size}, got {capacity!r}"
            )
    if not is_number(evict_fraction) or not 0.0 < evict_fraction < 1.0:  # type: ignore[operator]
        raise ValueError(f"evict_fraction must be a number in the open interval (0, 1), got {evict_fraction!r}")


def check_spaces(observation_space: spaces.Space, action_space: spaces.Space) -> None:
    """Vector/image Box (or Discrete/MultiDiscrete/MultiBinary) observations; Box/Discrete/MultiDiscrete/MultiBinary actions."""
    if not isinstance(observation_space, _OBS_SPACES):
        raise ValueError(
            f"PrioritizedRolloutBuffer supports Box (vector or image), Discrete, MultiDiscrete and MultiBinary "
            f"observation spaces, got {type(observation_space).__name__} (Dict observations are not supported)"
        )
    if not isinstance(action_space, _ACTION_SPACES):
        raise ValueError(
            f"PrioritizedRolloutBuffer supports Box, Discrete, MultiDiscrete and MultiBinary action spaces, "
            f"got {type(action_space).__name__}"
        )


# ------------------------------------------------------------------------------------------------ selection
def top_k_indices(priority: th.Tensor, k: int) -> th.Tensor:
    """Indices (ascending) of exactly ``k`` largest entries of ``priority``, by partial selection (no sort).

    Ties at the threshold are kept in index order (older samples first).
    """
    m = priority.shape[0]
    if k >= m:
        return th.arange(m, device=priority.device)
    if k <= 0:
        return th.empty(0, dtype=th.long, device=priority.device)
    threshold = th.kthvalue(priority, m - k).values  # the largest evicted value
    above = priority > threshold
    n_ties = k - int(above.sum())
    keep = above
    if n_ties > 0:
        ties = th.nonzero(priority == threshold).flatten()[:n_ties]
        keep = above.clone()
        keep[ties] = True
    return th.nonzero(keep).flatten()


def n_to_evict(n_retained: int, n_new: int, capacity: int, evict_fraction: float) -> int:
    """How many retained samples to evict before inserting ``n_new`` (0 while everything fits)."""
    total = n_retained + n_new
    if total <= capacity:
        return 0
    return min(n_retained, max(math.ceil(evict_fraction * total), total - capacity))


# ------------------------------------------------------------------------------------------------ sampling
class PrioritySampler:
    """The mixture ``P(i) = h [i in H] / |H| + (1 - h) / M`` over one pool, its weights, and its draws.

    :param priority: one priority per pool sample (any device; draws happen there).
    :param high_fraction: ``h``, the probability that a draw comes from the high set.
    """

    def __init__(self, priority: th.Tensor, high_fraction: float) -> None:
        self.size = priority.shape[0]
        self.device = priority.device
        self.high_fraction = float(high_fraction)
        self.high_idx = th.nonzero(priority > priority.mean()).flatten()
        self.n_high = int(self.high_idx.shape[0])
        self.uniform = self.high_fraction == 0.0 or self.n_high == 0

    def probabilities(self) -> th.Tensor:
        """``P(i)`` per sample (float64, sums to 1)."""
        prob = th.full((self.size,), 1.0 / self.size, dtype=th.float64, device=self.device)
        if self.uniform:
            return prob
        prob *= 1.0 - self.high_fraction
        prob[self.high_idx] += self.high_fraction / self.n_high
        return prob

    def importance_weights(self) -> th.Tensor:
        """``1 / (M P(i))`` as float32; 0 where ``P(i) = 0`` (never drawn)."""
        prob = self.probabilities()
        weights = th.where(prob > 0, 1.0 / (self.size * prob.clamp_min(1e-300)), th.zeros_like(prob))
        return weights.float()

    def draw(self, n: int) -> tuple[th.Tensor, th.Tensor]:
        """``n`` indices with replacement, and a bool mask of the draws routed to the high set."""
        from_high = th.rand(n, device=self.device) < self.high_fraction
        if self.n_high == 0:
            from_high.zero_()
            high_pick = th.zeros(n, dtype=th.long, device=self.device)
        else:
            high_pick = self.high_idx[th.randint(self.n_high, (n,), device=self.device)]
        any_pick = th.randint(self.size, (n,), device=self.device)
        return th.where(from_high, high_pick, any_pick), from_high

    def epoch_order(self, n: int) -> th.Tensor:
        """One epoch's sample order: SB3's permutation when uniform, else ``n`` prioritized draws."""
        if self.uniform:
            return uniform_order(n)
        return self.draw(n)[0]


# ------------------------------------------------------------------------------------------------ retention
class RetainedPool:
    """Fixed-size device storage (``capacity`` rows) for the current rollout plus retained earlier samples.

    Rows ``[0, size)`` are valid; rows ``[0, n_retained)`` came from earlier rollouts. Storage is allocated on
    the first :meth:`merge`, on the staged rollout's device.
    """

    def __init__(self, capacity: int, evict_fraction: float) -> None:
        self.capacity = capacity
        self.evict_fraction = evict_fraction
        self.size = 0
        self.n_retained = 0
        self._store: dict[str, th.Tensor] = {}
        self._pending: dict[str, th.Tensor] | None = None

    @property
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._store.values())

    def merge(self, current: dict[str, th.Tensor]) -> dict[str, th.Tensor]:
        """Evict if needed, append ``current`` (fields of ``_FIELDS`` plus ``priority``); return the pool's views."""
        self._allocate(current)
        n_new = current["priority"].shape[0]
        retained = self.size
        evict = n_to_evict(retained, n_new, self.capacity, self.evict_fraction)
        if evict > 0:
            keep = top_k_indices(self._store["priority"][:retained], retained - evict)
            for name, store in self._store.items():
                store[: keep.shape[0]] = store.index_select(0, keep)
            retained = keep.shape[0]
        for name, store in self._store.items():
            store[retained : retained + n_new].copy_(current[name], non_blocking=True)
        self.n_retained, self.size = retained, retained + n_new
        assert self.size <= self.capacity
        return {name: store[: self.size] for name, store in self._store.items()}

    def _allocate(self, current: dict[str, th.Tensor]) -> None:
        if self._store:
            return
        for name, value in current.items():
            self._store[name] = th.empty((self.capacity, *value.shape[1:]), dtype=value.dtype, device=value.device)
        if self._pending is not None:
            size = self._pending["priority"].shape[0]
            for name, value in self._pending.items():
                self._store[name][:size].copy_(value)
            self.size, self._pending = size, None

    def state_dict(self) -> dict[str, Any]:
        """The valid rows as CPU tensors (pending rows if not yet allocated)."""
        if self._pending is not None:
            rows = self._pending
        else:
            rows = {name: store[: self.size] for name, store in self._store.items()}
        return {"capacity": self.capacity, "rows": {name: t.detach().cpu().clone() for name, t in rows.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rows = state["rows"]
        size = rows["priority"].shape[0] if rows else 0
        if size > self.capacity:
            raise ValueError(f"state holds {size} samples, more than this buffer's capacity={self.capacity}")
        self._store, self.size, self.n_retained = {}, 0, 0
        self._pending = dict(rows) if size > 0 else None


# ------------------------------------------------------------------------------------------------ the buffer
class PrioritizedRolloutBuffer(RolloutBuffer):
    """SB3 ``RolloutBuffer`` whose update phase samples high-priority transitions more often (see module doc).

    Arguments before ``priority`` are SB3's and are filled in by the algorithm.

    :param priority: what ranks samples: ``"reward"`` (per-step reward as stored, i.e. normalised when
        ``VecNormalize`` normalises rewards; the seed's rule), ``"return"`` (GAE return target),
        ``"advantage"`` (raw GAE advantage) or ``"abs_advantage"`` (its magnitude). Default ``"reward"``.
    :param high_fraction: probability that a draw comes from the above-mean set, in [0, 1] (default 0.7).
    :param importance_correction: weight each sample by ``1 / (M P(i))`` so the expected loss equals uniform
        sampling's (default True); False is the seed's biased rule.
    :param capacity: None (default: on-policy, current rollout only) or the pool size in samples,
        ``>= n_steps * n_envs``, retaining high-priority samples of earlier rollouts.
    :param evict_fraction: share of the pool evicted (lowest priority first, retained samples only) when an
        insert would exceed ``capacity``, in (0, 1) (default 0.2).
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        gae_lambda: float = 1,
        gamma: float = 0.99,
        n_envs: int = 1,
        priority: str = "reward",
        high_fraction: float = 0.7,
        importance_correction: bool = True,
        capacity: int | None = None,
        evict_fraction: float = 0.2,
    ) -> None:
        check_prioritized_args(priority, high_fraction, importance_correction, capacity, evict_fraction, buffer_size * n_envs)
        check_spaces(observation_space, action_space)
        super().__init__(buffer_size, observation_space, action_space, device, gae_lambda=gae_lambda, gamma=gamma, n_envs=n_envs)
        self.priority = priority
        self.high_fraction = float(high_fraction)
        self.importance_correction = importance_correction
        self.capacity = None if capacity is None else int(capacity)
        self.evict_fraction = float(evict_fraction)
        self.pool = None if self.capacity is None else RetainedPool(self.capacity, self.evict_fraction)
        self.sampler: PrioritySampler | None = None
        self._last_log: dict[str, float] = {}

    def get(self, batch_size: int | None = None) -> Generator[Any, None, None]:
        raise RuntimeError(
            "PrioritizedRolloutBuffer only works with sb3_ppo_scale.ScalablePPO, which asks it for the sample order "
            "and importance weights; SB3's PPO would silently sample uniformly"
        )

    # ---------------------------------------------------------------------------- RolloutHooks (used by ScalablePPO)
    def prepare_rollout(self, rollout: DeviceRollout) -> DeviceRollout:
        """Add retained samples and importance weights to the staged current rollout; set up this update's sampler."""
        current = {name: getattr(rollout, name) for name in _FIELDS}
        current.update({_EXTRA + name: value for name, value in rollout.extras.items()})
        current["priority"] = self._priorities(rollout)
        if self.pool is not None:
            pool = self.pool.merge(current)
            n_retained = self.pool.n_retained
        else:
            pool, n_retained = current, 0
        self.sampler = PrioritySampler(pool["priority"], self.high_fraction)
        weights = None
        if self.importance_correction and not self.sampler.uniform:
            weights = self.sampler.importance_weights()
        size = self.sampler.size
        self._last_log = {
            "train/retained_fraction": n_retained / size,
            "train/high_set_fraction": self.sampler.n_high / size,
        }
        extras = {name.removeprefix(_EXTRA): value for name, value in pool.items() if name.startswith(_EXTRA)}
        return dataclasses.replace(rollout, **{name: pool[name] for name in _FIELDS}, extras=extras, weights=weights)

    def epoch_order(self, n: int) -> th.Tensor:
        """The order for one epoch over the prepared pool (``n`` = pool size)."""
        if self.sampler is None or n != self.sampler.size:
            raise RuntimeError("epoch_order() needs prepare_rollout() on a pool of the same size first")
        return self.sampler.epoch_order(n)

    def train_log(self) -> dict[str, float]:
        """Scalars to log after an update (host floats, no device sync)."""
        return dict(self._last_log)

    # ---------------------------------------------------------------------------- retained pool persistence
    @property
    def n_retained(self) -> int:
        """Samples from earlier rollouts in the last prepared pool (0 without ``capacity``)."""
        return 0 if self.pool is None else self.pool.n_retained

    def state_dict(self) -> dict[str, Any]:
        """The retention pool as CPU tensors (for ``torch.save``); empty without ``capacity``."""
        return {} if self.pool is None else self.pool.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a pool saved by :meth:`state_dict`; it is moved to the buffer device at the next update."""
        if self.pool is None:
            if state:
                raise ValueError("this buffer has capacity=None and keeps no pool; construct it with a capacity")
            return
        self.pool.load_state_dict(state)

    # ---------------------------------------------------------------------------- internals
    def _priorities(self, rollout: DeviceRollout) -> th.Tensor:
        """This rollout's priorities, flattened in the staged (env-major) order, as a fresh float32 tensor."""
        if self.priority == "reward":
            rewards = self.swap_and_flatten(self.rewards).reshape(-1)
            return th.tensor(rewards, dtype=th.float32).to(rollout.device)
        if self.priority == "return":
            return rollout.returns.detach().float().clone()
        if self.priority == "advantage":
            return rollout.advantages.detach().float().clone()
        return rollout.advantages.detach().float().abs()


class MaskablePrioritizedRolloutBuffer(PrioritizedRolloutBuffer, MaskableRolloutBuffer):
    """:class:`PrioritizedRolloutBuffer` that also stores action masks (as sb3-contrib's ``MaskableRolloutBuffer``),
    for :class:`~sb3_ppo_scale.ScalableMaskablePPO`; same arguments. Each sample keeps its mask in the pool.
    Dict observations are not supported (as for :class:`PrioritizedRolloutBuffer`)."""


__all__ = ["PrioritizedRolloutBuffer", "MaskablePrioritizedRolloutBuffer", "PrioritySampler", "RetainedPool", "top_k_indices", "PRIORITIES"]
