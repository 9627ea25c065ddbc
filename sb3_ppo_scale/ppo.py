"""ScalablePPO: SB3's PPO with a device-resident rollout, oversized minibatches and exact gradient accumulation."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.utils import explained_variance

from sb3_ppo_scale.checks import check_batching, check_rollout_size, resolve_buffer_device
from sb3_ppo_scale.objectives import KL_INDEX, AdvantageNormalizer, LossSettings, TrainStats, clip_loss
from sb3_ppo_scale.rollout import DeviceRollout, RolloutStager
from sb3_ppo_scale.sampling import LogicalBatch, MinibatchLoader

_PPO_SIGNATURE = inspect.signature(PPO.__init__)


class ScalablePPO(PPO):
    """Proximal Policy Optimization, SB3's ``PPO`` with a faster, bigger update phase.

    Takes every argument of :class:`stable_baselines3.PPO` (same names, positions and defaults) and trains
    identically with the defaults below. The additions:

    :param grad_accum_steps: micro-batches per logical minibatch of ``batch_size`` samples (default 1).
        Gradients of the micro-batches accumulate into one gradient clip and one optimizer step per logical
        minibatch; the result equals the big-batch update (advantages normalised over the logical minibatch,
        each micro loss weighted by its share of it, ``target_kl`` decided on the logical minibatch).
        Peak activation memory scales with ``batch_size / grad_accum_steps``.
    :param buffer_device: where the rollout lives during ``train()`` (default "auto": the policy's device).
        The rollout crosses to that device once per rollout and minibatches are gathered there.

    ``batch_size`` may be anything from 1 (2 with advantage normalisation) up to the whole rollout
    (``n_steps * n_envs``).
    """

    def __init__(self, policy: Any, env: Any, *args: Any, grad_accum_steps: int = 1, buffer_device: str | th.device = "auto", **kwargs: Any) -> None:
        ppo_args = _PPO_SIGNATURE.bind(self, policy, env, *args, **kwargs)
        ppo_args.apply_defaults()
        check_batching(ppo_args.arguments["batch_size"], grad_accum_steps, ppo_args.arguments["normalize_advantage"])
        self.grad_accum_steps = grad_accum_steps
        self.buffer_device = buffer_device
        self._n_grad_steps = 0
        self._rollout_stager: RolloutStager | None = None
        super().__init__(policy, env, *args, **kwargs)

    # ----------------------------------------------------------------------------------------------- set-up
    def _setup_model(self) -> None:
        check_batching(self.batch_size, self.grad_accum_steps, self.normalize_advantage)
        check_rollout_size(self.batch_size, self.n_steps, self.n_envs)
        super()._setup_model()
        self._buffer_device = resolve_buffer_device(self.buffer_device, self.device)
        self._rollout_stager = None  # allocated by the first train(): loading for inference allocates nothing

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_rollout_stager", "_buffer_device"]

    # ----------------------------------------------------------------------------------------------- update
    def train(self) -> None:
        """One update phase: ``n_epochs`` passes over the rollout in logical minibatches of ``batch_size``."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        settings = self._loss_settings()
        loader = self._make_loader(self._stage_rollout())
        stats = TrainStats()
        for epoch in range(self.n_epochs):
            stopped = self._train_epoch(loader, settings, stats, epoch)
            self._n_updates += 1
            if stopped:
                break
        self._record(stats, settings)

    def _loss_settings(self) -> LossSettings:
        progress = self._current_progress_remaining
        clip_range_vf = None if self.clip_range_vf is None else float(self.clip_range_vf(progress))  # type: ignore[operator]
        return LossSettings(
            clip_range=float(self.clip_range(progress)),  # type: ignore[operator]
            clip_range_vf=clip_range_vf,
            ent_coef=float(self.ent_coef),
            vf_coef=float(self.vf_coef),
            discrete_actions=isinstance(self.action_space, spaces.Discrete),
        )

    def _stage_rollout(self) -> DeviceRollout:
        if self._rollout_stager is None:
            self._rollout_stager = RolloutStager(self._buffer_device)
        rollout = self._rollout_stager.stage(self.rollout_buffer)
        prepare = getattr(self.rollout_buffer, "prepare_rollout", None)  # e.g. PrioritizedRolloutBuffer: weights, retained samples
        return rollout if prepare is None else prepare(rollout)

    def _make_loader(self, rollout: DeviceRollout) -> MinibatchLoader:
        order = getattr(self.rollout_buffer, "epoch_order", None)  # a buffer may supply each epoch's sample order
        if order is None:
            return MinibatchLoader(rollout, self.batch_size, self.grad_accum_steps, target_device=self.device)
        return MinibatchLoader(rollout, self.batch_size, self.grad_accum_steps, target_device=self.device, order=order)

    def _train_epoch(self, loader: MinibatchLoader, settings: LossSettings, stats: TrainStats, epoch: int) -> bool:
        """One pass over the rollout; returns True when ``target_kl`` stopped training."""
        for batch in loader:
            batch_stats = self._accumulate_gradients(batch, settings)
            stats.add(batch_stats, epoch)
            if self._kl_exceeds_target(batch_stats):
                return True
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            self._n_grad_steps += 1
        return False

    def _accumulate_gradients(self, batch: LogicalBatch, settings: LossSettings) -> th.Tensor:
        """Backward every micro-batch of ``batch``; returns the logical minibatch's stats vector."""
        self.policy.optimizer.zero_grad()
        normalize = AdvantageNormalizer.fit(batch.advantages(), self.normalize_advantage)
        total: th.Tensor | None = None
        for micro in batch.micro_batches():
            loss, stats = clip_loss(self.policy, micro, normalize, settings)
            if micro.share != 1.0:
                loss, stats = loss * micro.share, stats * micro.share
            loss.backward()
            total = stats if total is None else total + stats
        assert total is not None
        return total

    def _kl_exceeds_target(self, batch_stats: th.Tensor) -> bool:
        """SB3's early stop: approx KL of the minibatch > 1.5 * target_kl (one host sync, only with target_kl)."""
        if self.target_kl is None:
            return False
        approx_kl = np.float32(batch_stats[KL_INDEX].item())
        if approx_kl > np.float32(1.5 * self.target_kl):
            if self.verbose >= 1:
                print(f"Early stopping at step {self._n_updates} due to reaching max kl: {approx_kl:.2f}")
            return True
        return False

    def _record(self, stats: TrainStats, settings: LossSettings) -> None:
        """Log every key PPO logs, with the same meaning, after a single device-to-host sync."""
        extra = [th.exp(self.policy.log_std).mean().detach()] if hasattr(self.policy, "log_std") else []
        summary, extra_values = stats.summary(extra)
        for name in ("entropy_loss", "policy_gradient_loss", "value_loss", "approx_kl", "clip_fraction", "loss"):
            self.logger.record(f"train/{name}", summary[name])
        values, returns = self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten()
        self.logger.record("train/explained_variance", explained_variance(values, returns))
        if extra_values:
            self.logger.record("train/std", extra_values[0])
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/n_grad_steps", self._n_grad_steps)
        self.logger.record("train/clip_range", settings.clip_range)
        if settings.clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", settings.clip_range_vf)
        buffer_log = getattr(self.rollout_buffer, "train_log", None)  # e.g. train/retained_fraction
        for key, value in ({} if buffer_log is None else buffer_log()).items():
            self.logger.record(key, value)
