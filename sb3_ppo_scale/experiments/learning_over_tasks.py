"""The learning report's aggregate over tasks (rliable, through :mod:`sb3_ppo_scale.experiments.intervals`):
final returns normalised per task (a uniformly random policy's mean return 0, :data:`REFERENCE_RETURNS` or else the
best label's mean final return 1), their IQM and mean per label run on every task, the performance profile PNG, and
the probability of improvement of each Scalable label over each label of the classes they extend (the baseline
first, then each task's strongest of those labels at once). :mod:`sb3_ppo_scale.experiments.learning_report`
builds the per-task tables and calls this module with its summary (task -> ``summarise``'s record)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sb3_ppo_scale.experiments import intervals
from sb3_ppo_scale.experiments.algorithms import BASELINES, label_order, pair_of, parsed_or_unknown, register_envs

#: the normalised score's 1 per task (an episode return): the learning-at-scale issue's targets. A task not named
#: here takes the best label's mean final return in the report instead.
REFERENCE_RETURNS = {"Hopper-v5": 3400.0, "HalfCheetah-v5": 5500.0, "Ant-v5": 5000.0, "Humanoid-v5": 5000.0}
#: episodes of the uniformly random policy whose mean return is the normalised score's 0
RANDOM_EPISODES = 10
#: the performance profile's file name inside ``--out``
PROFILE_FILE = "performance_profile.png"


def random_policy_return(task: str, episodes: int = RANDOM_EPISODES, max_steps: int = 100_000) -> float | None:
    """Mean return of a uniformly random policy over ``episodes`` episodes (env seeds 0, 1, ...; actions seeded 0;
    an episode cut at ``max_steps`` steps for an env without a time limit): the normalised score's 0. None where
    Gymnasium cannot make ``task``."""
    import gymnasium as gym

    register_envs(task)
    try:
        env = gym.make(task)
    except gym.error.Error:
        return None
    env.action_space.seed(0)
    totals = []
    for episode in range(episodes):
        env.reset(seed=episode)
        total, done, steps = 0.0, False, 0
        while not done and steps < max_steps:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total, done, steps = total + float(reward), terminated or truncated, steps + 1
        totals.append(total)
    env.close()
    return float(np.mean(totals))


@dataclass(frozen=True)
class Normalisation:
    """One task's normalised-score ends, in episode return: ``zero`` the random policy's mean return, ``one`` the
    reference return, ``source`` where the reference comes from."""

    zero: float
    one: float
    source: str


def normalisation(task: str, algos: dict[str, Any], random_return: Callable[[str], float | None]
                  ) -> Normalisation | str:
    """The task's :class:`Normalisation` (reference: :data:`REFERENCE_RETURNS`, else the best label's mean final
    return in ``algos``), or the sentence that says why it has none."""
    zero = random_return(task)
    if zero is None:
        return "Gymnasium cannot make it, so it has no random-policy score"
    if task in REFERENCE_RETURNS:
        one, source = REFERENCE_RETURNS[task], "the learning issue's target"
    else:
        best = max(algos, key=lambda a: algos[a]["final_return"]["mean"].point)
        one, source = algos[best]["final_return"]["mean"].point, f"the best label's mean final return ({best})"
    if one <= zero:
        return f"its reference return {one:.4g} is not above the random policy's {zero:.4g}"
    return Normalisation(zero, one, source)


def _final_returns(summary: dict[str, dict[str, Any]], tasks: list[str], label: str) -> np.ndarray:
    """``(seeds, tasks)`` final returns of ``label``, over the seeds it ran on every task."""
    return _final_returns_of(summary, {task: label for task in tasks})


def _final_returns_of(summary: dict[str, dict[str, Any]], label_per_task: dict[str, str]) -> np.ndarray:
    """``(seeds, tasks)`` final returns of each task's label in ``label_per_task``, over the seeds each of those
    labels ran on its task (the seeds common to all of them)."""
    by_seed = [{r["seed"]: r["final_return"] for r in summary[task]["runs"][label]}
               for task, label in label_per_task.items()]
    seeds = sorted(set.intersection(*(set(runs) for runs in by_seed))) if by_seed else []
    return np.array([[runs[seed] for runs in by_seed] for seed in seeds],
                    dtype=float).reshape(-1, len(label_per_task))


@dataclass(frozen=True)
class OverTasks:
    """The report's aggregate over tasks: per task its :class:`Normalisation` or why it has none; per label run on
    every normalised task, its ``(seeds, tasks)`` normalised final returns (seeds: those run on every task); per
    label left out, why."""

    normalisations: dict[str, Normalisation | str]
    scores: dict[str, np.ndarray]
    left_out: dict[str, str]

    @property
    def tasks(self) -> list[str]:
        """The tasks with a normalisation, in the order of the score columns."""
        return [task for task, n in self.normalisations.items() if isinstance(n, Normalisation)]


def over_tasks(summary: dict[str, dict[str, Any]],
               random_return: Callable[[str], float | None] = random_policy_return) -> OverTasks:
    """Normalised final returns of the labels run on every task that normalises (``random_return(task)``: the
    random policy's mean return, called once per task)."""
    normalisations = {task: normalisation(task, data["algos"], random_return) for task, data in summary.items()}
    ends = {task: n for task, n in normalisations.items() if isinstance(n, Normalisation)}
    tasks = list(ends)
    scores, left_out = {}, {}
    for label in report_labels(summary) if tasks else []:
        missing = [task for task in tasks if label not in summary[task]["runs"]]
        raw = None if missing else _final_returns(summary, tasks, label)
        if raw is None or raw.size == 0:
            left_out[label] = f"no runs on {', '.join(missing)}" if missing else "no seed run on every task"
            continue
        scores[label] = intervals.normalised(raw, [n.zero for n in ends.values()], [n.one for n in ends.values()])
    return OverTasks(normalisations, scores, left_out)


def report_baseline(summary: dict[str, dict[str, Any]]) -> str:
    """The report's baseline label (every task's is the same; "" without tasks)."""
    return next(iter(summary.values()))["baseline"] if summary else ""


def report_labels(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Every label of the report, in report order."""
    return sorted({label for data in summary.values() for label in data["runs"]},
                  key=lambda a: label_order(a, report_baseline(summary)))


def over_tasks_lines(over: OverTasks) -> list[str]:
    """The over-tasks section: the normalisation per task, IQM and mean of the normalised final returns per label."""
    lines = ["## Over tasks", "",
             f"Final returns normalised per task: (return - random) / (reference - random), where random is the mean "
             f"return of a uniformly random policy over {RANDOM_EPISODES} episodes (score 0) and reference the task's "
             f"reference return (score 1: the learning issue's targets {_targets()}; other tasks: the best label's "
             "mean final return in this report). IQM and mean over all runs of all tasks, with 95% stratified "
             "bootstrap intervals (seeds resampled within each task).", "",
             "| task | random policy | reference | reference from |", "|---|---|---|---|"]
    for task, n in over.normalisations.items():
        lines.append(f"| {task} | {n.zero:.4g} | {n.one:.4g} | {n.source} |" if isinstance(n, Normalisation)
                     else f"| {task} | n/a | n/a | left out: {n} |")
    if not over.tasks:
        return [*lines, "", "No task normalises: no aggregate over tasks."]
    lines += ["", f"Tasks: {', '.join(over.tasks)}.", "",
              "| algo | seeds (run on every task) | normalised final return IQM | normalised final return mean |",
              "|---|---|---|---|"]
    for label, scores in over.scores.items():
        stats = intervals.aggregates(scores)
        lines.append(f"| {label} | {scores.shape[0]} | {stats['iqm'].text(2)} | {stats['mean'].text(2)} |")
    if over.left_out:
        lines += ["", *(f"- {label} left out: {why}." for label, why in over.left_out.items())]
    if over.scores:
        lines += ["", f"Performance profile: [{PROFILE_FILE}]({PROFILE_FILE}) (the fraction of runs whose normalised "
                  "final return exceeds each tau, per label, with its bootstrap band)."]
    return lines


def _targets() -> str:
    return ", ".join(f"{task} {value:g}" for task, value in REFERENCE_RETURNS.items())


def _runs_extended_class(label: str) -> bool:
    """Whether ``label`` runs a class the Scalable ones extend (SB3's PPO, MaskablePPO, RecurrentPPO)."""
    return parsed_or_unknown(label)[0] in BASELINES


def _extended_class_labels(summary: dict[str, dict[str, Any]]) -> list[str]:
    """The report's labels that run an extended class (:func:`_runs_extended_class`), the baseline first."""
    return [label for label in report_labels(summary) if _runs_extended_class(label)]


def strongest_extended_label(data: dict[str, Any]) -> str | None:
    """A task's label of an extended class with the highest final-return IQM (None where it has none): the
    strongest config of SB3's PPO (or of the contrib class) that the report holds for the task."""
    labels = [label for label in data["algos"] if _runs_extended_class(label)]
    return max(labels, key=lambda a: data["algos"][a]["final_return"]["iqm"].point, default=None)


def _strongest_line(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Per task, the strongest config of the extended classes, and whether it is the baseline."""
    cells = []
    for task, data in summary.items():
        label = strongest_extended_label(data)
        if label is not None:
            seeds = len(data["algos"][label]["seeds"])
            note = "" if label == data["baseline"] else ", not the baseline"
            cells.append(f"{task} {label} ({seeds} seed{'s' if seeds > 1 else ''}{note})")
    if not cells:
        return []
    return ["", "Strongest config of the extended classes per task (the highest final-return IQM among their "
            "labels): " + "; ".join(cells) + "."]


IMPROVEMENT_MEANING = ("P(a run of the label scores a higher final return than a run of the other label on the same "
                       "task), averaged over the tasks both ran, with its 95% stratified bootstrap interval (0.5: no "
                       "difference; seeds run on every one of those tasks):")


def improvement_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Probability of improvement of each Scalable label over each label of the extended classes, the baseline
    first; where the report has no label of both kinds (a search among Scalable configs), of each label over the
    baseline."""
    labels = [label for label in report_labels(summary) if pair_of(label) is not None]
    references = _extended_class_labels(summary)
    if not labels or not references:
        return _improvement_over_baseline_lines(summary)
    return [*_strongest_line(summary),
            "", "Probability of improvement over each config of the extended classes (the baseline, "
            f"{report_baseline(summary)}, first): {IMPROVEMENT_MEANING}", "",
            *(_improvement_line(summary, label, reference) for reference in references for label in labels),
            *_improvement_over_strongest_lines(summary, labels)]


def _improvement_over_strongest_lines(summary: dict[str, dict[str, Any]], labels: list[str]) -> list[str]:
    """Each of ``labels`` over the strongest config of the extended classes on each task it ran (where those are
    not one label on every task, so the lines above do not already say it)."""
    strongest = {task: label for task, data in summary.items() if (label := strongest_extended_label(data))}
    if len(set(strongest.values())) < 2:
        return []
    return [_improvement_over_strongest_line(summary, label, strongest) for label in labels]


def _improvement_over_strongest_line(summary: dict[str, dict[str, Any]], label: str,
                                     strongest: dict[str, str]) -> str:
    """``label`` over the task's strongest label of the extended classes (``strongest``: task -> label) on the
    tasks ``label`` ran."""
    tasks = [task for task in strongest if label in summary[task]["runs"]]
    theirs = _final_returns_of(summary, {task: strongest[task] for task in tasks})
    ours = _final_returns(summary, tasks, label)
    names = ", ".join(f"{task} {strongest[task]}" for task in tasks)
    if ours.size == 0 or theirs.size == 0:
        return f"- {label} over the strongest config per task ({names}): n/a (no seed common to those runs)"
    p = intervals.probability_of_improvement(ours, theirs)
    return (f"- {label} over the strongest config per task ({names}; {ours.shape[0]} against {theirs.shape[0]} "
            f"seeds): {p.text(2)}")


def _improvement_over_baseline_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Probability of improvement of each label over the baseline label (none without another label)."""
    baseline = report_baseline(summary)
    others = [label for label in report_labels(summary) if label != baseline]
    if not baseline or not others:
        return []
    return ["", f"Probability of improvement over the baseline ({baseline}): {IMPROVEMENT_MEANING}", "",
            *(_improvement_line(summary, label, baseline) for label in others)]


def _improvement_line(summary: dict[str, dict[str, Any]], label: str, baseline: str) -> str:
    """``label`` over ``baseline`` on the tasks both ran, from their raw final returns."""
    tasks = [task for task, data in summary.items() if label in data["runs"] and baseline in data["runs"]]
    if not tasks:
        return f"- {label} over {baseline}: n/a (no task with runs of both)"
    ours, theirs = _final_returns(summary, tasks, label), _final_returns(summary, tasks, baseline)
    if ours.size == 0 or theirs.size == 0:
        return f"- {label} over {baseline}: n/a (no seed run on every one of {', '.join(tasks)})"
    p = intervals.probability_of_improvement(ours, theirs)
    return (f"- {label} over {baseline} ({', '.join(tasks)}; {ours.shape[0]} against {theirs.shape[0]} seeds): "
            f"{p.text(2)}")


def performance_profile(over: OverTasks, out: Path) -> Path | None:
    """``<out>/performance_profile.png`` of the normalised final returns (None without a label to draw)."""
    if not over.scores:
        return None
    return intervals.performance_profile_png(
        over.scores, out / PROFILE_FILE, "normalised final return tau (random policy 0, reference 1)",
        f"Performance profile over {', '.join(over.tasks)} (band: 95% stratified bootstrap)")
