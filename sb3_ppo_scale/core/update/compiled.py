"""``compile_loss=True``: the micro-batch loss and its backward run through ``torch.compile``.

One compiled function serves every model of the process (Dynamo keeps compiled code per Python function, so a
``torch.compile`` per model would only add entries to the same cache). Compilation happens once per kind of
update, not per ``train()`` call:

- shapes are dynamic from the start, so the short last minibatch, micro-batches and a new ``batch_size`` reuse
  the compiled code;
- the loss coefficients (clip range, value clip range, entropy and value coefficients, beta) enter as 0-d
  tensors, so a clip-range schedule or the adaptive KL coefficient does not compile again each call.

What still compiles anew: another observation/action shape or network, another objective, value clipping on or
off, prioritized weights on or off. Dynamo stops compiling a function after ``torch._dynamo.config.recompile_limit``
(8) variants in one process and runs the rest eagerly, with a warning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cache

import torch as th

from sb3_ppo_scale.core.update.objectives import AdvantageNormalizer, LossSettings, ppo_loss
from sb3_ppo_scale.core.update.sampling import MicroBatch

#: LossSettings fields passed to the compiled loss as tensors (values that may change between train() calls)
TENSOR_FIELDS = ("clip_range", "clip_range_vf", "ent_coef", "vf_coef", "kl_coef")

Loss = Callable[[th.nn.Module, MicroBatch, AdvantageNormalizer, LossSettings], tuple[th.Tensor, th.Tensor]]


@cache
def _compiled() -> Loss:
    return th.compile(ppo_loss, dynamic=True)


def compiled_ppo_loss(
    policy: th.nn.Module, micro: MicroBatch, normalize: AdvantageNormalizer, settings: LossSettings
) -> tuple[th.Tensor, th.Tensor]:
    """:func:`~sb3_ppo_scale.core.update.objectives.ppo_loss` through ``torch.compile`` (inductor, dynamic shapes), with the
    float coefficients of ``settings`` as 0-d float32 CPU tensors (so they promote as Python floats do)."""
    return _compiled()(policy, micro, normalize, tensor_settings(settings))


def tensor_settings(settings: LossSettings) -> LossSettings:
    """``settings`` with every float of :data:`TENSOR_FIELDS` replaced by a 0-d tensor (None stays None)."""
    values = {name: getattr(settings, name) for name in TENSOR_FIELDS}
    return dataclasses.replace(
        settings, **{name: th.tensor(value, dtype=th.float32) for name, value in values.items() if value is not None}
    )
