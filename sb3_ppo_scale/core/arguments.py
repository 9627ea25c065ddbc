"""The arguments the scale layer adds to an on-policy algorithm, documented once: ScalablePPO's docstring ends
with :data:`SCALE_ARGUMENTS`; docs/features.md has the same list as a table."""

#: The arguments the scale layer adds, as one docstring block (ScalablePPO's docstring ends with it).
SCALE_ARGUMENTS = """    :param grad_accum_steps: micro-batches per logical minibatch of ``batch_size`` samples (default 1).
        Gradients of the micro-batches accumulate into one gradient clip and one optimizer step per logical
        minibatch; the result equals the big-batch update (advantages normalised over the logical minibatch,
        each micro loss weighted by its share of it, ``target_kl`` decided on the logical minibatch).
        Peak activation memory scales with ``batch_size / grad_accum_steps``.
    :param buffer_device: where the rollout lives during ``train()`` (default "auto": the policy's device).
        The rollout crosses to that device once per rollout and minibatches are gathered there.
    :param objective: "clip" (default, SB3's PPO-Clip), "kl_penalty" (PPO-Penalty: maximise r * A - beta * KL,
        no clipping) or "clip_kl_penalty" (both terms, as RLlib does).
    :param kl_coef: initial beta (default 1.0, the PPO paper's), >= 0. The current beta is saved with the model;
        ``load(..., kl_coef=b)`` with another value starts beta at ``b`` again.
    :param kl_penalty_target: d_targ (default 0.01): after each ``train()`` the mean KL(pi_old || pi) over the
        rollout is measured and beta adapted (see :class:`~sb3_ppo_scale.core.update.kl.AdaptiveKLCoefficient`); None keeps
        beta fixed. Beta stays within :data:`~sb3_ppo_scale.core.update.kl.KL_COEF_BOUNDS`.
    :param kl_adapt_factor: beta's multiplicative step (default 2.0), > 1.
    :param kl_adapt_tolerance: beta changes when KL leaves [d_targ / tolerance, d_targ * tolerance]
        (default 1.5), >= 1.
    :param cuda_graphs: replay every full-size minibatch update (gather, loss, backward, gradient clip, optimizer
        step) from CUDA graphs (default False). Same kernels, same data, a fraction of the host cost: it pays when
        the GPU waits on Python (small models, many minibatches). The graphs are kept between ``train()`` calls
        while nothing they depend on changes (a learning-rate or clip-range schedule means one capture per call),
        and keep one minibatch's activations allocated. Needs the policy on CUDA and a capturable optimizer
        (Adam, AdamW, RMSprop); see :mod:`sb3_ppo_scale.core.update.graphs`. Collection's per-step policy call is then
        replayed from a CUDA graph too (same kernels and random draws; see
        :mod:`sb3_ppo_scale.core.collect.graphed_step`).

    :param learning_rate: as SB3's (a number or a schedule), or ``"kl_adaptive"`` / a
        :class:`~sb3_ppo_scale.core.update.lr.KLAdaptiveLR`: after each ``train()`` the learning rate is divided by 1.5
        when the update's mean KL(pi_old || pi) exceeds 2 x its target (0.01) and multiplied by 1.5 when it is
        below half of it, within [1e-5, 1e-2] (the large-batch rule of legged_gym / rl_games). Saved with the model.
    :param collect_device: where collection runs the policy for each env step (default "auto": the policy's device,
        as PPO; "cpu" is worth trying for small MLP policies trained on a GPU). When it differs from ``device``
        a copy of the policy lives there, refreshed once per rollout (see :mod:`sb3_ppo_scale.core.collect.device`).
        Saved with the model.
    :param overlap_collection: accepted for scripts and saved models that set it, and ignored with a warning
        (default False): the double-buffered EnvPool collector it switched on was slower than the lean loop on EnvPool
        in every measurement and was removed (:data:`OVERLAP_REMOVED`).
    :param nonfinite: what an update with a NaN or infinite loss or gradient norm does: "skip" (default: that
        optimizer step is not taken, counted in ``train/nonfinite_steps``, and training stops after
        :data:`~sb3_ppo_scale.core.update.guard.MAX_CONSECUTIVE` in a row) or "raise" (stop at the first one); see
        :mod:`sb3_ppo_scale.core.update.guard`.

    :param update_threads: torch's CPU threads during ``train()`` (default None: torch's setting as it is, as PPO).
        Collection keeps the process's setting: on a CPU box where the envs step on every core, one torch thread
        for the per-step policy call and every core for the update is the fast split (``benchmarks/scale.py``).
        The float sums of a multi-threaded update may round differently from a single-threaded one.

    :param normalize_value: the critic learns returns normalised by their running mean and std (default False:
        raw returns, as PPO). The policy's ``value_net`` becomes a
        :class:`~sb3_ppo_scale.core.policy.value_head.NormalizedValueHead`: its values stay in return units for
        collection and GAE; each ``train()`` first folds the rollout's returns into the statistics (rescaling the
        layer so that its predictions are unchanged, as PopArt does), then measures the value error, and
        ``clip_range_vf``, in units of the return std. Saved with the model (the statistics in the policy's state).
    :param mean_bound_coef: weight of a penalty on a diagonal-Gaussian policy's mean where it leaves the action box
        by more than 10% of the box's half-width (default 0: none, as PPO; rl_games' ``bounds_loss_coef``, which its
        Humanoid recipe sets to 5e-4); see :class:`~sb3_ppo_scale.core.update.objectives.MeanBound`. Needs a
        bounded ``Box`` action space.

    ``batch_size`` may be anything from 1 (2 with advantage normalisation); one above the whole rollout
    (``n_steps * n_envs``) trains on the whole rollout as one minibatch, as SB3's PPO does (which warns).
"""
