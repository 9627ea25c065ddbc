"""``report``: importance of every searched parameter per study, beside the documented table, as markdown and PNG.

Kept as one module (just over 600 lines): it lays out one report file; the measurements it prints live in
:mod:`~sb3_ppo_scale.tuning.importance`, :mod:`~sb3_ppo_scale.tuning.noise` and :mod:`~sb3_ppo_scale.tuning.advice`.

Writes ``report.md`` (verdict table, the documented advice where measurable, per-study details with the noise
floor, bootstrap stability and seed spread), ``importance.json``, ``importance.png``, ``slices_<label>.png`` (with
seed error bars) and ``trials_<label>.csv`` (label: the env id, plus the study name where two studies share an env)
into the output folder (default ``tune_results/reports/<source name>`` under the working directory; files committed to
git are only replaced with ``overwrite=True``), and prints the side-by-side table. A fixed study gives
byte-identical files. Verdicts of a study too small to support them are flagged (:func:`too_small`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import subprocess
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from sb3_ppo_scale.experiments.algorithms import DEFAULT_ALGO, algorithm
from sb3_ppo_scale.tuning.importance import (
    EVALUATOR_TITLES, EVALUATORS, STARS_RULE, TOP_FRACTION, Stability, bootstrap, complete_trials, importances,
    split_half_agreement, stars, top_range,
)
from sb3_ppo_scale.tuning.advice import DOCUMENTED, advice_lines, documented_row
from sb3_ppo_scale.tuning.noise import NoiseEstimate, is_decay_trial, is_noise_trial, learning_check, noise_estimate, seed_spread
from sb3_ppo_scale.tuning.plots import importance_chart, slice_plot
from sb3_ppo_scale.tuning.runner import (
    DECAY_REPEATS_ATTR, DEFINITION_ATTR, DUMMIES_ATTR, NOISE_REPEATS_ATTR, PLANNED_ATTR, SCHEDULES_ATTR,
    resolve_storage,
)
from sb3_ppo_scale.tuning.spec import load_spec
from sb3_ppo_scale.tuning.storage import DIVERGED_ATTR, open_storage
from sb3_ppo_scale.tuning.verdicts import (
    MIN_SPLIT_HALF, NOT_DISTINGUISHABLE, STAR_STABILITY, VERDICT_RULE, Rating, rate, split_half_note, verdict,
)

#: Fewest COMPLETE trials a study needs for a report (PED-ANOVA wants several trials in its top 10%).
MIN_TRIALS = 4
#: A study's verdicts are flagged as unreliable below this many COMPLETE trials ...
MIN_VERDICT_TRIALS = 32
#: ... or when its most important parameter stays on top in fewer than this share of the bootstrap resamples
#: (under either evaluator; only checked when bootstrapping is on).
MIN_TOP_STABILITY = 0.5
SMALL_STUDY_RULE = (f"a study's verdicts are flagged 'small study' when it has fewer than {MIN_VERDICT_TRIALS} "
                    f"complete trials, or when its most important parameter stays on top in fewer than "
                    f"{MIN_TOP_STABILITY:.0%} of the bootstrap resamples (either evaluator)")
#: Where reports go unless ``--out`` says otherwise (relative to the working directory).
DEFAULT_REPORTS_DIR = Path("tune_results") / "reports"


@dataclass
class StudyResult:
    """Everything the report says about one study. ``trials``: the sampled COMPLETE trials (importance is fitted
    on them); ``noise_trials`` / ``decay_trials``: the COMPLETE noise / decay repeats; ``ratings[evaluator][param]``: the stars a real
    parameter keeps (:func:`~sb3_ppo_scale.tuning.verdicts.rate`)."""

    name: str
    label: str
    objective: str
    n_trials: int
    params: list[str]  # Optuna names, in spec order (dummies included)
    arguments: dict[str, str]  # Optuna name -> argument of the algorithm (a dummy: its own name)
    importance: dict[str, dict[str, float]]  # evaluator -> param -> importance
    stars: dict[str, dict[str, int]]  # evaluator -> real param -> stars by the rule on all trials
    stability: dict[str, Stability]
    split_half: dict[str, float | None]
    top: dict[str, tuple[float, float]]
    best_value: float
    trials: list[optuna.trial.FrozenTrial]
    budget: dict[str, Any]
    dummies: list[str] = field(default_factory=list)
    ratings: dict[str, dict[str, Rating]] = field(default_factory=dict)
    noise_trials: list[optuna.trial.FrozenTrial] = field(default_factory=list)
    noise: NoiseEstimate = NoiseEstimate(0, math.nan, math.nan, math.nan)
    planned: int | None = None  # sampled trials planned (None: not recorded)
    noise_planned: int = 0
    decay_trials: list[optuna.trial.FrozenTrial] = field(default_factory=list)
    decay_planned: int = 0
    schedules: dict[str, str] | None = None
    env_id: str = ""
    algo: str = DEFAULT_ALGO  # the study definition's spec.algo
    diverged: list[optuna.trial.FrozenTrial] = field(default_factory=list)  # FAIL: training diverged

    @property
    def real_params(self) -> list[str]:
        """The searched arguments (Optuna names), dummies left out."""
        return [p for p in self.params if p not in self.dummies]

    @property
    def unfinished(self) -> str | None:
        """``'<done>/<planned> trials, <done>/<planned> noise repeats'`` (and decay repeats where planned) when the
        study is short of its plan."""
        short = ((self.planned is not None and self.n_trials < self.planned) or len(self.noise_trials) < self.noise_planned
                 or len(self.decay_trials) < self.decay_planned)
        if not short:
            return None
        decay = f", {len(self.decay_trials)}/{self.decay_planned} decay repeats" if self.decay_planned else ""
        return f"{self.n_trials}/{self.planned} trials, {len(self.noise_trials)}/{self.noise_planned} noise repeats{decay}"


def report_command(source: str | list[str], out: str | Path | None = None, storage: str | None = None,
                   studies: list[str] | None = None, n_bootstrap: int = 200, overwrite: bool = False) -> int:
    """Resolve ``source`` (a spec file or a storage, or a list of them: one report over all their studies, e.g. the
    HalfCheetah and Hopper studies kept in two journals) into studies, analyse them, write the report to ``out``
    (default :func:`default_out`) and print the verdict table.

    :param storage: with spec sources, read this storage instead of the specs'.
    :param studies: only these study names (each must exist in some source).
    :param overwrite: replace report files in ``out`` that are committed to git (otherwise ValueError).
    """
    if n_bootstrap < 0:
        raise ValueError(f"bootstrap must be an int >= 0, got {n_bootstrap!r}")
    sources = [source] if isinstance(source, str) else list(source)
    if not sources:
        raise ValueError("report needs at least one SPEC_OR_STUDY")
    not_specs = [s for s in sources if not s.endswith((".yaml", ".yml"))]
    if storage is not None and not_specs:
        raise ValueError(f"--storage replaces a spec's storage, so it needs spec sources (.yaml); got the storage(s) "
                         f"{not_specs}: name the storage to read as SPEC_OR_STUDY instead")
    out = default_out(sources) if out is None else Path(out)
    located = [_resolve_source(s, storage) for s in sources]
    located = _select(located, studies)
    if not overwrite:
        refuse_committed(out)
    results = unique_labels([analyse(optuna.load_study(study_name=name, storage=open_storage(url)), n_bootstrap)
                             for url, names in located for name in names])
    write_report(out, results, n_bootstrap)
    print("\n".join(terminal_table(results)))
    print(f"report for {len(results)} stud{'y' if len(results) == 1 else 'ies'} written to {out}/report.md")
    return 0


def _last_trial_date(results: list[StudyResult]) -> str:
    """The day the newest complete trial of the reported studies finished (a fixed study gives the same day)."""
    finished = [t.datetime_complete for r in results for t in [*r.trials, *r.noise_trials, *r.decay_trials]
                if t.datetime_complete is not None]
    return max(finished).strftime("%Y-%m-%d") if finished else "no complete trial"


def default_out(sources: str | list[str]) -> Path:
    """``tune_results/reports/<name>``: the spec's or journal's file name without suffix (``rdb`` for a URL); several
    sources: their names joined by ``+``."""
    sources = [sources] if isinstance(sources, str) else sources
    return DEFAULT_REPORTS_DIR / "+".join("rdb" if "://" in s else Path(s).stem for s in sources)


#: The files a report writes (``slices_*.png`` and ``trials_*.csv`` besides); a committed copy is not replaced by
#: default.
REPORT_FILES = ("report.md", "importance.json", "importance.png")


def refuse_committed(out: Path) -> None:
    """ValueError if ``out`` holds report files committed to git (checked with ``git ls-files``; no git: no check)."""
    if not out.is_dir():
        return
    try:
        listed = subprocess.run(["git", "-C", str(out), "ls-files", "--", "."], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.SubprocessError):
        return
    tracked = sorted(name for name in listed.stdout.split()
                     if name in REPORT_FILES or name.startswith(("slices_", "trials_")))
    if listed.returncode == 0 and tracked:
        raise ValueError(f"--out {out} holds committed results ({', '.join(tracked)}); choose another --out, or pass "
                         "--overwrite to regenerate them")


def unique_labels(results: list[StudyResult]) -> list[StudyResult]:
    """Label each study by its env id, adding the study's name where two studies share an env (their columns, bars
    and slice plots must not collide)."""
    counts = Counter(r.label for r in results)
    return [r if counts[r.label] == 1 else replace(r, label=f"{r.label} [{r.name.split(':')[0]}]") for r in results]


def _resolve_source(source: str, storage: str | None) -> tuple[str, list[str]]:
    """(storage URL, study names) of a spec file or a storage."""
    if source.endswith((".yaml", ".yml")):
        spec = load_spec(source)
        url = resolve_storage(spec, storage)
        names = [spec.study_name(env_id) for env_id in spec.envs]
        if "://" not in url and not Path(url).is_file():  # opening it would create an empty journal
            raise ValueError(f"no journal {url!r} for spec {source!r}; run `sb3-ppo-scale tune {source}` first "
                             "(from the directory its relative paths are meant for)")
    else:
        url = source
        if "://" not in url and not Path(url).is_file():
            raise ValueError(f"SPEC_OR_STUDY {source!r} is neither a .yaml spec, an existing journal file nor an RDB URL")
        names = optuna.get_all_study_names(open_storage(url))
    existing = set(optuna.get_all_study_names(open_storage(url)))
    absent = [n for n in names if n not in existing]
    if absent or not names:
        raise ValueError(f"no study {absent or ''} in storage {url!r}; run `sb3-ppo-scale tune` first")
    return url, names


def _select(located: list[tuple[str, list[str]]], studies: list[str] | None) -> list[tuple[str, list[str]]]:
    """Keep only the ``--study`` names (ValueError naming those found nowhere)."""
    if not studies:
        return located
    found = [n for _, names in located for n in names]
    missing = sorted(set(studies) - set(found))
    if missing:
        raise ValueError(f"--study {missing} not found; studies there: {found}")
    return [(url, [n for n in names if n in studies]) for url, names in located]


def analyse(study: optuna.Study, n_bootstrap: int) -> StudyResult:
    """Importances (both evaluators), stars and their ratings against the noise floor, top-decile ranges, bootstrap
    stability and the noise repeats of one study."""
    trials = complete_trials(study)
    diverged = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
                if DIVERGED_ATTR in t.user_attrs]
    if len(trials) < MIN_TRIALS:
        why = f" ({len(diverged)} more diverged: see tune's progress lines)" if diverged else ""
        raise ValueError(f"study {study.study_name!r} has {len(trials)} complete trial(s){why}; a report needs >= "
                         f"{MIN_TRIALS}")
    attrs = study.user_attrs
    arguments = dict(attrs.get("space") or {})
    params = list(arguments) or sorted({name for t in trials for name in t.params})
    arguments = {p: arguments.get(p, p) for p in params}
    noise_trials = complete_trials(study, "noise")
    env_id = str(attrs.get("env_id", study.study_name))
    result = StudyResult(
        name=study.study_name, label=env_id, objective=str(attrs.get("objective", "value")), n_trials=len(trials),
        params=params, arguments=arguments, importance={}, stars={}, stability={}, split_half={},
        top={p: top_range(trials, p) for p in params}, best_value=max(float(t.value) for t in trials),  # type: ignore[arg-type]
        trials=trials, budget=dict(attrs.get("budget") or {}), dummies=[d for d in attrs.get(DUMMIES_ATTR, []) if d in params],
        noise_trials=noise_trials, noise=noise_estimate(noise_trials), planned=attrs.get(PLANNED_ATTR),
        noise_planned=int(attrs.get(NOISE_REPEATS_ATTR, 0)), decay_trials=complete_trials(study, "decay"),
        decay_planned=int(attrs.get(DECAY_REPEATS_ATTR, 0)), schedules=attrs.get(SCHEDULES_ATTR), env_id=env_id,
        algo=str((attrs.get(DEFINITION_ATTR) or {}).get("algo", DEFAULT_ALGO)),
        diverged=diverged,
    )
    for evaluator in EVALUATORS:
        try:
            values = importances(trials, params, evaluator)
        except ValueError as error:
            raise ValueError(f"study {study.study_name!r}: cannot rank its parameters ({error})") from None
        result.importance[evaluator] = values
        result.stars[evaluator] = stars(values, result.dummies)
        result.stability[evaluator] = bootstrap(trials, params, evaluator, values, n_bootstrap, dummies=result.dummies)
        result.split_half[evaluator] = split_half_agreement(trials, result.real_params, evaluator)
        result.ratings[evaluator] = {p: rate(p, n, result.stability[evaluator], result.dummies)
                                     for p, n in result.stars[evaluator].items()}
    return result


# ------------------------------------------------------------------------------------------------ markdown
def _star_text(n: int) -> str:
    return "★" * n + "☆" * (4 - n)


def _rated_text(rating: Rating) -> str:
    """Kept stars, or '–' for none."""
    return _star_text(rating.stars) if rating.stars else "–"


def _fmt(name: str, value: float) -> str:
    if name.startswith("log2_"):
        return str(int(round(2**value)))
    if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e4):
        return f"{value:.1e}"
    return f"{value:.3g}"


def _range_text(name: str, bounds: tuple[float, float]) -> str:
    low, high = (_fmt(name, b) for b in bounds)
    return low if low == high else f"{low}-{high}"


def too_small(result: StudyResult) -> str | None:
    """Why ``result`` is too small for its verdicts (see :data:`SMALL_STUDY_RULE`), or None."""
    if result.n_trials < MIN_VERDICT_TRIALS:
        return f"{result.n_trials} complete trials < {MIN_VERDICT_TRIALS}"
    shaky = {EVALUATOR_TITLES[ev]: st.same_top for ev, st in result.stability.items()
             if st.n_resamples and st.same_top < MIN_TOP_STABILITY}
    if shaky:
        return ", ".join(f"{name} top parameter kept in {share:.0%} of resamples" for name, share in shaky.items()) + (
            f" < {MIN_TOP_STABILITY:.0%}")
    return None


def plateau(result: StudyResult) -> str | None:
    """Why the best trials have not learned the task, or None: for an env with a known plateau (the learning
    benchmark's floors, ``THRESHOLD_FLOORS``: Hopper-v5 and Ant-v5 1500, Humanoid-v5 6000, above what standing
    still earns), when the median last evaluation (mean over seeds) of the best 10% of sampled trials is below the
    floor. None for other envs or without stored curves."""
    from sb3_ppo_scale.experiments.learning_report import THRESHOLD_FLOORS

    floor = THRESHOLD_FLOORS.get(result.env_id)
    lasts = [curve[1] for t in _best(result) if (curve := learning_check([t])) is not None]
    if floor is None or not lasts or statistics.median(lasts) >= floor:
        return None
    return (f"the best {len(lasts)} trials end at a median last evaluation of {statistics.median(lasts):.0f}, below "
            f"{result.env_id}'s plateau floor {floor:g}")


def flags(result: StudyResult) -> list[str]:
    """The caveats of a study: unfinished, too small, a plateau (each with its reason)."""
    out = []
    if result.unfinished:
        out.append(f"unfinished ({result.unfinished})")
    if (reason := too_small(result)) is not None:
        out.append(f"small study ({reason})")
    if (reason := plateau(result)) is not None:
        out.append(f"plateau ({reason})")
    return out


def _param_of(result: StudyResult, argument: str) -> str | None:
    return next((p for p in result.real_params if result.arguments[p] == argument), None)


def rated_stars(results: list[StudyResult], argument: str) -> list[int] | None:
    """Kept stars of one ScalablePPO argument over every study and evaluator (0 = none); None: not searched."""
    ours = [r.ratings[ev][name].stars for r in results if (name := _param_of(r, argument)) is not None
            for ev in EVALUATORS]
    return ours if any(_param_of(r, argument) for r in results) else None


def row_verdict(results: list[StudyResult], argument: str, documented: int) -> str:
    """The verdict for one documented row over ``results`` ('not measured' where no study searched it)."""
    ours = rated_stars(results, argument)
    return "not measured" if ours is None else verdict(documented, ours)


def _interval_text(result: StudyResult, evaluator: str, param: str) -> str:
    """`` (low-high vs dummy <= x)``: the bootstrap 5-95% importance interval and the top of the dummy's (empty
    without bootstrap)."""
    st = result.stability[evaluator]
    if not st.n_resamples:
        return ""
    ceiling = max((st.high[d] for d in result.dummies), default=None)
    floor = "" if ceiling is None else f" vs dummy <= {ceiling:.2f}"
    return f" ({st.low[param]:.2f}-{st.high[param]:.2f}{floor})"


def side_by_side(results: list[StudyResult]) -> list[str]:
    """The verdict table: documented stars, range and advice; our kept stars per study (PED-ANOVA / fANOVA, each
    with its bootstrap 5-95% importance interval and the dummy's top) and top-10% range; the verdict over all
    studies."""
    header = ["parameter", "documented stars", "documented range", "documented advice"]
    for r in results:
        header += [f"{r.label}: stars kept PED-ANOVA / fANOVA (importance 5-95%)", f"{r.label}: top-10% range"]
    header += ["verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in DOCUMENTED:
        cells = [f"{row.label} (`{row.argument}`)", _star_text(row.stars), row.range, row.advice]
        for r in results:
            name = _param_of(r, row.argument)
            if name is None:
                cells += ["not searched", "-"]
                continue
            cells += [" / ".join(_rated_text(r.ratings[ev][name]) + _interval_text(r, ev, name) for ev in EVALUATORS),
                      _range_text(name, r.top[name])]
        cells.append(row_verdict(results, row.argument, row.stars))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def terminal_table(results: list[StudyResult]) -> list[str]:
    """The verdict table for a terminal: documented stars, our kept stars per study (PED-ANOVA / fANOVA), verdict;
    then one warning line per flagged study."""
    header = ["parameter", "documented"] + [r.label for r in results] + ["verdict"]
    rows = []
    for row in DOCUMENTED:
        cells = [row.argument, _star_text(row.stars)]
        for r in results:
            name = _param_of(r, row.argument)
            cells.append("not searched" if name is None else " / ".join(_rated_text(r.ratings[ev][name]) for ev in EVALUATORS))
        rows.append(cells + [row_verdict(results, row.argument, row.stars)])
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    lines.append("stars per study: PED-ANOVA / fANOVA; –: no stars (not distinguishable from noise)")
    for r in results:
        for flag in flags(r):
            lines.append(f"warning: {r.label} is flagged: {flag}" + (f"; rule: {SMALL_STUDY_RULE}" if flag.startswith("small") else ""))
    return lines


def budget_text(result: StudyResult) -> str:
    """What the study cost: trials x steps x seeds, evaluation protocol, summed trial time and wall-clock span."""
    budget = result.budget
    planned = "" if result.planned is None else f" of {result.planned} planned"
    text = (f"{result.n_trials} complete sampled trials{planned}, {len(result.noise_trials)} of {result.noise_planned} "
            f"noise repeats{_decay_count(result)}; best objective {result.best_value:.1f}.")
    if result.diverged:
        text += (f" {len(result.diverged)} trial(s) diverged (non-finite updates stopped their training) and are left "
                 f"out of importance; their parameters: trials_{_slug(result.label)}.csv.")
    if result.algo != DEFAULT_ALGO:
        text += f" Algorithm: {algorithm(result.algo).cls.__name__}."
    if budget:
        text += (f" Budget: {budget['timesteps']:,} env steps x {budget['seeds_per_trial']} seed(s) per trial, "
                 f"{budget['sampler']} sampling, evaluation of {budget['n_episodes']} "
                 f"{'deterministic ' if budget['deterministic'] else ''}episodes every {budget['eval_freq']:,} steps.")
    everything = result.trials + result.noise_trials + result.decay_trials
    durations = [t.duration.total_seconds() for t in everything if t.duration is not None]
    starts = [t.datetime_start for t in everything if t.datetime_start is not None]
    ends = [t.datetime_complete for t in everything if t.datetime_complete is not None]
    if durations and starts and ends:
        text += (f" Trial time summed: {sum(durations) / 60:.0f} min (median {sorted(durations)[len(durations) // 2]:.0f} s "
                 f"per trial); first start to last finish: {(max(ends) - min(starts)).total_seconds() / 60:.0f} min.")
    return text


def _decay_count(result: StudyResult) -> str:
    return f", {len(result.decay_trials)} of {result.decay_planned} decay repeats" if result.decay_planned else ""


def noise_text(result: StudyResult) -> str:
    """The study's noise floor in words: dummy parameters, noise repeats, seed spread of the sampled trials."""
    dummy = (", ".join(f"`{d}`" for d in result.dummies) + " (dummy, never passed to training)") if result.dummies else \
        "no dummy parameter: the importances have no noise floor and no parameter is rated"
    spreads = [seed_spread(t) for t in result.trials]
    multi = [s.std for s in spreads if s.n > 1]
    seeds = f"; median seed std within a sampled trial {statistics.median(multi):.1f}" if multi else "; one seed per trial"
    n = result.noise
    if n.n_trials:
        repeats = (f"; {n.n_trials} noise repeat(s) of the centre configuration: objective {n.mean:.1f}, std over "
                   f"repeats {_num(n.std_trial)}, single-seed std {_num(n.std_seed)}")
        curve = learning_check(result.noise_trials)
        if curve is not None:
            repeats += f"; their evaluation return went from {curve[0]:.1f} (first evaluation) to {curve[1]:.1f} (last)"
    else:
        repeats = "; no noise repeats"
    return f"Noise floor: {dummy}{repeats}{seeds}."


def _num(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.1f}"


def detail(result: StudyResult) -> list[str]:
    """Per-study numbers: importance with bootstrap 5-95% interval, stars by rule and kept, noise-floor status,
    top-10% range, documented row and verdict; split-half correlation; the best trials with their seed spread."""
    title = f"### {result.label} (`{result.name}`)" + (" - UNFINISHED" if result.unfinished else "")
    lines = [title, "", budget_text(result), "", noise_text(result), ""]
    header = ["parameter"] + [f"{EVALUATOR_TITLES[ev]} importance (5-95%)" for ev in EVALUATORS]
    header += ["stars by rule (PED / fANOVA)", "stars kept (PED / fANOVA)"] + [f"{EVALUATOR_TITLES[ev]} noise floor" for ev in EVALUATORS]
    header += ["top-10% range", "documented", "verdict"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in sorted(result.params, key=lambda n: -result.importance["ped_anova"][n]):
        lines.append("| " + " | ".join(_detail_row(result, p)) + " |")
    for ev in EVALUATORS:
        lines.append("\n" + _stability_text(result, ev))
    return lines + [""]


def _detail_row(result: StudyResult, p: str) -> list[str]:
    cells = [f"`{result.arguments[p]}`" + (" (log2)" if p.startswith("log2_") else "")]
    for ev in EVALUATORS:
        st = result.stability[ev]
        interval = f" ({st.low[p]:.2f}-{st.high[p]:.2f})" if st.n_resamples else ""
        cells.append(f"{result.importance[ev][p]:.3f}{interval}")
    if p in result.dummies:
        return cells + ["-", "-", "noise floor (dummy)", "noise floor (dummy)", _range_text(p, result.top[p]), "-", "-"]
    cells.append(" / ".join(str(result.stars[ev][p]) for ev in EVALUATORS))
    cells.append(" / ".join(_rated_text(result.ratings[ev][p]) for ev in EVALUATORS))
    cells += [result.ratings[ev][p].status for ev in EVALUATORS]
    row = documented_row(result.arguments[p])
    cells.append(_range_text(p, result.top[p]))
    if row is None:
        return cells + ["-", "-"]
    return cells + [f"{_star_text(row.stars)} {row.range}", verdict(row.stars, [result.ratings[ev][p].stars for ev in EVALUATORS])]


def _stability_text(result: StudyResult, ev: str) -> str:
    st = result.stability[ev]
    top = max(result.importance[ev], key=result.importance[ev].__getitem__)
    kept = f"; it stays on top in {st.same_top:.0%} of {st.n_resamples} bootstrap resamples" if st.n_resamples else ""
    rho = result.split_half[ev]
    halves = "; split-half rank correlation not computed" if rho is None else \
        f"; split-half rank correlation (real parameters, trials in number order) {rho:+.2f}"
    note = split_half_note(rho, result.n_trials, result.ratings[ev])
    return f"{EVALUATOR_TITLES[ev]}: most important `{result.arguments[top]}`{kept}{halves}" + (f" ({note})" if note else "") + "."


def best_trials(result: StudyResult) -> list[str]:
    """The best 10% of sampled trials with their per-seed spread and their last evaluation's return (whether the best
    policies learned the task by the end of the budget; all trials: trials_<label>.csv)."""
    best = _best(result)
    header = ["trial", "objective (seed mean)", "seed std", "seed min", "seed max", "last evaluation (seed mean)"] + [
        result.arguments[p] for p in result.real_params]
    lines = [f"Best {len(best)} sampled trials (per-seed spread; every trial: [trials_{_slug(result.label)}.csv]"
             f"(trials_{_slug(result.label)}.csv)):", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for t in best:
        spread = seed_spread(t)
        curve = learning_check([t])
        cells = [str(t.number), f"{float(t.value):.1f}", f"{spread.std:.1f}", f"{spread.low:.1f}", f"{spread.high:.1f}",  # type: ignore[arg-type]
                 "-" if curve is None else f"{curve[1]:.1f}"]
        cells += [_fmt(p, float(t.params[p])) for p in result.real_params]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _best(result: StudyResult) -> list[optuna.trial.FrozenTrial]:
    """The best ceil(10%) of the sampled trials, best first (ties: lower trial number first)."""
    n_best = max(1, math.ceil(TOP_FRACTION * result.n_trials))
    return sorted(result.trials, key=lambda t: (-float(t.value), t.number))[:n_best]  # type: ignore[arg-type]


def trials_csv(result: StudyResult) -> str:
    """Every complete trial (sampled, noise and decay repeats): value, per-seed values and spread, the last evaluation's
    return (mean over seeds; empty without stored curves), parameters; then each diverged trial (kind ``diverged``,
    its parameters only)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["trial", "kind", "objective", "seed_std", "seed_min", "seed_max", "seed_values", "last_eval_return",
                     *result.params])
    for t in sorted(result.trials + result.noise_trials + result.decay_trials, key=lambda t: t.number):
        spread = seed_spread(t)
        kind = "noise_repeat" if is_noise_trial(t) else "decay_repeat" if is_decay_trial(t) else "sampled"
        seeds = ";".join(f"{float(v):.6g}" for v in t.user_attrs.get("seed_values") or [t.value])
        curve = learning_check([t])
        writer.writerow([t.number, kind, f"{float(t.value):.6g}", f"{spread.std:.6g}", f"{spread.low:.6g}",  # type: ignore[arg-type]
                         f"{spread.high:.6g}", seeds, "" if curve is None else f"{curve[1]:.6g}",
                         *(t.params.get(p, "") for p in result.params)])
    for t in result.diverged:
        writer.writerow([t.number, "diverged", "", "", "", "", "", "", *(t.params.get(p, "") for p in result.params)])
    return buffer.getvalue()


def legend(results: list[StudyResult], n_bootstrap: int) -> list[str]:
    """How the report's numbers are made."""
    return [
        "- Importance: PED-ANOVA (global: evaluate_on_local=False; target = the top 10% of trials but at least 5, "
        "i.e. quantile max(0.1, 5/n); negated return since it minimises) and fANOVA (64 trees, seed 0); each "
        "normalised to sum to 1 over the searched parameters and the dummy. "
        + ("Noise- and decay-repeat" if any(r.decay_planned for r in results) else "Noise-repeat") + " trials are left out.",
        f"- Stars by rule: {STARS_RULE} (over the real parameters; the dummy gets none).",
        "- Noise floor: a dummy parameter sampled like the others but never passed to training. A parameter whose "
        f"bootstrap 5-95% interval ({n_bootstrap} resamples) reaches down to the dummy's is {NOT_DISTINGUISHABLE} and "
        "keeps no stars from that evaluator; so does one whose star rating holds in fewer than "
        f"{STAR_STABILITY:.0%} of the resamples. Noise repeats (the centre configuration run again) give the "
        "objective's seed variance.",
        f"- Top-10% range: min-max of the parameter over the best ceil({TOP_FRACTION:.0%} x trials) sampled trials.",
        f"- Verdict: {VERDICT_RULE}.",
        f"- Split-half: Spearman correlation of the real parameters' importances on the first and the second half of "
        f"the trials (each half of a Sobol sequence is itself space-filling); expected >= {MIN_SPLIT_HALF}, the report "
        "says why where it is not.",
        f"- Small study: {SMALL_STUDY_RULE}. Flagged here: "
        + ("; ".join(f"{r.label}: {', '.join(flags(r))}" for r in results if flags(r)) or "none") + ".",
    ]


def write_report(out: Path, results: list[StudyResult], n_bootstrap: int) -> None:
    """Write report.md, importance.json, importance.png, slices_<label>.png and trials_<label>.csv into ``out``;
    report.md names the command that rebuilds it and the day of the newest trial (the same for any source that
    holds the same studies, so a fixed study still gives byte-identical files)."""
    out.mkdir(parents=True, exist_ok=True)
    labels = {}
    for r in results:
        labels.update({p: r.arguments[p] + (" (log2)" if p.startswith("log2_") else "") for p in r.params})
    intervals = {r.label: {ev: (r.stability[ev].low, r.stability[ev].high) for ev in EVALUATORS} for r in results}
    importance_chart(out / "importance.png", {r.label: r.importance for r in results}, labels, intervals)
    for r in results:
        log_axes = {p for p in r.params if p == "learning_rate"}
        slice_plot(out / f"slices_{_slug(r.label)}.png", f"{r.label}: objective per parameter ({r.n_trials} trials)",
                   r.trials, {p: labels[p] for p in r.params}, log_axes, r.noise_trials)
        (out / f"trials_{_slug(r.label)}.csv").write_text(trials_csv(r))
    lines = ["# PPO hyperparameter sensitivity: measured beside the documented table", "",
             f"Produced by `sb3-ppo-scale report SPEC_OR_STUDY ...` over the studies below (a spec, or the storage that "
             f"holds them), from trials completed up to {_last_trial_date(results)}.", "",
             "Documented = the seed post's table (grid search claimed, no data). Ours = Optuna importance over complete "
             f"sampled trials of the studies below, objective `{results[0].objective}`.", "",
             *legend(results, n_bootstrap), "", "## Verdicts", "", *side_by_side(results), "",
             "## The documented advice, where measurable", "", *(f"- {line}" for line in advice_lines(results)), "",
             "![importance](importance.png)", "", "## Per study", ""]
    for r in results:
        lines += detail(r) + best_trials(r) + [f"![slices](slices_{_slug(r.label)}.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    (out / "importance.json").write_text(json.dumps(summary(results), indent=2, sort_keys=True) + "\n")


def summary(results: list[StudyResult]) -> dict[str, Any]:
    """importance.json: per study its progress, importances, stars (by rule and kept), noise floor and verdicts."""
    out: dict[str, Any] = {}
    for r in results:
        args = r.arguments
        out[r.name] = {
            "env": r.label, "n_trials": r.n_trials, "planned_trials": r.planned, "unfinished": r.unfinished is not None,
            "noise_repeats": {"done": len(r.noise_trials), "planned": r.noise_planned, "mean": _json(r.noise.mean),
                              "std_trial": _json(r.noise.std_trial), "std_seed": _json(r.noise.std_seed)},
            **({"decay_repeats": {"done": len(r.decay_trials), "planned": r.decay_planned}} if r.decay_planned else {}),
            "dummies": r.dummies, "best_value": r.best_value,
            "importance": {ev: {args[p]: v for p, v in r.importance[ev].items()} for ev in EVALUATORS},
            "stars": {ev: {args[p]: v for p, v in r.stars[ev].items()} for ev in EVALUATORS},
            "stars_kept": {ev: {args[p]: g.stars for p, g in r.ratings[ev].items()} for ev in EVALUATORS},
            "star_share": {ev: {args[p]: g.star_share for p, g in r.ratings[ev].items()} for ev in EVALUATORS},
            "noise_floor": {ev: {args[p]: g.above_noise for p, g in r.ratings[ev].items()} for ev in EVALUATORS},
            "interval": {ev: {args[p]: [r.stability[ev].low[p], r.stability[ev].high[p]] for p in r.params}
                         for ev in EVALUATORS if r.stability[ev].n_resamples},
            "verdict": {row.argument: row_verdict([r], row.argument, row.stars) for row in DOCUMENTED},
            "top_same_share": {ev: r.stability[ev].same_top for ev in EVALUATORS},
            "split_half_spearman": r.split_half,
        }
    if len(results) > 1:
        out["all studies"] = {"verdict": {row.argument: row_verdict(results, row.argument, row.stars) for row in DOCUMENTED}}
    return out


def _json(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


__all__ = ["report_command", "analyse", "write_report", "verdict", "too_small", "terminal_table", "MIN_TRIALS",
           "MIN_VERDICT_TRIALS", "MIN_TOP_STABILITY"]
