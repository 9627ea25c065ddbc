"""A user's code around the model (callbacks, their tensors, the training env they see) behaves with the Scalable
classes as with PPO, MaskablePPO and RecurrentPPO: same results, same objects, no new errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch as th
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.type_aliases import RolloutBufferSamples

from sb3_ppo_scale import ScalableMaskablePPO, ScalablePPO, ScalableRecurrentPPO
from tests.helpers import ACCUMULATION_ATOL, assert_identical, assert_params_close

#: algorithm -> (upstream class, Scalable class, policy, env maker)
ALGOS = {
    "ppo": (PPO, ScalablePPO, "MlpPolicy", lambda: make_vec_env("Pendulum-v1", n_envs=2, seed=0)),
    "maskable": (MaskablePPO, ScalableMaskablePPO, "MlpPolicy",
                 lambda: make_vec_env(InvalidActionEnvDiscrete, n_envs=2, seed=0,
                                      env_kwargs=dict(dim=10, n_invalid_actions=4))),
    "recurrent": (RecurrentPPO, ScalableRecurrentPPO, "MlpLstmPolicy",
                  lambda: make_vec_env("CartPole-v1", n_envs=2, seed=0)),
}


class _AuxiliaryTraining(BaseCallback):
    """What curiosity / auxiliary-loss callbacks do with the step's tensors: train a small net of their own on
    ``obs_tensor`` against ``values`` (autograd saves both for backward), then shift ``values`` in place (the
    algorithm's loop stores the tensor after the callbacks, so the buffer's values and advantages change)."""

    def __init__(self) -> None:
        super().__init__()
        self.net: th.nn.Linear | None = None

    def _on_step(self) -> bool:
        obs, values, log_probs = (self.locals[key] for key in ("obs_tensor", "values", "log_probs"))
        features = obs.float().reshape(len(values), -1)
        if self.net is None:
            rng = th.get_rng_state()  # the same start in both runs, leaving the models' random stream as it was
            th.manual_seed(3)
            self.net = th.nn.Linear(features.shape[1], 1)
            th.set_rng_state(rng)
        loss = ((self.net(features) - values) ** 2).mean() + (self.net(features).flatten() * log_probs).mean()
        loss.backward()
        with th.no_grad():
            for parameter in self.net.parameters():
                parameter -= 1e-3 * parameter.grad
                parameter.grad = None
        values.add_(0.5)
        return True


@pytest.mark.parametrize("algo", list(ALGOS))
def test_callbacks_may_train_on_the_step_tensors_and_change_them_in_place(algo: str) -> None:
    """``obs_tensor``, ``values`` and ``log_probs`` in a callback's ``locals`` are normal tensors, as the upstream
    loop's (made under ``no_grad``): autograd may save them and an in-place change reaches the rollout buffer. The
    lean loop makes its step under ``torch.inference_mode``, whose tensors autograd refuses ("Inference tensors
    cannot be saved for backward")."""
    base, ours, policy, make = ALGOS[algo]
    models, nets = [], []
    for cls in (base, ours):
        callback = _AuxiliaryTraining()
        model = cls(policy, make(), n_steps=32, batch_size=32, n_epochs=2, seed=0, device="cpu")
        model.learn(2 * 64, callback=callback)
        models.append(model)
        nets.append(callback.net)
    assert_identical(*models)  # the shifted values trained both alike
    for theirs, mine in zip(nets[0].parameters(), nets[1].parameters()):
        assert th.equal(theirs, mine)


class _ClippedAdvantages(RolloutBuffer):
    """A user's buffer that transforms its samples (advantages clipped to [-1, 1])."""

    def _get_samples(self, batch_inds: np.ndarray, env: Any = None) -> RolloutBufferSamples:
        samples = super()._get_samples(batch_inds, env)
        return samples._replace(advantages=samples.advantages.clamp(-1.0, 1.0))


class _RolloutOrder(RolloutBuffer):
    """A user's buffer that hands out minibatches in rollout order (no shuffling, no random draws)."""

    def get(self, batch_size: int | None = None) -> Iterator[RolloutBufferSamples]:
        next(super().get(1))  # SB3's flattening in place (and its permutation, which this order ignores)
        n = self.buffer_size * self.n_envs
        for start in range(0, n, batch_size or n):
            yield self._get_samples(np.arange(start, min(start + (batch_size or n), n)))


class _MaskableClippedAdvantages(MaskableRolloutBuffer):
    def _get_samples(self, batch_inds: np.ndarray, env: Any = None) -> Any:
        samples = super()._get_samples(batch_inds, env)
        return samples._replace(advantages=samples.advantages.clamp(-1.0, 1.0))


@pytest.mark.parametrize(("algo", "buffer_class"), [("ppo", _ClippedAdvantages), ("ppo", _RolloutOrder),
                                                    ("maskable", _MaskableClippedAdvantages)])
def test_a_buffer_class_with_its_own_sampling_trains_as_upstream(algo: str, buffer_class: type) -> None:
    """``rollout_buffer_class`` with its own ``get`` / ``_get_samples``: the algorithm's ``train()`` trains on what
    ``get(batch_size)`` yields, so the update does too (it had drawn SB3's minibatches from the arrays itself,
    ignoring the class: other parameters, without a word). With ``grad_accum_steps`` those minibatches are split."""
    base, ours, policy, make = ALGOS[algo]
    kwargs = dict(n_steps=32, batch_size=16, n_epochs=2, rollout_buffer_class=buffer_class)
    models = [cls(policy, make(), seed=0, device="cpu", **kwargs).learn(2 * 64) for cls in (base, ours)]
    assert_identical(*models)
    accumulated = ours(policy, make(), seed=0, device="cpu", grad_accum_steps=3, **kwargs).learn(2 * 64)
    assert_params_close(models[1], accumulated, ACCUMULATION_ATOL)


@pytest.mark.parametrize(("kwargs", "pattern"), [
    (dict(cuda_graphs=True), r"cannot be combined with cuda_graphs=True"),
    (dict(objective="kl_penalty"), r"cannot be combined with objective='kl_penalty' with this policy's analytic KL"),
])
def test_what_needs_rollout_indices_is_refused_with_a_buffer_of_its_own_sampling(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=r"rollout_buffer_class=_ClippedAdvantages draws its own minibatches .*"
                                         + pattern):
        ScalablePPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=0), n_steps=32, batch_size=16,
                    rollout_buffer_class=_ClippedAdvantages, device="cpu", **kwargs)
