"""ScalableRecurrentPPO(sequence_length=L): minibatches of an exact size (sb3_ppo_scale.contrib.sequences.ChunkLoader).

contrib's minibatches hold ``batch_size`` real samples in a padded tensor whose row count varies (measured below);
with ``sequence_length`` every logical minibatch holds exactly ``batch_size`` samples and rows (the last may be
shorter), no padding; chunks with an episode start after their first step reset the LSTM there, so evaluating the
collecting policy on the chunks reproduces the values and log-probs collection recorded; accumulation over whole
chunks equals the big batch; bad values are named."""

from __future__ import annotations

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_scale import ScalableRecurrentPPO
from sb3_ppo_scale.contrib.sequences import ChunkBatch, ChunkLoader, SequenceBatch, SequenceLoader
from sb3_ppo_scale.core.update.objectives import AdvantageNormalizer
from tests.helpers import ACCUMULATION_ATOL, assert_params_close, train_one

LSTM = dict(lstm_hidden_size=16, net_arch=[16])
N_STEPS, N_ENVS, L = 64, 2, 8


def cartpole():
    return make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0)  # episodes of ~10-40 steps: resets inside chunks


def collected(**kwargs) -> ScalableRecurrentPPO:
    """A model after one rollout (no update), its rollout staged for the loaders."""
    model = ScalableRecurrentPPO("MlpLstmPolicy", cartpole(), n_steps=N_STEPS, batch_size=48, seed=0, device="cpu",
                                 policy_kwargs=LSTM, **kwargs)
    _, callback = model._setup_learn(N_STEPS * N_ENVS, None)
    callback.on_training_start(locals(), globals())
    model.collect_rollouts(model.env, callback, model.rollout_buffer, N_STEPS)
    return model


def test_contrib_minibatches_hold_batch_size_samples_in_padded_tensors_of_varying_size() -> None:
    """What sequence_length is for: contrib's real-sample count is exact, its padded row count is not."""
    model = collected()
    rollout = model._stage_rollout()
    np.random.seed(0)
    batches = list(SequenceLoader(rollout, model._sequence_starts, 48, 1, model.device))
    assert [len(b) for b in batches] == [48, 48, 32]
    rows = [sum(len(layout.padded_rows) for layout in b.layouts()) for b in batches[:2]]
    assert all(r > 48 for r in rows)  # zero padding on top of the 48 samples, a different amount each time


@pytest.mark.parametrize("accum", [1, 2])
def test_every_minibatch_holds_exactly_batch_size_samples_and_rows(accum: int) -> None:
    model = collected(sequence_length=L, grad_accum_steps=accum)
    rollout = model._stage_rollout()
    loader = model._make_loader(rollout, model.batch_size)
    assert isinstance(loader, ChunkLoader) and len(loader) == 3  # 16 chunks of 8: 6 + 6 + 4
    seen = []
    for batch in loader:
        micro = list(batch.micro_batches())
        assert len(micro) == accum
        for m in micro:
            assert m.mask is None  # no padding slot: every row is a sample
            assert m.samples.observations.shape[0] == len(m.rows) == m.samples.lstm_states.pi[0].shape[1] * L
        assert sum(len(m.rows) for m in micro) == len(batch)
        assert sum(m.share for m in micro) == pytest.approx(1.0)
        seen.append(len(batch))
        chunks = batch.indices.numpy().reshape(-1, L)
        assert (np.diff(chunks, axis=1) == 1).all() and (chunks[:, 0] % L == 0).all()  # whole chunks of one env
    assert seen == [48, 48, 32]
    starts = model._sequence_starts.reshape(-1, L)
    assert starts[:, 1:].any()  # the test covers chunks with an episode start after their first step


@pytest.mark.parametrize("batched", [False, True])
def test_chunks_reproduce_what_collection_computed(batched: bool) -> None:
    """The collecting policy, evaluated on the chunks (stored initial states, resets inside chunks), gives the values
    and log-probs recorded during collection: the chunks' states and resets are right."""
    model = collected(sequence_length=L, batched_sequences=batched)
    rollout = model._stage_rollout()
    values, log_probs = th.empty(len(rollout)), th.empty(len(rollout))
    with th.no_grad():
        for batch in model._make_loader(rollout, model.batch_size, shuffle=False):
            for micro in batch.micro_batches():
                value, log_prob, _, _ = model._evaluator(model.policy, micro, micro.samples.actions.long().flatten(),
                                                         False)
                values[micro.rows], log_probs[micro.rows] = value.flatten(), log_prob
    th.testing.assert_close(values, rollout.old_values, rtol=0, atol=1e-5)
    th.testing.assert_close(log_probs, rollout.old_log_prob, rtol=0, atol=1e-5)


def _losses_and_gradients(model: ScalableRecurrentPPO, batch) -> tuple[list[th.Tensor], list[th.Tensor]]:
    """Each micro-batch's loss and stats, and the gradients accumulated as UpdateStep accumulates them."""
    settings = model._loss_settings()
    model.policy.optimizer.zero_grad()
    normalize = AdvantageNormalizer.fit(batch.advantages(), True)
    outputs = []
    for micro in batch.micro_batches():
        loss, stats = model._loss(model.policy, micro, normalize, settings)
        (loss * micro.share).backward()
        outputs += [loss.detach(), stats, th.tensor(micro.share)]
    return outputs, [p.grad.clone() for p in model.policy.parameters()]


@pytest.mark.parametrize("accum", [1, 2, 3])
def test_chunk_batches_on_the_device_equal_padded_sequence_batches_of_the_same_chunks(accum: int) -> None:
    """ChunkBatch (device indices, no mask: what a CUDA graph can replay) gives the losses, statistics and gradients of
    the same chunks cut as contrib-style padded sequences (host layouts, an all-True mask), bit for bit."""
    model = collected(sequence_length=L, grad_accum_steps=accum)
    rollout = model._stage_rollout()
    chunks = np.random.default_rng(1).permutation(len(rollout) // L)[:6]
    indices = (chunks[:, None] * L + np.arange(L)).reshape(-1)
    first_steps = np.zeros(len(indices), dtype=bool)
    first_steps[::L] = True
    padded = SequenceBatch(rollout, indices, first_steps, accum, model.device)
    on_device = ChunkBatch(rollout, th.from_numpy(indices), accum, model.device, L)
    assert [len(layout.rows) for layout in padded.layouts()] == [n * L for n in on_device.chunk_counts()]
    padded_out, padded_grads = _losses_and_gradients(model, padded)
    device_out, device_grads = _losses_and_gradients(model, on_device)
    assert all(th.equal(a, b) for a, b in zip(padded_out, device_out, strict=True))
    assert all(th.equal(a, b) for a, b in zip(padded_grads, device_grads, strict=True))
    assert model._sequence_starts[indices].reshape(-1, L)[:, 1:].any()  # chunks with a reset after their first step


def test_accumulation_over_whole_chunks_equals_the_big_batch() -> None:
    common = dict(n_steps=N_STEPS, batch_size=48, n_epochs=3, policy_kwargs=LSTM, sequence_length=L)
    big = train_one(ScalableRecurrentPPO, cartpole, 3 * N_STEPS * N_ENVS, "MlpLstmPolicy", "cpu", **common)
    accumulated = train_one(ScalableRecurrentPPO, cartpole, 3 * N_STEPS * N_ENVS, "MlpLstmPolicy", "cpu",
                            grad_accum_steps=3, **common)
    assert accumulated._n_grad_steps == big._n_grad_steps == 3 * 3 * 3
    assert_params_close(big, accumulated, ACCUMULATION_ATOL)


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(sequence_length=0), "sequence_length must be None or an int >= 1, got 0"),
    (dict(sequence_length=7), "sequence_length=7 must divide n_steps=64 and batch_size=48"),
    (dict(sequence_length=16, grad_accum_steps=4), "batch_size=48 holds 3 chunks of sequence_length=16, fewer than "
                                                   "grad_accum_steps=4"),
])
def test_bad_sequence_lengths_are_named(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        ScalableRecurrentPPO("MlpLstmPolicy", cartpole(), n_steps=N_STEPS, batch_size=48, device="cpu",
                             policy_kwargs=LSTM, **kwargs)
