"""The exact paths step aside when the installed upstream code is not the code they were verified against.

sb3_ppo_scale/core/exact/upstream.py fingerprints every SB3, sb3-contrib and torch function a lean path reproduces. Here:
the record holds the installed (pinned) versions' code; the fingerprint ignores what does not change a function's
computation and sees what does; and a changed upstream function (written to a module file, as an upgrade would
ship it, and put in the upstream function's place) makes the lean collection loop, the fused policy step, the lean
VecEnv step and the fused evaluation step aside for the upstream code, with a warning, so that ScalablePPO still
equals PPO running that changed code; the update, which has no upstream stand-in, warns.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
import textwrap
import types
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.vec_env import VecNormalize

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core import algorithm
from sb3_ppo_scale.core.exact import upstream_verified
from sb3_ppo_scale.core.collect.lean import collect_rollouts_lean
from sb3_ppo_scale.core.collect.vec_step import vec_env_step
from sb3_ppo_scale.core.exact.upstream import changed_upstream, fingerprint, name_of
from sb3_ppo_scale.core.exact.upstream_record import everything_reproduced
from tests.helpers import assert_identical, train_one


def test_the_installed_upstream_code_is_recorded() -> None:
    missing = [name_of(function) for function in everything_reproduced()
               if fingerprint(function) not in upstream_verified.FINGERPRINTS.get(name_of(function), ())]
    assert not missing, ("installed upstream code not in sb3_ppo_scale/core/exact/upstream_verified.py; after the parity "
                         f"tests pass on it, run `python -m sb3_ppo_scale.core.exact.upstream_record`: {missing}")


def _function_from_source(tmp_path: Path, source: str, name: str) -> Any:
    """``name`` from a module file holding ``source`` (inspect reads a function's source from its file)."""
    path = tmp_path / f"upstream_{uuid.uuid4().hex}.py"
    path.write_text("from __future__ import annotations\n" + textwrap.dedent(source))  # hints name the owner's imports
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return getattr(module, name)


BASE = '''
def scale(values, factor=2):
    total = values * factor
    return total + 1
'''


@pytest.mark.parametrize("variant, same", [
    ('''
def scale(values: "Tensor", factor: int = 2) -> "Tensor":
    """Docstrings, comments, type hints and layout do not count."""
    total = values * factor  # a comment
    return (total
            + 1)
''', True),
    ('''
def scale(values, factor=3):
    total = values * factor
    return total + 1
''', False),
    ('''
def scale(values, factor=2):
    total = factor * values
    return total + 1
''', False),
    ('''
def scale(values, factor=2):
    total = values * factor
    total = total + 0
    return total + 1
''', False),
])
def test_the_fingerprint_sees_what_a_function_computes(tmp_path: Path, variant: str, same: bool) -> None:
    base = fingerprint(_function_from_source(tmp_path, BASE, "scale"))
    assert base is not None
    assert (fingerprint(_function_from_source(tmp_path, variant, "scale")) == base) is same


def _changed_upstream_method(tmp_path: Path, owner: type, name: str, old: str, new: str) -> Any:
    """``owner.name`` with ``old`` replaced by ``new`` in its source: compiled from a module file (inspect reads the
    source there), run in the owner module's namespace and named as the original, as an upgraded package would
    ship it."""
    original = vars(owner)[name]
    source = textwrap.dedent(inspect.getsource(original))
    assert old in source
    compiled = _function_from_source(tmp_path, source.replace(old, new), name)
    changed = types.FunctionType(compiled.__code__, sys.modules[owner.__module__].__dict__, name,
                                 original.__defaults__, original.__closure__)
    changed.__kwdefaults__ = original.__kwdefaults__
    changed.__module__, changed.__qualname__ = original.__module__, original.__qualname__
    return changed


def test_a_changed_collect_rollouts_runs_the_installed_loop_and_says_so(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An SB3 release that bootstraps time-limit ends another way: PPO collects that way, and so must ScalablePPO
    (the lean loop would keep the old bootstrap)."""
    changed = _changed_upstream_method(tmp_path, OnPolicyAlgorithm, "collect_rollouts",
                                       "rewards[idx] += self.gamma * terminal_value",
                                       "rewards[idx] += 0.5 * self.gamma * terminal_value")
    monkeypatch.setattr(OnPolicyAlgorithm, "collect_rollouts", changed)
    assert "OnPolicyAlgorithm.collect_rollouts is not the code it reproduces" in changed_upstream((changed,))
    lean_calls: list = []
    monkeypatch.setattr(algorithm, "collect_rollouts_lean", lambda *a: lean_calls.append(a) or collect_rollouts_lean(*a))
    make_env = lambda: make_vec_env("Pendulum-v1", n_envs=2, seed=0, env_kwargs=dict(max_episode_steps=15))  # noqa: E731
    kwargs: dict[str, Any] = dict(n_steps=32, batch_size=32, n_epochs=2)
    reference = train_one(PPO, make_env, 64, "MlpPolicy", "cpu", **kwargs)
    with pytest.warns(UserWarning, match="collects with PPO's loop, not the lean one: stable-baselines3 .*"
                                         "OnPolicyAlgorithm.collect_rollouts is not the code it reproduces"):
        scalable = train_one(ScalablePPO, make_env, 64, "MlpPolicy", "cpu", **kwargs)
    assert not lean_calls
    assert_identical(reference, scalable)


def test_a_changed_distribution_steps_the_fused_policy_and_evaluation_aside(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch release whose Normal.log_prob computes otherwise: collection and the update's evaluation use it. The
    change scales the squared error (an offset in log_scale would nearly cancel in PPO's ratio: with the fused paths
    kept, it left ScalablePPO 3e-8 from PPO, this change 1.6e-5)."""
    changed = _changed_upstream_method(tmp_path, th.distributions.Normal, "log_prob", "(2 * var)", "(2.2 * var)")
    monkeypatch.setattr(th.distributions.Normal, "log_prob", changed)
    kwargs: dict[str, Any] = dict(n_steps=32, batch_size=16, n_epochs=2)
    reference = train_one(PPO, "Pendulum-v1", 64, "MlpPolicy", "cpu", **kwargs)
    with pytest.warns(UserWarning, match="not the lean one: torch .*Normal.log_prob is not the code it reproduces"):
        scalable = train_one(ScalablePPO, "Pendulum-v1", 64, "MlpPolicy", "cpu", **kwargs)
    assert scalable._evaluator is scalable._plain_evaluator  # the fused evaluation stepped aside too
    assert_identical(reference, scalable)


def test_a_changed_vec_normalize_is_stepped_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A method replaced at run time by a wrapper (``functools.wraps`` names it as the original) is not the original
    code either."""
    original = vars(VecNormalize)["normalize_reward"]

    @functools.wraps(original)
    def normalize_reward(self: VecNormalize, reward: Any) -> Any:
        return original(self, reward) * 2

    monkeypatch.setattr(VecNormalize, "normalize_reward", normalize_reward)
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=0))
    with pytest.warns(UserWarning, match="not the lean step: stable-baselines3 .*VecNormalize.normalize_reward"):
        step = vec_env_step(env)
    assert step == env.step


def test_a_changed_train_is_reported_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    original = vars(PPO)["train"]

    def train(self: PPO) -> None:  # a stand-in for another release's PPO.train
        original(self)

    train.__module__, train.__qualname__ = original.__module__, original.__qualname__
    monkeypatch.setattr(PPO, "train", train)
    with pytest.warns(UserWarning, match="update performs PPO.train's operations as verified, but stable-baselines3 "
                                         ".*PPO.train is not the code it reproduces"):
        ScalablePPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, device="cpu")
