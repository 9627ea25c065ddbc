"""The one switch for scale on one box: the plan's rules, the VecEnv it builds, ``train --variant scale``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch as th
import yaml
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_ppo_scale import cli
from sb3_ppo_scale.envs import EnvPoolVecEnv, make_scale_vec_env, plan_scale
from sb3_ppo_scale.envs import scale as scale_module
from sb3_ppo_scale.experiments import zoo
from tests.helpers import import_envpool


@pytest.fixture(autouse=True)
def _keep_threads() -> Iterator[None]:
    """The plan sets torch's threads for the process; give the other tests theirs back."""
    threads = th.get_num_threads()
    yield
    th.set_num_threads(threads)


@pytest.fixture
def no_envpool(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(env_id: str, env_kwargs: dict) -> None:
        raise ImportError("no envpool")

    monkeypatch.setattr(scale_module, "resolve_task", missing)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(th.cuda, "is_available", lambda: True)


def test_with_envpool_the_envs_get_every_core_and_the_update_too() -> None:
    import_envpool()
    plan = plan_scale("Hopper-v5", cores=2, device="cpu")
    assert (plan.backend, plan.n_envs, plan.env_workers, plan.torch_threads, plan.update_threads) == (
        "envpool", 64, 2, 1, 2)
    assert plan.model_kwargs() == {"device": "cpu", "collect_device": "auto", "update_threads": 2,
                                   "cuda_graphs": False, "compile_loss": scale_module.cxx_compiler() is not None}
    assert plan_scale("Hopper-v5", cores=32, device="cpu").n_envs == 128  # at least 4 envs a core
    assert plan_scale("Hopper-v5", n_envs=8, cores=32, device="cpu").n_envs == 8  # the config's count is kept


def test_without_envpool_worker_processes_split_the_envs_evenly(no_envpool: None) -> None:
    plan = plan_scale("Hopper-v5", 64, cores=3, device="cpu")
    assert (plan.backend, plan.env_workers) == ("processes", 2)  # 3 does not divide 64
    assert "EnvPool is not installed" in plan.describe()
    assert plan_scale("Hopper-v5", 64, cores=16, device="cpu").env_workers == 16
    one_core = plan_scale("Hopper-v5", 64, cores=1, device="cpu")
    assert (one_core.backend, one_core.env_workers, one_core.update_threads) == ("dummy", 1, 1)


def test_on_cuda_small_env_counts_collect_on_a_cpu_copy(cuda: None) -> None:
    import_envpool()
    few, many = plan_scale("Hopper-v5", 8, cores=16), plan_scale("Hopper-v5", 64, cores=16)
    assert (few.device, few.collect_device, few.update_threads) == ("cuda", "cpu", 1)
    assert (many.device, many.collect_device) == ("cuda", "auto")
    assert many.model_kwargs()["cuda_graphs"] is True and many.model_kwargs()["compile_loss"] is False
    assert "collection on a CPU copy" in few.describe() and "collection on a CPU copy" not in many.describe()


def test_on_the_cpu_the_update_is_compiled_where_a_compiler_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scale_module, "cxx_compiler", lambda: "g++")
    assert plan_scale("Hopper-v5", 64, cores=2, device="cpu").compile_loss is True
    monkeypatch.setattr(scale_module, "cxx_compiler", lambda: None)
    plan = plan_scale("Hopper-v5", 64, cores=2, device="cpu")
    assert plan.compile_loss is False and plan.model_kwargs()["compile_loss"] is False
    assert "no C++ compiler found (g++, clang++ or $CXX): the update runs eagerly" in plan.describe()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_envs": 0}, r"n_envs must be None \(the plan picks\) or an int >= 1, got 0"),
    ({"n_envs": 2.5}, r"n_envs must be None \(the plan picks\) or an int >= 1, got 2.5"),
    ({"cores": 0}, r"cores must be None \(this process's cores\) or an int >= 1, got 0"),
    ({"device": "tpu"}, r"device must be 'auto', 'cpu' or 'cuda', got 'tpu'"),
    ({"backend": "threads"}, r"backend must be None \(the plan picks\) or one of 'envpool', 'processes', 'dummy', "
                             r"got 'threads'"),
])
def test_bad_plan_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_scale("Hopper-v5", **kwargs)


def test_cuda_without_a_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(th.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device='cuda' but torch sees no CUDA device here"):
        plan_scale("Hopper-v5", device="cuda")


def test_the_vec_env_is_the_plans_and_the_plan_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    import_envpool()
    th.set_num_threads(2)
    env, plan = make_scale_vec_env("Hopper-v5", 8, seed=3, plan=plan_scale("Hopper-v5", 8, cores=2, device="cpu"))
    assert isinstance(env, EnvPoolVecEnv) and env.num_envs == 8 and env.envpool_options["num_threads"] == 2
    assert th.get_num_threads() == 1  # collection's threads
    assert capsys.readouterr().out.startswith("scale plan for Hopper-v5 on 2 core(s):\n  envs: 8 on envpool with 2")
    env.close()


def test_a_backend_asked_for_is_built(no_envpool: None) -> None:
    from sb3_ppo_scale.envs import ProcessVecEnv

    plan = plan_scale("Pendulum-v1", 4, cores=2, backend="processes")
    assert "backend='processes' asked for: 2 worker processes step 2 envs each" in plan.reasons
    env, _ = make_scale_vec_env("Pendulum-v1", plan=plan, verbose=0)
    try:
        assert type(env) is ProcessVecEnv and env.num_envs == 4 and env.n_workers == 2
    finally:
        env.close()
    with pytest.raises(ValueError, match="backend='envpool' but EnvPool is not installed"):
        plan_scale("Pendulum-v1", 4, backend="envpool")


def test_one_core_builds_sb3s_dummy_vec_env(no_envpool: None) -> None:
    env, plan = make_scale_vec_env("Pendulum-v1", 4, plan=plan_scale("Pendulum-v1", 4, cores=1), verbose=0)
    assert type(env) is DummyVecEnv and env.num_envs == 4 and plan.backend == "dummy"


@pytest.mark.parametrize("task", ["HalfCheetah-v5", "Hopper-v5", "Ant-v5", "Humanoid-v5"])
def test_every_task_has_a_scale_entry(task: str) -> None:
    config = zoo.load_config(None, task, "scale", {})
    assert config.vec_env == "scale" and config.n_envs == 64
    assert config.n_envs * config.model_kwargs["n_steps"] >= 4096 and config.model_kwargs["batch_size"] <= 2048


def test_train_variant_scale_prints_the_plan_and_trains_with_it(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import_envpool()
    run = tmp_path / "run"
    code = cli.main(["train", "--env", "Hopper-v5", "--variant", "scale", "--set", "n_envs=8", "--set", "n_steps=32",
                     "--set", "batch_size=64", "--n-timesteps", "512", "--eval-freq", "0", "--eval-episodes", "1",
                     "--no-progress", "--log-dir", str(run), "--device", "cpu"])
    assert code == 0
    out = capsys.readouterr().out
    cores = scale_module.available_cores()
    assert f"scale plan for Hopper-v5 on {cores} core(s):\n  envs: 8 on envpool with {cores} thread(s)" in out
    saved = yaml.safe_load((run / "config.yml").read_text())
    assert saved["vec_env"] == "scale" and saved["threads"] == 1
    from sb3_ppo_scale import ScalablePPO

    model = ScalablePPO.load(run / "model.zip")
    assert model.update_threads == cores and model.collect_device == "auto"
    assert model.compile_loss is (scale_module.cxx_compiler() is not None)


def test_train_variant_scale_refuses_a_device_it_does_not_plan_for() -> None:
    """``--device mps`` passes argparse on a Mac; the scale plan knows the CPU and CUDA only."""
    import argparse

    from sb3_ppo_scale.experiments import commands

    config = zoo.load_config(None, "Hopper-v5", "scale", {})
    with pytest.raises(ValueError, match=r"--device must be auto, cpu, cuda or cuda:<index>, got 'mps'"):
        commands._placement(config, argparse.Namespace(device="mps", threads=1))
    assert commands._placement(zoo.load_config(None, "Hopper-v5", None, {}),
                               argparse.Namespace(device="mps", threads=1)) == {"device": "mps"}
