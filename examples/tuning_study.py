"""A small Optuna sensitivity study with ``sb3-ppo-scale tune`` and its report, all in a temporary folder.

A study spec is a YAML file (the keys are documented in ``sb3_ppo_scale/tuning/spec.py``; full-size specs are in
``tuning/``). This script writes a small one (CartPole-v1, 20k steps per trial, three PPO arguments, Sobol
sampling), runs

    sb3-ppo-scale tune SPEC --n-trials N --n-timesteps T --storage TMP/study.journal
    sb3-ppo-scale report TMP/study.journal --out TMP/report --bootstrap 200

through the CLI's entry point, and prints the best trial. ``--n-timesteps`` shrinks every trial of a spec
(evaluations scaled alike): the same command gives any committed spec in ``tuning/`` a quick look. Every file
goes to a temporary folder that is removed at the end (``--keep DIR`` keeps them in DIR instead). A journal file
can be resumed: run ``tune`` again with a larger ``--n-trials`` (and the same budget) and it adds trials.

    python examples/tuning_study.py [--n-trials 8] [--timesteps 20000] [--keep DIR]

``SB3_PPO_SCALE_SMOKE=1`` runs 4 trials (the fewest a report takes) of 1024 steps (the CI smoke test).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import optuna
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from sb3_ppo_scale.cli import main as sb3_ppo_scale

SMOKE = os.environ.get("SB3_PPO_SCALE_SMOKE") == "1"


SPEC_TIMESTEPS = 20_000


def write_spec(folder: Path) -> Path:
    """A sensitivity spec for CartPole-v1: learning_rate, n_epochs and batch_size; two evaluations per trial, with
    sampled actions."""
    spec = {
        "name": "cartpole-quick",
        "mode": "sensitivity",
        "envs": ["CartPole-v1"],
        "timesteps": SPEC_TIMESTEPS,
        # stochastic evaluation: on CartPole an untrained *deterministic* policy can already score 500 (seed 0 does)
        "evaluation": {"eval_freq": SPEC_TIMESTEPS // 2, "n_episodes": 2 if SMOKE else 5, "deterministic": False,
                       "objective": "auc"},
        "base": {"policy": "MlpPolicy", "n_envs": 4, "n_steps": 128, "gamma": 0.98, "device": "cpu"},
        "space": {
            "learning_rate": {"type": "float", "low": 1e-4, "high": 3e-3, "log": True},
            "n_epochs": {"type": "int", "low": 3, "high": 10},
            "batch_size": {"type": "pow2", "low": 32, "high": 512},  # <= the rollout, 4 x 128
        },
        "sampler": {"name": "sobol", "seed": 0},
        "output_dir": str(folder),
    }
    path = folder / "cartpole-quick.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run(argv: list[str]) -> None:
    """Run one ``sb3-ppo-scale`` command in this process; raise on a non-zero status."""
    print("$ sb3-ppo-scale " + " ".join(argv), flush=True)
    status = sb3_ppo_scale(argv)
    if status != 0:
        raise SystemExit(f"sb3-ppo-scale {argv[0]} exited with status {status}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-trials", type=int, default=4 if SMOKE else 8, help="trials (default 8)")
    parser.add_argument("--timesteps", type=int, default=1024 if SMOKE else SPEC_TIMESTEPS,
                        help=f"env steps per trial, passed as tune --n-timesteps (default {SPEC_TIMESTEPS})")
    parser.add_argument("--keep", default=None, help="write into this folder and keep it (default: a temporary folder)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.keep or scratch).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        spec, journal = write_spec(folder), folder / "study.journal"
        run(["tune", str(spec), "--n-trials", str(args.n_trials), "--n-timesteps", str(args.timesteps),
             "--storage", str(journal)])
        run(["report", str(journal), "--out", str(folder / "report"), "--bootstrap", "20" if SMOKE else "200"])
        study = optuna.load_study(study_name="cartpole-quick:CartPole-v1",
                                  storage=JournalStorage(JournalFileBackend(str(journal))))
        print(f"report files: {sorted(p.name for p in (folder / 'report').iterdir())}")
        params = study.best_trial.params  # pow2 arguments are searched as log2_<name>
        best = {k.removeprefix("log2_"): 2**v if k.startswith("log2_") else v for k, v in params.items()}
        print(f"best of {len(study.trials)} trials: trial {study.best_trial.number}, {best}")
        print(f"best objective (mean evaluation return over the run): {study.best_value:.1f}")


if __name__ == "__main__":
    main()
