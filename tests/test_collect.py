"""``collect_device``: collection on a copy of the policy gives the same training, with the copy refreshed once per
rollout. On this CPU-only machine the copy lives on "cpu:0", a device that compares unequal to "cpu" (so the copy
path runs) and computes exactly like it (so results must be bit-identical)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.core.collect import device as collect
from tests.helpers import assert_identical

SMALL = dict(n_steps=64, batch_size=32, n_epochs=2, device="cpu", seed=0)


class PolicySeen(BaseCallback):
    """Records which policy object and which device the model shows during collection."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def _on_step(self) -> bool:
        self.seen.add((id(self.model.policy), str(self.model.device)))
        return True


def test_copy_on_another_device_trains_identically() -> None:
    plain = ScalablePPO("MlpPolicy", "Pendulum-v1", **SMALL)
    plain.learn(4 * 64)
    copied = ScalablePPO("MlpPolicy", "Pendulum-v1", collect_device="cpu:0", **SMALL)
    seen = PolicySeen()
    with mock.patch.object(collect.CollectionPolicy, "refresh", autospec=True, side_effect=collect.CollectionPolicy.refresh) as refresh:
        copied.learn(4 * 64, callback=seen)
    assert refresh.call_count == 4  # once per rollout
    assert copied._collection is not None and seen.seen == {(id(copied._collection.policy), "cpu:0")}
    assert copied.policy is not copied._collection.policy and str(copied.device) == "cpu"  # restored after each rollout
    assert_identical(plain, copied)


def test_copy_exposes_the_training_optimizer_and_is_not_saved(tmp_path) -> None:
    model = ScalablePPO("MlpPolicy", "Pendulum-v1", collect_device="cpu:0", **SMALL)
    model.learn(2 * 64)
    assert model._collection.policy.optimizer is model.policy.optimizer
    model.save(tmp_path / "m")
    loaded = ScalablePPO.load(tmp_path / "m", device="cpu")
    assert loaded.collect_device == "cpu:0" and loaded._collection is None
    assert_identical(model, loaded)


def test_auto_is_the_policy_device() -> None:
    assert collect.resolve_collect_device("auto", th.device("cpu")) == th.device("cpu")
    assert ScalablePPO("MlpPolicy", "Pendulum-v1", **SMALL)._collect_device == th.device("cpu")


@pytest.mark.parametrize("bad", ["gpu", "mps", 3.5])
def test_bad_collect_device(bad) -> None:
    with pytest.raises(ValueError, match=r"collect_device must be 'auto', 'cpu', 'cuda'"):
        ScalablePPO("MlpPolicy", "Pendulum-v1", collect_device=bad, **SMALL)


def test_overlap_collection_is_ignored_with_a_warning_and_collects_lean() -> None:
    """The double-buffered EnvPool collector was removed (slower than the lean loop); scripts and saved models that
    set the argument still run, told so once, with the same rollouts and parameters as without it."""
    import warnings

    from sb3_ppo_scale.core.algorithm import OVERLAP_REMOVED

    with pytest.warns(UserWarning) as caught:
        overlapped = ScalablePPO("MlpPolicy", "Pendulum-v1", overlap_collection=True, **SMALL)
    assert [str(w.message) for w in caught].count(OVERLAP_REMOVED) == 1
    assert OVERLAP_REMOVED.startswith("overlap_collection=True is ignored: the double-buffered EnvPool collector")
    plain = ScalablePPO("MlpPolicy", "Pendulum-v1", **SMALL)
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        for model in (overlapped, plain):
            model.set_random_seed(0)
            model.learn(2 * 64)
    assert OVERLAP_REMOVED not in [str(w.message) for w in later]
    assert_identical(overlapped, plain)


def test_bad_overlap_collection() -> None:
    with pytest.raises(ValueError, match=r"overlap_collection must be True or False, got 'yes'"):
        ScalablePPO("MlpPolicy", "Pendulum-v1", overlap_collection="yes", **SMALL)
