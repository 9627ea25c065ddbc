"""ScalableMaskablePPO: sb3-contrib's ``MaskablePPO`` with the scale layer.

Identical by default: policies, ``predict`` and save format are MaskablePPO's, and its rollouts are collected by the
lean loop (:mod:`sb3_ppo_scale.core.collect.lean`: MaskablePPO's ``collect_rollouts`` with the fused, masked policy
call; the same rollout bit for bit); ``train()`` is the shared update
(:class:`~sb3_ppo_scale.core.algorithm.ScalableOnPolicyMixin`) performing MaskablePPO's operations in its order. What masking adds to that update is supplied here:

- the rollout's ``action_masks`` are staged with the rest of the rollout (``DeviceRollout.extras``) and gathered into
  sb3-contrib's ``MaskableRolloutBufferSamples``, so they live on ``buffer_device`` (and in CUDA graphs' static
  gathers) like every other field;
- :func:`evaluate_masked` evaluates a micro-batch with the masked distribution, in the loss and in every KL
  measurement (masked logits are -1e8, never -inf: no objective produces NaN from them);
- masks are checked (:mod:`sb3_ppo_scale.contrib.masks`) where they enter: each collection step's
  ``env.action_masks()`` and ``predict(..., action_masks=...)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch as th
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.buffers import (
    MaskableDictRolloutBuffer,
    MaskableDictRolloutBufferSamples,
    MaskableRolloutBuffer,
    MaskableRolloutBufferSamples,
)
from sb3_contrib.common.maskable.utils import is_masking_supported
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_ppo_scale.contrib.masks import check_action_masks, masks_checked_at_policy_call, read_action_masks
from sb3_ppo_scale.core.algorithm import ScalableOnPolicyMixin
from sb3_ppo_scale.core.config import ScaleConfig
from sb3_ppo_scale.core.policy.evaluation import Evaluation, evaluate_with_distribution
from sb3_ppo_scale.core.collect.lean import collect_rollouts_lean
from sb3_ppo_scale.core.update.rollout import DeviceRollout, SampleTypes, flat_field

#: what a masked rollout's gather returns: SB3's six fields, then ``action_masks``
MASKABLE_SAMPLES = SampleTypes(MaskableRolloutBufferSamples, MaskableDictRolloutBufferSamples)
_MASK_BUFFERS = (MaskableRolloutBuffer, MaskableDictRolloutBuffer)


def evaluate_masked(policy: ActorCriticPolicy, micro: Any, actions: th.Tensor, with_distribution: bool) -> Evaluation:
    """MaskablePPO's evaluation: ``policy.evaluate_actions(obs, actions, action_masks=...)`` with the micro-batch's
    masks (or the same operations returning the masked distribution)."""
    data = micro.samples
    if with_distribution:
        return evaluate_with_distribution(policy, data.observations, actions, action_masks=data.action_masks)
    values, log_prob, entropy = policy.evaluate_actions(data.observations, actions, action_masks=data.action_masks)
    return values, log_prob, entropy, None


class _CheckedMaskablePPO(MaskablePPO):
    """MaskablePPO whose collection checks every step's masks (:func:`masks_checked_at_policy_call`) and takes
    ``use_masking`` from the model when the scale layer's collection path calls it with four arguments."""

    _use_masking: bool = True  # set per rollout by ScalableMaskablePPO.collect_rollouts

    def collect_rollouts(self, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int,
                         use_masking: bool | None = None) -> bool:
        use_masking = self._use_masking if use_masking is None else use_masking
        if not use_masking:
            return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps, use_masking)
        with masks_checked_at_policy_call(self.policy, self.action_space, env.num_envs):
            return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps, use_masking)


class ScalableMaskablePPO(ScalableOnPolicyMixin, _CheckedMaskablePPO):
    """Proximal Policy Optimization with invalid-action masking: ``sb3_contrib.MaskablePPO`` with ScalablePPO's
    additions.

    Takes every argument of :class:`sb3_contrib.MaskablePPO` (same names, positions and defaults) and trains
    identically with the defaults; plus every argument ScalablePPO adds (``grad_accum_steps``, ``buffer_device``,
    ``objective``, ``kl_coef`` ..., ``learning_rate="kl_adaptive"``, ``cuda_graphs``, ``compile_loss``,
    ``nonfinite``, ``collect_device``), documented on :class:`~sb3_ppo_scale.ScalablePPO`. Not supported, with a
    clear error: a rollout buffer without masks (the prioritized buffer with masks is :class:`~sb3_ppo_scale.MaskablePrioritizedRolloutBuffer`).

    ``learn(..., use_masking=False)`` and ``predict(..., action_masks=...)`` behave as MaskablePPO's; masks of the
    wrong size, or with a row that allows no action, raise ValueError naming the argument.
    """

    def _check_supported(self, config: ScaleConfig) -> None:
        buffer_class = self.rollout_buffer_class
        if buffer_class is not None and not issubclass(buffer_class, _MASK_BUFFERS):
            raise ValueError(f"rollout_buffer_class must store action masks (a subclass of MaskableRolloutBuffer or "
                             f"MaskableDictRolloutBuffer) for ScalableMaskablePPO, got {buffer_class.__name__}; the "
                             f"prioritized buffer with masks is sb3_ppo_scale.MaskablePrioritizedRolloutBuffer")

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_use_masking"]

    def _rollout_extras(self, buffer: Any) -> dict[str, np.ndarray]:
        return {"action_masks": flat_field(buffer, buffer.action_masks)}

    def _stage_rollout(self) -> DeviceRollout:
        rollout = super()._stage_rollout()
        return dataclasses.replace(rollout, sample_types=MASKABLE_SAMPLES, sample_extras=("action_masks",))

    _plain_evaluator = staticmethod(evaluate_masked)  # fused where the policy allows (ScalableOnPolicyMixin._evaluator)

    _lean_reproduces = _CheckedMaskablePPO

    def _collect_lean(self, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int) -> bool:
        """MaskablePPO's loop, lean: with ``use_masking``, the env's masks (checked, :func:`read_action_masks`) are
        read every step, sampled under and stored."""
        if not self._use_masking:
            return collect_rollouts_lean(self, env, callback, rollout_buffer, n_rollout_steps)
        if not is_masking_supported(env):
            raise ValueError("Environment does not support action masking. Consider using ActionMasker wrapper")
        return collect_rollouts_lean(self, env, callback, rollout_buffer, n_rollout_steps,
                                     lambda venv: read_action_masks(venv, self.action_space))

    def collect_rollouts(self, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int,
                         use_masking: bool = True) -> bool:
        """MaskablePPO's collection (``use_masking`` as there) through the scale layer's collection path."""
        self._use_masking = use_masking
        return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)

    def predict(  # type: ignore[override]
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        action_masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """MaskablePPO's ``predict``, after checking ``action_masks`` (one mask per observation)."""
        if action_masks is not None:
            check_action_masks(action_masks, self.action_space, self._n_observations(observation), "action_masks")
        return super().predict(observation, state, episode_start, deterministic, action_masks=action_masks)
