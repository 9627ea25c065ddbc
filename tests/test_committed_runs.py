"""The committed runs of the learning-at-scale benchmark are runs of the configs their labels name today: a change to
an ``@recipe`` entry that is not followed by moving its runs (to the recipe search, under the candidate's name) fails
here, instead of mixing two configs under one label in the report that ``--report-only`` rebuilds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sb3_ppo_scale.experiments import bench, zoo
from sb3_ppo_scale.experiments.algorithms import family, parse_label

RUNS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "learning_at_scale" / "runs"


@pytest.mark.parametrize("path", sorted(RUNS.glob("*.json")), ids=lambda p: p.stem)
def test_a_committed_run_has_its_entrys_hyperparameters(path: Path) -> None:
    run = json.loads(path.read_text())
    algo, variant = parse_label(run["algo"])
    config, dropped = bench._config_for(zoo.load_config(None, run["task"], variant, algo=family(algo).name), algo)
    assert run["hyperparams"] == bench.recorded_hyperparams(config, dropped)
    assert path.stem == f"{run['task']}__{run['algo']}__seed{run['seed']}"


def test_there_are_committed_runs_to_check() -> None:
    assert len(list(RUNS.glob("*.json"))) >= 9
