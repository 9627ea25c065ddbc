"""End to end at the user's own config: SB3 PPO against ScalablePPO (and SBX's PPO where installed), same config.

Three measurements, each writing a markdown table (with the command, the box and its raw MuJoCo step cost) under
benchmarks/results/end_to_end/:

``collect``  collection steps/s of SB3's ``collect_rollouts`` against ScalablePPO's lean loop, on two identical
             models (DummyVecEnv + VecNormalize, SB3's default MlpPolicy), alternating rollouts from the same RNG
             state; every pair of rollouts is checked equal field by field. Medians over the repeats. A masking env
             (``--envs InvalidActionEnvDiscrete80-v0``) compares MaskablePPO's loop with ScalableMaskablePPO's, a
             velocity-masked one (``CartPoleNoVel-v1``) RecurrentPPO's with ScalableRecurrentPPO's. With
             ``--device cuda`` (MuJoCo envs) both policies run on the GPU, and two more loops are timed beside
             them: ScalablePPO with ``cuda_graphs=True`` (the lean loop's policy step replayed from a CUDA graph; its
             rollouts checked equal too) and with ``collect_device="cpu"`` (its policy on the GPU, collection from a
             CPU copy); written to collect_cuda.md.
``profile``  one collection step (default: 1 env on Hopper-v5; ``--env``, ``--n-envs``) taken apart: the physics,
             the env through its wrappers and VecEnvs, SB3's policy call, the fused policy call, whole collection
             steps of both loops, and the ceiling of a bit-identical loop.
``learn``    ``learn()`` steps/s end to end, one fresh process per run, pinned to one CPU core (``--core``; one torch
             thread; SBX's XLA runs its computations on threads of its own besides Python's, which the pin keeps on
             the same core), runs of the algorithms alternating, medians over repeats, collection and update time
             split out, and the process's CPU time over wall time (at most 1 on one core).
             Each run first learns one rollout untimed (SBX's jit and ``compile_loss`` compile there), then times
             the next ``rollouts`` rollouts: steady-state throughput. Ratios are per repeat (run r of an algorithm
             against SB3 PPO's run r), then the median. Also writes a PNG.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/end_to_end.py collect|profile|learn [options]``; ``learn --configs``
takes any of :data:`CONFIGS`. SBX is the ``bench`` extra (``pip install -e ".[bench]"``); CI never installs it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch as th

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "end_to_end"
#: config name -> (zoo entry or "demo", overrides, env id, rollouts timed, what it is)
CONFIGS: dict[str, tuple[str, dict[str, Any], str, int, str]] = {
    "hopper_sb3_defaults": ("Hopper-v5", {}, "Hopper-v5", 2, "SB3's defaults on Hopper-v5, 1 env, VecNormalize"),
    "halfcheetah_zoo": ("HalfCheetah-v5", {}, "HalfCheetah-v5", 6, "the zoo's HalfCheetah-v5 entry, 1 env"),
    "demo": ("demo", {}, "HalfCheetah-v5", 4, "the demo's config: 4 envs, 256x256 ReLU, batch 128, 10 epochs"),
    "demo_compile": ("demo", {"compile_loss": True}, "HalfCheetah-v5", 4,
                     "the demo's config with compile_loss=True (ScalablePPO only)"),
    "envs16": ("HalfCheetah-v5@sb3_defaults", {"n_envs": 16, "n_steps": 128}, "HalfCheetah-v5", 2,
               "SB3's defaults on HalfCheetah-v5 at 16 envs x 128 steps, VecNormalize"),
    "gpu_const_64": ("HalfCheetah-v5@gpu_const", {}, "HalfCheetah-v5", 1,
                     "@gpu_const: 64 envs x 256 steps, batch 2048, 10 epochs, lr 1e-3 (@gpu_kl with SB3's constant lr)"),
    "cartpole_zoo": ("CartPole-v1", {}, "CartPole-v1", 24,
                     "the zoo's CartPole-v1 entry: 8 envs x 32 steps, batch 256, 20 epochs, discrete actions"),
    "atari_pong": ("atari", {}, "PongNoFrameskip-v4", 2, "the zoo's Atari config: Pong, 8 envs, CnnPolicy"),
    "atari_pong_thp": ("atari", {}, "PongNoFrameskip-v4", 2,
                       "atari_pong with torch's `THP_MEM_ALLOC_ENABLE=1` for every algorithm (CPU tensors of 2 MB or "
                       "more on transparent huge pages)"),
}
#: config name -> environment variables set for every algorithm's runs of it (and unset for every other config)
PROCESS_ENV: dict[str, dict[str, str]] = {"atari_pong_thp": {"THP_MEM_ALLOC_ENABLE": "1"}}
ALGOS = ("sb3_ppo", "scalable_ppo", "sbx_ppo")
SCALABLE_ONLY = ("compile_loss",)


# --------------------------------------------------------------------------------------------------- the box
def mujoco_step_us(env_id: str = "Hopper-v5", steps: int = 2000) -> float:
    """Microseconds of one MuJoCo ``do_simulation`` (the env's frame skip) on this box: its raw step cost."""
    import gymnasium as gym

    env = gym.make(env_id).unwrapped
    env.reset(seed=0)
    action = np.zeros(env.action_space.shape)
    start = time.perf_counter()
    for _ in range(steps):
        env.do_simulation(action, env.frame_skip)
    return (time.perf_counter() - start) / steps * 1e6


def box_line() -> str:
    load = os.getloadavg()[0]
    return (f"{platform.machine()}, {os.cpu_count()} cores, torch {th.__version__} with {th.get_num_threads()} thread, "
            f"python {platform.python_version()}; raw step cost: Hopper-v5 `do_simulation` {mujoco_step_us():.0f} us; "
            f"load average {load:.1f} at the end")


def header(title: str, argv: list[str], note: str, script: str = "end_to_end.py") -> list[str]:
    command = " ".join([f"benchmarks/{script}", *argv])
    return [f"# {title}", "", f"Produced by `OMP_NUM_THREADS=1 python {command}` on "
            f"{time.strftime('%Y-%m-%d')}; {box_line()}.", "", note, ""]


# --------------------------------------------------------------------------------------------------- models
def _filter_known_warnings() -> None:
    from sb3_ppo_scale.envs.known_warnings import filter_known_warnings

    filter_known_warnings()


def _demo_hyperparams() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("quickstart", ROOT / "examples" / "quickstart.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return {**module.HYPERPARAMS, **module.epochs_and_lr(10)}


def build_env_and_kwargs(config: str, seed: int) -> tuple[Any, str, dict[str, Any]]:
    """The VecEnv, the policy name and the constructor arguments of ``config`` (ScalablePPO-only keys included)."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from sb3_ppo_scale.experiments import zoo

    entry, overrides, env_id, _, _ = CONFIGS[config]
    scalable = {k: v for k, v in overrides.items() if k in SCALABLE_ONLY}
    overrides = {k: v for k, v in overrides.items() if k not in SCALABLE_ONLY}
    if entry == "demo":
        return VecNormalize(make_vec_env(env_id, n_envs=4, seed=seed)), "MlpPolicy", {**_demo_hyperparams(), **scalable}
    zoo_config = zoo.load_config(None, env_id, entry.partition("@")[2] or None, overrides)
    env = zoo.make_envs(zoo_config, seed=seed)
    return env, zoo_config.policy, {**zoo_config.model_kwargs, **scalable}


def _sbx_policy_kwargs(policy_kwargs: dict[str, Any]) -> dict[str, Any]:
    """SB3's policy_kwargs in SBX's terms (flax activations)."""
    import flax.linen as nn

    activations = {th.nn.ReLU: nn.relu, th.nn.Tanh: nn.tanh}
    out = dict(policy_kwargs)
    if "activation_fn" in out:
        out["activation_fn"] = activations[out["activation_fn"]]
    return out


def build_model(algo: str, config: str, seed: int) -> Any:
    env, policy, kwargs = build_env_and_kwargs(config, seed)
    if algo == "scalable_ppo":
        from sb3_ppo_scale import ScalablePPO

        return ScalablePPO(policy, env, seed=seed, device="cpu", **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in SCALABLE_ONLY}
    if algo == "sb3_ppo":
        from stable_baselines3 import PPO

        return PPO(policy, env, seed=seed, device="cpu", **kwargs)
    from sbx import PPO as SBXPPO

    kwargs["policy_kwargs"] = _sbx_policy_kwargs(kwargs.get("policy_kwargs", {}))
    return SBXPPO(policy, env, seed=seed, **kwargs)


def algos_for(config: str, wanted: list[str]) -> list[str]:
    """The algorithms a config runs: ScalablePPO-only settings run ScalablePPO alone (against SB3 PPO's plain run
    of the same hyperparameters); SBX only where installed."""
    algos = [a for a in wanted if a != "sbx_ppo" or importlib.util.find_spec("sbx") is not None]
    if any(k in SCALABLE_ONLY for k in CONFIGS[config][1]):
        algos = [a for a in algos if a == "scalable_ppo"]
    return algos


# --------------------------------------------------------------------------------------------------- learn
def phase_timer() -> Any:
    """A callback that adds up the seconds spent collecting (``collect_s``); the rest of ``learn()`` is the update."""
    from stable_baselines3.common.callbacks import BaseCallback

    class PhaseTimer(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.collect_s, self.started = 0.0, 0.0

        def _on_rollout_start(self) -> None:
            self.started = time.perf_counter()

        def _on_rollout_end(self) -> None:
            self.collect_s += time.perf_counter() - self.started

        def _on_step(self) -> bool:
            return True

    return PhaseTimer()


def run_once(algo: str, config: str, seed: int) -> dict[str, float]:
    """One learn() run in this process: one rollout untimed, then ``rollouts`` timed; times split by phase."""
    _filter_known_warnings()
    model = build_model(algo, config, seed)
    rollout = model.n_steps * model.n_envs
    timed_rollouts = CONFIGS[config][3]
    model.learn(rollout)  # untimed: jit / compile warm-up
    timer = phase_timer()
    start, steps_before, faults_before = time.perf_counter(), model.num_timesteps, _minor_page_faults()
    cpu_before = time.process_time()
    model.learn(timed_rollouts * rollout, callback=timer, reset_num_timesteps=False)
    wall = time.perf_counter() - start
    steps = model.num_timesteps - steps_before
    return {"steps": steps, "wall_s": wall, "collect_s": timer.collect_s, "update_s": wall - timer.collect_s,
            "page_faults": _minor_page_faults() - faults_before, "cpu_s": time.process_time() - cpu_before}


def _minor_page_faults() -> int:
    """This process's minor page faults so far (memory the kernel maps in on first touch)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def run_environment(config: str) -> dict[str, str]:
    """The environment of one run of ``config``: one torch thread, XLA's Eigen single-threaded, and its
    :data:`PROCESS_ENV` settings, none of another config's (whatever this shell has set)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}
    for name in {key for values in PROCESS_ENV.values() for key in values}:
        env.pop(name, None)
    return {**env, **PROCESS_ENV.get(config, {})}


def default_core() -> int:
    """The highest-numbered CPU core this process may run on (the one the learn runs are pinned to by default)."""
    return max(os.sched_getaffinity(0))


def pin_to(core: int | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that pins the new process, so every thread it starts, to CPU core ``core`` (None: no pin)."""
    return None if core is None else lambda: os.sched_setaffinity(0, {core})


def _core_argument(text: str) -> int | None:
    """``--core``: a core number, or ``none`` for unpinned runs (to see how many cores each algorithm takes)."""
    if text == "none":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a core number or 'none', got {text!r}")
    return int(text)


def _positive_int(text: str) -> int:
    """``--n-envs``: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def _pinning_text(core: int | None, capital: bool = False) -> str:
    """How the benchmark process was pinned (``--core``), for a table's note."""
    text = f"the process pinned to CPU core {core}" if core is not None else "the process not pinned to a core"
    return text[:1].upper() + text[1:] if capital else text


def _run_subprocess(algo: str, config: str, seed: int, core: int | None) -> dict[str, float]:
    """One run of :func:`run_once` in a fresh process pinned to CPU core ``core`` (None: unpinned)."""
    done = subprocess.run([sys.executable, __file__, "_run", algo, config, str(seed)], env=run_environment(config),
                          capture_output=True, text=True, timeout=1800, cwd=ROOT, preexec_fn=pin_to(core))
    if done.returncode != 0:
        raise RuntimeError(f"{algo} {config} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def learn_command(args: argparse.Namespace, argv: list[str]) -> None:
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for config in args.configs:
        algos = algos_for(config, args.algos)
        results[config] = {algo: [] for algo in algos}
        for repeat in range(args.repeats):
            order = algos[repeat % len(algos):] + algos[:repeat % len(algos)]  # alternate who runs first
            for algo in order:
                run = _run_subprocess(algo, config, args.seed, args.core)
                results[config][algo].append(run)
                print(f"{config:20s} {algo:13s} repeat {repeat}: {run['steps'] / run['wall_s']:7.0f} steps/s "
                      f"(collect {run['collect_s']:.1f} s, update {run['update_s']:.1f} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "learn.json").write_text(json.dumps(results, indent=1))
    rows = learn_table(results)
    pinning = (f"every process pinned to CPU core {args.core} (all its threads)" if args.core is not None
               else "processes NOT pinned (each may use every core)")
    note = ("`learn()` steps/s after one untimed warm-up rollout, one process per run, one torch thread, "
            f"{pinning}; median over "
            f"{args.repeats} alternating repeats. collect / update: seconds per 1000 env steps in each phase. "
            "page faults: minor page faults of the timed part, per env step. CPU / wall: the process's CPU time "
            "(all threads) over the wall time of the timed part (at most 1 on one core; below 1 where it waited). "
            "ratio: end-to-end steps/s against SB3 PPO's run of the same repeat (median [min, max] over repeats); "
            "`demo_compile` is ScalablePPO with `compile_loss=True` against the `demo` row's SB3 PPO runs.")
    text = header("End to end at the same config: SB3 PPO, ScalablePPO, SBX PPO", argv, note) + rows
    (args.out / "learn.md").write_text("\n".join(text) + "\n")
    plot_learn(results, args.out / "learn.png")
    print("\n".join(rows))


def _baseline_runs(results: dict[str, dict[str, list[dict[str, float]]]], config: str) -> list[dict[str, float]]:
    """SB3 PPO's runs at this config's hyperparameters (a ScalablePPO-only variant takes its base config's)."""
    if "sb3_ppo" in results[config]:
        return results[config]["sb3_ppo"]
    base = next((c for c in results if c != config and CONFIGS[c][0] == CONFIGS[config][0]
                 and "sb3_ppo" in results[c]), None)
    return results[base]["sb3_ppo"] if base else []


def learn_table(results: dict[str, dict[str, list[dict[str, float]]]]) -> list[str]:
    rows = ["| config | algorithm | steps/s | collect s / 1k steps | update s / 1k steps | page faults / step "
            "| CPU / wall | ratio to SB3 PPO |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for config, by_algo in results.items():
        baseline = _baseline_runs(results, config)
        for algo, runs in by_algo.items():
            rate = statistics.median(r["steps"] / r["wall_s"] for r in runs)
            collect, update = _seconds_per_1k(runs, "collect_s"), _seconds_per_1k(runs, "update_s")
            faults = (f"{statistics.median(r['page_faults'] / r['steps'] for r in runs):.0f}"
                      if all("page_faults" in r for r in runs) else "n/a")
            cores = (f"{statistics.median(r['cpu_s'] / r['wall_s'] for r in runs):.2f}"
                     if all("cpu_s" in r for r in runs) else "n/a")
            ratios = _ratios(runs, baseline)
            ratio = (f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]"
                     if ratios and algo != "sb3_ppo" else "1" if algo == "sb3_ppo" else "n/a")
            rows.append(f"| {config} | {algo} | {rate:.0f} | {collect:.2f} | {update:.2f} | {faults} | {cores} "
                        f"| {ratio} |")
    rows += ["", "Configs:", ""] + [f"- `{name}`: {CONFIGS[name][4]}" for name in results]
    return rows + sbx_ahead_rows(results)


def _ratios(runs: list[dict[str, float]], baseline: list[dict[str, float]]) -> list[float]:
    """Each run's steps/s over the baseline run of the same repeat."""
    return [(r["steps"] / r["wall_s"]) / (b["steps"] / b["wall_s"]) for r, b in zip(runs, baseline)]


def _seconds_per_1k(runs: list[dict[str, float]], phase: str) -> float:
    """Median seconds per 1000 env steps spent in ``phase`` ("collect_s" or "update_s")."""
    return statistics.median(1000 * r[phase] / r["steps"] for r in runs)


def sbx_ahead_rows(results: dict[str, dict[str, list[dict[str, float]]]]) -> list[str]:
    """Where SBX's PPO ran ahead of ScalablePPO (median ratios to SB3 PPO), and which phase made the difference;
    nothing when SBX did not run."""
    if not any("sbx_ppo" in by_algo for by_algo in results.values()):
        return []
    lines = []
    for config, by_algo in results.items():
        ours, sbx, baseline = by_algo.get("scalable_ppo"), by_algo.get("sbx_ppo"), _baseline_runs(results, config)
        if not (ours and sbx and baseline):
            continue
        sbx_ratio, our_ratio = statistics.median(_ratios(sbx, baseline)), statistics.median(_ratios(ours, baseline))
        if sbx_ratio <= our_ratio:
            continue
        sbx_faster = [f"{phase[:-2]} {theirs:.2f} s / 1k steps against ScalablePPO's {mine:.2f}"
                      for phase in ("collect_s", "update_s")
                      for theirs, mine in [(_seconds_per_1k(sbx, phase), _seconds_per_1k(ours, phase))] if theirs < mine]
        lines.append(f"- `{config}`: SBX {sbx_ratio:.2f}x, ScalablePPO {our_ratio:.2f}x; "
                     f"SBX faster in: {'; '.join(sbx_faster) or 'neither phase alone (medians)'}.")
    if not lines:
        return ["", "SBX's PPO was not ahead of ScalablePPO at any config."]
    return ["", "Where SBX's PPO ran ahead of ScalablePPO (its update is one compiled XLA program a minibatch; "
            "ScalablePPO runs SB3's eager torch ops, to stay bit-identical):", ""] + lines


def plot_learn(results: dict[str, dict[str, list[dict[str, float]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(results)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(configs)), 3.6))
    width = 0.8 / len(ALGOS)
    for i, algo in enumerate(ALGOS):
        xs, heights = [], []
        for j, config in enumerate(configs):
            baseline = _baseline_runs(results, config)
            runs = results[config].get(algo)
            if runs and baseline:
                xs.append(j + (i - 1) * width)
                heights.append(statistics.median(_ratios(runs, baseline)))
        if xs:
            ax.bar(xs, heights, width, label=algo)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(configs)), configs, rotation=20, ha="right")
    ax.set_ylabel("end-to-end steps/s / SB3 PPO's")
    ax.set_title("learn() at the same config, one thread (median over repeats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# --------------------------------------------------------------------------------------------------- collect
def _collection_pair(env_id: str, n_envs: int, seed: int,
                     device: str = "cpu") -> list[tuple[str, Any, Any, Callable[..., bool]]]:
    """Two identical models and the loops to time: SB3 PPO's ``collect_rollouts`` against the lean loop; on a
    masking env (:data:`MASKING_ENVS`) MaskablePPO's against ScalableMaskablePPO's (the lean loop with masks); on a
    velocity-masked ``*NoVel-v*`` env RecurrentPPO's against ScalableRecurrentPPO's (``MlpLstmPolicy``). On
    ``device="cuda"`` (MuJoCo envs only) two more: ScalablePPO with its policy step replayed from a CUDA graph
    (``cuda_graphs=True``) and ScalablePPO collecting from a CPU copy (``collect_device="cpu"``)."""
    from sb3_contrib import MaskablePPO, RecurrentPPO
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import CallbackList
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
    from stable_baselines3.common.vec_env import VecNormalize

    from sb3_ppo_scale import ScalableMaskablePPO, ScalablePPO, ScalableRecurrentPPO
    from sb3_ppo_scale.core.collect.lean import collect_rollouts_lean
    from sb3_ppo_scale.experiments.algorithms import MASKING_ENVS, register_envs

    register_envs(env_id)
    policy = "MlpPolicy"
    if env_id in MASKING_ENVS:
        pair = [("baseline", MaskablePPO, MaskablePPO.collect_rollouts),
                ("lean", ScalableMaskablePPO, ScalableMaskablePPO.collect_rollouts)]
    elif "NoVel-v" in env_id:
        policy = "MlpLstmPolicy"
        pair = [("baseline", RecurrentPPO, RecurrentPPO.collect_rollouts),
                ("lean", ScalableRecurrentPPO, ScalableRecurrentPPO.collect_rollouts)]
    else:
        pair = [("baseline", PPO, OnPolicyAlgorithm.collect_rollouts), ("lean", PPO, collect_rollouts_lean)]
    if device == "cpu" and pair[0][1] is PPO:
        pair.append(("lean_own_step", PPO, _lean_with_own_env_step))
    if device != "cpu":
        if len(pair) != 2 or pair[0][1] is not PPO:
            raise SystemExit(f"--device {device}: MuJoCo envs only (SB3 PPO's loop against the lean loop), got {env_id}")
        pair += [("lean_graphed", ScalablePPO, ScalablePPO.collect_rollouts),
                 ("lean_cpu_copy", ScalablePPO, ScalablePPO.collect_rollouts)]
    models = []
    for name, algo, collect in pair:
        env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
        env = env if env_id in MASKING_ENVS else VecNormalize(env)
        extra = {"lean_cpu_copy": {"collect_device": "cpu"}, "lean_graphed": {"cuda_graphs": True}}.get(name, {})
        model = algo(policy, env, n_steps=max(1, 2048 // n_envs), seed=seed, device=device, **extra)
        _, callback = model._setup_learn(10**9, CallbackList([]))
        models.append((name, model, callback, collect))
    return models


def _lean_with_own_env_step(model: Any, env: Any, callback: Any, buffer: Any, n_steps: int) -> bool:
    """The lean loop with the VecEnv stepped by its own ``step``: what ``vec_env_step`` buys, measured."""
    from sb3_ppo_scale.core.collect import lean as lean_collect

    lean_step = lean_collect.vec_env_step
    lean_collect.vec_env_step = lambda vec_env: vec_env.step
    try:
        return lean_collect.collect_rollouts_lean(model, env, callback, buffer, n_steps)
    finally:
        lean_collect.vec_env_step = lean_step


def collect_command(args: argparse.Namespace, argv: list[str]) -> None:
    on_gpu = args.device != "cpu"
    if on_gpu and not th.cuda.is_available():
        raise SystemExit(f"--device {args.device}: no CUDA device on this machine")
    rows = ["| env | envs | baseline loop steps/s | lean loop steps/s | ratio [min, max] | rollouts equal "
            "| lean loop, the VecEnv's own `step`: steps/s | lean loop against it [min, max] |"
            + (" lean, graphed steps/s | its ratio [min, max] | graphed rollouts equal | lean from a CPU copy steps/s "
               "| its ratio [min, max] |" if on_gpu else ""),
            "|---|---:|---:|---:|---|---|---:|---|" + ("---:|---|---|---:|---|" if on_gpu else "")]
    for env_id in args.envs:
        for n_envs in args.n_envs:
            pair = _collection_pair(env_id, n_envs, args.seed, args.device)
            (_, baseline, _, _), (_, lean, _, _) = pair[:2]
            times: dict[str, list[float]] = {name: [] for name, *_ in pair}
            equal, graphed_equal = True, True
            for repeat in range(args.repeats + 1):  # the first pair warms up, untimed
                rng, np_rng = th.get_rng_state(), np.random.get_state()  # masking envs draw masks from np.random
                gpu_rng = th.cuda.get_rng_state() if on_gpu else None
                for name, model, callback, collect in (pair if repeat % 2 else pair[::-1]):
                    th.set_rng_state(rng)
                    np.random.set_state(np_rng)
                    if gpu_rng is not None:
                        th.cuda.set_rng_state(gpu_rng)
                    start = time.perf_counter()
                    collect(model, model.env, callback, model.rollout_buffer, model.n_steps)
                    if on_gpu:
                        th.cuda.synchronize()
                    if repeat:
                        times[name].append(time.perf_counter() - start)
                fields = ["observations", "actions", "rewards", "values", "log_probs", "advantages"]
                fields += [f for f in ("action_masks", "hidden_states_pi", "cell_states_vf") if hasattr(lean.rollout_buffer, f)]
                equal &= all(_same_rollout(baseline, model, fields) for name, model, *_ in pair
                             if name in ("lean", "lean_own_step"))
                if on_gpu:
                    graphed_equal &= _same_rollout(baseline, pair[2][1], fields)
            steps = baseline.n_steps * n_envs
            rows.append(f"| {env_id} | {n_envs} | {steps / statistics.median(times['baseline']):.0f} | "
                        f"{steps / statistics.median(times['lean']):.0f} | {_ratio_text(times['baseline'], times['lean'])} "
                        f"| {'yes' if equal else 'NO'} |")
            own = times.get("lean_own_step")
            rows[-1] += (f" {steps / statistics.median(own):.0f} | {_ratio_text(own, times['lean'])} |" if own
                         else " n/a | n/a |")
            if on_gpu:
                graphed, copy = times["lean_graphed"], times["lean_cpu_copy"]
                rows[-1] += (f" {steps / statistics.median(graphed):.0f} | {_ratio_text(times['baseline'], graphed)} | "
                             f"{'yes' if graphed_equal else 'NO'} | {steps / statistics.median(copy):.0f} | "
                             f"{_ratio_text(times['baseline'], copy)} |")
            print(rows[-1], flush=True)
    note = (f"Collection only (`collect_rollouts`, 2048 env steps a rollout), SB3's default MlpPolicy. MuJoCo envs: "
            "SB3 PPO's loop against the lean loop, DummyVecEnv + VecNormalize. Masking envs (sb3-contrib's "
            "InvalidActionEnvDiscrete, DummyVecEnv): MaskablePPO's loop against ScalableMaskablePPO's (the lean loop "
            "with masks). Velocity-masked envs (rl_zoo3's `*NoVel-v*`, VecNormalize): RecurrentPPO's loop against "
            "ScalableRecurrentPPO's, contrib's default `MlpLstmPolicy` (one 256-unit LSTM each for actor and critic). "
            f"{_pinning_text(args.core, capital=True)}. Median over {args.repeats} alternating rollout pairs, each pair started from the same torch "
            "and numpy RNG states on two identical models; 'rollouts equal': every buffer field (masks included) equal in every "
            "pair. 'The VecEnv's own `step`': the lean loop with the env stepped by `env.step` rather than "
            "`vec_env_step` (MuJoCo envs on the CPU), alternating with the other two loops from the same RNG states.")
    if on_gpu:
        note += (f" Device {args.device} ({th.cuda.get_device_name()}): both loops run the policy there; 'lean, "
                 "graphed' is ScalablePPO with cuda_graphs=True (the lean loop with its policy step replayed from a CUDA "
                 "graph; its rollouts checked equal to the baseline's too); 'lean from a "
                 "CPU copy' is ScalablePPO with collect_device=\"cpu\" (policy on the GPU, collection from a CPU copy "
                 "refreshed each rollout; same rollout up to float rounding, so not compared), its ratio against the "
                 "baseline loop on the GPU.")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / ("collect.md" if not on_gpu else "collect_cuda.md")).write_text("\n".join(header("Collection: the baseline loop against the lean loop", argv,
                                                         note) + rows) + "\n")


def _same_rollout(baseline: Any, other: Any, fields: list[str]) -> bool:
    """Every named rollout-buffer field of ``other`` equals ``baseline``'s."""
    return all(np.array_equal(getattr(baseline.rollout_buffer, f), getattr(other.rollout_buffer, f)) for f in fields)


def _ratio_text(baseline: list[float], other: list[float]) -> str:
    """Median [min, max] of the per-repeat time ratios baseline / other."""
    ratios = [b / o for b, o in zip(baseline, other)]
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]"


# --------------------------------------------------------------------------------------------------- profile
def _interleaved_us(parts: dict[str, Callable[[], Any]], calls: int, rounds: int = 30) -> dict[str, float]:
    """Microseconds per call of each function: ``rounds`` rounds, each calling every function ``calls // rounds``
    times in turn (so a box that slows down or speeds up affects every part alike); the median over rounds of each
    round's mean."""
    per_round = max(1, calls // rounds)
    for fn in parts.values():  # warm-up
        for _ in range(min(100, per_round)):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(rounds):
        for name, fn in parts.items():
            start = time.perf_counter()
            for _ in range(per_round):
                fn()
            samples[name].append((time.perf_counter() - start) / per_round * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def profile_command(args: argparse.Namespace, argv: list[str]) -> None:
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
    from stable_baselines3.common.utils import obs_as_tensor

    from sb3_ppo_scale.core.policy.inference import FusedActorCritic
    from sb3_ppo_scale.core.collect.vec_step import vec_env_step

    n_envs = args.n_envs
    _, model, callback, _ = _collection_pair(args.env, n_envs, args.seed)[0]
    env = model.env
    wrapped = list(env.venv.envs)
    inners = [one.unwrapped for one in wrapped]
    action = np.zeros((n_envs, *model.action_space.shape), dtype=np.float32)
    obs = obs_as_tensor(model._last_obs, "cpu")
    fused = FusedActorCritic(model.policy)
    model.policy.set_training_mode(False)
    for index, one in enumerate(wrapped):
        one.reset(seed=args.seed + index)
    lean_step = vec_env_step(env)
    envs_text = "one env's" if n_envs == 1 else f"the {n_envs} envs'"

    def physics() -> None:
        for inner, row in zip(inners, action):
            inner.do_simulation(row, inner.frame_skip)

    def wrapped_steps() -> None:
        for one, row in zip(wrapped, action):
            _step_or_reset(one, row)

    def sb3_policy() -> None:  # as SB3's loop calls it
        with th.no_grad():
            model.policy(obs)

    def fused_policy() -> None:  # as the lean loop calls it
        with th.inference_mode():
            fused(obs)

    parts = _interleaved_us({
        f"physics ({envs_text} `do_simulation`, MuJoCo)": physics,
        f"{envs_text} `step` through gymnasium's wrappers and Monitor": wrapped_steps,
        "DummyVecEnv `step`": lambda: env.venv.step(action),
        "VecNormalize(DummyVecEnv) `step`": lambda: env.step(action),
        "VecNormalize(DummyVecEnv), the lean loop's step (`vec_env_step`)": lambda: lean_step(action),
        "SB3's `policy(obs)`": sb3_policy,
        "fused policy step (`FusedActorCritic`)": fused_policy,
    }, args.calls)
    steps = model.n_steps
    sb3_us: list[float] = []
    insides: list[dict[str, float]] = []
    for repeat in range(args.rollouts + 1):  # alternating rollouts; the first pair warms up, untimed
        for loop in (("sb3", "lean") if repeat % 2 else ("lean", "sb3")):
            if loop == "lean":
                lean_run = _lean_step_inside(model, callback)
                insides += [lean_run] if repeat else []
                continue
            start = time.perf_counter()
            OnPolicyAlgorithm.collect_rollouts(model, env, callback, model.rollout_buffer, steps)
            sb3_us += [(time.perf_counter() - start) / steps * 1e6] if repeat else []
    inside = {key: statistics.median(run[key] for run in insides) for key in insides[0]}
    parts["one collection step, SB3's loop"] = statistics.median(sb3_us)
    parts["one collection step, lean loop"] = inside["total"]
    physics = parts[f"physics ({envs_text} `do_simulation`, MuJoCo)"]
    rows = ["| part of one collection step | us | x physics |", "|---|---:|---:|"]
    rows += [f"| {name} | {us:.0f} | {us / physics:.1f} |" for name, us in parts.items()]
    rows += ["", f"Inside a lean collection step ({inside['total']:.0f} us, the medians over the lean rollouts above): "
             f"the env's `step` {inside['env']:.0f} us (physics ~{physics:.0f} us; the rest is the user's env stack: "
             "gymnasium's wrappers, Monitor, DummyVecEnv, VecNormalize (stepped by `vec_env_step`), resets), the fused "
             f"policy step {inside['policy']:.0f} us, and the loop around them (tensor conversion, clipping, callbacks, "
             f"info buffer, buffer writes) {inside['total'] - inside['env'] - inside['policy']:.0f} us. The policy step "
             "runs the same tensor operations as SB3's (so that its numbers are SB3's): its cost is theirs, without "
             "module dispatch and Distribution objects."]
    target = 2.0 if n_envs == 1 else 1.5
    speedups = [sb3 / run["total"] for sb3, run in zip(sb3_us, insides)]
    ceilings = [sb3 / (run["env"] + run["policy"]) for sb3, run in zip(sb3_us, insides)]
    rows += ["", f"The ceiling of a bit-identical loop: with a loop around them that cost nothing, a step would still be "
             f"the env's step and the fused policy step as a rollout runs them, {inside['env'] + inside['policy']:.0f} "
             f"us, so collection could run at most {statistics.median(ceilings):.2f}x SB3's loop "
             f"[{min(ceilings):.2f}, {max(ceilings):.2f}] (per pair of rollouts, SB3's step over that env and policy "
             f"time); it runs at {statistics.median(speedups):.2f}x [{min(speedups):.2f}, {max(speedups):.2f}]. "
             f"{target}x SB3's speed (the target {'at 1 env' if n_envs == 1 else 'at several envs'}) needs a step of "
             f"{statistics.median(sb3_us) / target:.0f} us. (The parts "
             "table is timed in tight loops on a zero action: warmer caches than a rollout's and fewer resets than its "
             "sampled actions cause, so it understates what a rollout pays; the ceiling uses the rollouts' own times.)"]
    if args.update_configs:
        rows += ["", *_update_split_rows(args.update_configs, args.seed)]
    note = (f"{args.env}, {n_envs} env{'s' if n_envs > 1 else ''} (a step: each env steps once), DummyVecEnv + "
            "VecNormalize, SB3's default MlpPolicy (64x64 tanh), one thread, "
            f"{_pinning_text(args.core)}; "
            f"microseconds per call: {args.calls} calls of each part in 30 interleaved rounds, the median of the "
            f"rounds' means; a collection step: the median over {args.rollouts} alternating rollouts of {steps} steps "
            "per loop; inside a lean step: the median over the same lean rollouts.")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile.md").write_text("\n".join(header("One collection step, taken apart", argv, note) + rows) + "\n")
    print("\n".join(rows))


def _update_split_rows(configs: list[str], seed: int) -> list[str]:
    """The update phase per 1k env steps at each ``config`` (one timed ``train()`` after a warm-up one, on one
    collected rollout), SB3 PPO and ScalablePPO, and the share of each update spent in matrix multiplications
    (``aten::mm``/``aten::addmm`` self time over all self time, under torch's profiler)."""
    from torch.profiler import ProfilerActivity, profile

    rows = ["| config | algorithm | update s / 1k env steps | matmul share (profiled) | matmul s / 1k env steps |",
            "|---|---|---:|---:|---:|"]
    for config in configs:
        for algo in algos_for(config, ["sb3_ppo", "scalable_ppo"]):
            model = build_model(algo, config, seed)
            _, callback = model._setup_learn(model.n_steps * model.n_envs, None)
            callback.init_callback(model)
            model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
            model.train()  # warm-up (compile_loss compiles here)
            start = time.perf_counter()
            model.train()
            seconds = time.perf_counter() - start
            with profile(activities=[ProfilerActivity.CPU]) as profiled:
                model.train()
            events = profiled.key_averages()
            matmul = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm"))
            share = matmul / sum(e.self_cpu_time_total for e in events)
            per_1k = 1000 / (model.n_steps * model.n_envs)
            rows.append(f"| {config} | {algo} | {seconds * per_1k:.3f} | {share:.0%} | {share * seconds * per_1k:.3f} |")
            print(rows[-1], flush=True)
    return rows + ["", "matmul s: the update's time times the profiled share, what it would take if everything but the "
                   "matrix multiplications (the same kernels with any setting) cost nothing. The profiler slows the "
                   "small ops more than the matmuls, so the share is a lower bound."]


class _TimedEnv:
    """A VecEnv proxy that adds up the seconds spent in ``step``, stepping ``env`` as the lean loop steps it."""

    def __init__(self, env: Any) -> None:
        from sb3_ppo_scale.core.collect.vec_step import vec_env_step

        self.env, self.lean_step, self.seconds = env, vec_env_step(env), 0.0

    def step(self, actions: np.ndarray) -> Any:
        start = time.perf_counter()
        out = self.lean_step(actions)
        self.seconds += time.perf_counter() - start
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


def _lean_step_inside(model: Any, callback: Any) -> dict[str, float]:
    """Microseconds per step of one lean rollout: in all, in the env's ``step`` and in the fused policy call (the
    probes add two clock reads and one proxy attribute lookup per step, under 1 us)."""
    from sb3_ppo_scale.core.collect import lean as lean_collect
    from sb3_ppo_scale.core.policy import inference

    timed_env, policy_s = _TimedEnv(model.env), [0.0]
    fused_call = inference.FusedActorCritic.__call__

    def timed_call(self: Any, *args: Any) -> Any:
        start = time.perf_counter()
        out = fused_call(self, *args)
        policy_s[0] += time.perf_counter() - start
        return out

    inference.FusedActorCritic.__call__ = timed_call  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        lean_collect.collect_rollouts_lean(model, timed_env, callback, model.rollout_buffer, model.n_steps)
        total = time.perf_counter() - start
    finally:
        inference.FusedActorCritic.__call__ = fused_call  # type: ignore[method-assign]
    per_step = 1e6 / model.n_steps
    return {"total": total * per_step, "env": timed_env.seconds * per_step, "policy": policy_s[0] * per_step}


def _step_or_reset(env: Any, action: np.ndarray) -> None:
    _, _, terminated, truncated, _ = env.step(action)
    if terminated or truncated:
        env.reset()


# --------------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    th.set_num_threads(1)
    if argv and argv[0] == "_run":  # one learn() run, for learn_command's subprocesses
        print(json.dumps(run_once(argv[1], argv[2], int(argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"where the tables go (default {RESULTS})")
    commands = parser.add_subparsers(dest="command", required=True)
    learn = commands.add_parser("learn", help="learn() steps/s end to end at each config")
    learn.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    learn.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    learn.add_argument("--repeats", type=int, default=3)
    learn.add_argument("--seed", type=int, default=0)
    learn.add_argument("--core", type=_core_argument, default=default_core(),
                       help="the CPU core every run is pinned to (default: the highest this process may use); 'none' "
                            "runs unpinned, to see in the CPU / wall column how many cores each algorithm takes")
    collect = commands.add_parser("collect", help="collection steps/s, SB3's loop against the lean loop")
    collect.add_argument("--envs", nargs="+", default=["Hopper-v5", "HalfCheetah-v5"])
    collect.add_argument("--n-envs", nargs="+", type=int, default=[1, 8])
    collect.add_argument("--repeats", type=int, default=5)
    collect.add_argument("--seed", type=int, default=0)
    collect.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                         help="where the policies run (cuda: also ScalablePPO's collect_device='cpu'; MuJoCo envs only)")
    profile = commands.add_parser("profile", help="one collection step taken apart")
    profile.add_argument("--env", default="Hopper-v5")
    profile.add_argument("--n-envs", type=_positive_int, default=1, help="envs in the DummyVecEnv (default 1)")
    profile.add_argument("--calls", type=int, default=3000)
    profile.add_argument("--seed", type=int, default=0)
    for command in (learn, collect, profile):  # --out also after the sub-command (argparse keeps the top one's
        command.add_argument("--out", type=Path, default=argparse.SUPPRESS,  # value unless this one is given)
                             help=f"where the tables go (default {RESULTS})")
    for command in (collect, profile):
        command.add_argument("--core", type=_core_argument, default=default_core(),
                             help="the CPU core this process is pinned to (default: the highest it may use); "
                                  "'none': unpinned")
    profile.add_argument("--rollouts", type=int, default=5, help="timed rollouts per loop (default 5)")
    profile.add_argument("--update-configs", nargs="*", choices=list(CONFIGS), default=["demo", "demo_compile"],
                         help="configs whose update phase is split into matmuls and the rest (default: demo, "
                              "demo_compile; none to skip)")
    args = parser.parse_args(argv)
    if args.core is not None and args.core not in os.sched_getaffinity(0):
        parser.error(f"--core must be one of the cores this process may use, {sorted(os.sched_getaffinity(0))}, "
                     f"got {args.core}")
    if args.command != "learn" and args.core is not None:  # learn pins each run's subprocess instead
        os.sched_setaffinity(0, {args.core})
    _filter_known_warnings()
    {"learn": learn_command, "collect": collect_command, "profile": profile_command}[args.command](args, argv)


if __name__ == "__main__":
    main()
