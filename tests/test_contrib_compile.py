"""compile_loss=True for sb3-contrib's classes, with tests/test_compile.py's proof of compilation (every backward of
the update goes through an AOT-compiled function, recompile-limit fallback to eager is an error) and its tolerance
(COMPILE_ATOL against the eager run, which is the contrib class's bit for bit):

- ScalableMaskablePPO: the whole masked loss is one graph (masks, masked distribution, entropy), no graph break
  (micro-batches of 17+ samples here: Dynamo guards its first graph on ``17 <= batch``, and a smaller micro-batch
  compiles one more variant);
- ScalableRecurrentPPO (contrib's per-step loop and ``batched_sequences=True``): the loss compiles around the LSTM.
  Dynamo does not trace ``nn.LSTM`` (its graph break "Dynamo does not support RNN, GRU, or LSTM": the LSTM runs
  eagerly) and RecurrentPPO's masked means index by a data-dependent mask (``aten.nonzero``); those two are the only
  graph breaks. One rollout each, as test_compile's POLICIES cases (a flipped discrete action sample on a second
  rollout would compare different data).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch as th
import torch._dynamo
from sb3_contrib import MaskablePPO, RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env
from torch._dynamo.utils import counters

from sb3_ppo_scale import ScalableMaskablePPO, ScalableRecurrentPPO
from tests.helpers import assert_params_close, train_one
from tests.test_compile import COMPILE_ATOL, assert_every_update_compiled, train_recording_backward
from tests.test_contrib_checkpoint import MaskedFixedLengthEnv

#: the graph breaks a recurrent loss is compiled around (see the module docstring)
RECURRENT_GRAPH_BREAKS = ("Dynamo does not support RNN, GRU, or LSTM", "aten.nonzero")


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """As tests/test_compile.py: no compiled code and zeroed counters at the start; falling back to eager after the
    recompile limit, or swallowing a compile error, is an error."""
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, suppress_errors=False):
        yield
    torch._dynamo.reset()


def masked_envs() -> Any:
    return make_vec_env(MaskedFixedLengthEnv, n_envs=2, seed=0)


def cartpole() -> Any:
    return make_vec_env("CartPole-v1", n_envs=2, seed=0)  # episodes end inside the rollout: sequences of many lengths


def test_maskable_compiled_loss_is_one_graph_and_trains_like_maskable_ppo(monkeypatch: pytest.MonkeyPatch) -> None:
    common = dict(n_steps=64, batch_size=48, n_epochs=4, policy_kwargs={"net_arch": [16]})  # 48 + 48 + 32
    baseline = train_one(MaskablePPO, masked_envs, 128, "MlpPolicy", "cpu", **common)
    assert counters["frames"]["total"] == 0
    model, flags = train_recording_backward(
        monkeypatch, lambda: train_one(ScalableMaskablePPO, masked_envs, 128, "MlpPolicy", "cpu", compile_loss=True,
                                       **common))
    assert_every_update_compiled(model, flags)  # one graph, no graph break, every backward compiled
    assert model._n_grad_steps == baseline._n_updates * 3 > 1
    assert_params_close(baseline, model, COMPILE_ATOL)


@pytest.mark.parametrize("batched", [False, True])
def test_recurrent_compiled_loss_trains_like_the_eager_one(batched: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    common = dict(n_steps=64, batch_size=64, n_epochs=3, policy_kwargs=dict(lstm_hidden_size=16, net_arch=[16]))
    if batched:  # eager batched_sequences: the same maths as compiled, RecurrentPPO's up to its own rounding
        baseline = train_one(ScalableRecurrentPPO, cartpole, 128, "MlpLstmPolicy", "cpu", batched_sequences=True,
                             **common)
    else:
        baseline = train_one(RecurrentPPO, cartpole, 128, "MlpLstmPolicy", "cpu", **common)
    assert counters["frames"]["total"] == 0
    model, flags = train_recording_backward(
        monkeypatch, lambda: train_one(ScalableRecurrentPPO, cartpole, 128, "MlpLstmPolicy", "cpu", compile_loss=True,
                                       batched_sequences=batched, **common))
    assert len(flags) >= model._n_grad_steps == 2 * 3 and all(flags)  # every backward went through compiled code
    assert counters["frames"]["ok"] >= 1 and counters["stats"]["unique_graphs"] >= 1
    breaks = list(counters["graph_break"])
    assert breaks and all(any(known in reason for known in RECURRENT_GRAPH_BREAKS) for reason in breaks), breaks
    assert_params_close(baseline, model, COMPILE_ATOL)
