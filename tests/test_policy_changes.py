"""A user changes the policy during training, as fine-tuning and exploration schedules do, and ScalablePPO follows
PPO bit for bit: a head or ``log_std`` replaced between ``learn()`` calls or in ``on_rollout_start`` (the fused update
and collection steps are built again), ``log_std`` changed in place during a rollout (the sampler sees it at the next
step). A module replaced during a rollout is only seen at the next one: a warning says so."""

from __future__ import annotations

from collections.abc import Callable
import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_scale import ScalablePPO
from tests.helpers import HistoryLogger, assert_identical


def _model(cls: type[PPO]) -> PPO:
    model = cls("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=0), n_steps=32, batch_size=32, n_epochs=2, seed=0,
                device="cpu")
    model.set_logger(HistoryLogger())
    return model


def _new_optimizer(model: PPO) -> None:
    policy = model.policy
    policy.optimizer = policy.optimizer_class(policy.parameters(), lr=model.lr_schedule(1), **policy.optimizer_kwargs)


def _replace_value_head(model: PPO) -> None:
    old = model.policy.value_net
    new = th.nn.Linear(old.in_features, 1)
    with th.no_grad():
        new.weight.copy_(old.weight * 0.5)
        new.bias.fill_(3.0)
    model.policy.value_net = new
    _new_optimizer(model)


def _replace_log_std(model: PPO) -> None:
    model.policy.log_std = th.nn.Parameter(th.full_like(model.policy.log_std, -1.0))
    _new_optimizer(model)


def _replace_action_net(model: PPO) -> None:
    old = model.policy.action_net
    new = th.nn.Linear(old.in_features, old.out_features)
    with th.no_grad():
        new.weight.copy_(old.weight * 0.5)
        new.bias.copy_(old.bias)
    model.policy.action_net = new
    _new_optimizer(model)


class AtRolloutStart(BaseCallback):
    """Calls ``change(model)`` at the start of the ``at``-th rollout."""

    def __init__(self, change: Callable[[PPO], None], at: int = 2) -> None:
        super().__init__()
        self.change, self.at, self.rollouts = change, at, 0

    def _on_rollout_start(self) -> None:
        self.rollouts += 1
        if self.rollouts == self.at:
            self.change(self.model)

    def _on_step(self) -> bool:
        return True


class AnnealStd(BaseCallback):
    """Lowers ``log_std`` in place at every step, through ``.data`` (invisible to autograd's version counter)."""

    def _on_step(self) -> bool:
        self.model.policy.log_std.data.sub_(0.01)
        return True


def _both(run: Callable[[PPO], None]) -> tuple[PPO, PPO]:
    models = []
    for cls in (PPO, ScalablePPO):
        model = _model(cls)
        run(model)
        models.append(model)
    return models[0], models[1]


def _assert_same_training(reference: PPO, ours: PPO) -> None:
    """Parameters, optimizer state and every logged training value equal PPO's."""
    assert_identical(reference, ours)
    logged, ours_logged = reference.logger.history, ours.logger.history  # type: ignore[attr-defined]
    for key in (key for key in logged if key.startswith("train/")):
        assert ours_logged[key] == logged[key], key


@pytest.mark.parametrize("change", [_replace_value_head, _replace_log_std, _replace_action_net],
                         ids=["value_head", "log_std", "action_net"])
def test_a_part_replaced_between_learn_calls_is_trained(change: Callable[[PPO], None]) -> None:
    def run(model: PPO) -> None:
        model.learn(128)
        change(model)
        model.learn(128, reset_num_timesteps=False)

    reference, ours = _both(run)
    _assert_same_training(reference, ours)


def test_a_head_replaced_at_a_rollout_start_is_collected_with_and_trained() -> None:
    reference, ours = _both(lambda model: model.learn(192, callback=AtRolloutStart(_replace_action_net)))
    _assert_same_training(reference, ours)


def test_log_std_changed_during_a_rollout_is_sampled_with_at_the_next_step() -> None:
    reference, ours = _both(lambda model: model.learn(128, callback=AnnealStd()))
    _assert_same_training(reference, ours)


class ReplaceMidRollout(BaseCallback):
    def _on_step(self) -> bool:
        if self.n_calls == 5:
            _replace_action_net(self.model)
        return True


def test_a_module_replaced_during_a_rollout_is_reported() -> None:
    model = _model(ScalablePPO)
    with pytest.warns(UserWarning, match="a callback replaced a module or parameter of the policy during a rollout"):
        model.learn(64, callback=ReplaceMidRollout())


def test_update_reads_the_replaced_parts() -> None:
    """The fused evaluator is built again for new parts and kept while they are the same objects."""
    model = _model(ScalablePPO)
    model.learn(64)
    first = model._evaluator
    assert model._evaluator is first
    _replace_value_head(model)
    assert model._evaluator is not first and model._evaluator is model._evaluator

