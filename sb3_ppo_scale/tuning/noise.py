"""The noise floor of a study (repeated trials of one fixed configuration, the seed spread of every trial), and the
decay repeats that check the learning-rate-decay advice against it.

- ``noise_repeats: N`` in a spec enqueues N trials of the space's centre (:func:`~sb3_ppo_scale.tuning.spec.centre_values`)
  before the sampled trials. Each carries the user attribute :data:`NOISE_ATTR` (its index 0..N-1). Their objectives
  differ only by seed, so their spread is the objective's seed variance; they are left out of importance fitting.
- ``decay_repeats: M`` (M <= N) enqueues M more trials of the centre whose learning rate decays linearly to 0
  (:data:`DECAY_ATTR`, index 0..M-1); decay repeat k trains with noise repeat k's seeds, so each pair differs by the
  schedule alone (:func:`~sb3_ppo_scale.tuning.advice.decay_line` compares them). Also left out of importance.
- A re-queued copy of a repeat (a killed or preempted worker) inherits its mark when it starts
  (:func:`inherit_repeat_mark`).
- The dummy parameter (``type: dummy`` in the space) is the other half of the noise floor; its importance is read
  in :mod:`sb3_ppo_scale.tuning.verdicts`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from sb3_ppo_scale.tuning.spec import StudySpec, centre_values
from sb3_ppo_scale.tuning.storage import DIVERGED_ATTR, RETRY_ATTR

#: User attribute of a noise-repeat trial: its index among the study's ``noise_repeats``.
NOISE_ATTR = "noise_repeat"
#: User attribute of a decay-repeat trial: its index among the study's ``decay_repeats``.
DECAY_ATTR = "decay_repeat"
#: Each repeat mark -> the spec field that says how many repeats of that kind a study plans.
REPEAT_KINDS = {NOISE_ATTR: "noise_repeats", DECAY_ATTR: "decay_repeats"}
#: Trial states in which an enqueued repeat counts as present: a FAIL one (retries exhausted) is enqueued again
#: by the next ``tune``; a PRUNED one (search mode) is not.
_LIVE_STATES = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)


def is_noise_trial(trial: FrozenTrial | optuna.Trial) -> bool:
    """Whether ``trial`` is a noise repeat (run at the fixed centre configuration)."""
    return NOISE_ATTR in trial.user_attrs


def is_decay_trial(trial: FrozenTrial | optuna.Trial) -> bool:
    """Whether ``trial`` is a decay repeat (the centre configuration with a linearly decayed learning rate)."""
    return DECAY_ATTR in trial.user_attrs


def is_repeat_trial(trial: FrozenTrial | optuna.Trial) -> bool:
    """Whether ``trial`` is a noise or a decay repeat (not a sampled trial)."""
    return any(attr in trial.user_attrs for attr in REPEAT_KINDS)


def repeat_index(trial: FrozenTrial | optuna.Trial) -> int | None:
    """The index of a noise or decay repeat (its seeds depend on it), None for a sampled trial."""
    marks = [trial.user_attrs[attr] for attr in REPEAT_KINDS if attr in trial.user_attrs]
    return int(marks[0]) if marks else None


def enqueue_repeats(study: optuna.Study, spec: StudySpec) -> dict[str, list[int]]:
    """Enqueue the noise repeats ``0 .. spec.noise_repeats - 1`` and decay repeats ``0 .. spec.decay_repeats - 1``
    that are neither waiting, running, complete nor diverged (its seeds would diverge again); returns the indices
    enqueued per mark (:data:`NOISE_ATTR`, :data:`DECAY_ATTR`; empty on a resumed study that has them all)."""
    trials = study.get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}
    present: dict[str, set[int]] = {attr: set() for attr in REPEAT_KINDS}
    for trial in trials:
        if trial.state not in _LIVE_STATES and DIVERGED_ATTR not in trial.user_attrs:  # a diverged one ran: not again
            continue
        attrs = trial.user_attrs
        if not is_repeat_trial(trial) and RETRY_ATTR in attrs:  # a waiting re-queued copy not yet marked
            attrs = by_number.get(attrs[RETRY_ATTR], trial).user_attrs
        for attr in REPEAT_KINDS:
            if attr in attrs:
                present[attr].add(int(attrs[attr]))
    params, enqueued = centre_values(spec), {}
    for attr, field_name in REPEAT_KINDS.items():
        missing = [index for index in range(getattr(spec, field_name)) if index not in present[attr]]
        for index in missing:
            study.enqueue_trial(params, user_attrs={attr: index}, skip_if_exists=False)
        if missing:
            enqueued[attr] = missing
    return enqueued


def inherit_repeat_mark(trial: optuna.Trial) -> None:
    """Mark a re-queued copy of a noise or decay repeat as that repeat (``retry_of`` names the original trial)."""
    attrs = trial.user_attrs
    if any(attr in attrs for attr in REPEAT_KINDS) or RETRY_ATTR not in attrs:
        return
    original = next((t for t in trial.study.get_trials(deepcopy=False) if t.number == attrs[RETRY_ATTR]), None)
    for attr in REPEAT_KINDS:
        if original is not None and attr in original.user_attrs:
            trial.set_user_attr(attr, original.user_attrs[attr])


@dataclass(frozen=True)
class SeedSpread:
    """Per-seed objectives of one trial: mean, sample standard deviation (ddof 1; 0 for one seed), min and max."""

    n: int
    mean: float
    std: float
    low: float
    high: float


def seed_spread(trial: FrozenTrial) -> SeedSpread:
    """The spread of ``trial``'s per-seed objectives (``seed_values``; a trial without them: its value, one seed)."""
    values = [float(v) for v in trial.user_attrs.get("seed_values") or [trial.value]]
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return SeedSpread(len(values), float(np.mean(values)), std, min(values), max(values))


@dataclass(frozen=True)
class NoiseEstimate:
    """The noise repeats of a study: how many completed, the mean and standard deviation of their trial objectives
    (each a mean over ``seeds_per_trial`` seeds), and the standard deviation of single-seed objectives pooled over
    them (NaN where undefined)."""

    n_trials: int
    mean: float
    std_trial: float
    std_seed: float


def noise_estimate(trials: list[FrozenTrial]) -> NoiseEstimate:
    """Summarise the COMPLETE noise repeats among ``trials``."""
    repeats = [t for t in trials if is_noise_trial(t) and t.state == TrialState.COMPLETE and t.value is not None]
    values = [float(t.value) for t in repeats]  # type: ignore[arg-type]
    seeds = [float(v) for t in repeats for v in (t.user_attrs.get("seed_values") or [t.value])]
    return NoiseEstimate(
        n_trials=len(repeats),
        mean=float(np.mean(values)) if values else math.nan,
        std_trial=float(np.std(values, ddof=1)) if len(values) > 1 else math.nan,
        std_seed=float(np.std(seeds, ddof=1)) if len(seeds) > 1 else math.nan,
    )


def learning_check(trials: list[FrozenTrial]) -> tuple[float, float] | None:
    """Mean evaluation return of the first and of the last evaluation over ``trials`` and their seeds
    (``eval_returns``): whether the configuration learned within the budget. None without stored curves."""
    curves = [curve for t in trials for curve in t.user_attrs.get("eval_returns") or [] if curve]
    if not curves:
        return None
    return float(np.mean([c[0] for c in curves])), float(np.mean([c[-1] for c in curves]))
