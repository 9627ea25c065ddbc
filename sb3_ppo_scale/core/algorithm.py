"""The scale layer: what ScalablePPO adds to SB3's PPO, as a mixin any on-policy PPO algorithm can take.

``class ScalablePPO(ScalableOnPolicyMixin, PPO)`` and sb3-contrib's ``ScalableMaskablePPO`` /
``ScalableRecurrentPPO`` share everything here: the device-resident rollout, the loader, the update step, the
objectives and the KL-adaptive rate, the non-finite guard, checkpoint state, the data-parallel reducer and the
collection hooks. The mixin replaces the algorithm's ``train()`` and runs the algorithm's own collection loop lean
(SB3's, MaskablePPO's, RecurrentPPO's: the same rollout); the algorithm keeps its policies, ``predict`` and save
format. What differs between algorithms is supplied by overriding a few hooks (section "algorithm hooks" below):

- :meth:`~ScalableOnPolicyMixin._rollout_extras`: per-sample fields beyond PPO's six (action masks; LSTM states and
  episode starts), staged into :class:`~sb3_ppo_scale.core.update.rollout.DeviceRollout.extras`;
- :meth:`~ScalableOnPolicyMixin._make_loader`: how a rollout is cut into logical minibatches (samples, or whole
  sequences) that split into micro-batches;
- :attr:`~ScalableOnPolicyMixin._evaluator`: how the policy evaluates a micro-batch
  (:mod:`sb3_ppo_scale.core.policy.evaluation`);
- :meth:`~ScalableOnPolicyMixin._check_supported`: a clear error for an added argument the algorithm cannot honour.

The mixin must come first in the bases (``class X(ScalableOnPolicyMixin, SomeOnPolicyPPO)``); the algorithm's
constructor arguments are bound against that base's signature.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.utils import explained_variance

from sb3_ppo_scale.core.checks import (
    check_batching,
    check_learn_arguments,
    check_net_arch,
    check_ppo_arguments,
    check_rollout_buffer_kwargs,
    check_scheduled_value,
    plain_number,
)
from sb3_ppo_scale.core.collect.device import CollectionPolicy, collecting_on, resolve_collect_device
from sb3_ppo_scale.core.collect.graphed_step import InferenceGraphs
from sb3_ppo_scale.core.collect.lean import collect_rollouts_lean, lean_blocker
from sb3_ppo_scale.core.config import ScaleConfig
from sb3_ppo_scale.core.exact.upstream import changed_upstream, collection_loop, update
from sb3_ppo_scale.core.extensions import EXTENSIONS, load_checkpoint
from sb3_ppo_scale.core.policy.evaluation import Evaluator, FusedEvaluator, evaluate_actions
from sb3_ppo_scale.core.policy.inference import PolicyParts
from sb3_ppo_scale.core.policy.value_head import fold_returns, normalize_value_head
from sb3_ppo_scale.core.update.compiled import compiled_ppo_loss
from sb3_ppo_scale.core.update.graphs import CudaGraphStep, GraphCache
from sb3_ppo_scale.core.update.guard import NonFiniteGuard
from sb3_ppo_scale.core.update.kl import K3, kl_estimator, mean_rollout_kl, rollout_distribution_params
from sb3_ppo_scale.core.update.lr import KLAdaptiveLR, resolve_learning_rate
from sb3_ppo_scale.core.update.objectives import LossSettings, Objective, TrainStats, make_mean_bound, ppo_loss
from sb3_ppo_scale.core.update.rollout import DeviceRollout, RolloutHooks, RolloutStager, rollout_hooks, samples_itself
from sb3_ppo_scale.core.update.sampling import BufferLoader, Loader, MicroBatch, MinibatchLoader
from sb3_ppo_scale.core.update.step import (
    LOCAL,
    Reducer,
    StepSettings,
    UpdateStep,
    distribution_validation,
    torch_threads,
)


#: what ``overlap_collection=True`` says (the argument stays accepted: scripts and saved models set it)
OVERLAP_REMOVED = ("overlap_collection=True is ignored: the double-buffered EnvPool collector was slower than the lean "
                   "loop on EnvPool in every measurement (benchmarks/results/scale/scale.md) and was removed; collection "
                   "runs the lean loop, and train --variant scale picks the fastest backend for this machine")


def algorithm_base(cls: type) -> type[OnPolicyAlgorithm]:
    """The on-policy algorithm class that ``cls`` puts the scale layer on (the first after the mixin in its MRO)."""
    mro = cls.__mro__
    after = mro[mro.index(ScalableOnPolicyMixin) + 1 :]
    for base in after:
        if issubclass(base, OnPolicyAlgorithm):
            return base
    raise TypeError(f"{cls.__name__} must list an OnPolicyAlgorithm subclass after ScalableOnPolicyMixin in its bases")


class ScalableOnPolicyMixin:
    """The arguments and the update that :class:`~sb3_ppo_scale.ScalablePPO` adds to SB3's PPO, for any on-policy
    PPO algorithm (see the module docstring). Their meaning and defaults:
    :data:`~sb3_ppo_scale.core.arguments.SCALE_ARGUMENTS`.
    """

    # class defaults: models saved before these arguments existed load with them off
    cuda_graphs: bool = False
    compile_loss: bool = False
    nonfinite: str = "skip"
    collect_device: str = "auto"
    overlap_collection: bool = False
    update_threads: int | None = None
    normalize_value: bool = False
    mean_bound_coef: float = 0.0

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
        nonfinite: str = "skip",
        collect_device: str | th.device = "auto",
        overlap_collection: bool = False,
        update_threads: int | None = None,
        normalize_value: bool = False,
        mean_bound_coef: float = 0.0,
        **kwargs: Any,
    ) -> None:
        try:
            base_args = inspect.signature(algorithm_base(type(self)).__init__).bind(self, policy, env, *args, **kwargs)
        except TypeError as error:  # Python's own message names no class
            raise TypeError(f"{type(self).__name__}(): {error}") from None
        base_args.apply_defaults()
        # before the algorithm's own `batch_size > 1` assertion, so that error reads like every other
        # (ScaleConfig.validate)
        check_batching(base_args.arguments["batch_size"], grad_accum_steps, base_args.arguments["normalize_advantage"])
        check_ppo_arguments(base_args.arguments)  # n_steps before the algorithm divides by it
        # plain attributes, so SB3's save() keeps them; ScaleConfig.of(self) reads them back in _setup_model
        self.__dict__.update(grad_accum_steps=grad_accum_steps, buffer_device=buffer_device, objective=objective,
                             kl_coef=kl_coef, kl_penalty_target=kl_penalty_target, kl_adapt_factor=kl_adapt_factor,
                             kl_adapt_tolerance=kl_adapt_tolerance, cuda_graphs=cuda_graphs, compile_loss=compile_loss,
                             nonfinite=nonfinite, collect_device=collect_device, overlap_collection=overlap_collection,
                             update_threads=update_threads, normalize_value=normalize_value,
                             mean_bound_coef=mean_bound_coef)
        self._n_grad_steps = 0
        self._n_nonfinite_steps = 0
        super().__init__(policy, env, *args, **kwargs)
        if getattr(self, "policy", None) is not None:  # unset while load() rebuilds the model: checked before learning
            self._config.check_runtime(self, self._buffer_device)

    # ----------------------------------------------------------------------------------------------- set-up
    def _setup_model(self) -> None:
        """The algorithm's set-up plus the scale layer's derived state; the one place the added arguments are validated
        (it runs at construction and in ``load(..., **kwargs)``)."""
        self.device = EXTENSIONS.data_parallel.rank_device(self.device)  # cuda:LOCAL_RANK under torchrun
        self._config = ScaleConfig.of(self)
        self._buffer_device = self._config.validate(self.batch_size, self.normalize_advantage, self.device)
        self._check_supported(self._config)
        if self.overlap_collection:
            warnings.warn(OVERLAP_REMOVED, stacklevel=3)
        check_rollout_buffer_kwargs(self.rollout_buffer_class, self.rollout_buffer_kwargs)
        check_ppo_arguments(vars(self))
        check_net_arch(self.policy_kwargs, self.policy_class)
        for name in ("clip_range", "clip_range_vf"):  # NumPy numbers as SB3's schedules take them (learning_rate:
            setattr(self, name, plain_number(getattr(self, name)))  # resolve_learning_rate)
        super()._setup_model()
        if self.normalize_value:
            normalize_value_head(self.policy)
        self._mean_bound = make_mean_bound(self.mean_bound_coef, self.policy)
        self._warn_if_update_upstream_changed()
        self._objective: Objective = self._config.make_objective()
        self._objective.load_state_dict(self._saved_objective_state())
        self._check_own_sampling()
        self._rollout_stager: RolloutStager | None = None  # allocated by the first train(): loading allocates nothing
        self._graph_cache = GraphCache()  # cuda_graphs=True: the captured update, reused across train() calls
        # cuda_graphs=True: collection's captured policy step, reused across rollouts
        self._inference_graphs = InferenceGraphs() if self.cuda_graphs else None
        self._loss = compiled_ppo_loss if self.compile_loss else ppo_loss
        self._fused_evaluator: FusedEvaluator | None = None  # built by the first train() that can use it
        self._guard = NonFiniteGuard(self.nonfinite, self.device, on_device=self.cuda_graphs)
        self._reducer: Reducer = LOCAL  # data-parallel training replaces it
        self._collect_device = resolve_collect_device(self.collect_device, self.device)
        self._collection: CollectionPolicy | None = None  # the policy's copy on _collect_device, made when needed
        if self.env is None:  # loaded for inference: no rollout storage until learn() needs it
            self.rollout_buffer = None  # type: ignore[assignment]

    def _check_own_sampling(self) -> None:
        """A rollout buffer class with a sampling of its own (:func:`samples_itself`) hands the update minibatches of
        samples, not of rollout indices: refuse the settings that need the indices (ValueError naming them)."""
        buffer_class = getattr(self, "rollout_buffer_class", None)
        if buffer_class is None or not samples_itself(buffer_class):
            return
        if self.cuda_graphs:
            needs = "cuda_graphs=True (its graphs replay minibatches of rollout indices); pass cuda_graphs=False"
        elif self._objective.needs_old_dist(kl_estimator(self.policy.action_dist)):
            needs = (f"objective={self.objective!r} with this policy's analytic KL (each sample's rollout distribution "
                     "is looked up by its index); pass objective='clip'")
        else:
            return
        raise ValueError(f"rollout_buffer_class={buffer_class.__name__} draws its own minibatches (its get() / "
                         f"_get_samples()), which the update iterates as {algorithm_base(type(self)).__name__}'s "
                         f"train() does; that cannot be combined with {needs}")

    def _warn_if_update_upstream_changed(self) -> None:
        """Warn when the installed algorithm's ``train()`` (or the minibatch layout) is not the code the update was
        verified to reproduce: with default arguments its parameters may then differ from the algorithm's."""
        train, *layout = update(algorithm_base(type(self)))
        changed = changed_upstream((train, *layout))
        if changed is not None:
            warnings.warn(f"{type(self).__name__}'s update performs {train.__qualname__}'s operations as verified, "
                          f"but {changed}: "
                          "with default arguments its parameters may no longer equal the upstream class's "
                          "(docs/known-limits.md)", stacklevel=3)

    def _setup_lr_schedule(self) -> None:
        """SB3's, after turning ``learning_rate="kl_adaptive"`` into a :class:`KLAdaptiveLR` (at construction and
        in ``load(..., learning_rate=...)``)."""
        self.learning_rate = resolve_learning_rate(self.learning_rate)
        super()._setup_lr_schedule()

    def _saved_objective_state(self) -> dict[str, Any]:
        """The objective state a loaded model carries (models saved before objectives were objects kept ``_kl_beta``),
        unless ``load(..., kl_coef=b)`` chose another initial beta than the one the saved beta adapted from: then beta
        starts at ``b`` (the saved adapted beta would have overridden it without a word)."""
        state = self.__dict__.get("_objective_state")
        if state is None and "_kl_beta" in self.__dict__:
            state = {"kl_beta": self.__dict__["_kl_beta"]}
        state = dict(state or {})
        adapted_from = state.pop("kl_coef", None)  # saved since kl_coef at load counts; older models restore beta
        return {} if adapted_from is not None and adapted_from != float(self.kl_coef) else state

    def learn(self, *args: Any, **kwargs: Any) -> Any:
        """The algorithm's ``learn()`` (same arguments), after :func:`~sb3_ppo_scale.core.checks.check_learn_arguments`."""
        try:
            bound = inspect.signature(algorithm_base(type(self)).learn).bind(self, *args, **kwargs)
        except TypeError:  # the algorithm's own error for a missing or unknown argument
            return super().learn(*args, **kwargs)  # type: ignore[misc]
        bound.apply_defaults()
        check_learn_arguments(*(bound.arguments[name] for name in ("total_timesteps", "callback", "log_interval")))
        return super().learn(*args, **kwargs)  # type: ignore[misc]

    def _setup_learn(self, *args: Any, **kwargs: Any) -> Any:
        self._reducer = EXTENSIONS.data_parallel.attach(self)  # LOCAL unless data-parallel (sb3_ppo_scale.distributed)
        # checked here, not at load: a model may be loaded with fewer envs, or on another machine, for evaluation
        self._config.check_runtime(self, self._buffer_device)
        if self.rollout_buffer is None:
            self.rollout_buffer = self._build_rollout_buffer()
        return super()._setup_learn(*args, **kwargs)

    def _build_rollout_buffer(self) -> Any:
        """The rollout buffer of a model loaded without an env, built when ``learn()`` first needs it."""
        return self.rollout_buffer_class(  # type: ignore[misc]
            self.n_steps,
            self.observation_space,  # type: ignore[arg-type]
            self.action_space,
            device=self.device,
            gamma=self.gamma,
            gae_lambda=self.gae_lambda,
            n_envs=self.n_envs,
            **self.rollout_buffer_kwargs,
        )

    @property
    def kl_beta(self) -> float:
        """The current KL-penalty coefficient (beta), adapted after each ``train()``; saved with the model.
        ``kl_coef`` for an objective without a KL term."""
        beta = getattr(self._objective, "beta", None)
        return float(self.kl_coef) if beta is None else beta.value

    def save(self, *args: Any, **kwargs: Any) -> None:
        """SB3's ``save``, with the objective's state (beta, and the ``kl_coef`` it adapted from) among the saved
        attributes."""
        self._objective_state = {**self._objective.state_dict(), "kl_coef": float(self.kl_coef)}
        super().save(*args, **kwargs)

    @classmethod
    def load_checkpoint(cls, path: Any, env: Any, device: str | th.device = "auto", **kwargs: Any) -> Any:
        """The model of an exact-resume checkpoint, ready to continue training on ``env`` (reset here); continue
        with :func:`sb3_ppo_scale.checkpoint.learn_resumable` (see :func:`sb3_ppo_scale.checkpoint.load_checkpoint`)."""
        return load_checkpoint(path, env, device=device, cls=cls, **kwargs)  # type: ignore[return-value]

    def _excluded_save_params(self) -> list[str]:
        runtime = ["_rollout_stager", "_buffer_device", "_graph_cache", "_inference_graphs", "_loss", "_config",
                   "_objective", "_guard", "_reducer", "_kl_beta", "_collect_device", "_collection",
                   "_fused_evaluator"]
        return [*super()._excluded_save_params(), *runtime]

    @property
    def _hooks(self) -> RolloutHooks:
        """What the rollout buffer adds to the update (the prioritized buffer's order and weights)."""
        return rollout_hooks(self.rollout_buffer)

    # ----------------------------------------------------------------------------------------------- collection
    def collect_rollouts(self, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int) -> bool:
        """SB3's ``collect_rollouts`` with the policy run on ``collect_device`` (see that argument); data-parallel
        ranks then agree on the global ``num_timesteps`` and on whether to go on."""
        start = self.num_timesteps
        collected = self._collect_on_device(env, callback, rollout_buffer, n_rollout_steps)
        if self._reducer.world_size == 1:
            return collected
        return EXTENSIONS.data_parallel.after_rollout(self, start, collected)

    def _collect_on_device(self, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int) -> bool:
        if self._collect_device == self.device:
            return self._collect(env, callback, rollout_buffer, n_rollout_steps)
        if self._collection is None or self._collection.device != self._collect_device:
            self._collection = CollectionPolicy(self.policy, self._collect_device)
        with collecting_on(self, self._collection):
            return self._collect(env, callback, rollout_buffer, n_rollout_steps)

    def _collect(self, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int) -> bool:
        """SB3's loop run lean (same rollout, see :mod:`sb3_ppo_scale.core.collect.lean`), or the algorithm's own where
        the lean loop cannot promise its numbers."""
        if self._collects_lean():
            return self._collect_lean(env, callback, rollout_buffer, n_rollout_steps)
        return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)

    #: The class whose ``collect_rollouts`` :meth:`_collect_lean` reproduces; a subclass whose algorithm collects
    #: another way keeps its own loop.
    _lean_reproduces: type = OnPolicyAlgorithm

    def _collects_lean(self) -> bool:
        """Whether the lean loop replaces the algorithm's: only the ``collect_rollouts`` it reproduces
        (``_lean_reproduces``'s), and only for a policy it can run exactly (else a warning, once)."""
        if algorithm_base(type(self)).collect_rollouts is not self._lean_reproduces.collect_rollouts:
            return False
        blocker = changed_upstream(collection_loop(self._lean_reproduces)) or self._lean_blocker()
        if blocker is not None:
            owner = next(base.__name__ for base in type(self).__mro__
                         if base.__module__.startswith(("sb3_contrib.", "stable_baselines3.")))
            warnings.warn(f"{type(self).__name__} collects with {owner}'s loop, not the lean one: {blocker}",
                          stacklevel=3)
        return blocker is None

    # ----------------------------------------------------------------------------------------------- algorithm hooks
    # What differs between on-policy PPO algorithms. The defaults are SB3 PPO's; sb3-contrib's classes override them.
    def _check_supported(self, config: ScaleConfig) -> None:
        """Raise ValueError naming an added argument this algorithm cannot honour (default: all are supported)."""

    def _lean_blocker(self) -> str | None:
        """Why this model's policy cannot be collected lean exactly, or None (default: the fused ``policy(obs)``'s)."""
        return lean_blocker(self)

    def _collect_lean(self, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int) -> bool:
        """The lean loop: ``_lean_reproduces.collect_rollouts``, same rollout (default: SB3's, ``collect_rollouts_lean``)."""
        return collect_rollouts_lean(self, env, callback, rollout_buffer, n_rollout_steps)

    def _rollout_extras(self, buffer: Any) -> dict[str, np.ndarray]:
        """The algorithm's own per-sample rollout fields, flattened to SB3's env-major order (default: none)."""
        return {}

    def _make_loader(self, rollout: DeviceRollout, batch_size: int, shuffle: bool = True) -> Loader:
        """How the rollout is cut into logical minibatches of ``batch_size`` samples each epoch (default: SB3 PPO's
        permutation, or the buffer's hooks' order, sliced into samples; a buffer class with a sampling of its own is
        iterated through its ``get``, as the algorithm's ``train()`` does)."""
        if shuffle and samples_itself(type(self.rollout_buffer)):  # settings that need indices: _check_own_sampling
            return BufferLoader(self.rollout_buffer, batch_size, self.grad_accum_steps)
        return MinibatchLoader(rollout, batch_size, self.grad_accum_steps if shuffle else 1, shuffle=shuffle,
                               target_device=self.device, order=self._hooks.epoch_order)

    #: The algorithm's own evaluation, as its ``train()`` calls the policy (sb3-contrib's classes set theirs).
    _plain_evaluator: Evaluator = staticmethod(evaluate_actions)  # type: ignore[assignment]

    @property
    def _evaluator(self) -> Evaluator:
        """How the policy evaluates a micro-batch: :attr:`_plain_evaluator` (default ``policy.evaluate_actions(obs,
        actions)``), or for a diagonal-Gaussian, categorical or masked categorical policy its operations without
        module dispatch (:class:`FusedEvaluator`). One object per policy, so that the CUDA graphs' key (which holds the
        evaluator) stays the same across ``train()`` calls while the policy's modules and parameters are the same
        objects; ``compile_loss`` traces the policy's own
        ``evaluate_actions``."""
        if self.compile_loss or FusedEvaluator.blocker(self.policy) is not None:
            return self._plain_evaluator
        if self._fused_evaluator is None or self._fused_evaluator.parts != PolicyParts(self.policy):  # a new head
            self._fused_evaluator = FusedEvaluator(self.policy, self._plain_evaluator)
        return self._fused_evaluator

    def _n_observations(self, observation: Any) -> int:
        """How many observations ``observation`` holds, as the policy reads it (1 for a single, unbatched one); for
        the checks of ``predict``'s per-observation arguments (action masks, LSTM states)."""
        tensor, _ = self.policy.obs_to_tensor(observation)
        first = next(iter(tensor.values())) if isinstance(tensor, dict) else tensor
        return int(first.shape[0])

    def _boundary_state(self) -> dict[str, Any]:
        """State of the algorithm's own that changes during collection and that ``save()`` leaves out, as it is now
        (at a rollout boundary); the checkpoint stores it with SB3's ``_last_obs`` (default: none). Returned values
        must not alias live state: collection goes on after the capture."""
        return {}

    def _restore_boundary_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`_boundary_state` captured (after ``load()`` and the env reset of a resume)."""

    def _rollout_chunks(self, rollout: DeviceRollout) -> Iterator[MicroBatch]:
        """Micro-batches covering the rollout once, in rollout order, at most a micro-batch's worth of samples each
        (for the no-grad passes of the KL measurement)."""
        for batch in self._make_loader(rollout, self._micro_batch_size, shuffle=False):
            yield from batch.micro_batches()

    # ----------------------------------------------------------------------------------------------- update
    def train(self) -> None:
        """One update phase: ``n_epochs`` passes over the rollout in logical minibatches of ``batch_size``."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        if self.normalize_value:
            fold_returns(self.policy.value_net, self.rollout_buffer.returns, self._reducer.sum_, self._buffer_device)
        check_scheduled_value("learning_rate", self.policy.optimizer.param_groups[0]["lr"],
                              self._current_progress_remaining, finite=True)
        settings = self._loss_settings()
        with distribution_validation(False), torch_threads(self.update_threads):
            rollout = self._prepare_rollout(settings)
            batch_size = EXTENSIONS.data_parallel.local_batch_size(self, len(rollout))  # batch_size / world_size
            loader = self._make_loader(rollout, batch_size)
            step = self._update_step(settings, n_full_batches=len(rollout) // self.batch_size * self.n_epochs)
            try:
                stats = self._run_epochs(loader, step)
            finally:
                step.close()
            measured_kl = self._measure_kl(rollout, settings) if self._adapts_to_kl(settings) else None
        self._record(stats, settings, measured_kl)

    @property
    def _micro_batch_size(self) -> int:
        return -(-self.batch_size // self.grad_accum_steps)

    def _loss_settings(self) -> LossSettings:
        progress = self._current_progress_remaining
        clip_range_vf = None if self.clip_range_vf is None else check_scheduled_value(
            "clip_range_vf", float(self.clip_range_vf(progress)), progress)  # type: ignore[operator]
        return LossSettings(
            clip_range=check_scheduled_value("clip_range", float(self.clip_range(progress)), progress),  # type: ignore[operator]
            clip_range_vf=clip_range_vf,
            ent_coef=float(self.ent_coef),
            vf_coef=float(self.vf_coef),
            discrete_actions=isinstance(self.action_space, spaces.Discrete),
            objective=self._objective,
            kl_coef=self.kl_beta,
            kl_estimator=kl_estimator(self.policy.action_dist),
            evaluator=self._evaluator,
            normalize_value=self.normalize_value,
            mean_bound=self._mean_bound,
        )

    def _stage_rollout(self) -> DeviceRollout:
        """The rollout buffer's contents on the buffer device (as staged, before the buffer's hooks)."""
        if self._rollout_stager is None:
            self._rollout_stager = RolloutStager(self._buffer_device)
        return self._rollout_stager.stage(self.rollout_buffer, self._rollout_extras(self.rollout_buffer))

    def _prepare_rollout(self, settings: LossSettings) -> DeviceRollout:
        """Stage, let the buffer prepare it, and add the rollout policy's distribution where the loss needs it."""
        rollout = self._hooks.prepare_rollout(self._stage_rollout())
        if settings.terms.needs_old_dist(settings.kl_estimator):
            rollout.old_dist = rollout_distribution_params(
                self.policy, self._rollout_chunks(rollout), self._evaluator, len(rollout), rollout.device
            )
        return rollout

    def _update_step(self, settings: LossSettings, n_full_batches: int) -> UpdateStep | CudaGraphStep:
        step_settings = StepSettings(float(self.max_grad_norm), bool(self.normalize_advantage), self.target_kl)
        self._guard.begin()
        step = UpdateStep(self.policy, self._loss, settings, step_settings, self._guard, self._reducer)
        if not self.cuda_graphs:
            return step
        return CudaGraphStep(step, self.batch_size, n_full_batches, self._graph_cache)

    def _run_epochs(self, loader: Loader, step: UpdateStep | CudaGraphStep) -> TrainStats:
        """``n_epochs`` passes over ``loader``, each logical minibatch one ``step``; stops early at ``target_kl``."""
        stats = TrainStats()
        for epoch in range(self.n_epochs):
            for batch in loader:
                batch_stats, stepped = step(batch)
                stats.add(batch_stats, epoch)
                if not stepped:
                    self._n_updates += 1
                    if self.verbose >= 1:
                        print(f"Early stopping at step {epoch} due to reaching max kl: {stats.last_kl():.2f}")  # PPO's words
                    return stats
                self._n_grad_steps += 1
            self._n_updates += 1
        return stats

    def _adapts_to_kl(self, settings: LossSettings) -> bool:
        """Something adapts to the KL measured after the update: the KL-penalty beta or the learning rate."""
        return settings.penalises_kl or isinstance(self.learning_rate, KLAdaptiveLR)

    def _measure_kl(self, rollout: DeviceRollout, settings: LossSettings) -> th.Tensor:
        """Mean KL(pi_old || pi_updated) over the whole rollout, as a device scalar (the penalty's estimator; k3 when
        only the learning rate adapts, which needs no rollout distribution)."""
        estimator = settings.kl_estimator if settings.penalises_kl else K3
        kl = mean_rollout_kl(self.policy, self._rollout_chunks(rollout), self._evaluator, len(rollout), estimator)
        return EXTENSIONS.data_parallel.global_mean_kl(self, kl, len(rollout))  # all ranks adapt on the same KL

    def _record(self, stats: TrainStats, settings: LossSettings, measured_kl: th.Tensor | None) -> None:
        """Log every key PPO logs, with the same meaning, after a single device-to-host sync; then adapt beta."""
        extra = {"nonfinite_skipped": self._guard.skipped, "nonfinite_consecutive": self._guard.consecutive}
        if measured_kl is not None:
            extra["kl"] = measured_kl
        if hasattr(self.policy, "log_std"):
            extra["std"] = th.exp(self.policy.log_std).mean().detach()
        summary = stats.summary(extra)
        self._count_nonfinite(int(summary["nonfinite_skipped"]), int(summary["nonfinite_consecutive"]))
        for name in ("entropy_loss", "policy_gradient_loss", "value_loss", "approx_kl", "clip_fraction", "loss"):
            self.logger.record(f"train/{name}", summary[name])
        values, returns = (env_major(self.rollout_buffer, array)
                           for array in (self.rollout_buffer.values, self.rollout_buffer.returns))
        self.logger.record("train/explained_variance", explained_variance(values, returns))
        if "std" in summary:
            self.logger.record("train/std", summary["std"])
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/n_grad_steps", self._n_grad_steps)
        self.logger.record("train/clip_range", settings.clip_range)
        if settings.clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", settings.clip_range_vf)
        for key, value in self._hooks.train_log().items():  # e.g. train/retained_fraction
            self.logger.record(key, value)
        if measured_kl is not None:
            self._adapt_to_kl(summary["kl"], settings)

    def _count_nonfinite(self, skipped: int, consecutive: int) -> None:
        """Logged from the first skipped step on (a run without any logs exactly PPO's keys)."""
        self._n_nonfinite_steps += skipped
        if self._n_nonfinite_steps:
            self.logger.record("train/nonfinite_steps", self._n_nonfinite_steps)
        if self._guard.on_device:
            self._guard.check_after_train(skipped, consecutive)

    def _adapt_to_kl(self, measured_kl: float, settings: LossSettings) -> None:
        """Log the KL measured after the update, then adapt the KL-penalty beta (logging the beta this update used)
        and the KL-adaptive learning rate (used from the next update on)."""
        self.logger.record("train/kl", measured_kl)
        if settings.penalises_kl:
            self.logger.record("train/kl_coef", settings.kl_coef)
            self.logger.record("train/kl_estimator", settings.kl_estimator, exclude="tensorboard")
            self._objective.beta.adapt(measured_kl)  # type: ignore[attr-defined]
        if isinstance(self.learning_rate, KLAdaptiveLR):
            self.learning_rate.adapt(measured_kl, self._current_progress_remaining)


def env_major(buffer: Any, array: np.ndarray) -> np.ndarray:
    """A ``(n_steps, n_envs)`` rollout array flattened in the order SB3's ``train()`` sees it, after the buffer's
    ``get()`` has swapped and flattened it in place (env after env): float32 sums such as ``explained_variance``'s
    ``np.var`` round by that order. An array ``get()`` already flattened is flattened as it is."""
    return array.flatten() if buffer.generator_ready else array.swapaxes(0, 1).flatten()
