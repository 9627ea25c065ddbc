"""The scale layer, algorithm-independent: what ScalablePPO adds to an on-policy PPO algorithm, in four parts.

At the top: the public class (:mod:`~sb3_ppo_scale.core.ppo`), the algorithm mixin every Scalable class shares
(:mod:`~sb3_ppo_scale.core.algorithm`), its configuration (:mod:`~sb3_ppo_scale.core.config`), the argument checks
(:mod:`~sb3_ppo_scale.core.checks`, a leaf every part may use) and the hooks the layers above plug in
(:mod:`~sb3_ppo_scale.core.extensions`: data parallelism, checkpoint loading).

- :mod:`sb3_ppo_scale.core.update`: one ``train()``: the rollout staged on the device, the minibatch loader, the
  objectives and the KL, the update step (accumulation, gradient clip, optimizer step), CUDA graphs, the compiled
  loss, the non-finite guard and the KL-adaptive learning rate.
- :mod:`sb3_ppo_scale.core.collect`: one rollout: the lean loop, the lean VecEnv step, the graphed policy step and
  collection on another device.
- :mod:`sb3_ppo_scale.core.policy`: the policy's operations without module dispatch, used by both halves (the fused
  collection step and the fused evaluation of a micro-batch).
- :mod:`sb3_ppo_scale.core.exact`: the record of the upstream code these parts reproduce, and the check that makes a
  lean path step aside when the installed code differs.

Dependencies point one way: ``exact`` <- ``policy`` <- ``update``, ``collect`` <- the top; ``update`` and ``collect``
do not import each other, and nothing in ``core`` imports a module above it (tests/test_imports.py). Every file in
``update``, ``collect``, ``policy`` and ``exact`` is covered by the parity suites (tests/test_parity.py,
tests/test_lean_collect.py, SB3's and sb3-contrib's own tests): a change there must keep them green.

The modules moved here from a flat ``core/`` keep their old import paths (``sb3_ppo_scale.core.lr``, ...) as aliases
of the new modules (:data:`MOVED`), so models and checkpoints pickled before the move still load.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

#: old module path -> the module it moved to (2026-12-04)
MOVED = {f"sb3_ppo_scale.core.{old}": f"sb3_ppo_scale.core.{new}" for old, new in {
    "upstream": "exact.upstream", "upstream_verified": "exact.upstream_verified",
    "upstream_record": "exact.upstream_record", "inference": "policy.inference", "evaluation": "policy.evaluation",
    "step": "update.step", "objectives": "update.objectives", "graphs": "update.graphs", "sampling": "update.sampling",
    "kl": "update.kl", "lr": "update.lr", "guard": "update.guard", "flat_adam": "update.flat_adam",
    "gradient_ops": "update.gradient_ops", "compiled": "update.compiled", "rollout": "update.rollout",
    "lean_collect": "collect.lean", "lean_step": "collect.vec_step", "inference_graph": "collect.graphed_step",
}.items()}


class _Alias(importlib.abc.Loader):
    """Loads an old module path as the module it moved to (the same module object)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the module ran when it was imported under its own name."""


class _MovedModules(importlib.abc.MetaPathFinder):
    """Finds :data:`MOVED`'s old paths (``sb3_ppo_scale.core.collect`` is a package now: its old module is
    :mod:`sb3_ppo_scale.core.collect.device`, re-exported by the package)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(MOVED[fullname]))


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
