"""Study specs: load a YAML file into a validated :class:`StudySpec`; every mistake is a ValueError before any trial.

A spec (see ``tuning/*.yaml``) has these top-level keys; all but ``name``, ``envs`` and ``space`` have defaults:

- ``name`` (str): the study name; one Optuna study per env is named ``"{name}:{env_id}"``.
- ``algo``: the algorithm the trials train, as ``train --algo`` names it: ``scalable_ppo`` (default),
  ``scalable_maskable_ppo`` (evaluated with the env's action masks) or ``scalable_recurrent_ppo`` (LSTM policies;
  evaluated with the LSTM state carried over each episode); :data:`sb3_ppo_scale.experiments.algorithms.ALGORITHMS`.
  ``base`` and ``space`` take that class's constructor arguments.
- ``mode``: ``sensitivity`` (default; random or Sobol sampling, no pruning: global importance) or ``search``
  (TPE, optional median pruning: finds a good configuration, importance from it is biased).
- ``envs`` (list of Gymnasium ids), ``timesteps`` (env steps per trial and seed, default 50 000),
  ``seeds_per_trial`` (default 1; every trial trains with seeds ``seed, seed + 1, ...``; ``seed``: an int >= 0, default 0).
- ``evaluation``: ``eval_freq`` (env steps between evaluations, default ``timesteps // 5``), ``n_episodes``
  (default 5), ``deterministic`` (default true), ``objective``: ``auc`` (default; mean of the evaluation returns over
  the run = area under the evaluation curve / timesteps) or ``final`` (mean return of the last evaluation).
- ``base``: fixed arguments of the algorithm (``policy``, ``n_steps``, ``gamma``, ...), plus ``n_envs`` (default 1) and
  ``normalize`` (VecNormalize on observations and rewards, default false). ``policy_kwargs.activation_fn`` is a
  name (tanh, relu, elu, leaky_relu, ...: :data:`sb3_ppo_scale.experiments.pipeline.ACTIVATIONS`).
- ``space``: argument of the algorithm -> ``{type: float|int|pow2|categorical, low, high, log, step, choices, schedule}``;
  ``choices`` for categorical only, ``low``/``high`` for the others, ``log`` and ``step`` (> 0, dividing ``high - low``,
  not with ``log``) for float and int (a key the type would ignore is an error); ``schedule: linear`` (floats only)
  decays the value linearly to 0 over training. The ends of each range (and each choice) must be values the
  algorithm accepts. An entry of ``type: dummy`` (any name that is not an argument of the algorithm, e.g.
  ``dummy: {type: dummy}``) is a **noise-floor parameter**: a float in [``low``, ``high``] (default [0, 1]) sampled
  like the others and never passed to training, so its importance is what seed noise alone produces
  (:mod:`sb3_ppo_scale.tuning.noise`).
- ``noise_repeats`` (int >= 0, default 0): trials of the space's centre configuration
  (:func:`centre_values`) enqueued before the sampled ones and marked as such; they measure the objective's seed
  variance and are left out of importance. They come on top of ``n_trials``.
- ``decay_repeats`` (int, 0 to ``noise_repeats``, default 0): trials of the centre configuration whose
  ``learning_rate`` (searched, constant) decays linearly to 0 instead; decay repeat k trains with noise repeat k's
  seeds, so each pair measures what linear decay changes (the "use linear decay" advice). On top of ``n_trials`` too.
- ``sampler``: ``{name: random|sobol|tpe, seed}`` (seed: an int >= 0) (default sobol for sensitivity, tpe for search);
  ``pruner``: ``{name: none|median}`` (median only in search mode).
- ``n_trials`` (completed trials per env, default 32), ``storage`` (null = journal file under ``output_dir``; a
  journal file path; or an RDB URL such as ``postgresql://user:pw@host/db``), ``output_dir`` (null or
  absent: ``tune_results/<name>``). Relative paths are relative to the current working directory, not to the spec file:
  running a committed spec never writes into (or resumes) the results committed beside it.

:func:`load_spec` can change a spec before validation: ``--set key=value`` (:func:`apply_overrides`, dotted keys such
as ``base.n_envs=2``) and ``--n-timesteps`` (:func:`shrink`, keeps the number of evaluations).
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from optuna.distributions import FloatDistribution, IntDistribution

from sb3_ppo_scale.core.checks import check_net_arch, check_ppo_arguments
from sb3_ppo_scale.core.update.lr import resolve_learning_rate
from sb3_ppo_scale.experiments.algorithms import ALGORITHMS, DEFAULT_ALGO, algorithm
from sb3_ppo_scale.experiments.pipeline import ACTIVATIONS as ACTIVATION_CLASSES
from sb3_ppo_scale.experiments.zoo import check_env_id, parse_model_kwargs

TOP_KEYS = {"name", "algo", "mode", "envs", "timesteps", "seeds_per_trial", "seed", "evaluation", "base", "space",
            "sampler", "pruner", "n_trials", "noise_repeats", "decay_repeats", "storage",
            "output_dir"}
EVAL_KEYS = {"eval_freq", "n_episodes", "deterministic", "objective"}
PARAM_KEYS = {"type", "low", "high", "log", "step", "choices", "schedule"}
#: Keys of a searched parameter that its type has no use for (an error rather than ignored).
UNUSED_PARAM_KEYS = {"float": {"choices"}, "int": {"choices"}, "pow2": {"log", "step", "choices"},
                     "categorical": {"low", "high", "log", "step"}}
MODES = ("sensitivity", "search")
OBJECTIVES = ("auc", "final")
SAMPLERS = {"sensitivity": ("random", "sobol"), "search": ("tpe", "random", "sobol")}
PRUNERS = {"sensitivity": ("none",), "search": ("none", "median")}
PARAM_TYPES = ("float", "int", "pow2", "categorical", "dummy")
#: Range of a ``dummy`` parameter unless the spec gives ``low``/``high``.
DUMMY_RANGE = (0.0, 1.0)
SCHEDULES = ("constant", "linear")
ACTIVATIONS = tuple(ACTIVATION_CLASSES)
#: Base-config keys that are not arguments of the algorithm.
EXTRA_BASE_KEYS = {"n_envs", "normalize"}
#: The argument whose schedule a decay repeat changes (constant in the spec, linear in the repeat).
DECAYED_ARGUMENT = "learning_rate"
#: Arguments a spec may not set (the tuner owns them).
RESERVED_ARGS = {"seed", "tensorboard_log"}


def spec_arguments(algo: str = DEFAULT_ALGO) -> set[str]:
    """The constructor arguments of ``algo``'s class (and of the class it is compared with) that a spec's ``base``
    and ``space`` may set: ``policy`` and the model's arguments, less :data:`RESERVED_ARGS`."""
    return (set(algorithm(algo).model_keys()) | {"policy"}) - RESERVED_ARGS


@dataclass(frozen=True)
class ParamSpec:
    """One searched argument. ``pow2`` samples the exponent: Optuna sees ``log2_<name>`` in [log2 low, log2 high]."""

    name: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: int | float | None = None
    choices: tuple[Any, ...] = ()
    schedule: str = "constant"

    @property
    def optuna_name(self) -> str:
        """The parameter's name inside the Optuna study."""
        return f"log2_{self.name}" if self.type == "pow2" else self.name

    @property
    def is_dummy(self) -> bool:
        """A noise-floor parameter: sampled, never passed to training."""
        return self.type == "dummy"


@dataclass(frozen=True)
class EvalSpec:
    """Evaluation protocol: ``n_episodes`` episodes every ``eval_freq`` env steps, then reduce with ``objective``."""

    eval_freq: int
    n_episodes: int = 5
    deterministic: bool = True
    objective: str = "auc"


@dataclass(frozen=True)
class StudySpec:
    """A validated study spec. ``path`` is the YAML file it came from (None when built from a dict)."""

    name: str
    envs: tuple[str, ...]
    space: tuple[ParamSpec, ...]
    evaluation: EvalSpec
    algo: str = DEFAULT_ALGO
    mode: str = "sensitivity"
    timesteps: int = 50_000
    seeds_per_trial: int = 1
    seed: int = 0
    base: dict[str, Any] = field(default_factory=dict)
    sampler: dict[str, Any] = field(default_factory=dict)
    pruner: dict[str, Any] = field(default_factory=dict)
    n_trials: int = 32
    noise_repeats: int = 0
    decay_repeats: int = 0
    storage: str | None = None
    output_dir: Path = Path(".")
    path: Path | None = None

    def study_name(self, env_id: str) -> str:
        """The Optuna study name for ``env_id``."""
        return f"{self.name}:{env_id}"

    @property
    def trained_space(self) -> tuple[ParamSpec, ...]:
        """The searched parameters that training receives (dummies left out)."""
        return tuple(p for p in self.space if not p.is_dummy)

    @property
    def dummies(self) -> tuple[ParamSpec, ...]:
        """The noise-floor parameters (``type: dummy``)."""
        return tuple(p for p in self.space if p.is_dummy)

    @property
    def n_envs(self) -> int:
        return int(self.base.get("n_envs", 1))

    @property
    def rollout_size(self) -> int:
        """Samples per rollout: ``n_steps * n_envs`` (SB3 default n_steps 2048)."""
        return int(self.base.get("n_steps", 2048)) * self.n_envs


# --------------------------------------------------------------------------------------------------- loading
#: Where ``tune`` writes by default, relative to the current working directory.
DEFAULT_RESULTS_DIR = Path("tune_results")


def load_spec(path: str | Path, overrides: dict[str, Any] | None = None, n_timesteps: int | None = None) -> StudySpec:
    """Read and validate a YAML study spec, after ``overrides`` (:func:`apply_overrides`) and ``n_timesteps``
    (:func:`shrink`). Relative ``output_dir``/journal paths are relative to the current working directory."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"spec file {str(path)!r} does not exist")
    with path.open() as handle:
        raw = yaml.safe_load(handle)
    raw = apply_overrides(_mapping(raw, "spec"), overrides or {})
    if n_timesteps is not None:
        raw = shrink(raw, n_timesteps)
    return spec_from_dict(raw, path=path)


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``raw`` with each ``dotted.key: value`` set (``base.n_envs`` sets ``raw["base"]["n_envs"]``)."""
    raw = copy.deepcopy(raw)
    for dotted, value in overrides.items():
        *parents, key = dotted.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {dotted}: {part!r} is not a mapping in the spec")
        node[key] = value
    return raw


def shrink(raw: dict[str, Any], n_timesteps: int) -> dict[str, Any]:
    """``raw`` with ``timesteps = n_timesteps`` and ``evaluation.eval_freq`` scaled alike (same number of
    evaluations per trial, at least 1 step apart)."""
    _positive_int(n_timesteps, "--n-timesteps")
    raw = copy.deepcopy(raw)
    old = _positive_int(raw.get("timesteps", 50_000), "spec.timesteps")
    evaluation = dict(_mapping(raw.get("evaluation") or {}, "spec.evaluation"))
    eval_freq = _positive_int(evaluation.get("eval_freq", max(1, old // 5)), "spec.evaluation.eval_freq")
    evaluation["eval_freq"] = max(1, eval_freq * n_timesteps // old)
    raw.update(timesteps=n_timesteps, evaluation=evaluation)
    return raw


def spec_from_dict(raw: Any, base_dir: Path = Path("."), path: Path | None = None) -> StudySpec:
    """Validate a parsed spec mapping (see the module docstring for the keys)."""
    raw = _mapping(raw, "spec")
    _check_keys(raw, TOP_KEYS, "spec")
    for key in ("name", "envs", "space"):
        if key not in raw:
            raise ValueError(f"spec: missing required key {key!r}")
    name = raw["name"]
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"spec.name must be a non-empty string without ':', got {name!r}")
    algo = _choice(raw.get("algo", DEFAULT_ALGO), tuple(ALGORITHMS), "spec.algo")
    mode = _choice(raw.get("mode", "sensitivity"), MODES, "spec.mode")
    timesteps = _positive_int(raw.get("timesteps", 50_000), "spec.timesteps")
    base = _check_base(raw.get("base") or {}, algo)
    space = _check_space(raw["space"], base, algo)
    spec = StudySpec(
        name=name,
        envs=_check_envs(raw["envs"]),
        space=space,
        evaluation=_check_eval(raw.get("evaluation") or {}, timesteps),
        algo=algo,
        mode=mode,
        timesteps=timesteps,
        seeds_per_trial=_positive_int(raw.get("seeds_per_trial", 1), "spec.seeds_per_trial"),
        seed=_non_negative_int(raw.get("seed", 0), "spec.seed"),
        base=base,
        sampler=_check_sampler(raw.get("sampler") or {}, mode),
        pruner=_check_pruner(raw.get("pruner") or {}, mode),
        n_trials=_positive_int(raw.get("n_trials", 32), "spec.n_trials"),
        noise_repeats=_non_negative_int(raw.get("noise_repeats", 0), "spec.noise_repeats"),
        decay_repeats=_non_negative_int(raw.get("decay_repeats", 0), "spec.decay_repeats"),
        storage=_check_storage(raw.get("storage"), base_dir),
        output_dir=base_dir / _check_output_dir(raw.get("output_dir"), name),
        path=path,
    )
    _check_batch_fits(spec)
    _check_trains_before_evaluating(spec)
    _check_decay_repeats(spec)
    return spec


def _check_trains_before_evaluating(spec: StudySpec) -> None:
    """A trial must run more than one rollout: an evaluation that falls due during a rollout runs before that
    rollout's update, so in a one-rollout trial the evaluations score the untrained policy (the same value for
    every trial of an env, at most a final evaluation apart)."""
    if spec.timesteps <= spec.rollout_size:
        raise ValueError(f"spec.timesteps (or --n-timesteps) must be more than one rollout (n_steps * n_envs = "
                         f"{spec.rollout_size} env steps), got {spec.timesteps}: the evaluations of a one-rollout trial "
                         "run before its only update, so they score the untrained policy")


def _check_decay_repeats(spec: StudySpec) -> None:
    """Decay repeat k reuses noise repeat k's seeds, and decays a searched constant learning rate."""
    if not spec.decay_repeats:
        return
    if spec.decay_repeats > spec.noise_repeats:
        raise ValueError(f"spec.decay_repeats must be an int from 0 to spec.noise_repeats ({spec.noise_repeats}): decay "
                         f"repeat k is paired with noise repeat k, got {spec.decay_repeats!r}")
    searched = next((p for p in spec.trained_space if p.name == DECAYED_ARGUMENT), None)
    if searched is None or searched.type != "float" or searched.schedule != "constant":
        raise ValueError(f"spec.decay_repeats needs {DECAYED_ARGUMENT} in spec.space as a float with schedule constant "
                         f"(its centre value is what the decay repeats decay), got "
                         f"{'nothing' if searched is None else f'type {searched.type}, schedule {searched.schedule}'}")


# ------------------------------------------------------------------------------------------------ sections
def _check_envs(envs: Any) -> tuple[str, ...]:
    if isinstance(envs, str):
        envs = [envs]
    if not isinstance(envs, list) or not envs or not all(isinstance(e, str) for e in envs):
        raise ValueError(f"spec.envs must be a non-empty list of Gymnasium env ids, got {envs!r}")
    for env_id in envs:
        try:
            check_env_id(env_id)
        except ValueError as error:
            raise ValueError(f"spec.envs: {error}") from None
    if len(set(envs)) != len(envs):
        raise ValueError(f"spec.envs lists an env id twice: {envs!r}")
    return tuple(envs)


def _check_eval(raw: Any, timesteps: int) -> EvalSpec:
    raw = _mapping(raw, "spec.evaluation")
    _check_keys(raw, EVAL_KEYS, "spec.evaluation")
    eval_freq = _positive_int(raw.get("eval_freq", max(1, timesteps // 5)), "spec.evaluation.eval_freq")
    if eval_freq > timesteps:
        raise ValueError(f"spec.evaluation.eval_freq must be between 1 and timesteps={timesteps}, got {eval_freq}")
    deterministic = raw.get("deterministic", True)
    if not isinstance(deterministic, bool):
        raise ValueError(f"spec.evaluation.deterministic must be true or false, got {deterministic!r}")
    return EvalSpec(
        eval_freq=eval_freq,
        n_episodes=_positive_int(raw.get("n_episodes", 5), "spec.evaluation.n_episodes"),
        deterministic=deterministic,
        objective=_choice(raw.get("objective", "auc"), OBJECTIVES, "spec.evaluation.objective"),
    )


def _check_base(raw: Any, algo: str = DEFAULT_ALGO) -> dict[str, Any]:
    base = dict(_mapping(raw, "spec.base"))
    _check_keys(base, spec_arguments(algo) | EXTRA_BASE_KEYS, "spec.base")
    cls = algorithm(algo).cls
    base.setdefault("policy", next(iter(cls.policy_aliases)))  # MlpPolicy, MlpLstmPolicy
    if base["policy"] not in cls.policy_aliases:
        raise ValueError(f"spec.base.policy must be one of {tuple(cls.policy_aliases)} (the policies of "
                         f"{cls.__name__}, spec.algo {algo!r}), got {base['policy']!r}")
    _positive_int(base.get("n_envs", 1), "spec.base.n_envs")
    if not isinstance(base.get("normalize", False), bool):
        raise ValueError(f"spec.base.normalize must be true or false, got {base['normalize']!r}")
    kwargs = base.get("policy_kwargs")
    if kwargs is not None:
        kwargs = dict(_mapping(kwargs, "spec.base.policy_kwargs"))
        if "activation_fn" in kwargs:
            _choice(kwargs["activation_fn"], ACTIVATIONS, "spec.base.policy_kwargs.activation_fn")
        base["policy_kwargs"] = kwargs
    _check_arguments({k: v for k, v in base.items() if k not in EXTRA_BASE_KEYS | {"policy"}}, "spec.base")
    return base


def _check_arguments(arguments: dict[str, Any], where: str) -> None:
    """ValueError (prefixed with ``where``) for an argument value no trial could train with, parsed as a
    trial parses it (:func:`~sb3_ppo_scale.experiments.zoo.parse_model_kwargs`): PPO's numeric arguments
    (:func:`~sb3_ppo_scale.core.checks.check_ppo_arguments`), the learning rate and ``policy_kwargs.net_arch``."""
    try:
        kwargs = parse_model_kwargs(arguments)
        check_ppo_arguments(kwargs)
        if "learning_rate" in kwargs:
            resolve_learning_rate(kwargs["learning_rate"])
        check_net_arch(kwargs.get("policy_kwargs"))
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def _check_space(raw: Any, base: dict[str, Any], algo: str = DEFAULT_ALGO) -> tuple[ParamSpec, ...]:
    raw = _mapping(raw, "spec.space")
    if not raw:
        raise ValueError("spec.space must name at least one argument of the algorithm to search")
    dummies = {name for name, entry in raw.items() if isinstance(entry, dict) and entry.get("type") == "dummy"}
    arguments = spec_arguments(algo)
    _check_keys({k: v for k, v in raw.items() if k not in dummies}, arguments - {"policy"}, "spec.space")
    params = []
    for name, entry in raw.items():
        if name in base:
            raise ValueError(f"spec.space.{name} is also fixed in spec.base; keep it in one of them")
        if name in dummies:
            params.append(_check_dummy(name, entry, arguments))
        else:
            params.append(_check_param(name, entry))
    if not any(not p.is_dummy for p in params):
        raise ValueError("spec.space must name at least one argument of the algorithm besides its dummy parameter(s)")
    return tuple(params)


def _check_dummy(name: str, raw: dict[str, Any], arguments: set[str]) -> ParamSpec:
    """A ``type: dummy`` entry: a name that is none of the algorithm's ``arguments``, optional float ``low`` <
    ``high``."""
    where = f"spec.space.{name}"
    if name in arguments or name in RESERVED_ARGS:
        raise ValueError(f"{where}: a dummy parameter must not be named like an argument of the algorithm ({name!r} is one); "
                         "call it e.g. 'dummy'")
    _check_keys(raw, {"type", "low", "high"}, where)
    low, high = raw.get("low", DUMMY_RANGE[0]), raw.get("high", DUMMY_RANGE[1])
    for key, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}.{key} must be a number, got {value!r}")
    if not low < high:
        raise ValueError(f"{where}: low must be < high for type dummy, got low={low}, high={high}")
    return ParamSpec(name, "dummy", low=float(low), high=float(high))


def _check_param(name: str, raw: Any) -> ParamSpec:
    where = f"spec.space.{name}"
    raw = _mapping(raw, where)
    _check_keys(raw, PARAM_KEYS, where)
    kind = _choice(raw.get("type", "float"), PARAM_TYPES, f"{where}.type")
    schedule = _choice(raw.get("schedule", "constant"), SCHEDULES, f"{where}.schedule")
    if schedule != "constant" and kind != "float":
        raise ValueError(f"{where}.schedule={schedule!r} needs type float, got type {kind!r}")
    unused = sorted(set(raw) & UNUSED_PARAM_KEYS[kind])
    if unused:
        raise ValueError(f"{where}: {unused} would be ignored for type {kind!r}; its keys: "
                         f"{sorted(PARAM_KEYS - UNUSED_PARAM_KEYS[kind])}")
    if kind == "categorical":
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ValueError(f"{where}.choices must be a non-empty list for type categorical, got {choices!r}")
        for index, choice in enumerate(choices):
            _check_arguments({name: choice}, f"{where}.choices[{index}]")
        return ParamSpec(name, kind, choices=tuple(choices))
    if "low" not in raw or "high" not in raw:
        raise ValueError(f"{where} needs both low and high for type {kind!r}")
    low, high = raw["low"], raw["high"]
    number = (int, float) if kind == "float" else (int,)
    for key, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, number):
            raise ValueError(f"{where}.{key} must be {'a number' if kind == 'float' else 'an int'}, got {value!r}")
    if low > high:
        raise ValueError(f"{where}: low must be <= high, got low={low} > high={high}")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise ValueError(f"{where}.log must be true or false, got {log!r}")
    if (log or kind == "pow2") and low <= 0:
        raise ValueError(f"{where}: low must be > 0 for a log or pow2 range, got {low}")
    if kind == "pow2":
        for key, value in (("low", low), ("high", high)):
            if value & (value - 1):
                raise ValueError(f"{where}.{key} must be a power of two for type pow2, got {value}")
    step = raw.get("step")
    if step is not None:
        _check_step(where, kind, low, high, log, step)
    for key, value in (("low", low), ("high", high)):  # the ends of the range are sampled values too
        _check_arguments({name: value}, f"{where}.{key}")
    return ParamSpec(name, kind, low=low, high=high, log=log, step=step, schedule=schedule)


def _check_step(where: str, kind: str, low: float, high: float, log: bool, step: Any) -> None:
    """``step`` of a float or int range: a number (int for type int) > 0, without ``log``, that divides
    ``high - low`` (Optuna would otherwise narrow the range to the last step below ``high``, with a warning)."""
    number = (int, float) if kind == "float" else (int,)
    if isinstance(step, bool) or not isinstance(step, number) or step <= 0:
        raise ValueError(f"{where}.step must be {'a number' if kind == 'float' else 'an int'} > 0, got {step!r}")
    if log:
        raise ValueError(f"{where}: step cannot be combined with log: true (Optuna samples a log range continuously)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's warning that it narrows the range: an error here instead
        searched = (FloatDistribution if kind == "float" else IntDistribution)(low, high, step=step).high
    if searched != high:
        raise ValueError(f"{where}: high - low must be a multiple of step {step}, got low={low}, high={high} (Optuna "
                         f"would search up to {searched} only)")


def _check_sampler(raw: Any, mode: str) -> dict[str, Any]:
    raw = dict(_mapping(raw, "spec.sampler"))
    _check_keys(raw, {"name", "seed"}, "spec.sampler")
    default = "sobol" if mode == "sensitivity" else "tpe"
    allowed = SAMPLERS[mode]
    name = raw.get("name", default)
    if name not in allowed:
        why = " (TPE concentrates samples near good points, which biases global importance)" if name == "tpe" else ""
        raise ValueError(f"spec.sampler.name must be one of {allowed} in {mode} mode, got {name!r}{why}")
    return {"name": name, "seed": _non_negative_int(raw.get("seed", 0), "spec.sampler.seed")}


def _check_pruner(raw: Any, mode: str) -> dict[str, Any]:
    raw = dict(_mapping(raw, "spec.pruner"))
    _check_keys(raw, {"name"}, "spec.pruner")
    name = raw.get("name", "none")
    if name not in PRUNERS[mode]:
        why = " (pruned trials are left out of importance, which biases it)" if mode == "sensitivity" else ""
        raise ValueError(f"spec.pruner.name must be one of {PRUNERS[mode]} in {mode} mode, got {name!r}{why}")
    return {"name": name}


def _check_storage(raw: Any, base_dir: Path) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"spec.storage must be null, a journal file path or an RDB URL, got {raw!r}")
    return raw if "://" in raw else str(base_dir / raw)


def _check_output_dir(raw: Any, name: str) -> Path:
    """``output_dir``: null (the default, ``tune_results/<name>``) or a folder path."""
    if raw is None:
        return DEFAULT_RESULTS_DIR / name
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"spec.output_dir must be null (default: {DEFAULT_RESULTS_DIR / name}) or a folder path, "
                         f"got {raw!r}")
    return Path(raw)


def _check_batch_fits(spec: StudySpec) -> None:
    for param in spec.space:
        if param.name == "batch_size":
            biggest = max(param.choices) if param.type == "categorical" else param.high
            if biggest > spec.rollout_size:  # type: ignore[operator]
                raise ValueError(
                    f"spec.space.batch_size reaches {biggest} but a rollout holds n_steps * n_envs = "
                    f"{spec.rollout_size} samples; raise spec.base.n_steps or spec.base.n_envs"
                )


# ------------------------------------------------------------------------------------------------- helpers
def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a mapping, got {type(value).__name__}: {value!r}")
    return value


def _check_keys(raw: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _choice(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise ValueError(f"{where} must be one of {allowed}, got {value!r}")
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an int, got {value!r}")
    return value


def _non_negative_int(value: Any, where: str) -> int:
    if _int(value, where) < 0:
        raise ValueError(f"{where} must be an int >= 0, got {value!r}")
    return value


def _positive_int(value: Any, where: str) -> int:
    if _int(value, where) < 1:
        raise ValueError(f"{where} must be an int >= 1, got {value!r}")
    return value


def centre_values(spec: StudySpec) -> dict[str, Any]:
    """The space's centre in Optuna's names: the middle of each range (geometric middle of a log range, rounded for
    ints and pow2 exponents, snapped to ``step``), the first choice of a categorical; the noise-repeat trials run it."""
    return {p.optuna_name: _centre(p) for p in spec.space}


def _centre(param: ParamSpec) -> Any:
    if param.type == "categorical":
        return param.choices[0]
    if param.type == "pow2":
        low, high = pow2_bounds(param)
        return (low + high) // 2
    low, high = float(param.low), float(param.high)  # type: ignore[arg-type]
    middle = math.sqrt(low * high) if param.log else (low + high) / 2
    if param.step:
        middle = low + round((middle - low) / param.step) * param.step
    return int(round(middle)) if param.type == "int" else float(middle)


def pow2_bounds(param: ParamSpec) -> tuple[int, int]:
    """Exponent range of a ``pow2`` parameter."""
    return int(math.log2(param.low)), int(math.log2(param.high))  # type: ignore[arg-type]
