"""Rollout collection with EnvPool against SB3's VecEnvs (issue 14), on one process with pinned torch threads.

Three measurements, each writing a markdown table (command and machine line included) and a PNG under
benchmarks/results/:

``collect``   collection steps/s through SB3's ``collect_rollouts`` (policy inference included: MlpPolicy for
              HalfCheetah-v5, CnnPolicy for Pong-v5), at 1/4/16/64 envs, for DummyVecEnv, SubprocVecEnv and the
              EnvPool VecEnv; medians over alternating repeats, ratios to SB3's best VecEnv at that size. (Its
              committed tables also have the overlapped EnvPool collector, removed since: benchmarks/scale.py.)
``ceiling``   EnvPool's own stepping rate at 64 envs without a policy (what any collector can reach).
``learn``     ``learn()`` steps/s end to end at the same config: SB3 PPO + its best VecEnv against ScalablePPO +
              EnvPool, with a profile splitting the time into env stepping, inference,
              bookkeeping and the update.
``learning``  ScalablePPO on EnvPool HalfCheetah-v5 against the Gymnasium env at the same budget and seeds
              (HalfCheetah-v5@cpu_linear hyperparameters): final training return and deterministic evaluation on the
              Gymnasium env.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/collection.py collect|ceiling|learn|learning [options]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecFrameStack, VecNormalize

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.envs import make_envpool_vec_env
from sb3_ppo_scale.experiments.zoo import load_config

RESULTS = Path(__file__).resolve().parent / "results"
ATARI_GYM_ID = "PongNoFrameskip-v4"
KINDS = ("dummy", "subproc", "envpool")


# --------------------------------------------------------------------------------------------------- helpers
_LOAD_AT_START = os.getloadavg()


def machine_line() -> str:
    start, end = _LOAD_AT_START, os.getloadavg()
    return (
        f"torch {th.__version__}, torch threads {th.get_num_threads()}, {platform.machine()} {os.cpu_count()} cores, "
        f"python {platform.python_version()}, load average (1 min) {start[0]:.1f} at the start and {end[0]:.1f} at the "
        "end (a shared box: other jobs ran alongside when it is above ~2)"
    )


def header(title: str, argv: list[str]) -> list[str]:
    return [
        f"# {title}",
        "",
        f"Produced by `OMP_NUM_THREADS=1 python benchmarks/collection.py {' '.join(argv)}` on "
        f"{time.strftime('%Y-%m-%d')}; {machine_line()}.",
        "",
    ]


def make_env(task: str, kind: str, n_envs: int, seed: int) -> VecEnv:
    """``task``: HalfCheetah-v5 or Pong-v5; ``kind``: one of :data:`KINDS`."""
    if kind.startswith("envpool"):
        return make_envpool_vec_env(task, n_envs, seed=seed)
    vec_cls = DummyVecEnv if kind == "dummy" else SubprocVecEnv
    if task == "Pong-v5":  # SB3's AtariWrapper + 4-frame stack, as the zoo trains Pong
        return VecFrameStack(make_atari_env(_gym_pong, n_envs=n_envs, seed=seed, vec_env_cls=vec_cls), 4)
    return make_vec_env(task, n_envs=n_envs, seed=seed, vec_env_cls=vec_cls)


def _gym_pong(**kwargs: Any) -> Any:
    """Gymnasium's PongNoFrameskip-v4 (registers ALE's envs first: also runs in SubprocVecEnv's workers)."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    return gym.make(ATARI_GYM_ID, **kwargs)


def policy_for(task: str) -> str:
    return "CnnPolicy" if task == "Pong-v5" else "MlpPolicy"


class _NoCallback(BaseCallback):
    def _on_step(self) -> bool:
        return True


def prepared(model: PPO, kind: str) -> Callable[[], None]:
    """One rollout of ``model.n_steps`` steps per env with the model's ``collect_rollouts``."""
    _, callback = model._setup_learn(10**9, _NoCallback())  # resets the env, creates the episode buffers
    collect = type(model).collect_rollouts

    def run() -> None:
        collect(model, model.env, callback, model.rollout_buffer, model.n_steps)

    return run


# --------------------------------------------------------------------------------------------------- collect
def bench_collect(args: argparse.Namespace) -> None:
    rows: dict[tuple[str, int], dict[str, float]] = {}
    raw: dict[str, dict[str, list[float]]] = {}  # every repeat's steps/s, written next to the table
    for task in args.tasks:
        for n_envs in args.n_envs:
            n_steps = max((args.atari_samples if task == "Pong-v5" else args.samples) // n_envs, 8)
            runners = {}
            for kind in args.kinds:
                if kind == "subproc" and n_envs > args.max_subproc:
                    continue
                model = PPO(policy_for(task), make_env(task, kind, n_envs, 0), n_steps=n_steps, batch_size=n_steps * n_envs,
                            seed=0, device="cpu")
                runners[kind] = prepared(model, kind)
                runners[kind]()  # warm-up
            times: dict[str, list[float]] = {kind: [] for kind in runners}
            for _ in range(args.repeats):  # alternating repeats
                for kind, run in runners.items():
                    start = time.perf_counter()
                    run()
                    times[kind].append(time.perf_counter() - start)
            rows[(task, n_envs)] = {k: n_steps * n_envs / statistics.median(v) for k, v in times.items()}
            raw[f"{task} {n_envs}"] = {k: [n_steps * n_envs / t for t in v] for k, v in times.items()}
            print(task, n_envs, {k: round(v) for k, v in rows[(task, n_envs)].items()}, flush=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"load_average_end": os.getloadavg(), "steps_per_s": raw}))
    write_collect(args, rows)


def write_collect(args: argparse.Namespace, rows: dict[tuple[str, int], dict[str, float]]) -> None:
    lines = header("Collection steps/s: EnvPool against SB3's VecEnvs", sys.argv[1:])
    lines += [
        f"SB3's `PPO.collect_rollouts` (policy inference included: MlpPolicy for HalfCheetah-v5, CnnPolicy for Pong-v5; "
        f"1 torch thread) filling a rollout of ~{args.samples} steps (Pong: ~{args.atari_samples}), median over {args.repeats} alternating repeats "
        "after one warm-up rollout. Pong with SB3: `PongNoFrameskip-v4` + AtariWrapper + VecFrameStack(4); with "
        "EnvPool: `Pong-v5` with the AtariWrapper-matching settings. ratio = steps/s / SB3's best VecEnv (DummyVecEnv or SubprocVecEnv) at that size. "
        f"SubprocVecEnv is measured up to {args.max_subproc} envs (one process per env; on a quiet box with few cores it "
        "only gets slower with more processes). Every repeat's steps/s: the .json file of the same name.",
        "",
    ]
    for task in args.tasks:
        lines += [f"## {task}", "", "| envs | " + " | ".join(f"{k} steps/s" for k in args.kinds)
                  + " | envpool / best SB3 |", "|---:" * (len(args.kinds) + 2) + "|"]
        for n_envs in args.n_envs:
            row = rows[(task, n_envs)]
            best = max(v for k, v in row.items() if not k.startswith("envpool"))
            cells = [f"{row[k]:,.0f}" if k in row else "-" for k in args.kinds]
            ratios = [f"{row[k] / best:.2f}" if k in row else "-" for k in ("envpool",)]
            lines.append(f"| {n_envs} | " + " | ".join(cells + ratios) + " |")
        lines.append("")
    out = RESULTS / f"{args.name}.md"
    out.write_text("\n".join(lines) + "\n")
    plot_collect(args, rows, RESULTS / f"{args.name}.png")
    print(out.read_text())


def plot_collect(args: argparse.Namespace, rows: dict[tuple[str, int], dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.tasks), figsize=(5.5 * len(args.tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], args.tasks):
        for kind in args.kinds:
            points = [(n, rows[(task, n)][kind]) for n in args.n_envs if kind in rows[(task, n)]]
            ax.plot(*zip(*points), marker="o", label=kind)
        ax.set(xscale="log", yscale="log", xlabel="envs", ylabel="collection steps/s (inference included)", title=task)
        ax.set_xticks(args.n_envs, [str(n) for n in args.n_envs])
        ax.legend()
    load = os.getloadavg()
    fig.suptitle(f"1 torch thread, {os.cpu_count()} cores, load average {load[0]:.1f} (1 min) at the end", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ------------------------------------------------------------------------------------------------ ceiling
def bench_ceiling(args: argparse.Namespace) -> None:
    """EnvPool's own stepping rate (no policy, zero actions, sync steps of all envs) per EnvPool thread count."""
    from sb3_ppo_scale.envs.tasks import import_envpool

    envpool = import_envpool()
    lines = header("EnvPool's stepping ceiling (no policy)", sys.argv[1:])
    lines += [f"`envpool.make(task, num_envs={args.n_envs}, num_threads=T).step(zeros)` for {args.steps} steps, median "
              f"of {args.repeats} repeats: the most any collector can get from EnvPool on this box.", "",
              "| task | EnvPool threads | steps/s |", "|---|---:|---:|"]
    for task in args.tasks:
        for threads in args.threads:
            pool = envpool.make(task, env_type="gymnasium", num_envs=args.n_envs, seed=0, num_threads=threads)
            pool.reset()
            actions = np.zeros((args.n_envs, *pool.action_space.shape), pool.action_space.dtype)
            rates = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                for _ in range(args.steps):
                    pool.step(actions)
                rates.append(args.steps * args.n_envs / (time.perf_counter() - start))
            lines.append(f"| {task} | {threads or 'default'} | {statistics.median(rates):,.0f} |")
            print(lines[-1], flush=True)
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------------------------ learn()
class Profile:
    """Wall seconds per phase of ``learn()``: env stepping, policy inference, update, and the rest (bookkeeping)."""

    def __init__(self) -> None:
        self.seconds = {"env": 0.0, "inference": 0.0, "update": 0.0}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start


def instrument(model: PPO, profile: Profile) -> None:
    """Time ``model``'s env calls, policy forward passes and ``train()`` (instance-level wrappers)."""
    venv = model.env.venv if isinstance(model.env, VecNormalize) else model.env
    targets = [(venv, "step_wait", "env"), (model.policy, "forward", "inference"),
               (model.policy, "predict_values", "inference"), (model, "train", "update")]
    for obj, name, phase in targets:
        original = getattr(obj, name)

        def timed(*a: Any, _original: Callable = original, _phase: str = phase, **k: Any) -> Any:
            with profile.phase(_phase):
                return _original(*a, **k)

        setattr(obj, name, timed)


def bench_learn(args: argparse.Namespace) -> None:
    variant = None if args.variant == "plain" else args.variant
    config = load_config(None, ATARI_GYM_ID if args.env == "Pong-v5" else args.env, variant)
    runs = [("SB3 PPO", PPO, best) for best in args.sb3_vec_env] + [
        ("ScalablePPO", ScalablePPO, "envpool")]
    results: dict[str, list[tuple[float, dict[str, float]]]] = {}
    for repeat in range(args.repeats):
        for label, algo, kind in runs:
            env = make_env(args.env, kind, config.n_envs, seed=repeat)
            if config.normalize is not None:
                env = VecNormalize(env, **config.normalize)
            model = algo(config.policy, env, seed=repeat, device="cpu", **config.model_kwargs)
            profile = Profile()
            instrument(model, profile)
            start = time.perf_counter()
            model.learn(args.timesteps)
            wall = time.perf_counter() - start
            env.close()
            key = f"{label} + {kind}"
            rest = wall - sum(profile.seconds.values())
            results.setdefault(key, []).append((args.timesteps / wall, {**profile.seconds, "rest": rest, "wall": wall}))
            print(key, round(args.timesteps / wall), {k: round(v, 2) for k, v in profile.seconds.items()}, flush=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"load_average_end": os.getloadavg(), "runs": results}))
    write_learn(args, config.entry, results)


def write_learn(args: argparse.Namespace, entry: str, results: dict[str, list]) -> None:
    lines = header(f"learn() end to end: {args.env} ({entry})", sys.argv[1:])
    base = max(statistics.median(r[0] for r in v) for k, v in results.items() if k.startswith("SB3"))
    lines += [
        f"`learn({args.timesteps})` with the entry's hyperparameters for every row (same config), CPU, 1 torch thread, "
        f"median over {args.repeats} alternating repeats (seed = repeat). Profile (median seconds per run): env = "
        "time inside the VecEnv's step, inference = policy forward passes "
        "(actions, values, terminal-observation values), update = `train()`, rest = bookkeeping (buffer, "
        "VecNormalize, callbacks, tensor conversion; wall minus the three, per run). Each column is a median on its own, "
        "so a row need not add up. ratio = steps/s / SB3 PPO's best. Every run: the .json file of the same name.",
        "",
        "| run | steps/s | ratio | env s | inference s | update s | rest s | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, runs in results.items():
        med = {k: statistics.median(r[1][k] for r in runs) for k in ("env", "inference", "update", "rest", "wall")}
        speed = statistics.median(r[0] for r in runs)
        lines.append(f"| {key} | {speed:,.0f} | {speed / base:.2f} | {med['env']:.2f} | {med['inference']:.2f} | "
                     f"{med['update']:.2f} | {med['rest']:.2f} | {med['wall']:.2f} |")
    out = RESULTS / f"{args.name}.md"
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


# ----------------------------------------------------------------------------------------------- learning
class Curve(BaseCallback):
    """Mean of the last 10 Monitor episode returns after each rollout: [(timesteps, mean return)]."""

    def __init__(self) -> None:
        super().__init__()
        self.points: list[tuple[int, float]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        episodes = list(self.model.ep_info_buffer)[-10:]
        if episodes:
            self.points.append((self.num_timesteps, float(np.mean([e["r"] for e in episodes]))))


def evaluate_on_gymnasium(model: PPO, env_id: str, obs_rms: Any, episodes: int, seed: int) -> float:
    """Mean deterministic return over ``episodes`` episodes of the Gymnasium env (obs normalised with ``obs_rms``)."""
    env = VecNormalize(make_vec_env(env_id, n_envs=1, seed=10_000 + seed), training=False, norm_reward=False)
    env.obs_rms = obs_rms
    returns, total, obs = [], 0.0, env.reset()
    while len(returns) < episodes:
        obs, _, done, infos = env.step(model.predict(obs, deterministic=True)[0])
        if done[0]:
            returns.append(infos[0]["episode"]["r"])
    return float(np.mean(returns))


def bench_learning(args: argparse.Namespace) -> None:
    config = load_config(None, args.env, args.variant)
    runs_dir = RESULTS / args.name
    runs_dir.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for kind in ("gymnasium", "envpool"):
            path = runs_dir / f"{kind}_seed{seed}.json"
            if path.exists():
                continue
            env = make_envpool_vec_env(args.env, config.n_envs, seed=seed) if kind == "envpool" else make_vec_env(
                args.env, n_envs=config.n_envs, seed=seed)
            env = VecNormalize(env, **(config.normalize or {}))
            model = ScalablePPO(config.policy, env, seed=seed, device="cpu", **config.model_kwargs)
            curve = Curve()
            start = time.perf_counter()
            model.learn(args.timesteps, callback=curve)
            wall = time.perf_counter() - start
            final = float(np.mean([e["r"] for e in list(model.ep_info_buffer)[-10:]]))
            evaluation = evaluate_on_gymnasium(model, args.env, env.obs_rms, args.eval_episodes, seed)
            record = {"kind": kind, "seed": seed, "load_average_after": os.getloadavg()[0], "timesteps": args.timesteps, "wall_s": wall, "final_train_return": final,
                      "eval_return_gymnasium": evaluation, "curve": curve.points}
            path.write_text(json.dumps(record))
            print(kind, seed, round(final, 1), round(evaluation, 1), round(wall), flush=True)
    write_learning(args, config.entry, runs_dir)


def interval(values: list[float]) -> str:
    """Mean and a 95% t-interval (Student t, n-1 degrees of freedom)."""
    from scipy import stats

    mean = float(np.mean(values))
    if len(values) < 2:
        return f"{mean:.0f}"
    half = stats.t.ppf(0.975, len(values) - 1) * stats.sem(values)
    return f"{mean:.0f} [{mean - half:.0f}, {mean + half:.0f}]"


def write_learning(args: argparse.Namespace, entry: str, runs_dir: Path) -> None:
    records = [json.loads(p.read_text()) for p in sorted(runs_dir.glob("*.json"))]
    lines = header(f"Learning check: ScalablePPO on EnvPool {args.env} against the Gymnasium env", sys.argv[1:])
    lines += [
        f"ScalablePPO with the `{entry}` hyperparameters (VecNormalize, 4 envs), {args.timesteps:,} steps, seeds "
        f"{sorted({r['seed'] for r in records})}, one process, 1 torch thread. Gymnasium: `make_vec_env` + DummyVecEnv; "
        "EnvPool: `make_envpool_vec_env` (env i seeded seed + i in both; the random streams differ). Final training "
        f"return: mean of the last 10 training episodes; evaluation: {args.eval_episodes} deterministic episodes on the "
        "*Gymnasium* env (VecNormalize statistics of the run). Mean and 95% t-interval over seeds.",
        "",
        "| envs | seeds | final training return | evaluation return (Gymnasium env) | per seed (training / evaluation) "
        "| training steps/s |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for kind in ("gymnasium", "envpool"):
        runs = [r for r in records if r["kind"] == kind]
        if runs:
            speed = statistics.median(r["timesteps"] / r["wall_s"] for r in runs)
            lines.append(f"| {kind} | {len(runs)} | {interval([r['final_train_return'] for r in runs])} | "
                         f"{interval([r['eval_return_gymnasium'] for r in runs])} | "
                         + ", ".join(f"seed {r['seed']}: {r['final_train_return']:.0f} / {r['eval_return_gymnasium']:.0f}"
                                     for r in sorted(runs, key=lambda r: r["seed"])) + f" | {speed:,.0f} |")
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    plot_learning(records, RESULTS / f"{args.name}.png", args.env)
    print((RESULTS / f"{args.name}.md").read_text())


def plot_learning(records: list[dict], path: Path, env_id: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for record in records:
        steps, returns = zip(*record["curve"]) if record["curve"] else ((), ())
        ax.plot(steps, returns, color="C0" if record["kind"] == "gymnasium" else "C1", alpha=0.8,
                label=f"{record['kind']} seed {record['seed']}")
    ax.set(xlabel="steps", ylabel="training return (last 10 episodes)", title=f"ScalablePPO {env_id}: Gymnasium vs EnvPool")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    th.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    collect = sub.add_parser("collect")
    collect.add_argument("--tasks", nargs="+", default=["HalfCheetah-v5", "Pong-v5"], choices=["HalfCheetah-v5", "Pong-v5"])
    collect.add_argument("--n-envs", nargs="+", type=int, default=[1, 4, 16, 64])
    collect.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    collect.add_argument("--samples", type=int, default=4096, help="steps per timed rollout (all envs), MuJoCo")
    collect.add_argument("--atari-samples", type=int, default=1024, help="steps per timed rollout (all envs), Pong")
    collect.add_argument("--repeats", type=int, default=5)
    collect.add_argument("--max-subproc", type=int, default=16, help="skip SubprocVecEnv above this many envs")
    collect.add_argument("--name", default="collection")
    ceiling = sub.add_parser("ceiling")
    ceiling.add_argument("--tasks", nargs="+", default=["HalfCheetah-v5", "Pong-v5"])
    ceiling.add_argument("--n-envs", type=int, default=64)
    ceiling.add_argument("--threads", nargs="+", type=int, default=[0, 1, 2], help="0: EnvPool's default")
    ceiling.add_argument("--steps", type=int, default=300)
    ceiling.add_argument("--repeats", type=int, default=3)
    ceiling.add_argument("--name", default="collection_ceiling")
    learn = sub.add_parser("learn")
    learn.add_argument("--env", default="HalfCheetah-v5", choices=["HalfCheetah-v5", "Pong-v5"])
    learn.add_argument("--variant", default="gpu", help="config variant; 'plain' for the entry itself")
    learn.add_argument("--sb3-vec-env", nargs="+", default=["dummy"], choices=["dummy", "subproc"])
    learn.add_argument("--timesteps", type=int, default=65_536)
    learn.add_argument("--repeats", type=int, default=3)
    learn.add_argument("--name", default="collection_learn")
    learning = sub.add_parser("learning")
    learning.add_argument("--env", default="HalfCheetah-v5")
    learning.add_argument("--variant", default="cpu_linear")
    learning.add_argument("--timesteps", type=int, default=150_000)
    learning.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    learning.add_argument("--eval-episodes", type=int, default=5)
    learning.add_argument("--name", default="collection_learning")
    args = parser.parse_args(argv)
    {"collect": bench_collect, "ceiling": bench_ceiling, "learn": bench_learn, "learning": bench_learning}[args.command](args)


if __name__ == "__main__":
    main()
