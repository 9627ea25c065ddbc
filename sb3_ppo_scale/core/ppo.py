"""ScalablePPO: SB3's PPO with a device-resident rollout, oversized minibatches and exact gradient accumulation."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.utils import explained_variance

from sb3_ppo_scale.core.checks import (
    check_batching,
    check_compile_loss,
    check_compile_toolchain,
    check_cuda_graphs,
    check_kl_penalty,
    check_rollout_size,
    resolve_buffer_device,
)
from sb3_ppo_scale.core.compiled import compiled_ppo_loss
from sb3_ppo_scale.core.kl import (
    ANALYTIC,
    KL_COEF_BOUNDS,
    AdaptiveKLCoefficient,
    kl_estimator,
    mean_rollout_kl,
    rollout_distribution_params,
)
from sb3_ppo_scale.core.objectives import KL_INDEX, OBJECTIVES, AdvantageNormalizer, LossSettings, TrainStats, ppo_loss
from sb3_ppo_scale.core.rollout import DeviceRollout, RolloutStager
from sb3_ppo_scale.core.sampling import LogicalBatch, MinibatchLoader, uniform_order
from sb3_ppo_scale.core.updates import CudaGraphUpdate, EagerUpdate, GraphCache, distribution_validation

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
    :param objective: "clip" (default, SB3's PPO-Clip), "kl_penalty" (PPO-Penalty: maximise r * A - beta * KL,
        no clipping) or "clip_kl_penalty" (both terms, as RLlib does).
    :param kl_coef: initial beta (default 1.0, the PPO paper's), >= 0. The current beta is saved with the model.
    :param kl_penalty_target: d_targ (default 0.01): after each ``train()`` the mean KL(pi_old || pi) over the
        rollout is measured and beta adapted (see :class:`~sb3_ppo_scale.core.kl.AdaptiveKLCoefficient`); None keeps
        beta fixed. Beta stays within :data:`~sb3_ppo_scale.core.kl.KL_COEF_BOUNDS`.
    :param kl_adapt_factor: beta's multiplicative step (default 2.0), > 1.
    :param kl_adapt_tolerance: beta changes when KL leaves [d_targ / tolerance, d_targ * tolerance]
        (default 1.5), >= 1.
    :param cuda_graphs: replay every full-size minibatch update (gather, loss, backward, gradient clip, optimizer
        step) from CUDA graphs (default False). Same kernels, same data, a fraction of the host cost: it pays when
        the GPU waits on Python (small models, many minibatches). The graphs are kept between ``train()`` calls
        while nothing they depend on changes (a learning-rate or clip-range schedule means one capture per call),
        and keep one minibatch's activations allocated. Needs the policy on CUDA and a capturable optimizer
        (Adam, AdamW, RMSprop); see :mod:`sb3_ppo_scale.core.updates`.

    ``batch_size`` may be anything from 1 (2 with advantage normalisation) up to the whole rollout
    (``n_steps * n_envs``).
    """

    # class defaults: models saved before these arguments existed load with them off
    cuda_graphs: bool = False
    compile_loss: bool = False

    def __init__(
        self,
        policy: Any,
        env: Any,
        *args: Any,
        grad_accum_steps: int = 1,
        buffer_device: str | th.device = "auto",
        objective: str = "clip",
        kl_coef: float = 1.0,
        kl_penalty_target: float | None = 0.01,
        kl_adapt_factor: float = 2.0,
        kl_adapt_tolerance: float = 1.5,
        cuda_graphs: bool = False,
        compile_loss: bool = False,
        **kwargs: Any,
    ) -> None:
        ppo_args = _PPO_SIGNATURE.bind(self, policy, env, *args, **kwargs)
        ppo_args.apply_defaults()
        check_batching(ppo_args.arguments["batch_size"], grad_accum_steps, ppo_args.arguments["normalize_advantage"])
        self.grad_accum_steps = grad_accum_steps
        self.buffer_device = buffer_device
        self.objective = objective
        self.kl_coef = kl_coef
        self.kl_penalty_target = kl_penalty_target
        self.kl_adapt_factor = kl_adapt_factor
        self.kl_adapt_tolerance = kl_adapt_tolerance
        self.cuda_graphs = cuda_graphs
        self.compile_loss = compile_loss
        self._check_kl_penalty()
        self._kl_beta = float(kl_coef)  # the current (adapted) beta
        self._n_grad_steps = 0
        self._rollout_stager: RolloutStager | None = None
        super().__init__(policy, env, *args, **kwargs)
        if self.env is not None:
            check_rollout_size(self.batch_size, self.n_steps, self.n_envs)
        if getattr(self, "policy", None) is not None:  # unset while load() rebuilds the model: checked before learning instead
            self._check_cuda_graphs()
            check_compile_toolchain(self.compile_loss, self.device)

    # ----------------------------------------------------------------------------------------------- set-up
    def _setup_model(self) -> None:
        check_batching(self.batch_size, self.grad_accum_steps, self.normalize_advantage)
        self._check_kl_penalty()
        super()._setup_model()
        self._buffer_device = resolve_buffer_device(self.buffer_device, self.device)
        self._rollout_stager = None  # allocated by the first train(): loading for inference allocates nothing
        self._graph_cache = GraphCache()  # cuda_graphs=True: the captured update, reused across train() calls
        check_compile_loss(self.compile_loss, self.cuda_graphs)
        self._loss = compiled_ppo_loss if self.compile_loss else ppo_loss
        if self.env is None:  # loaded for inference: no rollout storage until learn() needs it
            self.rollout_buffer = None  # type: ignore[assignment]

    def _setup_learn(self, *args: Any, **kwargs: Any) -> Any:
        # checked here, not at load: a model may be loaded with fewer envs for evaluation
        check_rollout_size(self.batch_size, self.n_steps, self.n_envs)
        self._check_cuda_graphs()
        check_compile_toolchain(self.compile_loss, self.device)
        if self.rollout_buffer is None:
            self.rollout_buffer = self.rollout_buffer_class(  # type: ignore[misc]
                self.n_steps,
                self.observation_space,  # type: ignore[arg-type]
                self.action_space,
                device=self.device,
                gamma=self.gamma,
                gae_lambda=self.gae_lambda,
                n_envs=self.n_envs,
                **self.rollout_buffer_kwargs,
            )
        return super()._setup_learn(*args, **kwargs)

    def _check_kl_penalty(self) -> None:
        check_kl_penalty(
            self.objective,
            self.kl_coef,
            self.kl_penalty_target,
            self.kl_adapt_factor,
            self.kl_adapt_tolerance,
            OBJECTIVES,
            KL_COEF_BOUNDS,
        )

    def _check_cuda_graphs(self) -> None:
        # at construction and before learning, not at load: a model trained on a GPU may be loaded on a CPU
        check_cuda_graphs(self.cuda_graphs, self.device, self._buffer_device, self.policy.optimizer)

    @property
    def kl_beta(self) -> float:
        """The current KL-penalty coefficient (beta), adapted after each ``train()``; saved with the model."""
        return self._kl_beta

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_rollout_stager", "_buffer_device", "_graph_cache", "_loss"]

    # ----------------------------------------------------------------------------------------------- update
    def train(self) -> None:
        """One update phase: ``n_epochs`` passes over the rollout in logical minibatches of ``batch_size``."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        settings = self._loss_settings()
        with distribution_validation(False):
            rollout = self._stage_rollout()
            if settings.penalises_kl and settings.kl_estimator == ANALYTIC:
                rollout.old_dist = rollout_distribution_params(self.policy, rollout, self._micro_batch_size)
            loader = self._make_loader(rollout)
            stats = TrainStats()
            update = self._make_update(settings, n_full_batches=len(rollout) // self.batch_size * self.n_epochs)
            try:
                for epoch in range(self.n_epochs):
                    stopped = self._train_epoch(loader, update, stats, epoch)
                    self._n_updates += 1
                    if stopped:
                        break
            finally:
                update.close()
            measured_kl = self._measure_kl(rollout, settings) if settings.penalises_kl else None
        summary = self._record(stats, settings, measured_kl)
        if measured_kl is not None:
            self._adapt_kl_beta(summary["kl"], settings)

    @property
    def _micro_batch_size(self) -> int:
        return -(-self.batch_size // self.grad_accum_steps)

    def _measure_kl(self, rollout: DeviceRollout, settings: LossSettings) -> th.Tensor:
        """Mean KL(pi_old || pi_updated) over the whole rollout, as a device scalar."""
        discrete = isinstance(self.action_space, spaces.Discrete)
        return mean_rollout_kl(self.policy, rollout, self._micro_batch_size, settings.kl_estimator, discrete)

    def _loss_settings(self) -> LossSettings:
        progress = self._current_progress_remaining
        clip_range_vf = None if self.clip_range_vf is None else float(self.clip_range_vf(progress))  # type: ignore[operator]
        return LossSettings(
            clip_range=float(self.clip_range(progress)),  # type: ignore[operator]
            clip_range_vf=clip_range_vf,
            ent_coef=float(self.ent_coef),
            vf_coef=float(self.vf_coef),
            discrete_actions=isinstance(self.action_space, spaces.Discrete),
            objective=self.objective,
            kl_coef=self._kl_beta,
            kl_estimator=kl_estimator(self.policy.action_dist),
        )

    def _stage_rollout(self) -> DeviceRollout:
        if self._rollout_stager is None:
            self._rollout_stager = RolloutStager(self._buffer_device)
        rollout = self._rollout_stager.stage(self.rollout_buffer)
        prepare = getattr(self.rollout_buffer, "prepare_rollout", None)  # e.g. PrioritizedRolloutBuffer: weights, retained samples
        return rollout if prepare is None else prepare(rollout)

    def _make_loader(self, rollout: DeviceRollout) -> MinibatchLoader:
        order = getattr(self.rollout_buffer, "epoch_order", uniform_order)  # a buffer may supply each epoch's order
        return MinibatchLoader(rollout, self.batch_size, self.grad_accum_steps, target_device=self.device, order=order)

    def _make_update(self, settings: LossSettings, n_full_batches: int) -> EagerUpdate:
        def gradients(batch: LogicalBatch) -> th.Tensor:
            return self._accumulate_gradients(batch, settings)

        if not self.cuda_graphs:
            return EagerUpdate(gradients, self._apply_gradients, self._kl_exceeds_target)
        return CudaGraphUpdate(
            gradients,
            self._apply_gradients,
            self._kl_exceeds_target,
            self.policy.optimizer,
            self.batch_size,
            n_full_batches,
            cache=self._graph_cache,
            config=(settings, self.max_grad_norm, self.normalize_advantage),
            policy=self.policy,
        )

    def _train_epoch(self, loader: MinibatchLoader, update: EagerUpdate, stats: TrainStats, epoch: int) -> bool:
        """One pass over the rollout; returns True when ``target_kl`` stopped training."""
        for batch in loader:
            batch_stats, stepped = update(batch)
            stats.add(batch_stats, epoch)
            if not stepped:
                return True
            self._n_grad_steps += 1
        return False

    def _apply_gradients(self) -> None:
        """One gradient clip (SB3's ``max_grad_norm``) and one optimizer step."""
        th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        self.policy.optimizer.step()

    def _accumulate_gradients(self, batch: LogicalBatch, settings: LossSettings) -> th.Tensor:
        """Backward every micro-batch of ``batch``; returns the logical minibatch's stats vector."""
        self.policy.optimizer.zero_grad()
        normalize = AdvantageNormalizer.fit(batch.advantages(), self.normalize_advantage)
        total: th.Tensor | None = None
        for micro in batch.micro_batches():
            loss, stats = self._loss(self.policy, micro, normalize, settings)
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

    def _record(self, stats: TrainStats, settings: LossSettings, measured_kl: th.Tensor | None) -> dict[str, float]:
        """Log every key PPO logs, with the same meaning, after a single device-to-host sync; returns the summary."""
        extra = {} if measured_kl is None else {"kl": measured_kl}
        if hasattr(self.policy, "log_std"):
            extra["std"] = th.exp(self.policy.log_std).mean().detach()
        summary = stats.summary(extra)
        for name in ("entropy_loss", "policy_gradient_loss", "value_loss", "approx_kl", "clip_fraction", "loss"):
            self.logger.record(f"train/{name}", summary[name])
        values, returns = self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten()
        self.logger.record("train/explained_variance", explained_variance(values, returns))
        if "std" in summary:
            self.logger.record("train/std", summary["std"])
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/n_grad_steps", self._n_grad_steps)
        self.logger.record("train/clip_range", settings.clip_range)
        if settings.clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", settings.clip_range_vf)
        buffer_log = getattr(self.rollout_buffer, "train_log", None)  # e.g. train/retained_fraction
        for key, value in ({} if buffer_log is None else buffer_log()).items():
            self.logger.record(key, value)
        return summary

    def _adapt_kl_beta(self, measured_kl: float, settings: LossSettings) -> None:
        """Log the KL measured after the update and the beta it was trained with, then adapt beta."""
        self.logger.record("train/kl", measured_kl)
        self.logger.record("train/kl_coef", settings.kl_coef)
        self.logger.record("train/kl_estimator", settings.kl_estimator, exclude="tensorboard")
        rule = AdaptiveKLCoefficient(self.kl_penalty_target, self.kl_adapt_factor, self.kl_adapt_tolerance)
        self._kl_beta = rule.update(self._kl_beta, measured_kl)
