"""rl_zoo3's own trainer with ``scalable_ppo`` and ``scalable_recurrent_ppo`` registered:
``python -m sb3_ppo_scale.experiments.rl_zoo``.

    python -m sb3_ppo_scale.experiments.rl_zoo --algo scalable_ppo --env CartPole-v1
    python -m sb3_ppo_scale.experiments.rl_zoo --algo scalable_ppo --env HalfCheetah-v5 --variant gpu -n 1000000
    python -m sb3_ppo_scale.experiments.rl_zoo --algo scalable_ppo --env Pendulum-v1 -optimize --n-trials 20 -n 50000
    python -m sb3_ppo_scale.experiments.rl_zoo --algo scalable_recurrent_ppo --env CartPoleNoVel-v1 --variant batched

Every rl_zoo3 ``train.py`` option works. Added here:

- ``ALGOS["scalable_ppo"] = ScalablePPO`` and its Optuna sampler / converter (``-optimize``);
  ``ALGOS["scalable_recurrent_ppo"] = ScalableRecurrentPPO`` with rl_zoo3's ``ppo_lstm`` sampler and converter;
- ``-conf`` defaults to the algorithm's config in the package (``configs/scalable_ppo.yml``, ``configs/contrib.yml``);
- ``--algo scalable_maskable_ppo`` is refused: rl_zoo3 has no masking algorithm and its evaluation callback would
  evaluate without action masks (``sb3-ppo-scale train --algo scalable_maskable_ppo`` evaluates with them);
- ``--variant NAME`` trains the entry ``<env>@NAME`` (the zoo itself only looks up ``<env>`` / ``atari``);
- the entry is checked with :func:`sb3_ppo_scale.experiments.zoo.load_config` *before* rl_zoo3 sees it, so unknown keys and
  ``policy_kwargs`` strings that are not plain literals are rejected instead of reaching the zoo's ``eval``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import yaml

from sb3_ppo_scale.contrib.recurrent import ScalableRecurrentPPO
from sb3_ppo_scale.core.update.lr import KLAdaptiveLR
from sb3_ppo_scale.core.ppo import ScalablePPO
from sb3_ppo_scale.experiments import zoo
from sb3_ppo_scale.experiments.algorithms import algorithm

ALGO_NAME = "scalable_ppo"
#: the algorithms this route registers with rl_zoo3
ZOO_ALGOS = (ALGO_NAME, "scalable_recurrent_ppo")
#: algorithms of this package the route refuses, and why
REFUSED = {"scalable_maskable_ppo": "rl_zoo3 has no masking algorithm and its evaluation callback does not pass "
                                    "action masks; train it with `sb3-ppo-scale train --algo scalable_maskable_ppo`"}


def sample_scalable_ppo_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """rl_zoo3's PPO search space with minibatches up to 65 536 samples (clamped to the rollout size)."""
    from rl_zoo3.hyperparams_opt import convert_onpolicy_params

    sampled = {
        "batch_size_pow": trial.suggest_int("batch_size_pow", 5, 16),
        "n_steps_pow": trial.suggest_int("n_steps_pow", 5, 12),
        "one_minus_gamma": trial.suggest_float("one_minus_gamma", 0.0001, 0.03, log=True),
        "one_minus_gae_lambda": trial.suggest_float("one_minus_gae_lambda", 0.0001, 0.1, log=True),
        "learning_rate": trial.suggest_float("learning_rate", 1e-5, 0.003, log=True),
        "ent_coef": trial.suggest_float("ent_coef", 1e-8, 0.1, log=True),
        "clip_range": trial.suggest_categorical("clip_range", [0.1, 0.2, 0.3, 0.4]),
        "n_epochs": trial.suggest_categorical("n_epochs", [1, 5, 10, 20]),
        "max_grad_norm": trial.suggest_float("max_grad_norm", 0.3, 2),
        "net_arch": trial.suggest_categorical("net_arch", ["tiny", "small", "medium"]),
        "activation_fn": trial.suggest_categorical("activation_fn", ["tanh", "relu"]),
    }
    params = convert_onpolicy_params(sampled)
    params["batch_size"] = min(params["batch_size"], params["n_steps"] * n_envs)
    trial.set_user_attr("batch_size", params["batch_size"])
    trial.set_user_attr("n_steps", params["n_steps"])
    return params


def convert_scalable_ppo_params(sampled: dict[str, Any]) -> dict[str, Any]:
    """Optuna trial params -> hyperparameters (rl_zoo3's on-policy converter; used by ``--trial-id`` loading)."""
    from rl_zoo3.hyperparams_opt import convert_onpolicy_params

    return convert_onpolicy_params(sampled)


def register_algorithm() -> None:
    """Add ``scalable_ppo`` and ``scalable_recurrent_ppo`` to rl_zoo3's algorithm, sampler and converter tables
    (idempotent; the recurrent one takes ``ppo_lstm``'s sampler and converter)."""
    from rl_zoo3 import hyperparams_opt, utils

    utils.ALGOS[ALGO_NAME] = ScalablePPO
    hyperparams_opt.HYPERPARAMS_SAMPLER[ALGO_NAME] = sample_scalable_ppo_params
    hyperparams_opt.HYPERPARAMS_CONVERTER[ALGO_NAME] = convert_scalable_ppo_params
    utils.ALGOS["scalable_recurrent_ppo"] = ScalableRecurrentPPO
    hyperparams_opt.HYPERPARAMS_SAMPLER["scalable_recurrent_ppo"] = hyperparams_opt.HYPERPARAMS_SAMPLER["ppo_lstm"]
    hyperparams_opt.HYPERPARAMS_CONVERTER["scalable_recurrent_ppo"] = hyperparams_opt.HYPERPARAMS_CONVERTER["ppo_lstm"]


def _own_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("-conf", "--conf-file", dest="conf", default=None)
    parser.add_argument("--variant", default=None)
    known, _ = parser.parse_known_args(argv)
    rest = _drop_option(list(argv), "--variant")
    return known, rest


def _drop_option(argv: list[str], name: str) -> list[str]:
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token == name:
            skip = True
        elif not token.startswith(f"{name}="):
            out.append(token)
    return out


def _replace_conf(argv: list[str], conf: str) -> list[str]:
    argv = _drop_option(_drop_option(argv, "-conf"), "--conf-file")
    return [*argv, "-conf", conf]


def prepare_argv(argv: Sequence[str]) -> list[str]:
    """Check the config entry safely and return the argv for rl_zoo3 (``-conf`` and ``--variant`` resolved)."""
    known, rest = _own_args(argv)
    if known.algo in REFUSED:
        raise ValueError(f"--algo {known.algo} is not available through rl_zoo3: {REFUSED[known.algo]}")
    if known.algo not in ZOO_ALGOS:
        return rest
    conf = Path(known.conf) if known.conf else algorithm(known.algo).config
    if conf.suffix not in (".yml", ".yaml"):
        raise ValueError(f"-conf must be a .yml/.yaml file for --algo {known.algo} (Python configs run code), got {conf}")
    config = zoo.load_config(conf, known.env, known.variant, algo=known.algo)  # ValueError: unsafe or unknown entries
    if isinstance(config.model_kwargs.get("learning_rate"), KLAdaptiveLR):  # rl_zoo3 would fail on it with a traceback
        raise ValueError(f"learning_rate of entry {config.entry!r} is KL-adaptive, which rl_zoo3's trainer cannot take "
                         "(it reads a string learning rate as lin_<x>); train it with `sb3-ppo-scale train`")
    if known.variant is None and known.conf:
        return rest
    key = "atari" if config.entry.split("@")[0] == "atari" else known.env
    handle = tempfile.NamedTemporaryFile("w", suffix=".yml", prefix="scalable_ppo_", delete=False)
    with handle:
        yaml.safe_dump({key: zoo.read_entries(conf)[config.entry]}, handle)
    return _replace_conf(rest, handle.name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run rl_zoo3's ``train()`` with ScalablePPO registered; returns 0, or 2 after one line on stderr when this
    module's own checks (algorithm, config entry, variant, env id) find a mistake. What rl_zoo3 then reports is its
    own."""
    from sb3_ppo_scale.cli import USAGE_ERROR, one_line, user_errors

    argv = list(sys.argv[1:] if argv is None else argv)
    register_algorithm()
    try:
        zoo_argv = prepare_argv(argv)
    except user_errors() as error:
        print(f"python -m sb3_ppo_scale.experiments.rl_zoo: error: {one_line(error)}", file=sys.stderr)
        return USAGE_ERROR
    from rl_zoo3.train import train

    saved = sys.argv
    sys.argv = ["sb3_ppo_scale.experiments.rl_zoo", *zoo_argv]
    try:
        train()
    finally:
        sys.argv = saved
        _remove_temporary_config(zoo_argv)
    return 0


def _remove_temporary_config(zoo_argv: list[str]) -> None:
    """Delete the one-entry YAML written by :func:`prepare_argv` (rl_zoo3 keeps its own copy in the log folder)."""
    if "-conf" in zoo_argv:
        conf = Path(zoo_argv[zoo_argv.index("-conf") + 1])
        if conf.parent == Path(tempfile.gettempdir()) and conf.name.startswith("scalable_ppo_"):
            conf.unlink(missing_ok=True)


if __name__ == "__main__":  # python -m sb3_ppo_scale.experiments.rl_zoo --algo scalable_ppo --env ID [...]
    raise SystemExit(main())
