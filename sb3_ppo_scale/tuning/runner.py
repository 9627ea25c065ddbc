"""Run a study: one Optuna study per env, trials spread over worker processes, resumable, capped at ``n_trials``.

Each env's study is created or loaded (re-running the same command resumes it), orphaned trials of killed workers
are failed and re-enqueued, the spec's noise and decay repeats still missing are enqueued (they run first; see
:mod:`sb3_ppo_scale.tuning.noise`), then the trials still missing are split over ``workers`` processes. A study
plans ``n_trials`` sampled trials plus ``noise_repeats`` and ``decay_repeats``; the counts are stored on it for the
report. Every worker also
stops when the study holds ``n_trials`` finished trials (``MaxTrialsCallback``), so several ``tune`` commands on
one database overshoot by at most (all their workers - 1). One line is printed per finished trial.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import signal
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, QMCSampler, RandomSampler, TPESampler
from optuna.study import MaxTrialsCallback
from optuna.trial import FrozenTrial, TrialState

from sb3_ppo_scale import stop_signals
from sb3_ppo_scale.checkpoint import PREEMPTED_EXIT_CODE
from sb3_ppo_scale.envs.known_warnings import filter_known_warnings
from sb3_ppo_scale.experiments.algorithms import DEFAULT_ALGO
from sb3_ppo_scale.experiments.pipeline import DEFAULT_THREADS, set_threads
from sb3_ppo_scale.tuning import preemption
from sb3_ppo_scale.tuning.noise import DECAY_ATTR, NOISE_ATTR, enqueue_repeats
from sb3_ppo_scale.tuning.objective import TrialDiverged, check_trials_can_start, decode_params, make_objective
from sb3_ppo_scale.tuning.spec import StudySpec
from sb3_ppo_scale.tuning.storage import (
    DIVERGED_ATTR, WORKER_ATTR, open_storage, recover_stale_trials, requeue, worker_id,
)


class TrialSeededRandomSampler(BaseSampler):
    """Uniform random sampling whose draw depends only on (seed, trial number, parameter name).

    Unlike ``RandomSampler(seed)`` shared by several processes, workers never draw the same points, and a study's
    points do not depend on which worker ran which trial.
    """

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution) -> Any:
        digest = hashlib.sha256(f"{self._seed}/{trial.number}/{param_name}".encode()).digest()
        sampler = RandomSampler(seed=int.from_bytes(digest[:4], "little"))
        return sampler.sample_independent(study, trial, param_name, param_distribution)


def make_sampler(spec: StudySpec) -> BaseSampler:
    """The spec's sampler: ``sobol`` (scrambled, seeded), ``random`` (seeded per trial) or ``tpe`` (constant liar)."""
    name, seed = spec.sampler.get("name", "sobol"), int(spec.sampler.get("seed", 0))
    if name == "sobol":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return QMCSampler(qmc_type="sobol", scramble=True, seed=seed, independent_sampler=TrialSeededRandomSampler(seed),
                              warn_asynchronous_seeding=False, warn_independent_sampling=False)
    if name == "random":
        return TrialSeededRandomSampler(seed)
    return TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=8)


def make_pruner(spec: StudySpec) -> optuna.pruners.BasePruner:
    """``median`` (search mode) or no pruning."""
    if spec.pruner.get("name") == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
    return optuna.pruners.NopPruner()


def counted_states(spec: StudySpec) -> tuple[TrialState, ...]:
    """Trial states that count towards ``n_trials``: complete (and pruned in search mode)."""
    return (TrialState.COMPLETE, TrialState.PRUNED) if spec.mode == "search" else (TrialState.COMPLETE,)


def resolve_storage(spec: StudySpec, storage: str | None = None) -> str:
    """``--storage`` if given, else the spec's storage, else ``<output_dir>/<name>.journal`` (relative paths:
    relative to the current working directory; the default output_dir is ``tune_results/<name>``)."""
    return storage or spec.storage or str(spec.output_dir / f"{spec.name}.journal")


def study_budget(spec: StudySpec) -> dict[str, Any]:
    """What one trial costs and how it is measured (stored on the study; a resumed study must match it)."""
    return {
        "timesteps": spec.timesteps, "seeds_per_trial": spec.seeds_per_trial, "eval_freq": spec.evaluation.eval_freq,
        "n_episodes": spec.evaluation.n_episodes, "deterministic": spec.evaluation.deterministic,
        "sampler": spec.sampler.get("name"), "mode": spec.mode,
    }


def study_definition(spec: StudySpec) -> dict[str, Any]:
    """What a trial's value means beyond its budget, keyed as in the spec (stored on the study; a resumed study must
    match it): the algorithm, the fixed arguments (``base``, except ``device``: moving a study to other hardware is
    allowed), each searched range and schedule, the objective, the seeds and the sampler's and pruner's settings.
    Not in it: what may change between sessions (``n_trials``, ``noise_repeats``, ``decay_repeats``, ``storage``,
    ``output_dir``)."""
    space = {p.name: {"type": p.type, "low": p.low, "high": p.high, "log": p.log, "step": p.step,
                      "choices": list(p.choices), "schedule": p.schedule} for p in spec.space}
    definition = {"algo": spec.algo, "base": {k: v for k, v in spec.base.items() if k != "device"}, "space": space,
                  "evaluation": {"objective": spec.evaluation.objective}, "seed": spec.seed,
                  "sampler": {"seed": spec.sampler.get("seed")}, "pruner": {"name": spec.pruner.get("name")}}
    return json.loads(json.dumps(definition, default=str))  # as the storage returns it (lists, not tuples)


def definition_changes(stored: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    """``"key: stored -> asked"`` for every dotted spec key (``base.gamma``) whose value differs; ``unset`` for a
    missing key."""
    flat_stored, flat_asked = _flatten(stored), _flatten(asked)
    missing = object()
    changes = []
    for key in sorted(flat_stored.keys() | flat_asked.keys()):
        old, new = flat_stored.get(key, missing), flat_asked.get(key, missing)
        if old != new:
            changes.append(f"{key}: {'unset' if old is missing else repr(old)} -> {'unset' if new is missing else repr(new)}")
    return changes


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


#: Study user attribute: :func:`study_definition` of the spec that ran the study.
DEFINITION_ATTR = "definition"
#: Study user attributes naming the plan: sampled trials asked for, noise and decay repeats, dummy parameters.
PLANNED_ATTR, NOISE_REPEATS_ATTR, DECAY_REPEATS_ATTR = "planned_trials", "noise_repeats", "decay_repeats"
DUMMIES_ATTR = "dummies"
#: Study user attribute: the schedule (constant / linear) of each searched float argument.
SCHEDULES_ATTR = "schedules"


def open_study(spec: StudySpec, env_id: str, storage: str, planned: int | None = None) -> optuna.Study:
    """Create or load the env's study (maximize) with the spec's sampler and pruner; record the plan (``planned``
    sampled trials, default the spec's ``n_trials``; its noise repeats and dummy parameters) on it.

    A study that already holds trials measured with another budget (e.g. an earlier ``--n-timesteps``), over other
    parameters (e.g. a dummy added later) or with another :func:`study_definition` (e.g. ``--set base.gamma=0.9``,
    another range or objective) is not resumed: ValueError naming the differences. A study written before the
    definition was stored gets it now, unchecked.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=open_storage(storage), study_name=spec.study_name(env_id), direction="maximize",
        sampler=make_sampler(spec), pruner=make_pruner(spec), load_if_exists=True,
    )
    budget, stored = study_budget(spec), study.user_attrs.get("budget")
    has_trials = bool(study.get_trials(deepcopy=False))
    if stored and stored != budget and has_trials:
        changed = {k: (stored.get(k), v) for k, v in budget.items() if stored.get(k) != v}
        raise ValueError(f"study {study.study_name!r} in {storage} was run with another budget (stored, asked: "
                         f"{changed}); use another --storage to start a new study")
    space, stored_space = {p.optuna_name: p.name for p in spec.space}, study.user_attrs.get("space")
    if stored_space and stored_space != space and has_trials:
        raise ValueError(f"study {study.study_name!r} in {storage} searched other parameters (stored: "
                         f"{sorted(stored_space)}, asked: {sorted(space)}); use another --storage to start a new study")
    definition, stored_definition = study_definition(spec), study.user_attrs.get(DEFINITION_ATTR)
    if stored_definition:  # one stored before spec.algo existed trained ScalablePPO
        stored_definition = {"algo": DEFAULT_ALGO, **stored_definition}
    changes = definition_changes(stored_definition, definition) if stored_definition and has_trials else []
    if changes:
        raise ValueError(f"study {study.study_name!r} in {storage} was run with another spec ({'; '.join(changes)}); "
                         "resume it with the spec it was run with, or use another --storage to start a new study")
    study.set_user_attr("env_id", env_id)
    study.set_user_attr("objective", spec.evaluation.objective)
    study.set_user_attr("space", space)
    study.set_user_attr("budget", budget)
    study.set_user_attr(DEFINITION_ATTR, definition)
    study.set_user_attr(PLANNED_ATTR, spec.n_trials if planned is None else planned)
    study.set_user_attr(NOISE_REPEATS_ATTR, spec.noise_repeats)
    study.set_user_attr(DECAY_REPEATS_ATTR, spec.decay_repeats)
    study.set_user_attr(DUMMIES_ATTR, [p.optuna_name for p in spec.dummies])
    study.set_user_attr(SCHEDULES_ATTR, {p.optuna_name: p.schedule for p in spec.trained_space if p.type == "float"})
    return study


def format_trial(study_name: str, trial: FrozenTrial, spec: StudySpec) -> str:
    """One progress line: study, trial number, state, value, elapsed seconds, decoded params."""
    value = "-" if trial.value is None else f"{trial.value:.2f}"
    elapsed = trial.duration.total_seconds() if trial.duration is not None else float("nan")
    try:
        params = decode_params(spec, trial.params)
    except KeyError:
        params = trial.params
    shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
    if NOISE_ATTR in trial.user_attrs:
        shown = f"(noise repeat {trial.user_attrs[NOISE_ATTR]}) {shown}"
    if DECAY_ATTR in trial.user_attrs:
        shown = f"(decay repeat {trial.user_attrs[DECAY_ATTR]}: learning rate decayed linearly) {shown}"
    if DIVERGED_ATTR in trial.user_attrs:
        shown = f"{shown} (diverged, {trial.user_attrs[DIVERGED_ATTR]}; left out of importance)"
    return f"[{study_name}] trial {trial.number:4d} {trial.state.name:8s} value={value:>9s} elapsed={elapsed:6.1f}s {shown}"


def _progress(spec: StudySpec) -> Callable[[optuna.Study, FrozenTrial], None]:
    def callback(study: optuna.Study, trial: FrozenTrial) -> None:
        print(format_trial(study.study_name, trial, spec), flush=True)

    return callback


def run_worker(spec: StudySpec, env_id: str, storage: str, n_trials: int, total: int,
               threads: int = DEFAULT_THREADS) -> None:
    """One worker: run up to ``n_trials`` trials with ``threads`` torch threads, stop early once the study holds
    ``total`` counted trials. SIGTERM/SIGINT fail the running trial, re-queue it and exit with code 75
    (:mod:`sb3_ppo_scale.tuning.preemption`). MuJoCo's known deprecation messages are dropped here as in the CLI
    (:func:`~sb3_ppo_scale.envs.known_warnings.filter_known_warnings`): a spawned worker does not inherit the handler."""
    filter_known_warnings()
    set_threads(threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=spec.study_name(env_id), storage=open_storage(storage),
                              sampler=make_sampler(spec), pruner=make_pruner(spec))
    objective = make_objective(spec, env_id)

    def owned_objective(trial: optuna.Trial) -> float:
        trial.set_user_attr(WORKER_ATTR, worker_id())
        try:
            return objective(trial)
        except stop_signals.StopSignalled as stopped:
            trial.set_user_attr(preemption.PREEMPTED_ATTR, stopped.signal_name)
            raise  # Optuna records the trial as FAIL

    stop = MaxTrialsCallback(total, states=counted_states(spec))
    optuna_logger, quiet = logging.getLogger(preemption.OPTUNA_TRIAL_LOGGER), QuietDiverged()
    optuna_logger.addFilter(quiet)  # the progress line says why, without Optuna's traceback
    with preemption.handling():
        try:
            study.optimize(owned_objective, n_trials=n_trials, callbacks=[stop, _progress(spec), preemption.between_trials],
                           catch=(TrialDiverged,))
        except stop_signals.StopSignalled as stopped:
            _requeue_preempted(study, stopped.signal_name)
        finally:
            optuna_logger.removeFilter(quiet)


class QuietDiverged(logging.Filter):
    """Drops Optuna's two warnings that a diverged trial failed (the first with the traceback of
    :class:`~sb3_ppo_scale.tuning.objective.TrialDiverged`, then "Trial N failed with value None."): the worker's
    progress line says why it failed."""

    def __init__(self) -> None:
        super().__init__()
        self.diverged: set[str] = set()  # "Trial N" of each diverged trial

    def filter(self, record: logging.LogRecord) -> bool:
        trial = " ".join(record.getMessage().split()[:2])
        if record.exc_info and isinstance(record.exc_info[1], TrialDiverged):
            self.diverged.add(trial)
            return False
        return trial not in self.diverged


def _requeue_preempted(study: optuna.Study, signal_name: str) -> NoReturn:
    """Re-queue this worker's trial that a signal stopped, say so, and exit with PREEMPTED_EXIT_CODE."""
    mine = [t for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
            if t.user_attrs.get(WORKER_ATTR) == worker_id() and preemption.PREEMPTED_ATTR in t.user_attrs]
    requeued = [t.number for t in mine if requeue(study, t)]
    print(f"[{study.study_name}] stopped by {signal_name}: trial(s) {[t.number for t in mine]} failed, re-queued "
          f"{requeued}; run the same command again to continue (exit code {PREEMPTED_EXIT_CODE})",
          file=sys.stderr, flush=True)
    raise SystemExit(PREEMPTED_EXIT_CODE)


def split(n: int, workers: int) -> list[int]:
    """``n`` trials over ``workers`` processes as evenly as possible (zeros dropped)."""
    return [q for q in (n // workers + (i < n % workers) for i in range(workers)) if q > 0]


def tune(spec: StudySpec, n_trials: int | None = None, workers: int = 1, storage: str | None = None,
         threads: int = DEFAULT_THREADS) -> int:
    """Run (or resume) the spec's studies; returns 0 when every study holds ``n_trials`` counted sampled trials plus
    its ``noise_repeats`` and ``decay_repeats``, else 1.

    :param threads: torch threads per worker process (default :data:`DEFAULT_THREADS`).
    """
    set_threads(threads)  # validates it before any study is opened
    if workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    total = spec.n_trials if n_trials is None else n_trials
    if total < 1:
        raise ValueError(f"n_trials must be an int >= 1, got {total!r}")
    for env_id in spec.envs:  # before the storage is touched: a mistake leaves no study behind
        check_trials_can_start(spec, env_id)
    url = resolve_storage(spec, storage)
    studies = {env_id: open_study(spec, env_id, url, total) for env_id in spec.envs}  # storage errors before trials
    status = 0
    for env_id, study in studies.items():
        status |= _tune_env(spec, env_id, study, url, total + spec.noise_repeats + spec.decay_repeats, workers, threads)
    return status


def _tune_env(spec: StudySpec, env_id: str, study: optuna.Study, url: str, total: int, workers: int,
              threads: int) -> int:
    failed = recover_stale_trials(study)
    if failed:
        print(f"[{study.study_name}] failed stale trials {failed} of dead workers; their parameters are re-queued", flush=True)
    enqueued = enqueue_repeats(study, spec)
    if NOISE_ATTR in enqueued:
        print(f"[{study.study_name}] enqueued noise repeats {enqueued[NOISE_ATTR]} (the centre configuration, run first)",
              flush=True)
    if DECAY_ATTR in enqueued:
        print(f"[{study.study_name}] enqueued decay repeats {enqueued[DECAY_ATTR]} (the centre configuration with its "
              "learning rate decayed linearly, run first)", flush=True)
    done = len(study.get_trials(deepcopy=False, states=counted_states(spec)))
    quotas = split(max(0, total - done), workers)
    print(f"[{study.study_name}] {done}/{total} trials done; running {sum(quotas)} on {len(quotas)} worker(s); storage {url}", flush=True)
    started = time.monotonic()
    if len(quotas) == 1:
        run_worker(spec, env_id, url, quotas[0], total, threads)
    elif quotas:
        context = multiprocessing.get_context("spawn")
        processes = [context.Process(target=run_worker, args=(spec, env_id, url, q, total, threads), daemon=False) for q in quotas]
        for process in processes:
            process.start()
        with preemption.handling(forward_to=lambda: [p.pid for p in processes if p.pid is not None]):
            for process in processes:
                process.join()
        if stop_signals.received() is not None:
            print(f"[{study.study_name}] worker(s) stopped by {signal.Signals(stop_signals.received()).name}; run the "
                  f"same command again to continue (exit code {PREEMPTED_EXIT_CODE})", file=sys.stderr, flush=True)
            raise SystemExit(PREEMPTED_EXIT_CODE)
        bad = [p.exitcode for p in processes if p.exitcode != 0]
        if bad:
            print(f"[{study.study_name}] {len(bad)} worker(s) exited with codes {bad}", file=sys.stderr, flush=True)
    done = len(study.get_trials(deepcopy=False, states=counted_states(spec)))
    print(f"[{study.study_name}] {done}/{total} trials done after {time.monotonic() - started:.0f}s"
          f"{_diverged_note(study, done < total)}", flush=True)
    return 0 if done >= total else 1


def _diverged_note(study: optuna.Study, short: bool) -> str:
    """``"; N diverged ..."`` for the study's diverged trials (empty without any); ``short``: the plan is not met."""
    diverged = sum(DIVERGED_ATTR in t.user_attrs for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))
    if not diverged:
        return ""
    return f"; {diverged} diverged (failed, not counted{': run the same command again for the rest' if short else ''})"
