"""A user's code around the model (callbacks, their tensors, the training env they see) behaves with the Scalable
classes as with PPO, MaskablePPO and RecurrentPPO: same results, same objects, no new errors."""

from __future__ import annotations

import pytest
import torch as th
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_scale import ScalableMaskablePPO, ScalablePPO, ScalableRecurrentPPO
from tests.helpers import assert_identical

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
