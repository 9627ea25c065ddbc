"""ScalableRecurrentPPO against sb3-contrib's RecurrentPPO: identical by default (parameters and Adam state after
learn(): MlpLstm with and without a critic LSTM, a shared LSTM, CnnLstm on images, VecNormalize, gSDE; contrib's
per-step LSTM loop run lean, the same values and gradients), the batched
LSTM path equal up to float rounding (and measured to differ), exact accumulation over whole sequences, contrib's
minibatch cutting, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch as th
from sb3_contrib import RecurrentPPO
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_ppo_scale import ScalableRecurrentPPO
from sb3_ppo_scale.contrib.lstm import every_step_sequence, per_step_sequence
from sb3_ppo_scale.contrib.recurrent import (
    evaluate_batched,
    evaluate_batched_or_lean_loop,
    evaluate_batched_or_loop,
    evaluate_every_step,
    evaluate_recurrent,
    evaluate_recurrent_lean,
)
from sb3_ppo_scale.contrib.sequences import SequenceBatch, sequence_starts
from tests.helpers import ACCUMULATION_ATOL, HistoryLogger, assert_identical, max_param_diff, train_one

LSTM = dict(lstm_hidden_size=16, net_arch=[16])
SMALL = dict(n_steps=64, batch_size=64, n_epochs=3)


def cartpole(n_envs: int = 2, normalize: bool = False):
    def make():
        env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=0)  # episodes end inside rollouts: resets mid-batch
        return VecNormalize(env) if normalize else env

    return make


def images():
    """Two small image envs; FakeImageEnv draws observations from its observation space, seeded here so that every
    model sees the same frames."""

    def one(index: int) -> FakeImageEnv:
        env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
        env.observation_space.seed(index)
        return env

    return DummyVecEnv([lambda i=i: one(i) for i in range(2)])


CASES = {
    "mlp_critic_lstm": (cartpole(), "MlpLstmPolicy", dict(policy_kwargs=LSTM)),
    "mlp_no_critic_lstm": (cartpole(), "MlpLstmPolicy", dict(policy_kwargs={**LSTM, "enable_critic_lstm": False})),
    "mlp_shared_lstm": (cartpole(), "MlpLstmPolicy",
                        dict(policy_kwargs={**LSTM, "shared_lstm": True, "enable_critic_lstm": False})),
    "vec_normalize_target_kl": (cartpole(normalize=True), "MlpLstmPolicy",
                                dict(policy_kwargs=LSTM, target_kl=0.0005, learning_rate=1e-2)),
    "gsde": (lambda: make_vec_env("Pendulum-v1", n_envs=2, seed=0), "MlpLstmPolicy",
             dict(policy_kwargs=LSTM, use_sde=True, sde_sample_freq=4)),
    "cnn_lstm": (images, "CnnLstmPolicy", dict(policy_kwargs=dict(lstm_hidden_size=16, features_extractor_kwargs=dict(features_dim=32)),
                                               n_steps=32, batch_size=32, n_epochs=2)),
}


def run(cls: type, case: str, steps: int = 3 * 128, **extra) -> RecurrentPPO:
    make_env, policy, kwargs = CASES[case]
    return train_one(cls, make_env, steps, policy, "cpu", **{**SMALL, **kwargs, **extra})


@pytest.mark.parametrize("case", list(CASES))
def test_defaults_are_recurrent_ppo_bit_for_bit(case: str) -> None:
    contrib, ours = run(RecurrentPPO, case), run(ScalableRecurrentPPO, case)
    assert_identical(contrib, ours)  # parameters and Adam state, torch.equal
    assert ours._n_updates == contrib._n_updates
    if case == "vec_normalize_target_kl":  # the early stop really fired
        assert ours._n_grad_steps < 3 * 3 * 2
    for key in ("train/policy_gradient_loss", "train/value_loss", "train/entropy_loss", "train/approx_kl",
                "train/clip_fraction", "train/loss"):
        assert ours.logger.seen[key] == pytest.approx(contrib.logger.seen[key], rel=1e-6), key


@pytest.mark.parametrize("case", ["mlp_critic_lstm", "mlp_no_critic_lstm", "gsde", "cnn_lstm"])
def test_batched_sequences_equal_the_loop_up_to_rounding(case: str) -> None:
    """One LSTM call per micro-batch: the same parameters as contrib's per-step loop within float rounding (it is
    not bit-identical, hence opt-in; see test_batched_forward_is_rounding_not_bitwise)."""
    contrib, batched = run(RecurrentPPO, case), run(ScalableRecurrentPPO, case, batched_sequences=True)
    assert max_param_diff(contrib, batched) <= ACCUMULATION_ATOL


def _gradients(model, evaluator, micro, actions) -> list[th.Tensor]:
    model.policy.zero_grad()
    values, log_prob, _, _ = evaluator(model.policy, micro, actions, False)
    (values.flatten()[micro.mask].mean() + log_prob[micro.mask].mean()).backward()
    return [p.grad.clone() for p in model.policy.parameters() if p.grad is not None]


def test_batched_forward_is_rounding_not_bitwise() -> None:
    """The measurement behind the default, on minibatches holding episode starts (contrib's loop path): without
    autograd the batched call's values, log-probs and entropies are bit-identical to the loop's; with autograd (as in
    training) they and the gradients agree to float32 rounding but are not all bit-identical."""
    model = ScalableRecurrentPPO("MlpLstmPolicy", cartpole(4)(), seed=0, device="cpu", n_steps=64, batch_size=128,
                                 n_epochs=1, policy_kwargs=dict(lstm_hidden_size=32))
    model.learn(256)
    rollout = model._stage_rollout()
    training_bitwise = []
    for batch in model._make_loader(rollout, 128):
        micro = next(batch.micro_batches())
        assert micro.samples.episode_starts.sum() > 0
        actions = micro.samples.actions.long().flatten()
        with th.no_grad():
            loop, fast = (evaluate(model.policy, micro, actions, False) for evaluate in (evaluate_recurrent, evaluate_batched))
            assert all(th.equal(a, b) for a, b in zip(loop[:3], fast[:3]))
        loop, fast = (evaluate(model.policy, micro, actions, False) for evaluate in (evaluate_recurrent, evaluate_batched))
        assert all(th.allclose(a, b, rtol=0, atol=1e-5) for a, b in zip(loop[:3], fast[:3]))
        loop_grads = _gradients(model, evaluate_recurrent, micro, actions)
        fast_grads = _gradients(model, evaluate_batched, micro, actions)
        assert all(th.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(loop_grads, fast_grads))
        training_bitwise += [th.equal(a, b) for a, b in zip(loop[:3], fast[:3])]
        training_bitwise += [th.equal(a, b) for a, b in zip(loop_grads, fast_grads)]
    assert not all(training_bitwise)


@pytest.mark.parametrize("n_layers", [1, 2])
def test_lean_lstm_loop_is_contribs_loop_in_values_and_gradients(n_layers: int) -> None:
    """per_step_sequence against RecurrentActorCriticPolicy._process_sequence on padded sequences with episode starts
    at some steps and none at others (the first among them, so initial states holding -0.0 go in unmultiplied): the
    output and every gradient (weights, features, initial states) bit for bit; every_step_sequence (the reset at every
    step, for CUDA graphs) too."""
    th.manual_seed(0)
    lstm = th.nn.LSTM(5, 8, num_layers=n_layers)
    n_seq, steps = 3, 7
    starts = th.zeros(n_seq, steps)
    starts[0, 2], starts[1, 3], starts[2, 3], starts[2, 5] = 1.0, 1.0, 1.0, 1.0  # steps 0, 1, 4, 6: no start
    features = th.randn(n_seq * steps, 5)
    hidden, cell = th.randn(n_layers, n_seq, 8), th.randn(n_layers, n_seq, 8)
    hidden[0, 1, :3] = -0.0
    results = []
    for process in (lambda *a: RecurrentActorCriticPolicy._process_sequence(*a)[0], per_step_sequence,
                    every_step_sequence):
        lstm.zero_grad()
        inputs = [t.clone().requires_grad_() for t in (features, hidden, cell)]
        output = process(inputs[0], (inputs[1], inputs[2]), starts.flatten(), lstm)
        (output * th.linspace(-1, 1, output.numel()).view_as(output)).sum().backward()
        results.append([output, *(t.grad for t in inputs), *(p.grad for p in lstm.parameters())])
    contrib, lean, every_step = results
    assert all(th.equal(a, b) and th.equal(a, c) for a, b, c in zip(contrib, lean, every_step, strict=True))


def test_default_training_runs_the_lean_lstm_loop_where_it_is_exact() -> None:
    """The lean loop is the default evaluator (and sequence_length's loop for chunks holding a reset); compile_loss, a
    policy class with its own evaluate_actions and a hook on an LSTM keep contrib's own evaluation."""
    model = ScalableRecurrentPPO("MlpLstmPolicy", cartpole()(), device="cpu", **SMALL)
    assert model._evaluator is evaluate_recurrent_lean
    assert ScalableRecurrentPPO("MlpLstmPolicy", cartpole()(), device="cpu", compile_loss=True,
                                **SMALL)._evaluator is evaluate_recurrent
    assert ScalableRecurrentPPO(_OwnEvaluation, cartpole()(), device="cpu", **SMALL)._evaluator is evaluate_recurrent
    chunked = ScalableRecurrentPPO("MlpLstmPolicy", cartpole()(), device="cpu", batched_sequences=True, sequence_length=8,
                                   **SMALL)
    assert chunked._evaluator is evaluate_batched_or_lean_loop  # chunks holding a reset take the loop
    handle = model.policy.lstm_critic.register_forward_hook(lambda *args: None)
    assert model._evaluator is evaluate_recurrent
    handle.remove()
    assert model._evaluator is evaluate_recurrent_lean
    chunked.policy.lstm_actor.register_forward_hook(lambda *args: None)
    assert chunked._evaluator is evaluate_batched_or_loop
    graphed = ScalableRecurrentPPO("MlpLstmPolicy", cartpole()(), device="cpu", sequence_length=8, **SMALL)
    graphed.cuda_graphs = True  # the constructor takes it on CUDA only: the evaluator a capture needs
    assert graphed._evaluator is evaluate_every_step
    graphed.policy.lstm_actor.register_forward_hook(lambda *args: None)
    assert graphed._evaluator is evaluate_recurrent  # a hook sees contrib's calls (a capture then fails, by name)


class _OwnEvaluation(RecurrentActorCriticPolicy):
    """A user's recurrent policy with its own ``evaluate_actions``: training must call it."""

    def evaluate_actions(self, *args):  # type: ignore[no-untyped-def]
        return super().evaluate_actions(*args)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize(("batch_size", "grad_accum_steps"), [(128, 2), (200, 3)])
def test_accumulation_over_whole_sequences_equals_the_big_batch(batched: bool, batch_size: int, grad_accum_steps: int) -> None:
    """4 envs x 64 steps; batch 200 leaves a short last minibatch of 56 (fewer sequences than micro-batches there)."""
    common = dict(n_steps=64, n_epochs=3, batch_size=batch_size, policy_kwargs=LSTM)
    contrib = train_one(RecurrentPPO, cartpole(4), 3 * 256, "MlpLstmPolicy", "cpu", **common)
    ours = train_one(ScalableRecurrentPPO, cartpole(4), 3 * 256, "MlpLstmPolicy", "cpu", grad_accum_steps=grad_accum_steps,
                     batched_sequences=batched, **common)
    assert max_param_diff(contrib, ours) <= ACCUMULATION_ATOL


def test_micro_batches_are_whole_sequences_weighted_by_real_samples() -> None:
    model = ScalableRecurrentPPO("MlpLstmPolicy", cartpole(4)(), seed=0, device="cpu", n_steps=64, batch_size=200,
                                 n_epochs=1, grad_accum_steps=3, policy_kwargs=LSTM)
    model.learn(256)
    rollout = model._stage_rollout()
    starts = sequence_starts(model.rollout_buffer.episode_starts.T.reshape(-1), 64)
    for batch in model._make_loader(rollout, 200):
        assert isinstance(batch, SequenceBatch) and batch.n_micro == 3
        micros = list(batch.micro_batches())
        assert sum(m.share for m in micros) == pytest.approx(1.0)
        rows = np.concatenate([m.rows.numpy() for m in micros])
        assert np.array_equal(rows, batch.indices)  # every sample once, in order
        for micro in micros:
            n_real = int(micro.mask.sum())
            assert micro.share == n_real / len(batch) and n_real == len(micro.rows)
            first = micro.rows[0].item()
            assert starts[first] or first == batch.indices[0]  # a micro-batch begins at a sequence start
            padded = micro.samples.observations[~micro.mask]
            assert th.count_nonzero(padded) == 0  # contrib's zero padding
        sizes = [len(m.rows) for m in micros]
        assert max(sizes) - min(sizes) <= 64  # balanced to within one sequence


@pytest.mark.parametrize("objective", ["kl_penalty", "clip_kl_penalty"])
def test_kl_objectives_and_kl_adaptive_rate_stay_finite(objective: str) -> None:
    make_env, policy, kwargs = CASES["gsde"]
    model = ScalableRecurrentPPO(policy, make_env(), objective=objective, learning_rate="kl_adaptive", seed=0,
                                 device="cpu", batched_sequences=True, **{**SMALL, **kwargs})
    model.set_logger(HistoryLogger())
    model.learn(3 * 128)
    history = model.logger.history
    for key in ("train/loss", "train/kl", "train/kl_coef"):
        assert np.isfinite(history[key]).all() and len(history[key]) == 3, key
    assert min(history["train/kl"]) >= 0.0 and model._n_nonfinite_steps == 0


def test_save_and_load_keep_the_model_and_its_arguments(tmp_path) -> None:
    model = run(ScalableRecurrentPPO, "mlp_critic_lstm", steps=128, batched_sequences=True, grad_accum_steps=2,
                batch_size=128)
    model.save(tmp_path / "model.zip")
    loaded = ScalableRecurrentPPO.load(tmp_path / "model.zip", env=cartpole()(), device="cpu")
    assert_identical(model, loaded)
    assert loaded.batched_sequences is True and loaded.grad_accum_steps == 2
    obs = loaded.env.reset()
    actions, states = loaded.predict(obs, deterministic=True)
    expected, _ = model.predict(obs, deterministic=True)
    assert np.array_equal(actions, expected) and states is not None
    loaded.learn(128, reset_num_timesteps=False)  # continues training from the loaded state
    assert loaded.num_timesteps == 2 * 128


@pytest.mark.parametrize(("kwargs", "pattern"), [
    (dict(batch_size=64, grad_accum_steps=2), r"batch_size=64 cannot hold grad_accum_steps=2 whole sequences"),
    (dict(cuda_graphs=True), r"cuda_graphs=True is not supported by ScalableRecurrentPPO"),
    (dict(batched_sequences="yes"), r"batched_sequences must be True or False"),
    (dict(batch_size=1), r"batch_size must be >= 2 when normalize_advantage=True"),
    (dict(policy_kwargs=dict(lstm_hidden_size=-1)), r"policy_kwargs\['lstm_hidden_size'\] must be an int >= 1, got -1"),
    (dict(policy_kwargs=dict(lstm_hidden_size=64.5)), r"policy_kwargs\['lstm_hidden_size'\] must be an int >= 1"),
    (dict(policy_kwargs=dict(n_lstm_layers=0)), r"policy_kwargs\['n_lstm_layers'\] must be an int >= 1, got 0"),
    # RecurrentPPO: torch's "hidden_size should be of type int, got: int64"
    (dict(policy_kwargs=dict(lstm_hidden_size=np.int64(8))), r"policy_kwargs\['lstm_hidden_size'\] must be a Python int "
                                                              r"\(torch's nn.LSTM takes no NumPy integer\)"),
    (dict(policy_kwargs=dict(n_lstm_layers=np.int32(2))), r"policy_kwargs\['n_lstm_layers'\] must be a Python int"),
])
def test_bad_arguments_are_named(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        ScalableRecurrentPPO("MlpLstmPolicy", cartpole()(), device="cpu", **{**SMALL, **kwargs})


@pytest.mark.parametrize(("kwargs", "pattern"), [
    (dict(), r"cuda_graphs=True .*padded minibatch shapes change .*pass sequence_length=L"),
    (dict(sequence_length=8, batched_sequences=True), r"cuda_graphs=True .*pass batched_sequences=False"),
])
def test_cuda_graphs_refusal_says_what_to_pass(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        ScalableRecurrentPPO("MlpLstmPolicy", cartpole()(), device="cpu", cuda_graphs=True, **kwargs, **SMALL)


def _predict_inputs(model):
    obs = model.env.reset()
    _, state = model.predict(obs)
    return obs, state


@pytest.mark.parametrize(("make", "pattern"), [
    (lambda s: (s[0][:, :, :5], s[1][:, :, :5]), r"state\[0\] must have shape \(n_lstm_layers, n_envs, lstm_hidden_size\) "
                                                 r"= \(1, 2, 16\) for 2 observation\(s\), got \(1, 2, 5\)"),
    (lambda s: (s[0][0], s[1][0]), r"state\[0\] must have shape .*got \(2, 16\)"),
    (lambda s: s[0], r"state must be None or the \(hidden, cell\) pair predict returned .*got ndarray"),
    (lambda s: (*s, s[0]), r"state must be None or the \(hidden, cell\) pair .*got tuple of 3"),  # contrib ignores the 3rd
    (lambda s: (s[0] * np.nan, s[1]), r"state\[0\] must hold finite numbers .* with nan or inf"),
])
def test_a_bad_predict_state_is_named(make, pattern) -> None:
    """RecurrentPPO fails inside torch (a reshape, the LSTM's size check, a distribution's nan check)."""
    model = ScalableRecurrentPPO("MlpLstmPolicy", cartpole()(), device="cpu", policy_kwargs=LSTM, **SMALL)
    obs, state = _predict_inputs(model)
    with pytest.raises(ValueError, match=pattern):
        model.predict(obs, state=make(state), episode_start=np.zeros(2, dtype=bool))


@pytest.mark.parametrize(("episode_start", "pattern"), [
    (np.zeros(3, dtype=bool), r"episode_start must hold one flag per observation \(2\), got shape \(3,\)"),
    (True, r"episode_start must hold one flag per observation \(2\), got shape \(\)"),
    (np.array([np.nan, 0.0]), r"episode_start must hold booleans \(or 0 / 1\), got \[nan, 0.0\]"),
    (np.array(["yes", "no"]), r"episode_start must hold booleans \(or 0 / 1\)"),
])
def test_a_bad_episode_start_is_named(episode_start, pattern) -> None:
    model = ScalableRecurrentPPO("MlpLstmPolicy", cartpole()(), device="cpu", policy_kwargs=LSTM, **SMALL)
    obs, state = _predict_inputs(model)
    with pytest.raises(ValueError, match=pattern):
        model.predict(obs, state=state, episode_start=episode_start)


def test_predict_takes_what_recurrent_ppo_takes() -> None:
    """Same actions and states as RecurrentPPO for the inputs it reads: lists, tensors, 0 / 1 numbers, and a state of
    one env with its observations read as consecutive steps."""
    contrib = RecurrentPPO("MlpLstmPolicy", cartpole()(), seed=0, device="cpu", policy_kwargs=LSTM, **SMALL)
    ours = ScalableRecurrentPPO("MlpLstmPolicy", cartpole()(), seed=0, device="cpu", policy_kwargs=LSTM, **SMALL)
    obs = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    _, state = contrib.predict(obs, deterministic=True)
    for args in [(tuple(th.as_tensor(part) for part in state), [1, 0]), (state, np.array([[1.0], [0.0]])),
                 ((state[0][:, :1], state[1][:, :1]), np.zeros(2))]:
        expected = contrib.predict(obs, *args, deterministic=True)
        actual = ours.predict(obs, *args, deterministic=True)
        assert np.array_equal(expected[0], actual[0]) and all(np.array_equal(e, a) for e, a in zip(expected[1], actual[1]))


@pytest.mark.parametrize("name", ["rollout_buffer_class", "rollout_buffer_kwargs"])
def test_a_buffer_argument_is_refused_with_the_reason(name: str) -> None:
    """RecurrentPPO takes no buffer arguments (a TypeError); ours says why, and that no sequence buffer exists."""
    from sb3_ppo_scale import PrioritizedRolloutBuffer

    value = PrioritizedRolloutBuffer if name == "rollout_buffer_class" else {}
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{name}': like sb3_contrib.RecurrentPPO .*"
                                        r"prioritized buffer for sequences is not built"):
        ScalableRecurrentPPO("MlpLstmPolicy", cartpole()(), device="cpu", **{**SMALL, name: value})
