"""The upstream code the exact paths reproduce, and whether the installed packages still have it.

The lean collection loops, the lean VecEnv step, the fused policy step and evaluation and the lean LSTM loop run the
statements of SB3's, sb3-contrib's and torch's own functions, leaner; the update performs PPO's (MaskablePPO's,
RecurrentPPO's) ``train()`` operations in its order. They are exact for the code they were written and tested
against (the versions in constraints.txt). pyproject.toml accepts later releases, in which one of those functions may
change; a lean path would then keep computing what the old code computed, silently.

Each path names the functions it reproduces. :func:`changed_upstream` compares a fingerprint of each (a hash of its
syntax tree without docstrings and annotations, so comments, docstrings, type hints and formatting do not count) with
those recorded in :mod:`sb3_ppo_scale.core.exact.upstream_verified` for the versions the parity tests passed on. Where one
differs, or its source cannot be read, the lean path steps aside for the upstream code, as it does for a custom
policy class, and the model says why once; the update, which has no upstream stand-in with every added argument,
warns that its numbers may no longer be the upstream class's.

After the parity tests pass on new upstream versions (``CI=true make test``), ``python -m
sb3_ppo_scale.core.exact.upstream_record`` adds the installed fingerprints; tests/test_upstream.py fails until they are
recorded.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import inspect
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

import torch as th
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer
from sb3_contrib.common.maskable.distributions import (
    MaskableBernoulliDistribution,
    MaskableCategorical,
    MaskableCategoricalDistribution,
    MaskableMultiCategoricalDistribution,
)
from sb3_contrib.common.recurrent import buffers as recurrent_buffers
from stable_baselines3.common import distributions as sb3_distributions
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common import preprocessing
from stable_baselines3.common import utils as sb3_utils
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.torch_layers import FlattenExtractor, MlpExtractor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecEnvWrapper, VecNormalize

from sb3_ppo_scale.core.exact import upstream_verified

Function = Callable[..., Any]
#: (a class or module, an attribute name): where an upstream function is looked up
References = tuple[tuple[Any, str], ...]
#: The packages whose code the exact paths reproduce: module prefix -> distribution name.
PACKAGES = {"stable_baselines3": "stable-baselines3", "sb3_contrib": "sb3-contrib", "torch": "torch"}
#: Fields that never change what a function computes: type hints and type comments.
_IGNORED_FIELDS = frozenset({"annotation", "returns", "type_comment"})

# ------------------------------------------------------------------------------------------------ what is reproduced
#: The fused policy step's building blocks (core/policy/inference.py, contrib/lstm.py), whatever the distribution.
POLICY_LAYERS: References = (
    (MlpExtractor, "forward"), (MlpExtractor, "forward_actor"), (MlpExtractor, "forward_critic"),
    (FlattenExtractor, "forward"), (preprocessing, "preprocess_obs"), (th.nn.Linear, "forward"),
    (th.nn.Tanh, "forward"), (th.nn.ReLU, "forward"), (th.nn.Flatten, "forward"), (th.nn.LSTM, "forward"),
)
#: SB3 distribution class -> (its torch distribution class, module-level helpers its methods call).
TORCH_DISTRIBUTIONS: dict[type, tuple[type, References]] = {
    sb3_distributions.DiagGaussianDistribution: (th.distributions.Normal,
                                                 ((sb3_distributions, "sum_independent_dims"),)),
    sb3_distributions.CategoricalDistribution: (th.distributions.Categorical, ()),
    sb3_distributions.MultiCategoricalDistribution: (th.distributions.Categorical, ()),
    sb3_distributions.BernoulliDistribution: (th.distributions.Bernoulli, ()),
    MaskableCategoricalDistribution: (MaskableCategorical, ()),
    MaskableMultiCategoricalDistribution: (MaskableCategorical, ()),
    MaskableBernoulliDistribution: (MaskableCategorical, ()),
}
#: The methods of those classes (theirs or inherited) that the fused samplers and scorers reproduce.
_DISTRIBUTION_METHODS = ("proba_distribution", "log_prob", "entropy", "sample", "get_actions", "apply_masking")
_TORCH_DISTRIBUTION_METHODS = ("__init__", "sample", "log_prob", "entropy", "apply_masking")
#: SB3's ``DummyVecEnv`` / ``VecNormalize`` stepping (core/collect/vec_step.py).
VEC_ENV_STEP: References = (
    (VecEnv, "step"), (DummyVecEnv, "step_async"), (DummyVecEnv, "step_wait"), (VecEnvWrapper, "step_async"),
    (VecNormalize, "step_wait"), (VecNormalize, "normalize_obs"), (VecNormalize, "_normalize_obs"),
    (VecNormalize, "normalize_reward"), (RunningMeanStd, "update"),
)
#: What the lean loops write and convert (core/collect/lean.py: ``_store``, ``observation_tensor``).
COLLECTION_PARTS: References = ((RolloutBuffer, "add"), (MaskableRolloutBuffer, "add"), (sb3_utils, "obs_as_tensor"))
#: The minibatch order and layout the update's loaders reproduce (core/update/sampling.py, contrib/sequences.py), by the
#: buffer class the algorithm's ``train()`` draws minibatches from.
UPDATE_PARTS: dict[type, References] = {
    RolloutBuffer: ((RolloutBuffer, "get"), (RolloutBuffer, "_get_samples")),
    MaskableRolloutBuffer: ((MaskableRolloutBuffer, "get"), (MaskableRolloutBuffer, "_get_samples")),
    recurrent_buffers.RecurrentRolloutBuffer: (
        (recurrent_buffers.RecurrentRolloutBuffer, "get"), (recurrent_buffers.RecurrentRolloutBuffer, "_get_samples"),
        (recurrent_buffers, "create_sequencers"), (recurrent_buffers, "pad"), (recurrent_buffers, "pad_and_flatten")),
}


def resolve(references: References) -> tuple[Function, ...]:
    """The functions ``references`` name, looked up now (so code that replaces one at run time is seen)."""
    return tuple(getattr(owner, name) for owner, name in references)


def upstream_method(cls: type, name: str) -> Function:
    """``cls``'s method ``name`` as the first SB3 or sb3-contrib class in its MRO defines it (this package's own
    subclasses skipped)."""
    for base in cls.__mro__:
        if base.__module__.startswith(("stable_baselines3.", "sb3_contrib.")) and name in vars(base):
            return vars(base)[name]
    raise AttributeError(f"no SB3 or sb3-contrib class in {cls.__name__}'s bases defines {name}")


def distribution_functions(distribution: type) -> tuple[Function, ...]:
    """The methods and helpers a fused sampler or scorer reproduces for SB3 distribution class ``distribution``
    (none for one it does not fuse: that one runs itself)."""
    if distribution not in TORCH_DISTRIBUTIONS:
        return ()
    torch_class, helpers = TORCH_DISTRIBUTIONS[distribution]
    own = [getattr(distribution, name) for name in _DISTRIBUTION_METHODS if hasattr(distribution, name)]
    torch_side = [getattr(cls, name) for cls in torch_class.__mro__[:-1] for name in _TORCH_DISTRIBUTION_METHODS
                  if name in vars(cls) and cls.__module__.startswith(("torch.distributions", "sb3_contrib."))]
    return (*own, *torch_side, *resolve(helpers))


def policy_step(reference: type, replaced: Iterable[str], distribution: type) -> tuple[Function, ...]:
    """What a fused step of a ``reference`` policy reproduces: the ``replaced`` methods, the layers and the
    distribution's methods."""
    return (*(upstream_method(reference, name) for name in replaced), *resolve(POLICY_LAYERS),
            *distribution_functions(distribution))


def collection_loop(algorithm: type) -> tuple[Function, ...]:
    """What a lean collection loop for ``algorithm`` reproduces: its ``collect_rollouts`` and the buffer writes."""
    return (upstream_method(algorithm, "collect_rollouts"), *resolve(COLLECTION_PARTS))


def update(algorithm: type) -> tuple[Function, ...]:
    """What the scale layer's update performs for ``algorithm``: its ``train()`` and its buffer's minibatch layout."""
    buffer = recurrent_buffers.RecurrentRolloutBuffer if issubclass(algorithm, RecurrentPPO) \
        else MaskableRolloutBuffer if issubclass(algorithm, MaskablePPO) else RolloutBuffer
    return (upstream_method(algorithm, "train"), *resolve(UPDATE_PARTS[buffer]))


# ------------------------------------------------------------------------------------------------ fingerprints
def name_of(function: Function) -> str:
    """``module.Qualified.name`` of ``function``."""
    return f"{function.__module__}.{function.__qualname__}"


def fingerprint(function: Function) -> str | None:
    """A hash of ``function``'s syntax tree without docstrings, type hints and formatting; None when its source
    cannot be read (a compiled or generated function)."""
    function = getattr(function, "__func__", function)  # a staticmethod or classmethod: the function it holds
    try:  # the function's own code: inspect would otherwise follow a wrapper's __wrapped__ to the code it wraps
        source = textwrap.dedent(inspect.getsource(function.__code__))
        node = ast.parse(source).body[0]
    except (AttributeError, OSError, TypeError, SyntaxError, IndexError):
        return None
    return hashlib.sha256(_canonical(node).encode()).hexdigest()[:20]


def _canonical(node: Any) -> str:
    """A text form of an AST that is the same on every supported Python: each node's fields in order, empty ones
    (None, []) left out (later Pythons add fields that are empty here), docstrings and :data:`_IGNORED_FIELDS`
    dropped."""
    if isinstance(node, list):
        return "[" + ",".join(_canonical(item) for item in _without_docstring(node)) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = (f"{name}={_canonical(value)}" for name, value in ast.iter_fields(node)
              if name not in _IGNORED_FIELDS and value is not None and value != [])
    return f"{type(node).__name__}({','.join(fields)})"


def _without_docstring(body: list) -> list:
    """A statement list without a leading string expression (a docstring)."""
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def installed_version(function: Function) -> str:
    """'package version' of the package ``function`` comes from."""
    package = PACKAGES.get(function.__module__.split(".")[0], function.__module__.split(".")[0])
    try:
        return f"{package} {importlib.metadata.version(package)}"
    except importlib.metadata.PackageNotFoundError:
        return package


@functools.lru_cache(maxsize=None)
def changed_upstream(functions: tuple[Function, ...]) -> str | None:
    """Why ``functions`` are not the code the exact paths were verified against (the first that differs), or None."""
    for function in functions:
        recorded = upstream_verified.FINGERPRINTS.get(name_of(function), ())
        if fingerprint(function) not in recorded:
            verified = ", ".join(f"{package} {' / '.join(versions)}"
                                 for package, versions in upstream_verified.VERIFIED_WITH.items())
            return (f"{installed_version(function)}'s {name_of(function)} is not the code it reproduces "
                    f"(verified with {verified})")
    return None
