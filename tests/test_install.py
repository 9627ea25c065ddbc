"""The package works when installed (not editable), from a directory outside the repository.

A wheel is built from a copy of the package's sources (pyproject.toml, README.md, sb3_ppo_scale/), installed
without dependencies into a fresh venv that sees this interpreter's site-packages (torch, SB3, ... are not
downloaded again), and three commands run with the working directory outside the repository: ``train`` with the
default config (package data), ``bench`` on CartPole and ``python -m sb3_ppo_scale --help``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _venv(tmp_path: Path) -> Path:
    """A venv holding only the built wheel; this interpreter's site-packages are on its path via a .pth file."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "sb3_ppo_scale", source / "sb3_ppo_scale", ignore=shutil.ignore_patterns("__pycache__"))
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                  str(tmp_path / "wheel"), str(source)], cwd=tmp_path)
    assert "deprecat" not in (built.stdout + built.stderr).lower()  # e.g. project.license as a table
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path)
    parent = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib.stdout.strip(), "_test_parent_site.pth").write_text("\n".join(sorted(parent)) + "\n")
    wheel = next((tmp_path / "wheel").glob("sb3_ppo_scale-*.whl"))
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", str(wheel)], cwd=tmp_path)
    return venv


def test_installed_package_trains_benches_and_runs_as_a_module(tmp_path: Path) -> None:
    venv = _venv(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    where = _run([str(venv / "bin" / "python"), "-c", "import sb3_ppo_scale; print(sb3_ppo_scale.__file__)"], outside)
    assert Path(where.stdout.strip()).is_relative_to(venv)  # the installed copy, not the repository

    _run([str(venv / "bin" / "sb3-ppo-scale"), "train", "--env", "CartPole-v1", "--n-timesteps", "2048",
          "--no-progress", "--device", "cpu"], outside)
    run = outside / "logs" / "CartPole-v1_seed0"
    saved = yaml.safe_load((run / "config.yml").read_text())
    assert Path(saved["config_file"]).is_relative_to(venv) and saved["n_timesteps"] == 2048
    assert json.loads((run / "final_eval.json").read_text())["episodes"] == 5 and (run / "model.zip").is_file()

    _run([str(venv / "bin" / "sb3-ppo-scale"), "bench", "--tasks", "CartPole-v1", "--budget", "4096", "--seeds", "0",
          "--out", str(outside / "bench")], outside)
    runs = sorted(p.name for p in (outside / "bench" / "runs").glob("*.json"))
    assert "CartPole-v1__sb3_ppo__seed0.json" in runs and any("scalable_ppo" in name for name in runs)
    assert all(json.loads((outside / "bench" / "runs" / name).read_text())["steps"] >= 4096 for name in runs)
    assert (outside / "bench" / "learning_summary.md").is_file()

    help_text = _run([str(venv / "bin" / "python"), "-m", "sb3_ppo_scale", "--help"], outside).stdout
    for command in ("train", "evaluate", "bench", "tune", "report"):
        assert command in help_text
    assert sorted(p.name for p in outside.iterdir()) == ["bench", "logs"]
