"""Defaults are PPO: identical parameters after the same training, with and without target_kl early stopping.

With grad_accum_steps=k > 1 the parameters match PPO with the same batch_size (exact accumulation).
"""

from __future__ import annotations

import pytest

from tests.helpers import ACCUMULATION_ATOL, assert_identical, max_param_diff, train_pair

N_STEPS = 256
ROLLOUTS = 3


def _common(env_id: str, target_kl: float | None) -> dict:
    kwargs = dict(n_steps=N_STEPS, batch_size=64, n_epochs=4)
    if target_kl is not None:  # a large learning rate makes the KL early stop fire on these tasks
        kwargs.update(target_kl=target_kl, learning_rate=3e-3)
    return kwargs


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("target_kl", [None, 0.003])
@pytest.mark.parametrize("grad_accum_steps", [1, 3])
def test_parameters_equal_ppo(env_id: str, target_kl: float | None, grad_accum_steps: int) -> None:
    ppo, scalable = train_pair(
        env_id, ROLLOUTS * N_STEPS, scalable_kwargs=dict(grad_accum_steps=grad_accum_steps), **_common(env_id, target_kl)
    )
    if grad_accum_steps == 1:
        assert_identical(ppo, scalable)  # parameters and Adam state, bit for bit
    else:  # another float summation order of the gradients (tests/helpers.py justifies the tolerance)
        assert max_param_diff(ppo, scalable) <= ACCUMULATION_ATOL
    assert scalable._n_updates == ppo._n_updates
    full_run_steps = ROLLOUTS * 4 * (N_STEPS // 64)
    if target_kl is None:
        assert scalable._n_grad_steps == full_run_steps
    else:  # early stopping really fired
        assert scalable._n_grad_steps < full_run_steps
    if grad_accum_steps == 1:  # same operations in the same order: bit-identical
        assert max_param_diff(ppo, scalable) == 0.0


@pytest.mark.parametrize(("batch_size", "grad_accum_steps"), [(100, 7), (256, 256), (256, 16), (96, 5)])
def test_accumulation_with_uneven_and_short_batches(batch_size: int, grad_accum_steps: int) -> None:
    """Micro sizes that do not divide, a short last minibatch (256 % 100, 256 % 96) and the whole rollout."""
    ppo, scalable = train_pair(
        "Pendulum-v1",
        2 * N_STEPS,
        scalable_kwargs=dict(grad_accum_steps=grad_accum_steps),
        n_steps=N_STEPS,
        batch_size=batch_size,
        n_epochs=3,
    )
    assert max_param_diff(ppo, scalable) <= ACCUMULATION_ATOL


@pytest.mark.parametrize("grad_accum_steps", [1, 50])
def test_batch_size_above_the_rollout_trains_on_the_whole_rollout_as_ppo(grad_accum_steps: int) -> None:
    """PPO warns and trains on the whole rollout as one minibatch; so does ScalablePPO (it used to refuse)."""
    ppo, scalable = train_pair("Pendulum-v1", 3 * 32, scalable_kwargs=dict(grad_accum_steps=grad_accum_steps),
                               n_steps=32, batch_size=100, n_epochs=3)
    assert scalable._n_grad_steps == ppo._n_updates == 3 * 3  # one minibatch per epoch
    if grad_accum_steps == 1:
        assert_identical(ppo, scalable)
    else:  # 32 samples in micro-batches: another summation order
        assert max_param_diff(ppo, scalable) <= ACCUMULATION_ATOL


def test_logger_keys_and_values_match_ppo() -> None:
    ppo, scalable = train_pair("Pendulum-v1", 2 * N_STEPS, n_steps=N_STEPS, batch_size=64, n_epochs=2, clip_range_vf=0.2)
    ppo_keys = {k for k in ppo.logger.seen if k.startswith("train/")}
    ours = {k for k in scalable.logger.seen if k.startswith("train/")}
    assert ours == ppo_keys | {"train/n_grad_steps"}
    for key in ppo_keys:
        assert scalable.logger.seen[key] == ppo.logger.seen[key], key  # the same values, not just close ones
    assert scalable.logger.seen["train/n_grad_steps"] == 2 * 2 * (N_STEPS // 64)


@pytest.mark.parametrize("algo", ["ppo", "maskable", "recurrent"])
def test_logged_training_values_equal_the_base_class_with_several_envs(algo: str) -> None:
    """Every ``train/`` value at every update equals the base class's, with its type, with 2 envs, where the rollout's
    order matters: ``explained_variance`` is computed on the buffer in SB3's env-major order (``get()`` flattens it
    so); the means are SB3's ``np.mean`` calls (``approx_kl`` in float32; values over many minibatches:
    tests/test_updates.py::test_logged_means_are_sb3s_numpy_means)."""
    from sb3_contrib import MaskablePPO, RecurrentPPO
    from sb3_contrib.common.envs import InvalidActionEnvDiscrete
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_ppo_scale import ScalableMaskablePPO, ScalablePPO, ScalableRecurrentPPO
    from tests.helpers import HistoryLogger

    base, ours, policy, make = {
        "ppo": (PPO, ScalablePPO, "MlpPolicy", lambda: make_vec_env("Pendulum-v1", n_envs=2, seed=0)),
        "maskable": (MaskablePPO, ScalableMaskablePPO, "MlpPolicy",
                     lambda: make_vec_env(InvalidActionEnvDiscrete, n_envs=2, seed=0,
                                          env_kwargs=dict(dim=10, n_invalid_actions=4))),
        "recurrent": (RecurrentPPO, ScalableRecurrentPPO, "MlpLstmPolicy",
                      lambda: make_vec_env("CartPole-v1", n_envs=2, seed=0)),
    }[algo]
    history = []
    for cls in (base, ours):
        model = cls(policy, make(), n_steps=32, batch_size=32, n_epochs=2, seed=0, device="cpu")
        model.set_logger(HistoryLogger())
        model.learn(128)
        history.append(model.logger.history)
    reference = {key: values for key, values in history[0].items() if key.startswith("train/")}
    assert "train/explained_variance" in reference
    for key, values in reference.items():
        assert history[1][key] == values, key
        assert [type(v) for v in history[1][key]] == [type(v) for v in values], key  # the CSV writes what it gets


def test_early_stopping_messages_equal_ppos(capsys: pytest.CaptureFixture[str]) -> None:
    """With verbose=1 each early stop prints PPO's line: the epoch it stopped in and the KL."""
    from stable_baselines3 import PPO

    from sb3_ppo_scale import ScalablePPO

    printed = []
    for cls in (PPO, ScalablePPO):
        model = cls("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=8, target_kl=0.003,
                    learning_rate=3e-3, seed=0, device="cpu", verbose=1)
        capsys.readouterr()
        model.learn(6 * 64)
        printed.append([line for line in capsys.readouterr().out.splitlines() if line.startswith("Early stopping")])
    assert len(printed[0]) >= 2 and len({line.split(" due")[0] for line in printed[0]}) >= 2  # several epochs
    assert printed[1] == printed[0]


def _table_without_timing(text: str) -> str:
    """A logger's stdout tables without the rows that differ from run to run (wall-clock time) or exist only in
    ScalablePPO's (``n_grad_steps``); the tables' widths follow from the rows kept."""
    import re

    rows = [line for line in text.splitlines() if not re.match(r"\|\s+(fps|time_elapsed|n_grad_steps)\s", line)]
    return "\n".join(line for line in rows if not line.startswith("---"))


@pytest.mark.parametrize("algo", ["ppo", "maskable", "recurrent"])
def test_logged_values_have_the_base_class_types_bits_and_print(algo: str) -> None:
    """Every ``train/`` value has the base class's type and bits, not just an equal value (NumPy compares a
    ``np.float32`` with a float in float32): ``approx_kl`` is ``np.mean`` of the last epoch's float32 KLs, summed in
    float32 (a float64 mean of them differs from it in the last float32 bit over many minibatches), the loss means
    are ``np.float64``. The stdout table (``verbose=1``, the ``log`` format) prints a ``np.float32`` in full and a
    float with ``%.3g``, so it reads the same only then; CSV likewise."""
    import io

    from sb3_contrib import MaskablePPO, RecurrentPPO
    from sb3_contrib.common.envs import InvalidActionEnvDiscrete
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import HumanOutputFormat

    from sb3_ppo_scale import ScalableMaskablePPO, ScalablePPO, ScalableRecurrentPPO
    from tests.helpers import HistoryLogger

    base, ours, policy, make = {
        "ppo": (PPO, ScalablePPO, "MlpPolicy", lambda: make_vec_env("CartPole-v1", n_envs=1, seed=0)),
        "maskable": (MaskablePPO, ScalableMaskablePPO, "MlpPolicy",
                     lambda: make_vec_env(InvalidActionEnvDiscrete, n_envs=1, seed=0,
                                          env_kwargs=dict(dim=10, n_invalid_actions=4))),
        "recurrent": (RecurrentPPO, ScalableRecurrentPPO, "MlpLstmPolicy",
                      lambda: make_vec_env("CartPole-v1", n_envs=1, seed=0)),
    }[algo]
    logged, printed = [], []
    for cls in (base, ours):
        # ppo: 64 minibatches an epoch, where approx_kl's float32 and float64 means round apart at the first update
        model = cls(policy, make(), n_steps=256, batch_size=4 if algo == "ppo" else 64, n_epochs=2, seed=0,
                    device="cpu")
        model.set_logger(HistoryLogger())
        table = io.StringIO()
        model.logger.output_formats = [HumanOutputFormat(table)]
        model.learn(3 * 256)
        logged.append({key: [(type(value), repr(value)) for value in values]
                       for key, values in model.logger.history.items() if key.startswith("train/")})
        printed.append(_table_without_timing(table.getvalue()))
    for key, values in logged[0].items():
        assert logged[1][key] == values, key
    assert printed[1] == printed[0]
