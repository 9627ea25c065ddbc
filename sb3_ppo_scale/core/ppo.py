"""ScalablePPO: SB3's PPO with a device-resident rollout, oversized minibatches and exact gradient accumulation.

The additions live in :class:`~sb3_ppo_scale.core.algorithm.ScalableOnPolicyMixin`, shared with sb3-contrib's
PPO variants (:mod:`sb3_ppo_scale.contrib`); SB3's PPO needs none of the mixin's algorithm hooks overridden.
"""

from __future__ import annotations

from stable_baselines3 import PPO

from sb3_ppo_scale.core.algorithm import ScalableOnPolicyMixin


class ScalablePPO(ScalableOnPolicyMixin, PPO):
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
        (Adam, AdamW, RMSprop); see :mod:`sb3_ppo_scale.core.graphs`.

    :param learning_rate: as SB3's (a number or a schedule), or ``"kl_adaptive"`` / a
        :class:`~sb3_ppo_scale.core.lr.KLAdaptiveLR`: after each ``train()`` the learning rate is divided by 1.5
        when the update's mean KL(pi_old || pi) exceeds 2 x its target (0.01) and multiplied by 1.5 when it is
        below half of it, within [1e-5, 1e-2] (the large-batch rule of legged_gym / rl_games). Saved with the model.
    :param collect_device: where collection runs the policy for each env step (default "auto": the policy's device,
        as PPO; "cpu" is worth trying for small MLP policies trained on a GPU). When it differs from ``device``
        a copy of the policy lives there, refreshed once per rollout (see :mod:`sb3_ppo_scale.core.collect`).
        Saved with the model.
    :param overlap_collection: on an EnvPool VecEnv, step one half of the envs while the policy runs on the other
        (default False; see :mod:`sb3_ppo_scale.envs.overlap`: same data distribution as SB3's loop, other random
        draws). Ignored for envs it does not support.
    :param nonfinite: what an update with a NaN or infinite loss or gradient norm does: "skip" (default: that
        optimizer step is not taken, counted in ``train/nonfinite_steps``, and training stops after
        :data:`~sb3_ppo_scale.core.guard.MAX_CONSECUTIVE` in a row) or "raise" (stop at the first one); see
        :mod:`sb3_ppo_scale.core.guard`.

    ``batch_size`` may be anything from 1 (2 with advantage normalisation) up to the whole rollout
    (``n_steps * n_envs``).
    """
