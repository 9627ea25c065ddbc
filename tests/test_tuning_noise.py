"""The noise floor's pieces without training: spec keys, the centre configuration, seeds per repeat, enqueueing
repeats on a resumed study (a re-queued repeat stays a repeat), the advice checks and the committed study specs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from sb3_ppo_scale.tuning import load_spec, spec_from_dict
from sb3_ppo_scale.tuning.advice import batch_line, decay_line, epsilon_line, lambda_lines, seed_pairs, trend
from sb3_ppo_scale.tuning.noise import (
    DECAY_ATTR, NOISE_ATTR, NoiseEstimate, enqueue_repeats, inherit_repeat_mark, is_repeat_trial, repeat_index,
    seed_spread,
)
from sb3_ppo_scale.tuning.objective import decode_params, trial_config, trial_seeds
from sb3_ppo_scale.tuning.spec import centre_values
from sb3_ppo_scale.tuning.storage import requeue

ROOT = Path(__file__).resolve().parents[1]


def raw_spec(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "n", "envs": ["CartPole-v1"], "timesteps": 256, "seeds_per_trial": 3, "noise_repeats": 2,
        "evaluation": {"eval_freq": 128, "n_episodes": 1},
        "base": {"n_steps": 64, "n_envs": 2},
        "space": {"clip_range": {"type": "float", "low": 0.1, "high": 0.3},
                  "learning_rate": {"type": "float", "low": 1e-4, "high": 4e-4, "log": True},
                  "batch_size": {"type": "pow2", "low": 16, "high": 128},
                  "n_epochs": {"type": "int", "low": 3, "high": 10},
                  "dummy": {"type": "dummy"}},
    }
    raw.update(overrides)
    return raw


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"noise_repeats": -1}, r"spec.noise_repeats must be an int >= 0, got -1"),
        ({"noise_repeats": 1.5}, r"spec.noise_repeats must be an int, got 1.5"),
        ({"space": {"clip_range": {"type": "gaussian", "low": 0.1, "high": 0.3}}},
         r"spec.space.clip_range.type must be one of \('float', 'int', 'pow2', 'categorical', 'dummy'\), got 'gaussian'"),
        ({"space": {"clip_range": {"type": "dummy"}}}, r"must not be named like an argument of the algorithm \('clip_range'"),
        ({"space": {"noise": {"type": "dummy", "low": 1, "high": 1}}}, r"spec.space.noise: low must be < high"),
        ({"space": {"noise": {"type": "dummy", "log": True}}}, r"spec.space.noise: unknown key\(s\) \['log'\]"),
        ({"space": {"noise": {"type": "dummy"}}}, "besides its dummy parameter"),
        ({"decay_repeats": 3}, r"spec.decay_repeats must be an int from 0 to spec.noise_repeats \(2\): decay repeat k is "
                               r"paired with noise repeat k, got 3"),
        ({"decay_repeats": -1}, r"spec.decay_repeats must be an int >= 0, got -1"),
        ({"decay_repeats": 1, "space": {"clip_range": {"type": "float", "low": 0.1, "high": 0.3}, "dummy": {"type": "dummy"}}},
         r"spec.decay_repeats needs learning_rate in spec.space as a float with schedule constant .*got nothing"),
        ({"decay_repeats": 1, "space": {"learning_rate": {"type": "float", "low": 1e-4, "high": 4e-4, "schedule": "linear"},
                                        "dummy": {"type": "dummy"}}}, r"got type float, schedule linear"),
    ],
)
def test_bad_noise_keys_are_value_errors(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec_from_dict(raw_spec(**change))


def test_centre_seeds_and_decoding() -> None:
    spec = spec_from_dict(raw_spec())
    assert [p.name for p in spec.dummies] == ["dummy"] and "dummy" not in [p.name for p in spec.trained_space]
    centre = centre_values(spec)
    assert centre == {"clip_range": pytest.approx(0.2), "learning_rate": pytest.approx(2e-4),
                      "log2_batch_size": 5, "n_epochs": 6, "dummy": 0.5}  # log: geometric middle; pow2: exponent
    assert decode_params(spec, centre) == {"clip_range": pytest.approx(0.2), "learning_rate": pytest.approx(2e-4),
                                           "batch_size": 32, "n_epochs": 6}  # the dummy never reaches training
    assert trial_seeds(spec) == [0, 1, 2] and trial_seeds(spec, 0) == [0, 1, 2] and trial_seeds(spec, 2) == [6, 7, 8]


def test_noise_repeats_are_enqueued_once_and_a_requeued_repeat_stays_one() -> None:
    spec = spec_from_dict(raw_spec())
    study = optuna.create_study(direction="maximize")
    assert enqueue_repeats(study, spec) == {NOISE_ATTR: [0, 1]}
    assert enqueue_repeats(study, spec) == {}  # resumed: both are waiting
    first = study.ask()
    assert first.user_attrs[NOISE_ATTR] == 0 and first.params == {} and first.study is not None
    value = first.suggest_float("clip_range", 0.1, 0.3)
    assert value == pytest.approx(0.2)
    study.tell(first, state=TrialState.FAIL)  # e.g. a preempted worker
    frozen = study.get_trials()[first.number]
    assert requeue(study, frozen)  # storage's retry copies params and retry_of, not the noise mark ...
    assert enqueue_repeats(study, spec) == {}  # ... yet the waiting copy counts as repeat 0
    second = study.ask()  # repeat 1 (enqueued earlier) runs first
    assert second.user_attrs[NOISE_ATTR] == 1
    study.tell(second, 1.0)
    retry = study.ask()
    assert NOISE_ATTR not in retry.user_attrs
    inherit_repeat_mark(retry)  # what the objective does first
    assert retry.user_attrs[NOISE_ATTR] == 0
    study.tell(retry, 2.0)
    assert enqueue_repeats(study, spec) == {}
    assert spec_from_dict(raw_spec(noise_repeats=3)).noise_repeats == 3
    assert enqueue_repeats(study, spec_from_dict(raw_spec(noise_repeats=3))) == {NOISE_ATTR: [2]}  # raised later


def test_a_diverged_repeat_is_not_enqueued_again() -> None:
    """A noise repeat whose training diverged (FAIL with the diverged mark) ran to its end: its seeds would diverge
    again, so the next run does not enqueue it (it used to, once per run); a preempted one (plain FAIL) is."""
    from optuna.trial import TrialState

    from sb3_ppo_scale.tuning.storage import DIVERGED_ATTR

    spec = spec_from_dict(raw_spec())
    study = optuna.create_study(direction="maximize")
    assert enqueue_repeats(study, spec) == {NOISE_ATTR: [0, 1]}
    diverged, stopped = study.ask(), study.ask()
    diverged.set_user_attr(DIVERGED_ATTR, "seed 0: non-finite loss")
    study.tell(diverged, state=TrialState.FAIL)
    study.tell(stopped, state=TrialState.FAIL)
    assert enqueue_repeats(study, spec) == {NOISE_ATTR: [1]}


def test_decay_repeats_pair_with_noise_repeats_and_decay_the_learning_rate() -> None:
    """Decay repeats are added to a study that already has its noise repeats (a spec raised later), train with their
    noise repeat's seeds, keep their mark when re-queued, and only their learning rate becomes a linear schedule."""
    spec = spec_from_dict(raw_spec(decay_repeats=2))
    study = optuna.create_study(direction="maximize")
    assert enqueue_repeats(study, spec_from_dict(raw_spec())) == {NOISE_ATTR: [0, 1]}
    assert enqueue_repeats(study, spec) == {DECAY_ATTR: [0, 1]}
    assert enqueue_repeats(study, spec) == {}
    trials = [study.ask() for _ in range(4)]
    assert [repeat_index(t) for t in trials] == [0, 1, 0, 1]
    assert [is_repeat_trial(t) for t in trials] == [True] * 4
    assert trial_seeds(spec, repeat_index(trials[3])) == trial_seeds(spec, repeat_index(trials[1])) == [3, 4, 5]
    trials[2].suggest_float("clip_range", 0.1, 0.3)  # the centre (fixed params)
    study.tell(trials[2], state=TrialState.FAIL)
    assert requeue(study, study.get_trials()[trials[2].number])
    assert enqueue_repeats(study, spec) == {}  # the waiting copy is decay repeat 0
    retry = study.ask()
    inherit_repeat_mark(retry)
    assert retry.user_attrs[DECAY_ATTR] == 0 and NOISE_ATTR not in retry.user_attrs
    values = decode_params(spec, centre_values(spec))
    constant, decayed = trial_config(spec, "CartPole-v1", values), trial_config(spec, "CartPole-v1", values, decayed=True)
    assert constant.hyperparams["learning_rate"] == pytest.approx(2e-4)
    assert decayed.hyperparams["learning_rate"] == f"lin_{values['learning_rate']!r}"
    schedule = decayed.model_kwargs["learning_rate"]  # SB3's progress_remaining: 1 at the start, 0 at the end
    assert schedule(1.0) == values["learning_rate"] and schedule(0.5) == values["learning_rate"] / 2 and schedule(0.0) == 0
    assert {k: v for k, v in decayed.hyperparams.items() if k != "learning_rate"} == {
        k: v for k, v in constant.hyperparams.items() if k != "learning_rate"}


def _repeat(attr: str, index: int, seed_values: list[float], last: list[float]) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(
        params={"learning_rate": 2e-4}, distributions={"learning_rate": optuna.distributions.FloatDistribution(1e-4, 4e-4)},
        value=sum(seed_values) / len(seed_values),
        user_attrs={attr: index, "seeds": [3 * index + k for k in range(3)], "seed_values": seed_values,
                    "eval_returns": [[0.0, x] for x in last]})


def test_decay_advice_pairs_each_seed_with_its_noise_repeat() -> None:
    noise = [_repeat(NOISE_ATTR, k, [100.0 + k, 110.0, 120.0], [200.0, 210.0 + k, 220.0]) for k in range(3)]
    better = [_repeat(DECAY_ATTR, k, [130.0 + k, 140.0, 155.0], [200.0 + k, 209.0, 222.0]) for k in range(2)]
    pairs = seed_pairs(noise, better)
    assert len(pairs) == 6 and pairs[0] == ((100.0, 200.0), (130.0, 200.0))  # repeat 2 has no decay twin
    result = _Result("Hopper-v5", "Hopper-v5", [], NoiseEstimate(3, 110.0, 1.0, 8.0))
    result.arguments = {"learning_rate": "learning_rate"}
    result.noise_trials, result.decay_trials = noise, better
    line = decay_line(result)
    assert line.startswith('Hopper-v5: "use linear decay": the centre configuration (learning rate 0.0002)')
    assert "6 seed pairs (2 decay repeats" in line
    assert "objective 141.8 decayed vs 110.2 constant (decayed higher in 6 of 6, Wilcoxon p = 0.031): supports the advice" in line
    assert "last evaluation" in line and "no significant difference" in line
    result.decay_trials = [_repeat(DECAY_ATTR, k, [50.0, 60.0, 70.0], [100.0, 100.0, 100.0]) for k in range(2)]
    assert "contradicts the advice" in decay_line(result)
    result.decay_trials = []
    assert "not measured" in decay_line(result)


def test_seed_spread() -> None:
    trial = optuna.trial.create_trial(value=2.0, user_attrs={"seed_values": [1.0, 2.0, 3.0]})
    spread = seed_spread(trial)
    assert (spread.n, spread.mean, spread.std, spread.low, spread.high) == (3, 2.0, 1.0, 1.0, 3.0)
    single = seed_spread(optuna.trial.create_trial(value=5.0))
    assert (single.n, single.std, single.low, single.high) == (1, 0.0, 5.0, 5.0)


class _Result:
    """What the advice checks read from a report's study result."""

    def __init__(self, label: str, env_id: str, trials: list[optuna.trial.FrozenTrial], noise: NoiseEstimate) -> None:
        self.label, self.env_id, self.trials, self.noise, self.schedules = label, env_id, trials, noise, {}
        self.noise_trials: list[optuna.trial.FrozenTrial] = []
        self.decay_trials: list[optuna.trial.FrozenTrial] = []
        self.arguments = {"clip_range": "clip_range", "log2_batch_size": "batch_size", "gae_lambda": "gae_lambda"}


def _trials(objective: Any, n: int = 20) -> list[optuna.trial.FrozenTrial]:
    dists = {"clip_range": optuna.distributions.FloatDistribution(0.1, 0.3),
             "log2_batch_size": optuna.distributions.IntDistribution(6, 12),
             "gae_lambda": optuna.distributions.FloatDistribution(0.9, 0.99)}
    out = []
    for i in range(n):
        params = {"clip_range": 0.1 + 0.2 * i / n, "log2_batch_size": 6 + i % 7, "gae_lambda": 0.9 + 0.09 * ((7 * i) % n) / n}
        out.append(optuna.trial.create_trial(params=params, distributions=dists, value=objective(params)))
    return out


def test_advice_checks_measure_trends() -> None:
    smaller_clip_wins = _trials(lambda p: -p["clip_range"])
    rho, p = trend(smaller_clip_wins, "clip_range")  # type: ignore[misc]
    assert rho == pytest.approx(-1.0) and p < 0.05
    noise = NoiseEstimate(3, 100.0, 5.0, 10.0)
    result = _Result("Pendulum-v1", "Pendulum-v1", smaller_clip_wins, noise)
    assert "rho(`clip_range`, objective) = -1.00" in epsilon_line(result) and "supports the advice" in epsilon_line(result)
    assert "no significant trend" in batch_line(result)  # batch size cycles independently of the objective
    bigger_batch_wins = _Result("Pendulum-v1", "Pendulum-v1", _trials(lambda p: p["log2_batch_size"]), noise)
    assert "rho(`batch_size` (log2), objective) = +1.00" in batch_line(bigger_batch_wins)
    assert "supports the advice" in batch_line(bigger_batch_wins)
    discrete = _Result("CartPole-v1", "CartPole-v1", smaller_clip_wins, noise)
    assert "not applicable (action space discrete)" in epsilon_line(discrete)
    # lambda: the noisier env (seed CV 0.5 against 0.1) has the lower top-decile lambda -> consistent
    calm = _Result("A", "A", _trials(lambda p: p["gae_lambda"]), NoiseEstimate(3, 100.0, 5.0, 10.0))
    noisy = _Result("B", "B", _trials(lambda p: -p["gae_lambda"]), NoiseEstimate(3, 100.0, 20.0, 50.0))
    line, = lambda_lines([noisy, calm])
    assert line.index("A: seed CV 0.10") < line.index("B: seed CV 0.50") and line.endswith("consistent with the advice "
                                                                                      "(an ordering of a few envs, not a test).")
    assert "not checkable" in lambda_lines([calm])[0]
    assert not math.isnan(noise.std_seed)


@pytest.mark.parametrize("name", ["ppo-sensitivity-300k-halfcheetah.yaml", "ppo-sensitivity-300k-hopper.yaml"])
def test_real_study_specs(name: str) -> None:
    """The specs of the noise-floor studies: >= 300k steps, 3 seeds, a dummy, noise repeats, Sobol, a journal under
    tuning/results/<name>/ that later sessions append to."""
    spec = load_spec(ROOT / "tuning" / name)
    assert spec.timesteps >= 300_000 and spec.seeds_per_trial == 3 and spec.noise_repeats >= 8
    assert spec.decay_repeats == spec.noise_repeats  # every noise repeat has its decayed twin
    assert [p.type for p in spec.dummies] == ["dummy"] and spec.sampler["name"] in ("sobol", "random")
    assert spec.storage == f"tuning/results/{spec.name}/{spec.name}.journal"
    assert {p.name for p in spec.trained_space} == {"clip_range", "learning_rate", "gae_lambda", "batch_size", "n_epochs"}
    assert spec.rollout_size >= 4096 and spec.base["normalize"] is True


def test_best_trials_and_csv_show_the_last_evaluation() -> None:
    """Whether the best policies learned the task is readable in the report: the last evaluation's return (mean over
    the trial's seeds) beside each best trial, and in every row of the CSV."""
    from sb3_ppo_scale.tuning.report import best_trials, trials_csv

    dist = {"clip_range": optuna.distributions.FloatDistribution(0.1, 0.3)}
    curves = {"eval_returns": [[10.0, 2000.0], [20.0, 3000.0]], "seed_values": [1005.0, 1510.0]}
    hopping = optuna.trial.create_trial(params={"clip_range": 0.2}, distributions=dist, value=1257.5, user_attrs=curves)
    no_curve = optuna.trial.create_trial(params={"clip_range": 0.1}, distributions=dist, value=5.0)
    hopping.number, no_curve.number = 0, 1

    class Result:
        trials, noise_trials, decay_trials, diverged, n_trials = [hopping, no_curve], [], [], [], 2
        real_params = params = ["clip_range"]
        arguments, label = {"clip_range": "clip_range"}, "Hopper-v5"

    table = "\n".join(best_trials(Result()))  # type: ignore[arg-type]
    assert "| last evaluation (seed mean) |" in table and "| 0 | 1257.5 |" in table and "| 2500.0 |" in table
    rows = trials_csv(Result()).splitlines()  # type: ignore[arg-type]
    assert rows[0].split(",")[7] == "last_eval_return"
    assert rows[1].split(",")[7] == "2500" and rows[2].split(",")[7] == ""


def test_a_study_whose_best_trials_stand_still_is_flagged_plateau() -> None:
    """Hopper-v5 pays ~1000 for standing still: when the best trials end below the learning benchmark's floor (1500)
    the study is flagged, so its verdicts are not read as a study of policies that hop."""
    from sb3_ppo_scale.tuning.report import flags, plateau

    dist = {"clip_range": optuna.distributions.FloatDistribution(0.1, 0.3)}

    def study(last_returns: list[float], env_id: str = "Hopper-v5") -> Any:
        trials = []
        for number, last in enumerate(last_returns):
            trial = optuna.trial.create_trial(params={"clip_range": 0.2}, distributions=dist, value=last / 2,
                                              user_attrs={"eval_returns": [[10.0, last], [20.0, last]]})
            trial.number = number
            trials.append(trial)

        class Result:
            pass

        result = Result()
        result.trials, result.n_trials, result.env_id = trials, len(trials), env_id
        result.unfinished, result.stability = None, {}
        return result

    standing = study([1000.0 + k for k in range(20)])  # best 2 trials end at 1019 and 1018
    assert plateau(standing) == "the best 2 trials end at a median last evaluation of 1018, below Hopper-v5's plateau floor 1500"
    assert plateau(study([1000.0] * 18 + [1900.0, 2100.0])) is None  # the best trials hop
    assert plateau(study([1000.0] * 20, env_id="HalfCheetah-v5")) is None  # no known plateau floor
    assert any(flag.startswith("plateau (") for flag in flags(standing))
