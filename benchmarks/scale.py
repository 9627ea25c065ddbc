"""Scale on one box: end-to-end ``learn()`` steps/s at 1, 2, ... cores, and a per-step cost model of every stage.

``run``    every variant at every core count, the same config on every row (the large-batch shape: 64 envs x 256
           steps, VecNormalize, minibatch 2048, 10 epochs, constant lr 1e-3, SB3's default MlpPolicy):

           - ``sb3_dummy``: SB3 PPO on ``make_vec_env`` (DummyVecEnv): what an SB3 user runs;
           - ``sb3_fast``: SB3 PPO on the fast backend (EnvPool, one thread per core): what the backend alone buys;
           - ``scalable``: ScalablePPO with everything the scale plan turns on (``sb3_ppo_scale.envs.plan_scale``:
             EnvPool on every core, one torch thread for collection, every core for ``train()``, the update
             compiled on the CPU, CUDA and graphs on a GPU box); the compile falls in the untimed first rollout,
             and each run's warm-up seconds are recorded;
           - ``scalable_eager``: the same with ``compile_loss=False`` (what the compiled CPU update buys);
           - ``scalable_processes``: the same plan on ``ProcessVecEnv`` (worker processes, shared-memory observations:
             the backend for envs EnvPool does not have);
           - ``sbx``: SBX's PPO (JAX) on the fast backend, where installed (``pip install -e ".[bench]"``).

           Each run is a fresh process pinned to cores ``0 .. k-1`` (all its threads), SB3 and SBX with one torch /
           XLA thread; it learns one rollout untimed, then times ``--rollouts`` rollouts. Variants alternate within
           a repeat; ratios are per repeat against ``sb3_dummy``'s run at the same core count, then the median.
``model``  the cost of each stage per env step, measured on this box one stage at a time (env stepping per core,
           EnvPool's scaling over threads, the fused policy step, VecNormalize at 64 / 256 / 1024 envs, the update per
           sample on 1 and on k threads), and what they predict for k cores and for a 16-core box, CPU-only and with
           a GPU update (the H200 figures of results/train_phase_cuda.md).
``report`` rebuild the table and plot from ``scale.json`` / ``cost_model.json``.

Usage (from the repository root, on a quiet box: nothing else running)::

    python benchmarks/scale.py run --tasks Hopper-v5 HalfCheetah-v5 --cores 1 2 --repeats 3
    python benchmarks/scale.py model --tasks Hopper-v5 HalfCheetah-v5
    python benchmarks/scale.py run --device cuda --tasks Hopper-v5 --cores 16 --repeats 2   # on a GPU box

Writes ``scale.md``, ``scale.json``, ``scale.png`` and ``cost_model.md`` / ``.json`` under ``--out``
(default benchmarks/results/scale/).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.end_to_end import header, mujoco_step_us, phase_timer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "scale"
VARIANTS = ("sb3_dummy", "sb3_fast", "scalable", "scalable_eager", "scalable_processes", "sbx")
BASELINE = "sb3_dummy"
#: the config of every row: the large-batch shape (@gpu_const's hyperparameters)
CONFIG: dict[str, Any] = {"n_steps": 256, "batch_size": 2048, "n_epochs": 10, "learning_rate": 1e-3}
N_ENVS = 64


# --------------------------------------------------------------------------------------------------- one run
def _envpool_env(task: str, threads: int, seed: int) -> Any:
    from stable_baselines3.common.vec_env import VecNormalize

    from sb3_ppo_scale.envs import make_envpool_vec_env

    return VecNormalize(make_envpool_vec_env(task, N_ENVS, seed, num_threads=threads))


def build(variant: str, task: str, cores: int, device: str, seed: int = 0) -> Any:
    """The model of ``variant`` on ``task`` for a process that may run on ``cores`` cores."""
    import torch as th
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from sb3_ppo_scale import ScalablePPO
    from sb3_ppo_scale.envs import make_scale_vec_env, plan_scale

    th.set_num_threads(1)
    if variant == "sb3_dummy":
        return PPO("MlpPolicy", VecNormalize(make_vec_env(task, n_envs=N_ENVS, seed=seed)), seed=seed, device=device,
                   **CONFIG)
    if variant == "sb3_fast":
        return PPO("MlpPolicy", _envpool_env(task, cores, seed), seed=seed, device=device, **CONFIG)
    if variant in ("scalable", "scalable_eager", "scalable_processes"):
        backend = "processes" if variant == "scalable_processes" else None
        plan = plan_scale(task, N_ENVS, cores=cores, device=device, backend=backend)
        env, plan = make_scale_vec_env(task, plan=plan, seed=seed, verbose=0)
        kwargs = {**plan.model_kwargs(), **({"compile_loss": False} if variant == "scalable_eager" else {})}
        return ScalablePPO("MlpPolicy", VecNormalize(env), seed=seed, **kwargs, **CONFIG)
    from sbx import PPO as SBXPPO

    return SBXPPO("MlpPolicy", _envpool_env(task, cores, seed), seed=seed, **CONFIG)


def run_once(variant: str, task: str, cores: int, device: str, rollouts: int) -> dict[str, float]:
    """One ``learn()`` run in this process: one rollout untimed, then ``rollouts`` timed, split by phase."""
    from sb3_ppo_scale.envs.known_warnings import filter_known_warnings

    filter_known_warnings()
    model = build(variant, task, cores, device)
    rollout = model.n_steps * model.n_envs
    warmup_start = time.perf_counter()
    model.learn(rollout)  # untimed: warm-up (SBX's jit, CUDA graph capture, torch.compile)
    warmup_s = time.perf_counter() - warmup_start
    timer = phase_timer()
    start, steps_before, cpu_before = time.perf_counter(), model.num_timesteps, time.process_time()
    model.learn(rollouts * rollout, callback=timer, reset_num_timesteps=False)
    wall = time.perf_counter() - start
    return {"steps": model.num_timesteps - steps_before, "wall_s": wall, "collect_s": timer.collect_s,
            "update_s": wall - timer.collect_s, "cpu_s": time.process_time() - cpu_before, "warmup_s": warmup_s}


def _environment() -> dict[str, str]:
    """One torch / BLAS / XLA thread unless the run sets more itself (the plan's update threads)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
            "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}


def run_pinned(variant: str, task: str, cores: int, device: str, rollouts: int) -> dict[str, float]:
    """:func:`run_once` in a fresh process whose threads may run on cores ``0 .. cores-1`` only."""
    allowed = sorted(os.sched_getaffinity(0))[:cores]
    done = subprocess.run([sys.executable, __file__, "_run", variant, task, str(cores), device, str(rollouts)],
                          env=_environment(), capture_output=True, text=True, timeout=3600, cwd=ROOT,
                          preexec_fn=lambda: os.sched_setaffinity(0, allowed))
    if done.returncode != 0:
        raise RuntimeError(f"{variant} {task} on {cores} core(s) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def variants_here(wanted: list[str]) -> list[str]:
    """The variants this box can run: SBX where installed."""
    return [v for v in wanted if v != "sbx" or importlib.util.find_spec("sbx") is not None]


def run_command(args: argparse.Namespace, argv: list[str]) -> None:
    variants = variants_here(args.variants)
    results: dict[str, Any] = {"device": args.device, "runs": {}}
    for task in args.tasks:
        for cores in args.cores:
            key = f"{task}|{cores}"
            results["runs"][key] = {v: [] for v in variants}
            for repeat in range(args.repeats):
                order = variants[repeat % len(variants):] + variants[:repeat % len(variants)]
                for variant in order:
                    run = run_pinned(variant, task, cores, args.device, args.rollouts)
                    results["runs"][key][variant].append(run)
                    print(f"{task} {cores} core(s) {variant:17s} repeat {repeat}: {run['steps'] / run['wall_s']:7.0f} "
                          f"steps/s (collect {run['collect_s']:.2f} s, update {run['update_s']:.2f} s)", flush=True)
    results["raw_step_us"] = {task: mujoco_step_us(task) for task in args.tasks}
    results["header"] = header("Scale on one box: end to end at 1, 2, ... cores", argv, NOTE, script="scale.py")
    args.out.mkdir(parents=True, exist_ok=True)
    previous = _load(args.out / "scale.json")
    if previous and previous.get("device") != args.device:  # keep the other device's rows
        results = {"device": args.device, "runs": results["runs"], "raw_step_us": results["raw_step_us"],
                   "header": results["header"], "other": previous}
    (args.out / "scale.json").write_text(json.dumps(results, indent=1))
    write_report(args.out)


NOTE = ("Same config on every row: 64 envs x 256 steps (16 384 samples a rollout), VecNormalize, minibatch 2048, 10 "
        "epochs, constant lr 1e-3, SB3's default MlpPolicy (64x64 tanh). `learn()` steps/s after one untimed rollout, "
        "each run a fresh process pinned to the first k cores; median over alternating repeats. ratio: against "
        "`sb3_dummy`'s run of the same repeat at the same core count, median [min, max]. efficiency: steps/s at k "
        "cores / (k x steps/s at 1 core), medians. collect / update: seconds per rollout.")


# --------------------------------------------------------------------------------------------------- report
def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _rate(run: dict[str, float]) -> float:
    return run["steps"] / run["wall_s"]


def _per_rollout(run: dict[str, float], phase: str) -> float:
    return run[phase] / run["steps"] * N_ENVS * CONFIG["n_steps"]


def scale_rows(results: dict[str, Any]) -> list[str]:
    rows = ["| task | cores | variant | steps/s | ratio to sb3_dummy | efficiency | collect s | update s | CPU / wall |",
            "|---|---:|---|---:|---|---:|---:|---:|---:|"]
    runs = results["runs"]
    for key, by_variant in runs.items():
        task, cores = key.split("|")
        baseline = by_variant.get(BASELINE, [])
        for variant, vruns in by_variant.items():
            rate = statistics.median(_rate(r) for r in vruns)
            ratios = [_rate(r) / _rate(b) for r, b in zip(vruns, baseline)]
            ratio = (f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]"
                     if variant != BASELINE and ratios else "1")
            one = runs.get(f"{task}|1", {}).get(variant)
            efficiency = (f"{rate / (int(cores) * statistics.median(_rate(r) for r in one)):.2f}" if one else "n/a")
            collect = statistics.median(_per_rollout(r, "collect_s") for r in vruns)
            update = statistics.median(_per_rollout(r, "update_s") for r in vruns)
            busy = statistics.median(r["cpu_s"] / r["wall_s"] for r in vruns)
            rows.append(f"| {task} | {cores} | {variant} | {rate:,.0f} | {ratio} | {efficiency} | {collect:.2f} | "
                        f"{update:.2f} | {busy:.2f} |")
    raw = ", ".join(f"{t} `do_simulation` {us:.0f} us" for t, us in results["raw_step_us"].items())
    return rows + ["", f"Raw env step cost on this box (one MuJoCo step of the task's frame skip, gymnasium): {raw}."]


def write_report(out: Path) -> None:
    results = _load(out / "scale.json")
    assert results is not None, f"no {out / 'scale.json'}: run `scale.py run` first"
    text = list(results["header"])
    text += [f"## Device for the policy and the update: {results['device']}", "", *scale_rows(results)]
    if "other" in results:
        other = results["other"]
        text += ["", f"## Device for the policy and the update: {other['device']}", "", *other["header"][2:3],
                 "", *scale_rows(other)]
    model = _load(out / "cost_model.json")
    if model is not None:
        text += ["", "## What the cost model predicts (cost_model.md)", "", *prediction_rows(model)]
        write_cost_model(model, out)
    (out / "scale.md").write_text("\n".join(text) + "\n")
    plot(results, out / "scale.png")
    print("\n".join(text))


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({key.split("|")[0] for key in results["runs"]})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        keys = sorted((k for k in results["runs"] if k.startswith(task + "|")), key=lambda k: int(k.split("|")[1]))
        cores = [int(k.split("|")[1]) for k in keys]
        for variant in dict.fromkeys(v for k in keys for v in results["runs"][k]):  # every variant the runs have
            rates = [statistics.median(_rate(r) for r in results["runs"][k][variant])
                     for k in keys if variant in results["runs"][k]]
            if len(rates) == len(keys):
                ax.plot(cores, rates, marker="o", label=variant)
        ax.set_xticks(cores)
        ax.set_xlabel("cores")
        ax.set_ylabel("end-to-end env steps/s")
        ax.set_title(f"{task} ({results['device']})")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# --------------------------------------------------------------------------------------------------- cost model
def _timed(fn: Any, repeats: int = 5) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def env_step_us(task: str, threads: int, steps: int = 128) -> float:
    """Wall microseconds per env step of EnvPool (64 envs, random actions) on ``threads`` threads."""
    from sb3_ppo_scale.envs import make_envpool_vec_env

    env = make_envpool_vec_env(task, N_ENVS, 0, num_threads=threads)
    env.reset()
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (steps, N_ENVS, *env.action_space.shape)).astype(np.float32)

    def run() -> None:
        for row in actions:
            env.step(row)

    seconds = _timed(run, 3)
    env.close()
    return seconds / (steps * N_ENVS) * 1e6


def policy_step_us(task: str) -> float:
    """Microseconds per env step of ScalablePPO's fused policy call at 64 envs (one torch thread)."""
    import torch as th

    from sb3_ppo_scale import ScalablePPO
    from sb3_ppo_scale.core.collect.graphed_step import collection_step
    from sb3_ppo_scale.envs import make_envpool_vec_env

    model = ScalablePPO("MlpPolicy", make_envpool_vec_env(task, N_ENVS, 0, num_threads=1), device="cpu", **CONFIG)
    act = collection_step(model)
    obs = th.zeros((N_ENVS, *model.observation_space.shape))

    def run() -> None:
        with th.inference_mode():
            for _ in range(100):
                act(obs, None)

    return _timed(run) / (100 * N_ENVS) * 1e6


def vec_normalize_us(task: str, n_envs: int) -> dict[str, float]:
    """Microseconds per env step of VecNormalize's own work at ``n_envs`` envs: SB3's ``step_wait`` against the
    lean step's (the physics left out: a VecEnv that returns fixed arrays)."""
    from gymnasium import spaces
    from stable_baselines3.common.vec_env import VecEnv, VecNormalize

    from sb3_ppo_scale.core.collect.vec_step import vec_env_step

    from sb3_ppo_scale.envs import make_envpool_vec_env

    probe = make_envpool_vec_env(task, 1, 0)
    obs_space, act_space = probe.observation_space, probe.action_space
    probe.close()

    class Fixed(VecEnv):
        def __init__(self) -> None:
            super().__init__(n_envs, obs_space, act_space)
            self.obs = np.random.default_rng(0).normal(size=(n_envs, *obs_space.shape)).astype(np.float32)

        def reset(self) -> np.ndarray:
            return self.obs.copy()

        def step_async(self, actions: np.ndarray) -> None:
            pass

        def step_wait(self) -> Any:
            return self.obs.copy(), np.ones(n_envs, np.float32), np.zeros(n_envs, bool), [{} for _ in range(n_envs)]

        def close(self) -> None: ...
        def get_attr(self, *a: Any, **k: Any) -> Any: return [None] * n_envs
        def set_attr(self, *a: Any, **k: Any) -> None: ...
        def env_method(self, *a: Any, **k: Any) -> Any: return [None] * n_envs
        def env_is_wrapped(self, *a: Any, **k: Any) -> Any: return [False] * n_envs

    assert isinstance(act_space, spaces.Box)
    actions = np.zeros((n_envs, *act_space.shape), np.float32)
    bare, normalized = Fixed(), VecNormalize(Fixed())
    normalized.reset()
    lean = vec_env_step(normalized)
    out = {}
    for name, step in (("bare", bare.step), ("sb3", normalized.step), ("lean", lean)):
        out[name] = _timed(lambda step=step: [step(actions) for _ in range(50)]) / (50 * n_envs) * 1e6
    return {"sb3": out["sb3"] - out["bare"], "lean": out["lean"] - out["bare"]}


def update_us_per_sample(task: str, threads: int) -> float:
    """Microseconds of ScalablePPO's eager ``train()`` per rollout sample (10 epochs of minibatch 2048) on ``threads``
    torch threads (the plan compiles it where a C++ compiler is found: the ``scalable_eager`` rows of ``run`` show
    what that changes)."""
    import torch as th

    from sb3_ppo_scale import ScalablePPO
    from sb3_ppo_scale.envs import make_envpool_vec_env

    th.set_num_threads(1)
    model = ScalablePPO("MlpPolicy", make_envpool_vec_env(task, N_ENVS, 0, num_threads=1), device="cpu",
                        update_threads=threads, **CONFIG)
    model.learn(N_ENVS * CONFIG["n_steps"])
    return _timed(model.train, 3) / (N_ENVS * CONFIG["n_steps"]) * 1e6


def model_command(args: argparse.Namespace, argv: list[str]) -> None:
    import torch as th

    th.set_num_threads(1)
    cores = len(os.sched_getaffinity(0))
    measured: dict[str, Any] = {"cores": cores, "tasks": {}}
    for task in args.tasks:
        stage = {
            "raw_step_us": mujoco_step_us(task),
            "env_us": {str(k): env_step_us(task, k) for k in sorted({1, cores})},
            "policy_us": policy_step_us(task),
            "vec_normalize_us": {str(n): vec_normalize_us(task, n) for n in (64, 256, 1024)},
            "update_us": {str(k): update_us_per_sample(task, k) for k in sorted({1, cores})},
        }
        measured["tasks"][task] = stage
        print(task, json.dumps(stage), flush=True)
    measured["header"] = header("Scale on one box: the cost of each stage per env step", argv, MODEL_NOTE,
                                script="scale.py")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cost_model.json").write_text(json.dumps(measured, indent=1))
    print(write_cost_model(measured, args.out))


def write_cost_model(measured: dict[str, Any], out: Path) -> str:
    """``cost_model.md`` from the measured stages (the ``model`` command's, or ``cost_model.json``'s)."""
    text = "\n".join([*measured["header"], *stage_rows(measured), "", "## What the stages predict", "",
                      *prediction_rows(measured)]) + "\n"
    (out / "cost_model.md").write_text(text)
    return text


MODEL_NOTE = ("Each stage timed alone on this box, one torch thread unless stated, microseconds per env step (the "
              "update: per rollout sample, 10 epochs of minibatch 2048, 64x64 tanh MlpPolicy). env: EnvPool with 64 "
              "envs and random actions, wall time per env step on k threads. VecNormalize: its own work per env "
              "step (SB3's `step_wait` and the lean step, a VecEnv without physics underneath).")


def stage_rows(measured: dict[str, Any]) -> list[str]:
    cores = measured["cores"]
    rows = [f"| task | raw `do_simulation` | env, 1 thread | env, {cores} threads | policy step (fused) | "
            "VecNormalize SB3 / lean at 64, 256, 1024 envs | update, 1 thread | update, "
            f"{cores} threads |", "|---|---:|---:|---:|---:|---|---:|---:|"]
    for task, s in measured["tasks"].items():
        vn = ", ".join(f"{v['sb3']:.2f} / {v['lean']:.2f}" for v in s["vec_normalize_us"].values())
        rows.append(f"| {task} | {s['raw_step_us']:.0f} | {s['env_us']['1']:.1f} | {s['env_us'][str(cores)]:.1f} | "
                    f"{s['policy_us']:.2f} | {vn} | {s['update_us']['1']:.1f} | {s['update_us'][str(cores)]:.1f} |")
    return rows


#: the H200's ``train()`` figures (``python benchmarks/train_phase.py --device cuda``), read by :func:`gpu_update_us`
TRAIN_PHASE_CUDA = ROOT / "benchmarks" / "results" / "train_phase_cuda.md"


def predict(stage: dict[str, Any], cores: int, measured_cores: int, gpu_update_us: float | None = None) -> float:
    """Predicted end-to-end steps/s on ``cores`` cores: env stepping spread over the cores (at the efficiency
    measured from 1 to ``measured_cores`` threads), plus the policy step and the lean VecNormalize in the Python
    thread, plus the update (on the CPU: Amdahl's law fitted to the 1- and ``measured_cores``-thread times; or
    ``gpu_update_us`` per sample)."""
    env1, envk = stage["env_us"]["1"], stage["env_us"][str(measured_cores)]
    efficiency = min(1.0, env1 / (envk * measured_cores)) if measured_cores > 1 else 1.0
    env = env1 / (1 + (cores - 1) * efficiency)
    python = stage["policy_us"] + stage["vec_normalize_us"]["64"]["lean"]
    if gpu_update_us is not None:
        update = gpu_update_us
    else:
        u1, uk = stage["update_us"]["1"], stage["update_us"][str(measured_cores)]
        parallel = 0.0 if measured_cores == 1 else max(0.0, min(1.0, (1 - uk / u1) / (1 - 1 / measured_cores)))
        update = u1 * ((1 - parallel) + parallel / cores)
    return 1e6 / (env + python + update)


def gpu_update_us(epochs: int = CONFIG["n_epochs"]) -> float | None:
    """Microseconds per rollout sample of ``epochs`` epochs of ``train()`` with ``cuda_graphs=True`` on the H200, from
    the committed results/train_phase_cuda.md: the geometric mean of its HalfCheetah-shaped minibatch 1,024 and 4,096
    rows (our minibatch, 2048, lies between). None where the file or the rows are missing."""
    if not TRAIN_PHASE_CUDA.exists():
        return None
    rates, section = {}, ""
    for line in TRAIN_PHASE_CUDA.read_text().splitlines():
        section = line if line.startswith("## ") else section
        cells = [c.strip().replace(",", "") for c in line.strip("|").split("|")]
        if "halfcheetah" in section and cells[0] in ("1024", "4096") and len(cells) >= 6:
            rates[cells[0]] = float(cells[4])  # ScalablePPO cuda_graphs samples/s (one epoch)
    if len(rates) != 2:
        return None
    return epochs * 1e6 / float(np.sqrt(rates["1024"] * rates["4096"]))


def prediction_rows(measured: dict[str, Any]) -> list[str]:
    cores = measured["cores"]
    gpu = gpu_update_us()
    rows = ["| task | predicted steps/s at 1 core | at " + f"{cores} cores | 16 cores, CPU update | 16 cores, H200 update "
            "| stage that bounds 16 cores |", "|---|---:|---:|---:|---:|---|"]
    for task, s in measured["tasks"].items():
        at = [predict(s, k, cores) for k in (1, cores, 16)]
        at_gpu = f"{predict(s, 16, cores, gpu):,.0f}" if gpu is not None else "n/a"
        env16 = s["env_us"]["1"] / 16
        python = s["policy_us"] + s["vec_normalize_us"]["64"]["lean"]
        bound = max((env16, "env stepping"), (python, "the Python thread (policy + VecNormalize)"))[1]
        rows.append(f"| {task} | {at[0]:,.0f} | {at[1]:,.0f} | {at[2]:,.0f} | {at_gpu} | {bound} |")
    return rows + ["", "Prediction: 1e6 / (env us / effective cores + policy us + lean VecNormalize us + update us), "
                   "env threads scaling at the efficiency measured here, the CPU update by Amdahl's law fitted to "
                   "its 1- and k-thread times, the H200 update from results/train_phase_cuda.md (cuda_graphs=True, "
                   "minibatch 4096). It assumes what the measurements do: one Python thread, no overlap between "
                   "stages, the envs' threads free of other work."]


# --------------------------------------------------------------------------------------------------- CLI
def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_run":
        variant, task, cores, device, rollouts = sys.argv[2:7]
        print(json.dumps(run_once(variant, task, int(cores), device, int(rollouts))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "model", "report"):
        sub = commands.add_parser(name)
        sub.add_argument("--out", type=Path, default=RESULTS)
        if name == "report":
            continue
        sub.add_argument("--tasks", nargs="+", default=["Hopper-v5", "HalfCheetah-v5"])
        if name == "run":
            all_cores = len(os.sched_getaffinity(0))
            sub.add_argument("--cores", type=int, nargs="+", default=sorted({1, 2, all_cores} & set(range(1, all_cores + 1))))
            sub.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
            sub.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
            sub.add_argument("--repeats", type=int, default=3)
            sub.add_argument("--rollouts", type=int, default=2, help="rollouts timed per run (default 2)")
    args = parser.parse_args()
    argv = sys.argv[1:]
    if args.command == "run":
        run_command(args, argv)
    elif args.command == "model":
        model_command(args, argv)
    else:
        write_report(args.out)


if __name__ == "__main__":
    main()
