"""The algorithms the experiment commands run (``train --algo``, ``bench`` labels) and what each needs: its class,
its default config file, the class it is compared with, how it is evaluated, and the extra envs its configs name.

===========================  ===========================================  =====================  ==================
``--algo``                   class                                        default config         compared with
===========================  ===========================================  =====================  ==================
``scalable_ppo`` (default)   :class:`sb3_ppo_scale.ScalablePPO`           ``scalable_ppo.yml``   ``sb3_ppo``
``scalable_maskable_ppo``    :class:`sb3_ppo_scale.ScalableMaskablePPO`   ``contrib.yml``        ``maskable_ppo``
``scalable_recurrent_ppo``   :class:`sb3_ppo_scale.ScalableRecurrentPPO`  ``contrib.yml``        ``recurrent_ppo``
===========================  ===========================================  =====================  ==================

Config files live in ``sb3_ppo_scale/experiments/configs/``. ``contrib.yml`` holds both contrib algorithms'
entries, named ``<env id>`` as usual: the recurrent ones are rl_zoo3's ``ppo_lstm`` entries, the masking ones use
sb3-contrib's masking envs, which :func:`register_envs` registers under a Gymnasium id.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from sb3_ppo_scale.experiments.masking_envs import MASKING_ENVS

#: the package's config files
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
#: what ``train`` runs without ``--algo``
DEFAULT_ALGO = "scalable_ppo"
@dataclass(frozen=True)
class Algorithm:
    """One runnable algorithm.

    :param name: its ``--algo`` / bench label name.
    :param class_path: ``module.Class`` of the Scalable class.
    :param config: its default config file.
    :param baseline: the bench label of the class it is compared with (same config, execution-only keys dropped).
    :param baseline_class: ``module.Class`` of that class.
    """

    name: str
    class_path: str
    config: Path
    baseline: str
    baseline_class: str

    @property
    def cls(self) -> type:
        return import_class(self.class_path)

    def model_keys(self) -> frozenset[str]:
        """Constructor arguments a config entry may set: the Scalable class's and its baseline's, without
        ``policy`` and ``env``."""
        return constructor_keys(self.cls) | constructor_keys(import_class(self.baseline_class))


ALGORITHMS: dict[str, Algorithm] = {
    algo.name: algo for algo in (
        Algorithm("scalable_ppo", "sb3_ppo_scale.ScalablePPO", CONFIG_DIR / "scalable_ppo.yml", "sb3_ppo",
                  "stable_baselines3.PPO"),
        Algorithm("scalable_maskable_ppo", "sb3_ppo_scale.ScalableMaskablePPO", CONFIG_DIR / "contrib.yml",
                  "maskable_ppo", "sb3_contrib.MaskablePPO"),
        Algorithm("scalable_recurrent_ppo", "sb3_ppo_scale.ScalableRecurrentPPO", CONFIG_DIR / "contrib.yml",
                  "recurrent_ppo", "sb3_contrib.RecurrentPPO"),
    )
}


def algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; ValueError listing the allowed names."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; allowed: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def import_class(path: str) -> type:
    """The class at ``module.Class``."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def constructor_keys(cls: type) -> frozenset[str]:
    """The named arguments ``cls(...)`` takes, without ``self``, ``policy``, ``env`` and catch-alls: its ``__init__``'s,
    and those of each ``__init__`` further up the MRO that the previous one's ``**kwargs`` hands on to, up to the
    first without ``**kwargs`` (ScalableRecurrentPPO: its own, the scale mixin's and RecurrentPPO's)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(klass.__init__).parameters
        names |= set(parameters)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            break
    return frozenset(names - {"self", "env", "policy", "args", "kwargs", "_init_setup_model"})


def evaluate_policy(model: Any, env: Any, **kwargs: Any) -> Any:
    """SB3's ``evaluate_policy``; sb3-contrib's masked one for a model that predicts with action masks
    (MaskablePPO and subclasses: each step's ``env.action_masks()`` is passed to ``predict``)."""
    from sb3_contrib import MaskablePPO

    if isinstance(model, MaskablePPO):
        from sb3_contrib.common.maskable.evaluation import evaluate_policy as masked

        return masked(model, env, **kwargs)
    from stable_baselines3.common.evaluation import evaluate_policy as plain

    return plain(model, env, **kwargs)


#: module to import (Gymnasium's ``"module:EnvId"`` form) so that a fresh process knows an env :func:`register_envs`
#: registers: the masking envs', and rl_zoo3's for its velocity-masked envs
_MASKING_MODULE = "sb3_ppo_scale.experiments.masking_envs"
_NOVEL_MODULE = "rl_zoo3.import_envs"


def register_envs(env_id: str) -> None:
    """Make ``env_id`` known to Gymnasium when it is one of the contrib configs' envs: the masking envs of
    :data:`MASKING_ENVS`, and rl_zoo3's velocity-masked ``<Env>NoVel-v<k>`` (registered by importing
    ``rl_zoo3.import_envs``, a few seconds, so only when such an id is asked for)."""
    module = _registering_module(env_id)
    if module is not None and env_id not in gym.registry:
        importlib.import_module(module)


def importable_env_id(env_id: str) -> str:
    """``env_id`` in the form ``gymnasium.make`` accepts in a process that has not registered it (a ``SubprocVecEnv``
    worker): ``"module:EnvId"`` for the envs :func:`register_envs` registers, ``env_id`` itself for any other."""
    module = _registering_module(env_id)
    return env_id if module is None else f"{module}:{env_id}"


def _registering_module(env_id: str) -> str | None:
    if ":" in env_id:
        return None
    if env_id in MASKING_ENVS:
        return _MASKING_MODULE
    if "NoVel-v" in env_id:
        return _NOVEL_MODULE
    return None


# ------------------------------------------------------------------------------------------------ bench labels
# ``sb3-ppo-scale bench`` labels its runs ``<algo>[@<variant>]`` (bench.py's docstring states the protocol); they live
# here so that the run protocol (bench.py) and its report (learning_report.py) read them without importing each other.

#: label algorithm name -> class path: each Scalable class (``scalable_ppo``, ``scalable_maskable_ppo``,
#: ``scalable_recurrent_ppo``) and the class it is compared with (``sb3_ppo``, ``maskable_ppo``, ``recurrent_ppo``)
ALGO_CLASSES = {name: path for a in ALGORITHMS.values()
                for name, path in ((a.baseline, a.baseline_class), (a.name, a.class_path))}
#: Scalable algorithm -> the algorithm it is paired with under the same entry
PAIRS = {a.name: a.baseline for a in ALGORITHMS.values()}
#: the classes Scalable ones are compared with (they get the entry without the execution-only keys)
BASELINES = frozenset(PAIRS.values())
#: labels of earlier results -> (algorithm, config variant)
LEGACY_LABELS: dict[str, tuple[str, str | None]] = {
    "scalable_ppo": ("scalable_ppo", "cpu"),
    "scalable_ppo_linear": ("scalable_ppo", "cpu_linear"),
    "scalable_ppo_zoo_batch": ("scalable_ppo", "cpu_zoo_batch"),
    "scalable_ppo_gpu": ("scalable_ppo", "gpu"),
    "scalable_ppo_gpu_linear": ("scalable_ppo", "gpu_linear"),
}
#: the variant name that selects the task's plain entry (``scalable_ppo@plain``: ScalablePPO with the baseline's config)
PLAIN_VARIANT = "plain"


def parse_label(label: str) -> tuple[str, str | None]:
    """``"sb3_ppo@cpu"`` -> ``("sb3_ppo", "cpu")``, ``"scalable_ppo@plain"`` -> ``("scalable_ppo", None)`` (the plain
    entry); legacy labels map as :data:`LEGACY_LABELS` says."""
    if label in LEGACY_LABELS:
        return LEGACY_LABELS[label]
    algo, _, variant = label.partition("@")
    if algo not in ALGO_CLASSES or (not variant and "@" in label):
        raise ValueError(f"--algos: {label!r} is not <algo>[@<variant>] with algo in {sorted(ALGO_CLASSES)} "
                         f"(or one of {sorted(LEGACY_LABELS)})")
    return algo, None if variant == PLAIN_VARIANT else variant or None


def parsed_or_unknown(label: str) -> tuple[str, str | None]:
    """:func:`parse_label`, or ``("", None)`` for a label it does not know (results of other scripts)."""
    try:
        return parse_label(label)
    except ValueError:
        return "", None


def family(algo: str) -> Algorithm:
    """The Scalable algorithm an algorithm name belongs to (itself, or the one it is the baseline of)."""
    return next(a for a in ALGORITHMS.values() if algo in (a.name, a.baseline))


def pair_of(label: str) -> str | None:
    """The label a Scalable label is paired with under the same entry (``scalable_ppo@cpu`` -> ``sb3_ppo@cpu``,
    ``scalable_recurrent_ppo`` -> ``recurrent_ppo``); None for the other labels."""
    algo, variant = parsed_or_unknown(label)
    return PAIRS[algo] + (f"@{variant}" if variant else "") if algo in PAIRS else None


def with_pairs(labels: list[str]) -> list[str]:
    """The labels, each Scalable one followed by its :func:`pair_of` (no duplicates)."""
    out: list[str] = []
    for label in labels:
        parse_label(label)  # ValueError for a label it does not know
        for item in (label, pair) if (pair := pair_of(label)) else (label,):
            if item not in out:
                out.append(item)
    return out


def label_order(label: str, baseline: str) -> tuple[int, str, int, str]:
    """Sort key of labels in reports: the baseline first, then by config variant, each baseline class before the
    Scalable class under the same variant."""
    algo, variant = parsed_or_unknown(label)
    return (0 if label == baseline else 1, variant or "", 0 if algo in BASELINES else 1, label)
