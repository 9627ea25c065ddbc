"""``update_threads``: torch's CPU threads during ``train()`` only; collection keeps the process's setting."""

from __future__ import annotations

import pytest
import torch as th

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core.update import step as step_module
from tests.helpers import assert_identical, train_pair

SMALL = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0, device="cpu", policy_kwargs={"net_arch": [16]})


@pytest.fixture
def one_thread():
    previous = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(previous)


def test_the_update_runs_on_update_threads_and_collection_on_the_process_setting(one_thread, monkeypatch) -> None:
    seen = {"update": set(), "collect": set()}
    real_call = step_module.UpdateStep.__call__

    def recording(self, batch):
        seen["update"].add(th.get_num_threads())
        return real_call(self, batch)

    monkeypatch.setattr(step_module.UpdateStep, "__call__", recording)
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", update_threads=2, **SMALL)
    from stable_baselines3.common.callbacks import BaseCallback

    class Collecting(BaseCallback):
        def _on_step(self) -> bool:
            seen["collect"].add(th.get_num_threads())
            return True

    model.learn(128, callback=Collecting())
    assert seen == {"update": {2}, "collect": {1}}
    assert th.get_num_threads() == 1  # put back after every train()


def test_the_process_own_thread_count_trains_as_ppo(one_thread) -> None:
    """The default (None) and the process's own count change nothing: parameters and Adam state equal PPO's."""
    assert ScalablePPO("MlpPolicy", "Pendulum-v1", **SMALL).update_threads is None
    small = {k: v for k, v in SMALL.items() if k not in ("device", "seed")}
    ppo, scalable = train_pair("Pendulum-v1", 128, scalable_kwargs={"update_threads": 1}, **small)
    assert_identical(ppo, scalable)
    assert th.get_num_threads() == 1


def test_update_threads_is_saved_and_restored_on_error(one_thread, tmp_path, monkeypatch) -> None:
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", update_threads=2, **SMALL)
    model.save(tmp_path / "m")
    assert ScalablePPO.load(tmp_path / "m").update_threads == 2

    def failing(self, batch):
        raise RuntimeError("boom")

    monkeypatch.setattr(step_module.UpdateStep, "__call__", failing)
    with pytest.raises(RuntimeError, match="boom"):
        model.learn(128)
    assert th.get_num_threads() == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_update_threads(bad) -> None:
    with pytest.raises(ValueError, match=r"update_threads must be None \(torch's thread setting as it is\) or an int "
                                         rf">= 1, got {bad!r}"):
        ScalablePPO("MlpPolicy", "Pendulum-v1", update_threads=bad, **SMALL)
