"""``report``: importance of every searched parameter per study, beside the documented table, as markdown and PNG.

Writes ``report.md`` (side-by-side table, per-study details with bootstrap stability), ``importance.json``,
``importance.png`` and ``slices_<label>.png`` (label: the env id, plus the study name where two studies share an env)
into the output folder (default ``tune_results/reports/<source name>`` under the working directory; files committed to
git are only replaced with ``overwrite=True``), and prints the side-by-side table. A fixed study gives
byte-identical files. Verdicts of a study too small to support them are flagged (:func:`too_small`).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from sb3_ppo_scale.tuning.documented import DOCUMENTED, documented_row
from sb3_ppo_scale.tuning.importance import (
    EVALUATOR_TITLES, EVALUATORS, STARS_RULE, TOP_FRACTION, Stability, bootstrap, complete_trials, importances,
    split_half_agreement, stars, top_range,
)
from sb3_ppo_scale.tuning.plots import importance_chart, slice_plot
from sb3_ppo_scale.tuning.runner import resolve_storage
from sb3_ppo_scale.tuning.spec import load_spec
from sb3_ppo_scale.tuning.storage import open_storage

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
    """Everything the report says about one study."""

    name: str
    label: str
    objective: str
    n_trials: int
    params: list[str]  # Optuna names, in spec order
    arguments: dict[str, str]  # Optuna name -> ScalablePPO argument
    importance: dict[str, dict[str, float]]  # evaluator -> param -> importance
    stars: dict[str, dict[str, int]]
    stability: dict[str, Stability]
    split_half: dict[str, float | None]
    top: dict[str, tuple[float, float]]
    best_value: float
    trials: list[optuna.trial.FrozenTrial]
    budget: dict[str, Any]


def report_command(source: str, out: str | Path | None = None, storage: str | None = None,
                   studies: list[str] | None = None, n_bootstrap: int = 200, overwrite: bool = False) -> int:
    """Resolve ``source`` (a spec file, or a storage) into studies, analyse them, write the report to ``out``
    (default :func:`default_out`) and print the side-by-side table.

    :param overwrite: replace report files in ``out`` that are committed to git (otherwise ValueError).
    """
    if n_bootstrap < 0:
        raise ValueError(f"bootstrap must be an int >= 0, got {n_bootstrap!r}")
    out = default_out(source) if out is None else Path(out)
    url, names = _resolve_source(source, storage, studies)
    if not overwrite:
        refuse_committed(out)
    backend = open_storage(url)
    results = unique_labels([analyse(optuna.load_study(study_name=name, storage=backend), n_bootstrap) for name in names])
    write_report(out, results, n_bootstrap)
    print("\n".join(terminal_table(results)))
    print(f"report for {len(results)} stud{'y' if len(results) == 1 else 'ies'} written to {out}/report.md")
    return 0


def default_out(source: str) -> Path:
    """``tune_results/reports/<name>``: the spec's or journal's file name without suffix (``rdb`` for a URL)."""
    return DEFAULT_REPORTS_DIR / ("rdb" if "://" in source else Path(source).stem)


#: The files a report writes (``slices_*.png`` besides); a committed copy is not replaced by default.
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
    tracked = sorted(name for name in listed.stdout.split() if name in REPORT_FILES or name.startswith("slices_"))
    if listed.returncode == 0 and tracked:
        raise ValueError(f"--out {out} holds committed results ({', '.join(tracked)}); choose another --out, or pass "
                         "--overwrite to regenerate them")


def unique_labels(results: list[StudyResult]) -> list[StudyResult]:
    """Label each study by its env id, adding the study's name where two studies share an env (their columns, bars
    and slice plots must not collide)."""
    counts = Counter(r.label for r in results)
    return [r if counts[r.label] == 1 else replace(r, label=f"{r.label} [{r.name.split(':')[0]}]") for r in results]


def _resolve_source(source: str, storage: str | None, studies: list[str] | None) -> tuple[str, list[str]]:
    if source.endswith((".yaml", ".yml")):
        spec = load_spec(source)
        url = resolve_storage(spec, storage)
        names = [spec.study_name(env_id) for env_id in spec.envs]
    else:
        url = source
        if "://" not in url and not Path(url).is_file():
            raise ValueError(f"SPEC_OR_STUDY {source!r} is neither a .yaml spec, an existing journal file nor an RDB URL")
        names = optuna.get_all_study_names(open_storage(url))
    if studies:
        missing = sorted(set(studies) - set(names))
        if missing:
            raise ValueError(f"--study {missing} not found; studies there: {names}")
        names = [n for n in names if n in studies]
    existing = set(optuna.get_all_study_names(open_storage(url)))
    absent = [n for n in names if n not in existing]
    if absent or not names:
        raise ValueError(f"no study {absent or ''} in storage {url!r}; run `sb3-ppo-scale tune` first")
    return url, names


def analyse(study: optuna.Study, n_bootstrap: int) -> StudyResult:
    """Importances (both evaluators), stars, top-decile ranges and bootstrap stability of one study."""
    trials = complete_trials(study)
    if len(trials) < MIN_TRIALS:
        raise ValueError(f"study {study.study_name!r} has {len(trials)} complete trial(s); a report needs >= {MIN_TRIALS}")
    arguments = dict(study.user_attrs.get("space") or {})
    params = list(arguments) or sorted({name for t in trials for name in t.params})
    arguments = {p: arguments.get(p, p) for p in params}
    result = StudyResult(
        name=study.study_name, label=str(study.user_attrs.get("env_id", study.study_name)),
        objective=str(study.user_attrs.get("objective", "value")), n_trials=len(trials), params=params,
        arguments=arguments, importance={}, stars={}, stability={}, split_half={}, top={p: top_range(trials, p) for p in params},
        best_value=max(float(t.value) for t in trials), trials=trials,
        budget=dict(study.user_attrs.get("budget") or {}),
    )
    for evaluator in EVALUATORS:
        try:
            values = importances(trials, params, evaluator)
        except ValueError as error:
            raise ValueError(f"study {study.study_name!r}: cannot rank its parameters ({error})") from None
        result.importance[evaluator] = values
        result.stars[evaluator] = stars(values)
        result.stability[evaluator] = bootstrap(trials, params, evaluator, values, n_bootstrap)
        result.split_half[evaluator] = split_half_agreement(trials, params, evaluator)
    return result


# ------------------------------------------------------------------------------------------------ markdown
def _star_text(n: int) -> str:
    return "★" * n + "☆" * (4 - n)


def _fmt(name: str, value: float) -> str:
    if name.startswith("log2_"):
        return str(int(round(2**value)))
    if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e4):
        return f"{value:.1e}"
    return f"{value:.3g}"


def _range_text(name: str, bounds: tuple[float, float]) -> str:
    low, high = (_fmt(name, b) for b in bounds)
    return low if low == high else f"{low}-{high}"


def verdict(documented: int, ours: list[int]) -> str:
    """Compare documented stars with ours (one entry per study and evaluator)."""
    diffs = [o - documented for o in ours]
    if all(d == 0 for d in diffs):
        return "agrees"
    if all(abs(d) <= 1 for d in diffs):
        return "agrees within 1 star"
    if all(d < 0 for d in diffs):
        return "documented overrates it"
    if all(d > 0 for d in diffs):
        return "documented underrates it"
    return "mixed"


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


def _verdict_cell(documented: int, ours: list[int], flagged: bool) -> str:
    if not ours:
        return "not measured"
    return verdict(documented, ours) + (" (small study)" if flagged else "")


def side_by_side(results: list[StudyResult]) -> list[str]:
    """The documented table's columns and ours, one row per parameter."""
    header = ["parameter", "documented range", "documented impact"]
    for r in results:
        header += [f"{r.label}: stars PED-ANOVA / fANOVA", f"{r.label}: top-10% range"]
    header += ["verdict (all studies, both evaluators)", "documented advice"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in DOCUMENTED:
        cells = [row.label + f" (`{row.argument}`)", row.range, _star_text(row.stars)]
        ours, flagged = _row_stars(results, row.argument)
        for r in results:
            name = _param_of(r, row.argument)
            if name is None:
                cells += ["not searched", "-"]
                continue
            got = [r.stars[ev][name] for ev in EVALUATORS]
            cells += [" / ".join(_star_text(s) for s in got), _range_text(name, r.top[name])]
        cells += [_verdict_cell(row.stars, ours, flagged), row.advice]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _param_of(result: StudyResult, argument: str) -> str | None:
    return next((p for p in result.params if result.arguments[p] == argument), None)


def _row_stars(results: list[StudyResult], argument: str) -> tuple[list[int], bool]:
    """Our stars for one ScalablePPO argument (every study and evaluator) and whether a small study gave some."""
    ours, flagged = [], False
    for r in results:
        name = _param_of(r, argument)
        if name is not None:
            ours += [r.stars[ev][name] for ev in EVALUATORS]
            flagged = flagged or too_small(r) is not None
    return ours, flagged


def terminal_table(results: list[StudyResult]) -> list[str]:
    """The side-by-side table for a terminal: documented stars, ours per study (PED-ANOVA / fANOVA), verdict."""
    header = ["parameter", "documented"] + [r.label for r in results] + ["verdict"]
    rows = []
    for row in DOCUMENTED:
        ours, flagged = _row_stars(results, row.argument)
        cells = [row.argument, _star_text(row.stars)]
        for r in results:
            name = _param_of(r, row.argument)
            cells.append("not searched" if name is None else " / ".join(_star_text(r.stars[ev][name]) for ev in EVALUATORS))
        rows.append(cells + [_verdict_cell(row.stars, ours, flagged)])
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    lines.append("stars per study: PED-ANOVA / fANOVA")
    for r in results:
        reason = too_small(r)
        if reason:
            lines.append(f"warning: {r.label} is too small for its verdicts ({reason}); rule: {SMALL_STUDY_RULE}")
    return lines


def budget_text(result: StudyResult) -> str:
    """What the study cost: trials x steps x seeds, evaluation protocol, summed trial time and wall-clock span."""
    budget = result.budget
    text = f"{result.n_trials} complete trials; best objective {result.best_value:.1f}."
    if budget:
        text += (f" Budget: {budget['timesteps']:,} env steps x {budget['seeds_per_trial']} seed(s) per trial, "
                 f"{budget['sampler']} sampling, evaluation of {budget['n_episodes']} "
                 f"{'deterministic ' if budget['deterministic'] else ''}episodes every {budget['eval_freq']:,} steps.")
    durations = [t.duration.total_seconds() for t in result.trials if t.duration is not None]
    starts = [t.datetime_start for t in result.trials if t.datetime_start is not None]
    ends = [t.datetime_complete for t in result.trials if t.datetime_complete is not None]
    if durations and starts and ends:
        text += (f" Trial time summed: {sum(durations) / 60:.0f} min (median {sorted(durations)[len(durations) // 2]:.0f} s "
                 f"per trial); first start to last finish: {(max(ends) - min(starts)).total_seconds() / 60:.0f} min.")
    return text


def detail(result: StudyResult) -> list[str]:
    """Per-study numbers: importance with its bootstrap 5-95% interval, how often the rank held, stars, top range."""
    lines = [f"### {result.label} (`{result.name}`)", "", budget_text(result), ""]
    header = ["parameter"] + [f"{EVALUATOR_TITLES[ev]} importance (5-95%)" for ev in EVALUATORS]
    header += [f"{EVALUATOR_TITLES[ev]} rank kept" for ev in EVALUATORS] + ["stars (PED / fANOVA)", "top-10% range"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in sorted(result.params, key=lambda n: -result.importance["ped_anova"][n]):
        cells = [f"`{result.arguments[p]}`" + (" (log2)" if p.startswith("log2_") else "")]
        for ev in EVALUATORS:
            st = result.stability[ev]
            interval = f" ({st.low[p]:.2f}-{st.high[p]:.2f})" if st.n_resamples else ""
            cells.append(f"{result.importance[ev][p]:.3f}{interval}")
        for ev in EVALUATORS:
            st = result.stability[ev]
            cells.append(f"{st.same_rank[p]:.0%}" if st.n_resamples else "-")
        cells += [" / ".join(str(result.stars[ev][p]) for ev in EVALUATORS), _range_text(p, result.top[p])]
        lines.append("| " + " | ".join(cells) + " |")
    for ev in EVALUATORS:
        st = result.stability[ev]
        top = max(result.importance[ev], key=result.importance[ev].__getitem__)
        kept = f"; it stays on top in {st.same_top:.0%} of {st.n_resamples} bootstrap resamples" if st.n_resamples else ""
        rho = result.split_half[ev]
        halves = "" if rho is None else f"; split-half rank correlation (trials in number order) {rho:+.2f}"
        lines.append(f"\n{EVALUATOR_TITLES[ev]}: most important `{result.arguments[top]}`{kept}{halves}.")
    return lines + [""]


def write_report(out: Path, results: list[StudyResult], n_bootstrap: int) -> None:
    """Write report.md, importance.json, importance.png and slices_<label>.png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    labels = {}
    for r in results:
        labels.update({p: r.arguments[p] + (" (log2)" if p.startswith("log2_") else "") for p in r.params})
    intervals = {r.label: {ev: (r.stability[ev].low, r.stability[ev].high) for ev in EVALUATORS} for r in results}
    importance_chart(out / "importance.png", {r.label: r.importance for r in results}, labels, intervals)
    for r in results:
        log_axes = {p for p in r.params if p == "learning_rate"}
        slice_plot(out / f"slices_{_slug(r.label)}.png", f"{r.label}: objective per parameter ({r.n_trials} trials)",
                   r.trials, {p: labels[p] for p in r.params}, log_axes)
    lines = ["# PPO hyperparameter sensitivity: measured beside the documented table", "",
             "Documented = the seed post's table (grid search claimed, no data). Ours = Optuna importance over complete "
             f"trials of the studies below, objective `{results[0].objective}`.", "",
             "- Importance: PED-ANOVA (global: evaluate_on_local=False; target = the top 10% of trials but at least 5, "
             "i.e. quantile max(0.1, 5/n); negated return since it minimises) and fANOVA (64 trees, seed 0); each "
             "normalised to sum to 1.",
             f"- Stars: {STARS_RULE}.",
             f"- Top-10% range: min-max of the parameter over the best ceil({TOP_FRACTION:.0%} x trials) trials.",
             f"- Stability: {n_bootstrap} bootstrap resamples of the trials (seed 0); 'rank kept' = share of resamples "
             "in which the parameter has the same importance rank as on all trials; split-half = Spearman correlation of "
             "the importances on the first and the second half of the trials (each half of a Sobol sequence is itself "
             "space-filling).",
             "- Verdict: 'agrees' = same stars in every study and evaluator; 'within 1 star'; 'overrates'/'underrates' "
             "= documented stars above/below ours everywhere; 'mixed' otherwise.",
             f"- Small study: {SMALL_STUDY_RULE}. Flagged here: "
             + ("; ".join(f"{r.label} ({reason})" for r in results if (reason := too_small(r))) or "none") + ".", "",
             "## Side by side", "", *side_by_side(results), "",
             "![importance](importance.png)", "", "## Per study", ""]
    for r in results:
        lines += detail(r) + [f"![slices](slices_{_slug(r.label)}.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    summary = {r.name: {"env": r.label, "n_trials": r.n_trials, "best_value": r.best_value,
                        "importance": {ev: {r.arguments[p]: v for p, v in r.importance[ev].items()} for ev in EVALUATORS},
                        "stars": {ev: {r.arguments[p]: v for p, v in r.stars[ev].items()} for ev in EVALUATORS},
                        "top_same_share": {ev: r.stability[ev].same_top for ev in EVALUATORS},
                        "split_half_spearman": r.split_half}
               for r in results}
    (out / "importance.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


__all__ = ["report_command", "analyse", "write_report", "verdict", "too_small", "terminal_table", "MIN_TRIALS",
           "MIN_VERDICT_TRIALS", "MIN_TOP_STABILITY"]
