"""Data-parallel ScalableMaskablePPO and ScalableRecurrentPPO (sb3_ppo_scale.distributed) with 2 gloo processes.

As tests/test_distributed.py does for ScalablePPO: after a 2-rank update the parameters equal (to its ATOL) those of
one process that trains on the concatenation of both ranks' rollouts with the same minibatch composition, rebuilt
from each rank's NumPy RNG state:

- masking: each rank's own permutation, sliced into ``batch_size / 2`` samples, the ranks' slices side by side; the
  action masks of both ranks travel with their samples;
- recurrent: each rank's own contrib split point, sliced into ``batch_size / 2`` samples and cut into sequences on
  the rank; the global minibatch is the union of both ranks' sequences, each micro-batch weighted by its share of
  the global minibatch's real (unpadded) samples. LSTM states of all four envs travel with their sequences.

- recurrent with ``sequence_length``: each rank's own permutation of its chunks, ``batch_size / 2 / L`` chunks per
  rank and minibatch; the global minibatch is the union of both ranks' chunks.

Variants: plain clip, ``target_kl`` firing, ``grad_accum_steps`` > 1, the KL-penalty objective (masking),
``batched_sequences=True`` and ``sequence_length`` with accumulation (recurrent). Both ranks end bitwise identical
(the debug checksum runs after every update).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer
from sb3_contrib.common.recurrent.buffers import RecurrentRolloutBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import Logger

from sb3_ppo_scale import ScalableMaskablePPO, ScalableRecurrentPPO
from sb3_ppo_scale.contrib.sequences import STATE_FIELDS, ChunkBatch, SequenceBatch
from tests.helpers import GivenOrderHooks
from tests.test_distributed import ATOL, BUFFER_FIELDS, WORLD, _CaptureLastRollout, _spawn, _state, _union_orders

N_STEPS, N_ENVS = 32, 2  # 64 samples per rank
N_LOCAL = N_STEPS * N_ENVS
L = 8  #: sequence_length: 8 chunks per rank, local minibatches of 3, 3 and 2 chunks
#: 48 global = 24 per rank: local minibatches of 24, 24 and 16 (a short last one)
COMMON = dict(n_steps=N_STEPS, batch_size=48, n_epochs=3, learning_rate=3e-3, device="cpu")
LSTM = dict(policy_kwargs=dict(lstm_hidden_size=8, net_arch=[16]))
#: (algorithm, variant) -> constructor arguments on top of COMMON
VARIANTS: dict[tuple[str, str], dict[str, Any]] = {
    ("maskable", "clip"): {},
    ("maskable", "target_kl"): dict(target_kl=0.0005),
    ("maskable", "grad_accum"): dict(grad_accum_steps=3),
    ("maskable", "kl_penalty"): dict(objective="kl_penalty", kl_penalty_target=1e-4),
    ("recurrent", "clip"): dict(LSTM),
    ("recurrent", "target_kl"): dict(LSTM, target_kl=1e-5),
    ("recurrent", "grad_accum"): dict(LSTM, grad_accum_steps=2),
    ("recurrent", "batched_sequences"): dict(LSTM, batched_sequences=True),
    ("recurrent", "sequence_length"): dict(LSTM, sequence_length=L, grad_accum_steps=2),
}
CLASSES = {"maskable": ScalableMaskablePPO, "recurrent": ScalableRecurrentPPO}
EXTRA_FIELDS = {"maskable": ("action_masks",), "recurrent": STATE_FIELDS}


def make_env(algo: str, n_envs: int = N_ENVS) -> Any:
    if algo == "maskable":
        return make_vec_env(lambda: InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10), n_envs=n_envs)
    return make_vec_env("CartPole-v1", n_envs=n_envs)  # episodes end inside rollouts: sequences cut at resets


def make_model(algo: str, variant: str, seed: int, n_envs: int = N_ENVS) -> Any:
    policy = "MlpPolicy" if algo == "maskable" else "MlpLstmPolicy"
    return CLASSES[algo](policy, make_env(algo, n_envs), seed=seed, **COMMON, **VARIANTS[(algo, variant)])


def _worker(rank: int, out: Path) -> dict[tuple[str, str], dict[str, Any]]:
    results = {}
    for (algo, variant) in VARIANTS:
        model = make_model(algo, variant, seed=0)
        capture = _CaptureLastRollout(BUFFER_FIELDS + EXTRA_FIELDS[algo])
        model.learn(2 * WORLD * N_LOCAL, callback=capture)  # two rollouts and two updates, both global
        results[(algo, variant)] = dict(capture.captured, final=_state(model), n_grad_steps=model._n_grad_steps,
                                        beta=model.kl_beta)
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict[tuple[str, str], dict[str, Any]]]:
    return _spawn(_worker, tmp_path_factory.mktemp("contrib_ranks"))


# ------------------------------------------------------------------------------------------------ one process
class _UnionMaskableBuffer(GivenOrderHooks, MaskableRolloutBuffer):
    """The concatenation of the ranks' masked rollouts (env axis), trained in a given order (RolloutHooks)."""


class _UnionSequenceLoader:
    """Each epoch: every rank's contrib split point (replayed from its NumPy state), its local minibatches cut into
    sequences as the rank cut them; global minibatch k = rank 0's k-th sequences, then rank 1's."""

    def __init__(self, model: Any, rollout: Any, states: list[tuple], local_batch: int) -> None:
        draws = []
        for state in states:
            rng = np.random.RandomState()
            rng.set_state(state)
            draws.append([rng.randint(N_LOCAL) for _ in range(model.n_epochs)])
        self.model, self.rollout, self.draws, self.local_batch, self.epoch = model, rollout, draws, local_batch, 0

    def __len__(self) -> int:
        return -(-N_LOCAL // self.local_batch)

    def __iter__(self) -> Iterator[SequenceBatch]:
        orders = [np.concatenate((np.arange(d[self.epoch], N_LOCAL), np.arange(d[self.epoch]))) for d in self.draws]
        self.epoch += 1
        for begin in range(0, N_LOCAL, self.local_batch):
            indices, starts = [], []
            for r, order in enumerate(orders):
                part = order[begin : begin + self.local_batch] + r * N_LOCAL
                part_starts = self.model._sequence_starts[part].copy()
                part_starts[0] = True  # a rank's minibatch begins a sequence
                indices.append(part)
                starts.append(part_starts)
            yield SequenceBatch(self.rollout, np.concatenate(indices), np.concatenate(starts),
                                self.model.grad_accum_steps, self.model.device)


class _UnionChunkLoader:
    """Each epoch: every rank's permutation of its own chunks (replayed from its NumPy state); global minibatch k =
    rank 0's k-th chunks, then rank 1's."""

    def __init__(self, model: Any, rollout: Any, states: list[tuple], local_batch: int) -> None:
        self.orders = []
        for state in states:
            rng = np.random.RandomState()
            rng.set_state(state)
            self.orders.append([rng.permutation(N_LOCAL // L) for _ in range(model.n_epochs)])
        self.model, self.rollout, self.per_batch, self.epoch = model, rollout, local_batch // L, 0

    def __len__(self) -> int:
        return -(-(N_LOCAL // L) // self.per_batch)

    def __iter__(self) -> Iterator[ChunkBatch]:
        orders = [order[self.epoch] for order in self.orders]
        self.epoch += 1
        for begin in range(0, N_LOCAL // L, self.per_batch):
            chunks = np.concatenate([order[begin : begin + self.per_batch] + r * (N_LOCAL // L)
                                     for r, order in enumerate(orders)])
            rows = th.from_numpy((chunks[:, None] * L + np.arange(L)).reshape(-1))
            yield ChunkBatch(self.rollout, rows, min(self.model.grad_accum_steps * WORLD, len(chunks)),
                             self.model.device, L)


def _union_buffer(algo: str, model: Any, ranks: list[dict[str, Any]]) -> Any:
    n_envs = WORLD * N_ENVS
    if algo == "maskable":
        buffer = _UnionMaskableBuffer(N_STEPS, model.observation_space, model.action_space, device="cpu", n_envs=n_envs)
    else:
        lstm = model.policy.lstm_actor
        shape = (N_STEPS, lstm.num_layers, n_envs, lstm.hidden_size)
        buffer = RecurrentRolloutBuffer(N_STEPS, model.observation_space, model.action_space, shape, device="cpu",
                                        n_envs=n_envs)
    buffer.reset()
    for key in ranks[0]["buffer"]:
        axis = 2 if key in STATE_FIELDS else 1  # LSTM states are stored (n_steps, n_layers, n_envs, hidden)
        setattr(buffer, key, np.concatenate([r["buffer"][key] for r in ranks], axis=axis))
    buffer.full = True
    return buffer


def _single_process_reference(algo: str, variant: str, ranks: list[dict[str, Any]]) -> Any:
    """One process, one update on the union of both ranks' last rollouts, from rank 0's state before it."""
    model = make_model(algo, variant, seed=1, n_envs=WORLD * N_ENVS)
    first = ranks[0]
    model.policy.load_state_dict(first["params"])
    model.policy.optimizer.load_state_dict(first["optimizer"])
    model._objective.load_state_dict(first["objective"])
    model._current_progress_remaining = first["progress"]
    model.set_logger(Logger(folder=None, output_formats=[]))
    model.rollout_buffer = _union_buffer(algo, model, ranks)
    states, local_batch = [r["numpy_state"] for r in ranks], COMMON["batch_size"] // WORLD
    if algo == "maskable":
        model.rollout_buffer.orders = _union_orders(states, N_LOCAL, local_batch, COMMON["n_epochs"])
    else:
        in_order = type(model)._make_loader.__get__(model)

        def union_loader(rollout: Any, batch_size: int, shuffle: bool = True) -> Any:
            if not shuffle:  # the KL passes over the rollout in order
                return in_order(rollout, batch_size, shuffle=False)
            union = _UnionChunkLoader if model.sequence_length else _UnionSequenceLoader
            return union(model, rollout, states, local_batch)

        model._make_loader = union_loader
    model._n_grad_steps = 0
    model.train()
    return model


@pytest.mark.parametrize("algo,variant", list(VARIANTS))
def test_two_ranks_update_equals_one_process_on_the_union(ranks, algo: str, variant: str) -> None:
    runs = [r[(algo, variant)] for r in ranks]
    assert not np.array_equal(runs[0]["buffer"]["observations"], runs[1]["buffer"]["observations"])  # own seeds
    reference = _single_process_reference(algo, variant, runs)
    for key, value in reference.policy.state_dict().items():
        assert th.equal(runs[1]["final"][key], runs[0]["final"][key])  # bitwise identical across ranks
        th.testing.assert_close(runs[0]["final"][key], value, rtol=0, atol=ATOL)
    moved = max(float((runs[0]["final"][k] - runs[0]["params"][k]).abs().max()) for k in runs[0]["params"])
    assert moved > 100 * ATOL  # the update did change the parameters
    steps = runs[0]["n_grad_steps"] - runs[0]["grad_steps_before"]  # the last update's optimizer steps
    assert runs[1]["n_grad_steps"] - runs[1]["grad_steps_before"] == steps == reference._n_grad_steps
    assert steps < 9 if variant == "target_kl" else steps == 9  # 3 minibatches x 3 epochs unless the KL stop fired
    if variant == "kl_penalty":  # beta adapted on the all-reduced KL: same on both ranks and in the reference
        assert runs[0]["beta"] == runs[1]["beta"] == pytest.approx(reference.kl_beta, rel=1e-6)
        assert runs[0]["beta"] != 1.0
