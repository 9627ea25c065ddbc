"""RL Baselines3 Zoo-style configs, read safely, and the envs and models they describe.

A config file is a YAML mapping from entry names to hyperparameters, in the zoo's format: one entry per env id
(``atari`` for every Atari game), keys ``n_timesteps``, ``policy``, ``n_envs``, ``normalize``, ``env_wrapper``,
``frame_stack``, ``env_kwargs``, ``vec_env`` (one of :data:`VEC_ENV_KINDS`) and the algorithm's
constructor arguments. Variants of an entry are named
``<entry>@<variant>`` (e.g. ``HalfCheetah-v5@gpu``). Unlike the zoo, nothing is passed to ``eval``:
``policy_kwargs`` / ``normalize`` strings go through :func:`parse_literal`, a literal parser that only knows
``dict(...)``, numbers, strings, lists, tuples, booleans, ``None`` and the activation / optimizer names of
:data:`SAFE_NAMES`. ``python -m sb3_ppo_scale.experiments.rl_zoo`` runs rl_zoo3's own trainer with ``scalable_ppo``
registered (see :mod:`sb3_ppo_scale.experiments.rl_zoo`).
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch as th
import yaml
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first
from stable_baselines3.common.vec_env import (
    DummyVecEnv, SubprocVecEnv, VecEnv, VecFrameStack, VecNormalize, VecTransposeImage,
)

from sb3_ppo_scale.core.update.lr import KL_ADAPTIVE, KLAdaptiveLR
from sb3_ppo_scale.core.ppo import ScalablePPO
from sb3_ppo_scale.envs.envpool import EnvPoolVecEnv
from sb3_ppo_scale.envs.episodes import EpisodeState
from sb3_ppo_scale.envs.processes import ProcessVecEnv
from sb3_ppo_scale.experiments.algorithms import DEFAULT_ALGO, algorithm, importable_env_id, register_envs
from sb3_ppo_scale.experiments.pipeline import ACTIVATIONS, MODEL_KEYS, VEC_ENV_KINDS, LinearSchedule, activation

#: ScalablePPO's config shipped with the package (``sb3_ppo_scale/experiments/configs/scalable_ppo.yml``); the other
#: algorithms' are in :data:`sb3_ppo_scale.experiments.algorithms.ALGORITHMS`.
DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "scalable_ppo.yml"

#: Keys that describe the envs and the run, not the model.
ENV_KEYS = frozenset(
    {"n_timesteps", "n_envs", "normalize", "env_wrapper", "frame_stack", "env_kwargs", "policy", "vec_env"}
)
#: Constructor arguments that each run sets from its own options (``train``, ``bench``), so an entry may not:
#: argument -> what sets it.
RUN_KEYS = {"seed": "--seed", "device": "--device", "verbose": "--verbose",
            "tensorboard_log": "--log-dir (TensorBoard logs go to <log-dir>/tensorboard)"}
#: Hyperparameters that are schedules: a number or ``lin_<initial value>``.
SCHEDULE_KEYS = ("learning_rate", "clip_range", "clip_range_vf")
#: Module prefixes an ``env_wrapper`` class may be imported from.
WRAPPER_MODULES = ("stable_baselines3.", "sb3_contrib.", "gymnasium.wrappers", "rl_zoo3.wrappers", "sb3_ppo_scale.")

#: The ``vec_env`` kinds whose envs are Gymnasium's, built by SB3's ``make_vec_env`` with this class.
GYMNASIUM_VEC_ENVS: dict[str, type[VecEnv]] = {"dummy": DummyVecEnv, "subproc": SubprocVecEnv, "processes": ProcessVecEnv}

#: Module prefixes a ``rollout_buffer_class`` may be imported from.
BUFFER_MODULES = ("stable_baselines3.", "sb3_contrib.", "sb3_ppo_scale.")

_OPTIMIZERS = ("Adam", "AdamW", "RMSprop", "SGD", "Adamax")


def _safe_names() -> dict[str, Any]:
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
    from stable_baselines3.common.torch_layers import FlattenExtractor, NatureCNN

    names: dict[str, Any] = {}
    for prefix in ("nn", "th.nn", "torch.nn"):
        names.update({f"{prefix}.{cls.__name__}": cls for cls in ACTIVATIONS.values()})
    for prefix in ("optim", "th.optim", "torch.optim"):
        names.update({f"{prefix}.{name}": getattr(th.optim, name) for name in _OPTIMIZERS})
    for cls in (RMSpropTFLike, NatureCNN, FlattenExtractor):
        names[cls.__name__] = cls
        names[f"{cls.__module__}.{cls.__name__}"] = cls
    return names


#: Dotted names a ``policy_kwargs`` string may mention (activations, optimizers, SB3 feature extractors).
SAFE_NAMES: dict[str, Any] = _safe_names()


# ------------------------------------------------------------------------------------------- literal parsing
def _dotted_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _literal(node: ast.AST, text: str) -> Any:  # noqa: C901 - one branch per allowed node type
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool, type(None))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand, text)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List):
        return [_literal(item, text) for item in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_literal(item, text) for item in node.elts)
    if isinstance(node, ast.Dict) and all(key is not None for key in node.keys):
        return {_literal(key, text): _literal(value, text) for key, value in zip(node.keys, node.values)}  # type: ignore[arg-type]
    if isinstance(node, ast.Call) and _dotted_name(node.func) == "dict" and not node.args:
        if all(keyword.arg is not None for keyword in node.keywords):
            return {keyword.arg: _literal(keyword.value, text) for keyword in node.keywords}
    name = _dotted_name(node)
    if name is not None and name in SAFE_NAMES:
        return SAFE_NAMES[name]
    raise ValueError(
        f"unsupported expression {ast.unparse(node)!r} in {text!r}: only dict(...), numbers, strings, lists, tuples, "
        f"True/False/None and these names are allowed: {sorted(n for n in SAFE_NAMES if '.' in n and n.count('.') < 3)}"
    )


def parse_literal(text: str) -> Any:
    """Parse a zoo-style Python literal string such as ``"dict(net_arch=[64, 64], activation_fn=nn.ReLU)"``.

    Nothing is executed: the string is parsed to a syntax tree and only literals, ``dict(key=value, ...)`` and
    the names of :data:`SAFE_NAMES` are accepted; anything else raises ``ValueError``.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"cannot parse {text!r}: {error.msg}") from error
    return _literal(tree.body, text)


# ------------------------------------------------------------------------------------------- schedules
def parse_schedule(value: Any, key: str = "learning_rate") -> float | LinearSchedule | KLAdaptiveLR:
    """A number (constant) or ``"lin_<x>"`` (linear decay from x to 0); for ``learning_rate`` also the KL-adaptive
    rate (:class:`~sb3_ppo_scale.core.update.lr.KLAdaptiveLR`): ``"kl_adaptive"`` (its defaults), ``"kl_adaptive_<x>"``
    (starting at x) or a mapping ``{kl_adaptive: {initial: x, target_kl: ..., factor: ..., min_lr: ..., max_lr:
    ...}}``. Anything else raises ``ValueError``."""
    if key == "learning_rate" and (value == KL_ADAPTIVE or isinstance(value, dict)
                                   or (isinstance(value, str) and value.startswith(KL_ADAPTIVE + "_"))):
        return _kl_adaptive(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        kind, _, number = value.partition("_")
        try:
            initial = float(number)
        except ValueError:
            initial = None
        if kind == "lin" and initial is not None:
            if not (math.isfinite(initial) and initial > 0):
                raise ValueError(f"{key}: 'lin_<number>' decays from the number to 0, so the number must be > 0, "
                                 f"got {value!r}")
            return LinearSchedule(initial)
        try:
            return float(value)
        except ValueError:
            pass
    kl_forms = ", 'kl_adaptive', 'kl_adaptive_<number>'" if key == "learning_rate" else ""
    raise ValueError(f"{key}: expected a number, 'lin_<number>' (e.g. lin_3e-4){kl_forms}, got {value!r}")


#: the arguments a ``{kl_adaptive: {...}}`` learning rate may set
KL_ADAPTIVE_ARGUMENTS = ("initial", "target_kl", "factor", "min_lr", "max_lr", "anneal_target")


def _kl_adaptive(value: str | dict[str, Any]) -> KLAdaptiveLR:
    if value == KL_ADAPTIVE:
        return KLAdaptiveLR()
    if isinstance(value, str):  # kl_adaptive_<x>
        try:
            initial = float(value[len(KL_ADAPTIVE) + 1:])
        except ValueError as error:
            raise ValueError(f"learning_rate: expected 'kl_adaptive_<number>' (e.g. kl_adaptive_1e-3), got {value!r}"
                             ) from error
        return KLAdaptiveLR(initial)  # its own ValueError names the bounds
    arguments = value.get(KL_ADAPTIVE) if list(value) == [KL_ADAPTIVE] else None
    if not isinstance(arguments, dict) or set(arguments) - set(KL_ADAPTIVE_ARGUMENTS):
        raise ValueError(f"learning_rate: a mapping must be {{kl_adaptive: {{...}}}} with keys among "
                         f"{', '.join(KL_ADAPTIVE_ARGUMENTS)}, got {value!r}")
    return KLAdaptiveLR(**arguments)


# ------------------------------------------------------------------------------------------- config files
@dataclass
class ZooConfig:
    """One resolved config entry: what to build and for how long.

    :param env_id: Gymnasium env id.
    :param entry: name of the entry used (``env_id``, ``atari``, or either with ``@variant``).
    :param n_timesteps: training budget in env steps (all envs together).
    :param vec_env: how the envs are vectorised, one of :data:`VEC_ENV_KINDS` (default ``dummy``).
    :param hyperparams: the entry as written (after overrides), JSON/YAML-serialisable; saved next to the model.
    :param model_kwargs: constructor arguments for the algorithm, parsed (schedules, policy_kwargs objects).
    """

    env_id: str
    entry: str
    n_timesteps: int
    policy: str
    n_envs: int = 1
    normalize: dict[str, Any] | None = None
    env_wrappers: list[tuple[type, dict[str, Any]]] = field(default_factory=list)
    frame_stack: int | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    hyperparams: dict[str, Any] = field(default_factory=dict)
    vec_env: str = "dummy"


def read_entries(path: str | Path) -> dict[str, dict[str, Any]]:
    """All entries of a config file (``yaml.safe_load``; merge keys ``<<:`` work)."""
    with open(path, encoding="utf-8") as stream:
        entries = yaml.safe_load(stream)
    if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
        raise ValueError(f"{path}: expected a mapping from entry names to mappings of hyperparameters")
    return entries


def is_atari(env_id: str) -> bool:
    """True for ALE games (their entry point is ale_py's ``AtariEnv``)."""
    _register_ale()
    spec = gym.registry.get(env_id)
    return spec is not None and "AtariEnv" in str(spec.entry_point)


def _register_ale() -> None:
    try:
        import ale_py
    except ImportError:  # pragma: no cover - ALE is a dependency, but Atari stays optional at run time
        return
    gym.register_envs(ale_py)


def entry_name(entries: dict[str, Any], env_id: str, variant: str | None = None) -> str:
    """The entry an env id uses: ``env_id[@variant]``, else ``atari[@variant]`` for Atari games."""
    suffix = f"@{variant}" if variant else ""
    for name in (f"{env_id}{suffix}", f"atari{suffix}" if is_atari(env_id) else None):
        if name is not None and name in entries:
            return name
    raise ValueError(f"no entry {env_id + suffix!r} (or 'atari{suffix}' for Atari games); entries: {sorted(entries)}")


def check_env_id(env_id: str) -> None:
    """ValueError naming ``env_id`` (and Gymnasium's suggestion) unless Gymnasium knows it.

    A user's own env is named as ``gymnasium.make`` accepts it: ``"module:EnvId-v0"`` imports ``module`` (which
    registers the env) and then looks up ``EnvId-v0``; every process that builds the env (tune's workers, torchrun's
    ranks) imports it the same way from the id. A module that cannot be imported is a ValueError naming it."""
    _register_ale()
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ValueError(f"env id {env_id!r}: cannot import module {module!r}, which should register "
                             f"{name!r} ({error}); is it on PYTHONPATH?") from None
    register_envs(name)
    try:
        gym.spec(name)
    except gym.error.Error as error:
        raise ValueError(f"unknown env id {env_id!r}: {error}") from None


def parse_overrides(pairs: list[str] | None) -> dict[str, Any]:
    """``["key=value", ...]`` -> dict; values are read as YAML scalars (``1e-3`` and ``lin_3e-4`` work; ``None`` as
    well as ``null`` is None)."""
    overrides: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {pair!r}")
        value = yaml.safe_load(text) if text.strip() else ""
        if value == "None":  # Python's spelling of YAML's null
            value = None
        if isinstance(value, str):
            try:
                value = float(value) if any(c in value for c in ".eE") else int(value)
            except ValueError:
                pass
        overrides[key.strip()] = value
    return overrides


def load_config(
    path: str | Path | None, env_id: str, variant: str | None = None, overrides: dict[str, Any] | None = None,
    algo: str = DEFAULT_ALGO,
) -> ZooConfig:
    """Read, check and parse the entry for ``env_id`` (see :class:`ZooConfig`).

    :param path: the config file (default: ``algo``'s, :data:`~sb3_ppo_scale.experiments.algorithms.ALGORITHMS`).
    :param algo: the algorithm the entry is for (default ``scalable_ppo``): its constructor arguments are the keys
        an entry may set. Unknown keys (in the file or in ``overrides``) raise ``ValueError`` naming the key and the
        entry.
    """
    path = algorithm(algo).config if path is None else Path(path)
    register_envs(env_id)
    entries = read_entries(path)
    try:
        name = entry_name(entries, env_id, variant)
    except ValueError:
        check_env_id(env_id)  # an unknown env id is the likelier mistake: say that first
        raise
    raw = copy.deepcopy(entries[name])
    raw.update(overrides or {})
    for key, flag in RUN_KEYS.items():
        if key in raw:
            raise ValueError(f"{key!r} in entry {name!r} of {path}: each run sets it; use {flag}")
    return config_from_hyperparams(env_id, name, raw, source=str(path), algo=algo)


def config_from_hyperparams(env_id: str, entry: str, raw: dict[str, Any], source: str = "<config>",
                            algo: str = DEFAULT_ALGO) -> ZooConfig:
    """Check and parse one entry's hyperparameters (a mapping as written in the YAML file) for ``algo``."""
    raw = copy.deepcopy(raw)
    check_keys(raw, entry, source, algorithm(algo).model_keys())
    if "policy" not in raw or "n_timesteps" not in raw:
        raise ValueError(f"entry {entry!r} of {source}: 'policy' and 'n_timesteps' are required")
    return ZooConfig(
        env_id=env_id,
        entry=entry,
        n_timesteps=_budget(raw["n_timesteps"], entry),
        policy=str(raw["policy"]),
        n_envs=_positive_int(raw.get("n_envs", 1), "n_envs", entry),
        normalize=parse_normalize(raw.get("normalize", False), raw.get("gamma")),
        env_wrappers=resolve_wrappers(raw.get("env_wrapper")),
        frame_stack=None if raw.get("frame_stack") is None else _positive_int(raw["frame_stack"], "frame_stack", entry),
        env_kwargs=_mapping_argument(raw.get("env_kwargs"), "env_kwargs"),
        model_kwargs=parse_model_kwargs({k: v for k, v in raw.items() if k not in ENV_KEYS}),
        hyperparams=raw,
        vec_env=_vec_env_kind(raw.get("vec_env", "dummy"), entry),
    )


def _budget(value: Any, entry: str) -> int:
    """``n_timesteps``: a number >= 1 (``1e6`` and ``1000000`` alike), as an int."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value < math.inf:
        raise ValueError(f"n_timesteps in entry {entry!r} must be a number >= 1, got {value!r}")
    return int(value)


def _mapping_argument(value: Any, key: str) -> dict[str, Any]:
    """A mapping, or a ``dict(...)`` string of one (:func:`parse_literal`), or None (empty)."""
    if isinstance(value, str):
        value = parse_literal(value)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be a mapping or a dict(...) string, got {value!r}")
    return dict(value)


def _vec_env_kind(value: Any, entry: str) -> str:
    if value not in VEC_ENV_KINDS:
        raise ValueError(f"vec_env in entry {entry!r} must be one of {VEC_ENV_KINDS}, got {value!r}")
    return value


def check_keys(raw: dict[str, Any], entry: str, path: str | Path, model_keys: frozenset[str] = MODEL_KEYS) -> None:
    """Raise ``ValueError`` for a key that is neither an env key nor a constructor argument (``model_keys``,
    default ScalablePPO's)."""
    for key in raw:
        if key not in ENV_KEYS and key not in model_keys:
            raise ValueError(
                f"unknown key {key!r} in entry {entry!r} of {path}; allowed: {sorted(ENV_KEYS | model_keys)}"
            )


def _positive_int(value: Any, key: str, entry: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} in entry {entry!r} must be a positive integer, got {value!r}")
    return value


def parse_model_kwargs(raw: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments: schedules parsed, ``policy_kwargs`` / ``rollout_buffer_kwargs`` strings parsed safely,
    a ``rollout_buffer_class`` given by class path imported (:func:`import_buffer_class`), an ``activation_fn`` given
    by name (``tanh``, see :data:`ACTIVATIONS`) replaced by its class."""
    kwargs = dict(raw)
    for key in SCHEDULE_KEYS:
        if key in kwargs and kwargs[key] is not None:
            kwargs[key] = parse_schedule(kwargs[key], key)
    for key in ("policy_kwargs", "rollout_buffer_kwargs"):
        if key in kwargs and kwargs[key] is not None:
            kwargs[key] = _mapping_argument(kwargs[key], key)
    if isinstance(kwargs.get("rollout_buffer_class"), str):
        kwargs["rollout_buffer_class"] = import_buffer_class(kwargs["rollout_buffer_class"])
    if isinstance(kwargs.get("policy_kwargs", {}).get("activation_fn"), str):
        kwargs["policy_kwargs"] = {**kwargs["policy_kwargs"],
                                   "activation_fn": activation(kwargs["policy_kwargs"]["activation_fn"])}
    return kwargs


def parse_normalize(value: Any, gamma: float | None = None) -> dict[str, Any] | None:
    """``normalize``: false/true, a mapping or a ``dict(...)`` string of VecNormalize kwargs -> kwargs or None.

    As in the zoo, VecNormalize's reward discount follows the entry's ``gamma``.
    """
    if isinstance(value, str):
        value = parse_literal(value)
    if value is False or value is None:
        return None
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f"normalize must be true/false, a mapping or a dict(...) string, got {value!r}")
    kwargs = dict(value)
    if gamma is not None:
        kwargs["gamma"] = float(gamma)
    return kwargs


def resolve_wrappers(value: Any) -> list[tuple[type, dict[str, Any]]]:
    """``env_wrapper``: a class path, or a list of class paths / ``{class path: kwargs}`` mappings (zoo format)."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    wrappers = []
    for item in items:
        if isinstance(item, dict) and len(item) == 1:
            (name, kwargs), = item.items()
        elif isinstance(item, str):
            name, kwargs = item, {}
        else:
            raise ValueError(f"env_wrapper: expected a class path or {{class path: kwargs}}, got {item!r}")
        wrappers.append((import_wrapper(name), dict(kwargs or {})))
    return wrappers


def import_wrapper(name: str) -> type:
    """Import a ``gym.Wrapper`` subclass by dotted path, only from :data:`WRAPPER_MODULES`."""
    return _import_class(name, WRAPPER_MODULES, gym.Wrapper, "env_wrapper", "gymnasium.Wrapper")


def _import_class(name: str, modules: tuple[str, ...], base: type, key: str, kind: str) -> type:
    """The class at the dotted path ``name``, imported only from ``modules`` and only a subclass of ``base``;
    ValueError naming ``key`` (the config key) and the ``kind`` of class expected otherwise."""
    module_name, _, class_name = name.rpartition(".")
    if not module_name or not name.startswith(modules):
        raise ValueError(f"{key} {name!r} must be the class path of a {kind} class under one of {modules}")
    try:
        cls = getattr(importlib.import_module(module_name), class_name, None)
    except ImportError:
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{key} {name!r} must be the class path of a {kind} class under one of {modules}")
    return cls


def import_buffer_class(name: str) -> type:
    """A rollout buffer class by dotted path (``sb3_ppo_scale.PrioritizedRolloutBuffer``), only from
    :data:`BUFFER_MODULES`, and only a subclass of SB3's ``RolloutBuffer``."""
    from stable_baselines3.common.buffers import RolloutBuffer

    return _import_class(name, BUFFER_MODULES, RolloutBuffer, "rollout_buffer_class", "RolloutBuffer")


# ------------------------------------------------------------------------------------------- envs and models
def _wrap(env: gym.Env, wrappers: list[tuple[type, dict[str, Any]]]) -> gym.Env:
    for cls, kwargs in wrappers:
        env = cls(env, **kwargs)
    return env


def make_envs(
    config: ZooConfig,
    *,
    n_envs: int | None = None,
    seed: int | None = None,
    eval_env: bool = False,
    monitor_dir: str | None = None,
    vec_env_cls: type | None = None,
    normalize_stats: str | Path | None = None,
) -> VecEnv:
    """Build the vectorised env as the zoo does: Monitor, wrappers, VecNormalize, VecFrameStack, image transpose.

    :param n_envs: number of envs (default: the config's ``n_envs``).
    :param seed: seed of the first env (env ``i`` gets ``seed + i``; None: random; EnvPool: 0).
    :param eval_env: VecNormalize neither updates its statistics nor normalises rewards (zoo convention).
    :param monitor_dir: folder for the Monitor CSVs (not with EnvPool, whose VecEnv records episodes itself).
    :param vec_env_cls: DummyVecEnv, SubprocVecEnv or ProcessVecEnv; default: the config's ``vec_env`` (``dummy``
        -> DummyVecEnv, ``subproc`` -> SubprocVecEnv, ``processes`` -> ProcessVecEnv, ``envpool`` ->
        :func:`sb3_ppo_scale.envs.make_envpool_vec_env`, ``scale`` -> :func:`sb3_ppo_scale.envs.make_scale_vec_env`).
    :param normalize_stats: a saved ``vecnormalize.pkl`` to load instead of fresh statistics.
    """
    _register_ale()
    register_envs(config.env_id)
    n_envs = n_envs or config.n_envs
    if vec_env_cls is None and config.vec_env == "envpool":
        env = _envpool_envs(config, n_envs, seed)
    elif vec_env_cls is None and config.vec_env == "scale":
        env = _scale_envs(config, n_envs, seed)
    else:
        _check_gymnasium_env_kwargs(config)
        vec_env_cls = vec_env_cls or GYMNASIUM_VEC_ENVS[config.vec_env]
        wrappers = list(config.env_wrappers)
        if vec_env_cls is SubprocVecEnv:  # so that checkpoints keep the episodes in the worker processes
            wrappers.append((EpisodeState, {}))
        in_workers = vec_env_cls in (SubprocVecEnv, ProcessVecEnv)
        env = make_vec_env(
            importable_env_id(config.env_id) if in_workers else config.env_id,  # workers import
            n_envs=n_envs,
            seed=seed,
            env_kwargs=config.env_kwargs,
            monitor_dir=monitor_dir,
            wrapper_class=(lambda e: _wrap(e, wrappers)) if wrappers else None,
            vec_env_cls=vec_env_cls,
        )
    if normalize_stats is not None:
        env = VecNormalize.load(str(normalize_stats), env)
        if eval_env:
            env.training, env.norm_reward = False, False
    elif config.normalize is not None:
        kwargs = dict(config.normalize)
        if eval_env:
            kwargs.update(training=False, norm_reward=False)
        env = VecNormalize(env, **kwargs)
    if config.frame_stack and not (isinstance(env.unwrapped, EnvPoolVecEnv) and is_atari(config.env_id)):
        env = VecFrameStack(env, config.frame_stack)  # EnvPool's Atari envs already stack 4 frames
    space = env.observation_space
    if is_image_space(space) and not is_image_space_channels_first(space):  # type: ignore[arg-type]
        env = VecTransposeImage(env)
    return env


#: ``env_kwargs`` that set EnvPool's thread pool, not the env: Gymnasium's envs do not take them
ENVPOOL_POOL_KWARGS = ("num_threads", "thread_affinity_offset")


def _check_gymnasium_env_kwargs(config: ZooConfig) -> None:
    """ValueError where ``env_kwargs`` holds EnvPool's pool options but the envs are Gymnasium's (an EnvPool entry
    run with ``--set vec_env=dummy``): the message names the keys and the fix."""
    pool_kwargs = sorted(set(config.env_kwargs) & set(ENVPOOL_POOL_KWARGS))
    if pool_kwargs:
        rest = {k: v for k, v in config.env_kwargs.items() if k not in pool_kwargs}
        raise ValueError(f"entry {config.entry!r}: env_kwargs {pool_kwargs} set EnvPool's threads (vec_env: envpool), "
                         f"but these envs are Gymnasium's (vec_env: {config.vec_env}); drop them: "
                         f"--set 'env_kwargs={rest}'")


def _scale_envs(config: ZooConfig, n_envs: int, seed: int | None) -> VecEnv:
    """The VecEnv :func:`sb3_ppo_scale.envs.plan_scale` picks for ``config`` on this machine (``vec_env: scale``;
    ``train`` prints the plan). No Monitor CSVs: the backends record episodes themselves."""
    if config.env_wrappers:
        raise ValueError(f"entry {config.entry!r}: env_wrapper cannot wrap the scale backends' envs (vec_env: scale); "
                         "drop env_wrapper or use vec_env dummy, subproc or processes")
    from sb3_ppo_scale.envs import make_scale_vec_env

    env, _ = make_scale_vec_env(config.env_id, n_envs, 0 if seed is None else seed, env_kwargs=config.env_kwargs,
                                verbose=0)
    return env


def _envpool_envs(config: ZooConfig, n_envs: int, seed: int | None) -> VecEnv:
    """EnvPool's VecEnv for ``config`` (``vec_env: envpool``); ValueError if the extra is not installed."""
    if config.env_wrappers:
        raise ValueError(f"entry {config.entry!r}: env_wrapper cannot wrap EnvPool's envs (vec_env: envpool); "
                         "drop env_wrapper or use vec_env dummy, subproc or processes")
    try:
        from sb3_ppo_scale.envs import make_envpool_vec_env

        return make_envpool_vec_env(config.env_id, n_envs, 0 if seed is None else seed, **config.env_kwargs)
    except ImportError as error:
        raise ValueError(f"vec_env 'envpool' needs EnvPool: pip install 'sb3-ppo-scale[envpool]' ({error})") from None


def build_model(config: ZooConfig, env: VecEnv, algo: type = ScalablePPO, **kwargs: Any) -> Any:
    """``algo(config.policy, env, **config.model_kwargs, **kwargs)``; ``kwargs`` (seed, device, ...) win.

    With ``algo=stable_baselines3.PPO`` the ScalablePPO-only keys must be absent (ValueError otherwise). Each model
    gets its own copy of the config's arguments: a KL-adaptive learning rate is state, not shared between models.
    """
    model_kwargs = {**copy.deepcopy(config.model_kwargs), **kwargs}
    accepted = inspect.signature(algo.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        extra = sorted(set(model_kwargs) - set(accepted))
        if extra:
            raise ValueError(f"{algo.__name__} does not take {extra} (entry {config.entry!r})")
    return algo(config.policy, env, **model_kwargs)

