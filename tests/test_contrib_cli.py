"""Configs and commands for sb3-contrib's classes: configs/contrib.yml's recurrent entries are rl_zoo3's ppo_lstm
values, its masking envs are registered; ``sb3-ppo-scale train --algo scalable_maskable_ppo|scalable_recurrent_ppo``
trains and evaluates that class (masked evaluation for the maskable one), a bad ``--algo`` is one line with exit
code 2 listing the allowed names; ``bench`` pairs each contrib label with the contrib class at the same entry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch as th
import yaml
from sb3_contrib import MaskablePPO

import rl_zoo3
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv
from sb3_ppo_scale import ScalableMaskablePPO, ScalablePPO, ScalableRecurrentPPO, cli
from sb3_ppo_scale.experiments import algorithms, bench, zoo

CONTRIB_CONFIG = algorithms.CONFIG_DIR / "contrib.yml"


@pytest.fixture(autouse=True)
def _keep_threads() -> Iterator[None]:
    """The CLI sets torch's threads for the whole process; give the other tests theirs back."""
    threads = th.get_num_threads()
    yield
    th.set_num_threads(threads)


# ------------------------------------------------------------------------------------------------ configs
@pytest.mark.parametrize("entry", ["CartPoleNoVel-v1", "PendulumNoVel-v1", "atari"])
def test_recurrent_entries_are_rl_zoo3_ppo_lstm_values(entry: str) -> None:
    installed = zoo.read_entries(Path(rl_zoo3.__file__).parent / "hyperparams" / "ppo_lstm.yml")
    ours = zoo.read_entries(CONTRIB_CONFIG)
    assert ours[entry] == installed[entry]
    if entry != "atari":  # the @batched variant: the same values plus batched_sequences
        batched = dict(ours[f"{entry}@batched"])
        assert batched.pop("batched_sequences") is True and batched == installed[entry]


def test_recurrent_configs_build_the_zoo_model() -> None:
    config = zoo.load_config(None, "PendulumNoVel-v1", algo="scalable_recurrent_ppo")
    assert config.n_envs == 4 and config.normalize == {"gamma": 0.9}
    env = zoo.make_envs(config, seed=0)
    model = zoo.build_model(config, env, algo=ScalableRecurrentPPO, seed=0, device="cpu")
    env.reset()
    assert (env.get_original_obs()[:, 2] == 0).all()  # rl_zoo3's velocity-masked Pendulum: angular velocity zeroed
    assert model.use_sde and model.sde_sample_freq == 4 and model.n_steps == 1024 and model.gamma == 0.9
    assert model.policy.lstm_actor.hidden_size == 64 and model.policy.lstm_critic is not None
    batched = zoo.load_config(None, "CartPoleNoVel-v1", "batched", algo="scalable_recurrent_ppo")
    assert batched.model_kwargs["batched_sequences"] is True and batched.model_kwargs["batch_size"] == 256


@pytest.mark.parametrize("env_id,dim,invalid", [("InvalidActionEnvDiscrete-v0", 20, 10),
                                                ("InvalidActionEnvDiscrete80-v0", 80, 60)])
def test_masking_envs_are_registered(env_id: str, dim: int, invalid: int) -> None:
    config = zoo.load_config(None, env_id, algo="scalable_maskable_ppo")
    env = zoo.make_envs(config, seed=0)
    masks = np.array(env.env_method("action_masks"))
    assert env.num_envs == 4 and masks.shape == (4, dim) and (masks.sum(axis=1) == dim - invalid).all()


@pytest.mark.parametrize("env_id,algo", [("InvalidActionEnvDiscrete-v0", "scalable_maskable_ppo"),
                                         ("CartPoleNoVel-v1", "scalable_recurrent_ppo")])
def test_contrib_envs_build_in_subprocess_workers(env_id: str, algo: str) -> None:
    """The envs the contrib configs register exist in SubprocVecEnv's workers (fresh processes) too, and step as
    in the main process."""
    config = zoo.load_config(None, env_id, overrides={"n_envs": 2, "normalize": False}, algo=algo)
    subproc = zoo.make_envs(config, seed=3, vec_env_cls=SubprocVecEnv)
    dummy = zoo.make_envs(config, seed=3, vec_env_cls=DummyVecEnv)
    try:
        np.testing.assert_array_equal(subproc.reset(), dummy.reset())
        actions = np.zeros(2, dtype=np.int64)
        for got, expected in zip(subproc.step(actions)[:3], dummy.step(actions)[:3]):
            np.testing.assert_array_equal(got, expected)
    finally:
        subproc.close()


def test_taxi_entry_masks_from_info() -> None:
    config = zoo.load_config(None, "Taxi-v4", algo="scalable_maskable_ppo")
    env = zoo.make_envs(config, seed=0)
    env.reset()
    masks = np.array(env.env_method("action_masks"))
    assert env.num_envs == 4 and masks.shape == (4, 6) and masks.dtype == bool and not masks[:, 4:].all()


def test_entry_keys_are_checked_per_algorithm() -> None:
    entry = "CartPoleNoVel-v1@batched"
    with pytest.raises(ValueError, match=f"unknown key 'batched_sequences' in entry '{entry}'"):
        zoo.load_config(None, "CartPoleNoVel-v1", "batched", algo="scalable_maskable_ppo")
    with pytest.raises(ValueError, match="unknown key 'batched_sequences'"):
        zoo.load_config(CONTRIB_CONFIG, "CartPoleNoVel-v1", "batched")  # scalable_ppo's keys
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'; allowed: scalable_ppo, scalable_maskable_ppo, "
                                         "scalable_recurrent_ppo"):
        zoo.load_config(None, "CartPole-v1", algo="ppo")


# ------------------------------------------------------------------------------------------------ train / evaluate
def test_bad_algo_is_one_line_listing_the_allowed_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["train", "--algo", "recurrent_ppo", "--env", "CartPoleNoVel-v1"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["sb3-ppo-scale train: error: argument --algo: invalid choice: 'recurrent_ppo' (choose from "
                   "'scalable_ppo', 'scalable_maskable_ppo', 'scalable_recurrent_ppo') (see sb3-ppo-scale train --help)"]


def test_every_scalable_argument_is_an_entry_key_of_the_contrib_classes() -> None:
    """The scale layer's arguments (taken by the mixin's constructor through the class's ``**kwargs``) are entry keys
    of both contrib classes, beside their own and the contrib class's."""
    from sb3_ppo_scale.experiments.algorithms import ALGORITHMS, constructor_keys
    from sb3_ppo_scale.core.algorithm import ScalableOnPolicyMixin

    added = constructor_keys(ScalableOnPolicyMixin)
    assert {"grad_accum_steps", "cuda_graphs", "compile_loss", "objective", "nonfinite"} <= added
    for name in ("scalable_maskable_ppo", "scalable_recurrent_ppo"):
        assert added <= ALGORITHMS[name].model_keys(), name
    assert {"batched_sequences", "sequence_length"} <= ALGORITHMS["scalable_recurrent_ppo"].model_keys()


@pytest.mark.parametrize("algo,env_id,cls,overrides", [
    ("scalable_recurrent_ppo", "CartPoleNoVel-v1", ScalableRecurrentPPO, ["--set", "n_epochs=2"]),
    ("scalable_recurrent_ppo", "CartPoleNoVel-v1", ScalableRecurrentPPO,
     ["--set", "sequence_length=8", "--set", "grad_accum_steps=2", "--set", "objective=clip_kl_penalty"]),
    ("scalable_maskable_ppo", "InvalidActionEnvDiscrete-v0", ScalableMaskablePPO, ["--set", "n_steps=64"]),
], ids=["recurrent", "recurrent_scale_arguments", "maskable"])
def test_train_and_evaluate_a_contrib_class(algo: str, env_id: str, cls: type, overrides: list[str], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    argv = ["train", "--algo", algo, "--env", env_id, "--n-timesteps", "256", "--eval-freq", "256", "--eval-episodes",
            "1", "--no-progress", "--log-dir", str(run), *overrides]
    assert cli.main(argv) == 0
    saved = yaml.safe_load((run / "config.yml").read_text())
    assert saved["algo"] == algo and saved["config_file"] == str(CONTRIB_CONFIG)
    model = cls.load(run / "model.zip", device="cpu")
    assert type(model) is cls and model.num_timesteps == 256
    for override in overrides[1::2]:  # each --set reached the model
        key, value = override.split("=")
        assert str(getattr(model, key)) == value, key
    assert sorted(p.name for p in (run / "tensorboard").iterdir()) == [f"{cls.__name__}_1"]
    assert (run / "evaluations.npz").is_file() and (run / "checkpoint.pt").is_file()
    capsys.readouterr()
    assert cli.main(["evaluate", "--log-dir", str(run), "--episodes", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["episodes"] == 2 and result["env_id"] == env_id


def test_maskable_models_are_evaluated_with_masks(monkeypatch: pytest.MonkeyPatch) -> None:
    config = zoo.load_config(None, "InvalidActionEnvDiscrete-v0", algo="scalable_maskable_ppo")
    model = ScalableMaskablePPO("MlpPolicy", zoo.make_envs(config, n_envs=1, seed=0), seed=0, device="cpu")
    masks = []
    predict = model.predict
    monkeypatch.setattr(model, "predict", lambda *a, **k: masks.append(k.get("action_masks")) or predict(*a, **k))
    returns, _ = algorithms.evaluate_policy(model, zoo.make_envs(config, n_envs=1, seed=1), n_eval_episodes=1,
                                            return_episode_rewards=True)
    assert len(masks) == 100 and all(m is not None and m.sum() == 10 for m in masks)  # one masked step per step
    plain = ScalablePPO("MlpPolicy", "CartPole-v1", seed=0, device="cpu")
    assert algorithms.evaluate_policy(plain, plain.get_env(), n_eval_episodes=1)[0] > 0


# ------------------------------------------------------------------------------------------------ bench
def test_bench_pairs_contrib_labels_with_the_contrib_class() -> None:
    assert bench.with_pairs(["scalable_recurrent_ppo@batched", "scalable_maskable_ppo"]) == [
        "scalable_recurrent_ppo@batched", "recurrent_ppo@batched", "scalable_maskable_ppo", "maskable_ppo"]
    assert bench.ALGO_CLASSES["recurrent_ppo"] == "sb3_contrib.RecurrentPPO"
    assert bench.default_baseline(["scalable_recurrent_ppo@batched"], "sb3_ppo") == "recurrent_ppo@batched"
    assert bench.default_baseline(["scalable_ppo@cpu"], "sb3_ppo") == "sb3_ppo"
    assert bench.default_baseline(["scalable_maskable_ppo"], "maskable_ppo") == "maskable_ppo"
    config = zoo.load_config(None, "CartPoleNoVel-v1", "batched", algo="scalable_recurrent_ppo")
    baseline_config, dropped = bench._config_for(config, "recurrent_ppo")
    assert dropped == ["batched_sequences"] and "batched_sequences" not in baseline_config.model_kwargs
    assert bench._config_for(config, "scalable_recurrent_ppo") == (config, [])


@pytest.mark.parametrize("label,cls", [("scalable_maskable_ppo", ScalableMaskablePPO), ("maskable_ppo", MaskablePPO)])
def test_bench_runs_a_contrib_label(label: str, cls: type, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    bench.run_one("InvalidActionEnvDiscrete-v0", label, 0, 2048, 2048, 1, 1, None, str(out))
    result = json.loads(out.read_text())
    assert result["algo_class"] == f"{cls.__module__.split('.')[0]}.{cls.__name__}"
    assert result["entry"] == "InvalidActionEnvDiscrete-v0" and result["steps"] == 2048
    assert result["final_return"] > 0  # the masked evaluation of an identity task


# ------------------------------------------------------------------------------------------------ rl_zoo3 route
def test_rl_zoo3_route_trains_the_recurrent_class(tmp_path: Path) -> None:
    from sb3_ppo_scale.experiments import rl_zoo

    logs = tmp_path / "zoo"
    rl_zoo.main(["--algo", "scalable_recurrent_ppo", "--env", "CartPoleNoVel-v1", "--variant", "batched", "-n", "256",
                 "-f", str(logs), "--eval-freq", "-1", "--seed", "1"])
    model = ScalableRecurrentPPO.load(logs / "scalable_recurrent_ppo" / "CartPoleNoVel-v1_1" / "CartPoleNoVel-v1.zip",
                                      device="cpu")
    assert model.num_timesteps == 256 and model.batched_sequences is True and model.n_epochs == 20
    from rl_zoo3 import hyperparams_opt

    assert hyperparams_opt.HYPERPARAMS_SAMPLER["scalable_recurrent_ppo"] is hyperparams_opt.HYPERPARAMS_SAMPLER["ppo_lstm"]


def test_rl_zoo3_route_refuses_the_maskable_class() -> None:
    from sb3_ppo_scale.experiments import rl_zoo

    with pytest.raises(ValueError, match="--algo scalable_maskable_ppo is not available through rl_zoo3: .*action "
                                         "masks; train it with `sb3-ppo-scale train --algo scalable_maskable_ppo`"):
        rl_zoo.prepare_argv(["--algo", "scalable_maskable_ppo", "--env", "InvalidActionEnvDiscrete-v0"])
