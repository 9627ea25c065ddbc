"""Data-parallel scaling of ScalablePPO under torchrun: env steps/s and learning at 1, 2, ... processes.

Every configuration trains the same zoo entry with the same GLOBAL batch and the same total env steps: with ``n``
processes each rank runs ``n_envs / n`` envs (so the global rollout, the global minibatch and the number of
optimizer steps per rollout are those of one process) and trains on ``batch_size / n`` samples of every minibatch.
One process runs without a process group (ScalablePPO's plain path, identical to SB3 PPO for these configs); ``n
>= 2`` are launched with ``python -m torch.distributed.run --standalone --nproc-per-node n`` (gloo). Every process
uses one torch thread (``OMP_NUM_THREADS=1``). SB3's PPO (one process) runs in the same alternation as a reference.

    python benchmarks/scaling.py throughput [--procs 1 2] [--repeats 3] [--timesteps 20480]
    python benchmarks/scaling.py learning [--procs 1 2] [--seeds 0 1] [--timesteps 150000] [--threshold 1500]
    python benchmarks/scaling.py profile [--procs 2]
    python benchmarks/scaling.py collectives
    python benchmarks/scaling.py report [--threshold 1500]

``throughput``: env steps/s of the whole ``learn()`` (collection + update) on rank 0, repeats alternating over the
process counts; efficiency(n) = throughput(n) / (n x throughput(1)) from the medians. Each rank also reports where
its time went (collection, update, and the gradient all-reduce inside the update, which includes waiting for the
slower rank). ``profile`` runs the largest count once more with a barrier before every gradient all-reduce, to
split that time into waiting for the other rank (stragglers) and the all-reduce itself.
``collectives``: the latency of one all-reduce alone (2 processes) at the two sizes the update sends per minibatch.
``learning``: periodic deterministic evaluations on rank 0 (5 episodes every ``--eval-freq`` steps, not counted in
the training time); final return, and the training time until the evaluation return first reaches ``--threshold``.
``report``: ``benchmarks/results/scaling.md`` and ``scaling.png`` from the JSON runs in
``benchmarks/results/scaling_runs/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = RESULTS / "scaling_runs"
DEFAULT_ENTRY = "HalfCheetah-v5@cpu_linear"


# ------------------------------------------------------------------------------------------------ worker
def _worker(args: argparse.Namespace) -> None:
    """One rank (or the single process): train, time, and (rank 0) write the run's JSON."""
    import torch as th
    import torch.distributed as dist

    th.set_num_threads(1)
    from sb3_ppo_scale import distributed as dp
    from sb3_ppo_scale.experiments import zoo
    from sb3_ppo_scale.experiments.pipeline import EVAL_SEED_OFFSET, PeriodicEvalCallback

    world = dp.torchrun_world_size()
    env_id, _, variant = args.entry.partition("@")
    overrides = zoo.parse_overrides(args.overrides)
    probe = zoo.load_config(None, env_id, variant or None, overrides)
    if probe.n_envs % world:
        raise ValueError(f"n_envs={probe.n_envs} of {args.entry} is not divisible by {world} processes")
    config = zoo.load_config(None, env_id, variant or None, {**overrides, "n_envs": probe.n_envs // world})
    env = zoo.make_envs(config, seed=args.seed)
    if args.algo == "sb3":
        from stable_baselines3 import PPO

        model = zoo.build_model(config, env, algo=PPO, seed=args.seed, device="cpu")
    else:
        model = zoo.build_model(config, env, seed=args.seed, device="cpu")
    profile = _instrument(model, barrier=args.split_wait)
    callback = None
    if args.eval_freq > 0 and dp.is_main_process():
        eval_env = zoo.make_envs(config, n_envs=1, seed=args.seed + EVAL_SEED_OFFSET, eval_env=True)
        callback = PeriodicEvalCallback(eval_env, args.eval_freq, args.eval_episodes, eval_at_end=True)
    if world > 1:  # a group now (the model would make it at learn()), so that every rank starts the clock together
        dp.init_process_group(model.device)
        dist.barrier()
    start = time.perf_counter()
    model.learn(args.timesteps, callback=callback)
    wall = time.perf_counter() - start
    profile["wall_s"] = wall
    ranks = [profile]
    if world > 1:
        ranks = [None] * world
        dist.all_gather_object(ranks, profile)
    if dp.is_main_process():
        record = dict(entry=args.entry, overrides=args.overrides, label=_label(args), algo=args.algo, procs=world,
                      seed=args.seed, timesteps=model.num_timesteps,
                      wall_s=wall, steps_per_s=model.num_timesteps / wall, ranks=ranks, split_wait=args.split_wait,
                      n_envs_per_rank=config.n_envs, batch_size=config.model_kwargs.get("batch_size"),
                      evaluations=callback.as_dicts() if callback is not None else [])
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1))


def _collectives_worker(args: argparse.Namespace) -> None:
    """Latency of one gloo all-reduce of the sizes the update uses: 3 doubles (advantage moments) and the flattened
    gradients of the entry's policy plus its 8 statistics (float32); ``--repeats`` x 200 timed calls each."""
    import torch as th
    import torch.distributed as dist

    th.set_num_threads(1)
    from sb3_ppo_scale import distributed as dp
    from sb3_ppo_scale.experiments import zoo

    env_id, _, variant = args.entry.partition("@")
    config = zoo.load_config(None, env_id, variant or None, zoo.parse_overrides(args.overrides))
    model = zoo.build_model(config, zoo.make_envs(config, n_envs=1, seed=0), seed=0, device="cpu")
    n_params = sum(p.numel() for p in model.policy.parameters())
    dp.init_process_group(th.device("cpu"))
    sizes = {"advantage moments (3 float64)": th.zeros(3, dtype=th.float64),
             f"gradients + stats ({n_params + 8} float32)": th.zeros(n_params + 8)}
    result = {}
    for name, tensor in sizes.items():
        times = []
        for _ in range(args.repeats):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(200):
                dist.all_reduce(tensor)
            times.append((time.perf_counter() - start) / 200)
        result[name] = statistics.median(times)
    if dp.is_main_process():
        record = dict(label=_label(args), procs=dist.get_world_size(), latency_s=result,
                      load_average=os.getloadavg()[0])
        Path(args.out).write_text(json.dumps(record, indent=1))


def _collectives(args: argparse.Namespace) -> None:
    out = RUNS / f"collectives_{_label(args)}_2p.json"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    worker = [str(Path(__file__).resolve()), "collectives_worker", "--entry", args.entry, "--repeats",
              str(args.repeats), "--out", str(out), *(f"--set={pair}" for pair in args.overrides)]
    subprocess.run([*launcher, *worker], check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    _stamp(out, args)
    print(out.read_text())


def _instrument(model: Any, barrier: bool) -> dict[str, float]:
    """Wrap ``collect_rollouts``, ``train`` and (data-parallel) every all-reduce with timers; ``allreduce_s`` is the
    time of the one per minibatch that carries the gradients, ``collectives_s`` of all of them (with the
    advantage moments, step counts, ...). ``barrier``: a barrier before each gradient all-reduce, timed as
    ``wait_s`` (waiting for the slower rank)."""
    import torch.distributed as dist

    from sb3_ppo_scale.distributed import ProcessGroupReducer

    profile = dict(collect_s=0.0, train_s=0.0, allreduce_s=0.0, wait_s=0.0, allreduces=0, collectives_s=0.0,
                   collectives=0)

    def timed(name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                profile[name] += time.perf_counter() - start
        return wrapper

    model.collect_rollouts = timed("collect_s", model.collect_rollouts)
    model.train = timed("train_s", model.train)
    original = ProcessGroupReducer.sum_

    def sum_(self: ProcessGroupReducer, tensor: Any) -> Any:
        carries_gradients = bool(self._pending)  # the minibatch's one gradient (+ statistics) all-reduce
        if barrier and carries_gradients:
            start = time.perf_counter()
            dist.barrier()
            profile["wait_s"] += time.perf_counter() - start
        start = time.perf_counter()
        result = original(self, tensor)
        elapsed = time.perf_counter() - start
        profile["collectives_s"] += elapsed
        profile["collectives"] += 1
        if carries_gradients:
            profile["allreduce_s"] += elapsed
            profile["allreduces"] += 1
        return result

    ProcessGroupReducer.sum_ = sum_  # type: ignore[method-assign]
    return profile


# ------------------------------------------------------------------------------------------------ launching
def _label(args: argparse.Namespace) -> str:
    """The configuration's name in file names and tables: the entry and its ``--set`` overrides."""
    return "+".join([args.entry, *args.overrides]).replace("/", "_")


def _launch(procs: int, out: Path, args: argparse.Namespace, seed: int, algo: str = "scalable_ppo",
            eval_freq: int = 0, split_wait: bool = False) -> dict[str, Any]:
    """Run one configuration (a plain process for 1, torchrun for more); returns its JSON record."""
    worker = [str(Path(__file__).resolve()), "worker", "--entry", args.entry, "--timesteps", str(args.timesteps),
              "--seed", str(seed), "--algo", algo, "--eval-freq", str(eval_freq), "--out", str(out),
              *(f"--set={pair}" for pair in args.overrides)]
    if split_wait:
        worker.append("--split-wait")
    launcher = [sys.executable] if procs == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                    "--nproc-per-node", str(procs)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([*launcher, *worker], check=True, env=env)
    return _stamp(out, args)


def _stamp(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Add to a run's JSON record the command that made it (this script's command line) and the UTC date; the report
    lists them."""
    record = json.loads(out.read_text())
    record["command"] = " ".join(["python benchmarks/scaling.py", *map(shlex.quote, args.argv)])
    record["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    out.write_text(json.dumps(record, indent=1))
    return record


def _throughput(args: argparse.Namespace) -> None:
    for repeat in range(args.repeats):  # alternate configurations so that load changes hit all of them
        for algo, procs in [("sb3", 1), *(("scalable_ppo", n) for n in args.procs)]:
            out = RUNS / f"throughput_{_label(args)}_{algo}_{procs}p_r{repeat}.json"
            record = _launch(procs, out, args, seed=repeat, algo=algo)
            print(f"repeat {repeat} {algo} x{procs}: {record['steps_per_s']:.0f} steps/s", flush=True)


def _profile(args: argparse.Namespace) -> None:
    for procs in args.procs:
        out = RUNS / f"profile_{_label(args)}_{procs}p.json"
        record = _launch(procs, out, args, seed=0, split_wait=True)
        print(json.dumps(record["ranks"], indent=1))


def _learning(args: argparse.Namespace) -> None:
    for seed in args.seeds:
        for procs in args.procs:
            out = RUNS / f"learning_{procs}p_seed{seed}.json"
            record = _launch(procs, out, args, seed=seed, eval_freq=args.eval_freq)
            print(f"seed {seed} x{procs}: final return {record['evaluations'][-1]['mean_return']:.0f}", flush=True)


# ------------------------------------------------------------------------------------------------ report
def _load(prefix: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(RUNS.glob(f"{prefix}*.json"))]


def _share(record: dict[str, Any], key: str) -> float:
    """Rank-mean fraction of the wall time spent in ``key``."""
    return statistics.mean(r.get(key, 0.0) / r["wall_s"] for r in record["ranks"])


def _throughput_table(runs: list[dict[str, Any]]) -> tuple[list[str], dict[int, float]]:
    by_config: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        by_config.setdefault((run["algo"], run["procs"]), []).append(run)
    base = statistics.median(r["steps_per_s"] for r in by_config[("scalable_ppo", 1)])
    sb3 = statistics.median(r["steps_per_s"] for r in by_config.get(("sb3", 1), by_config[("scalable_ppo", 1)]))
    single = {r["seed"]: r["steps_per_s"] for r in by_config[("scalable_ppo", 1)]}
    lines = ["| algorithm | processes | envs/rank | batch/rank | runs | env steps/s (median) | speed-up | efficiency | "
             "efficiency, paired | collect | update | of which grad all-reduce | all collectives |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    medians = {}
    for (algo, procs), group in sorted(by_config.items(), key=lambda kv: (kv[0][0] != "sb3", kv[0][1])):
        speed = statistics.median(r["steps_per_s"] for r in group)
        if algo == "scalable_ppo":
            medians[procs] = speed
        efficiency = f"{speed / (procs * base):.2f}"
        paired = f"{statistics.median(r['steps_per_s'] / (procs * single[r['seed']]) for r in group):.2f}"
        if algo == "sb3":  # a reference row: its speed relative to ScalablePPO at 1 process, no efficiency
            efficiency = paired = "-"
        run = group[0]
        shares = [statistics.median(_share(r, k) for r in group) for k in ("collect_s", "train_s", "allreduce_s",
                                                                         "collectives_s")]
        lines.append(f"| {'SB3 PPO' if algo == 'sb3' else 'ScalablePPO'} | {procs} | {run['n_envs_per_rank']} | "
                     f"{run['batch_size'] // procs} | {len(group)} | {speed:,.0f} | {speed / base:.2f} | "
                     f"{efficiency} | {paired} | "
                     + " | ".join(f"{share:.0%}" for share in shares) + " |")
    lines.append(f"\nefficiency = median steps/s at n / (n x median at 1); paired: median over repeats of the same "
                 f"ratio within a repeat (the runs of one repeat ran back to back). SB3 PPO / ScalablePPO at 1 "
                 f"process: {sb3 / base:.2f}.")
    return lines, medians


def _learning_table(runs: list[dict[str, Any]], threshold: float) -> list[str]:
    lines = ["| processes | seed | final return | best evaluation | training time (s) | time to "
             f"{threshold:g} (s) | env steps/s |", "|---|---|---|---|---|---|---|"]
    for run in sorted(runs, key=lambda r: (r["procs"], r["seed"])):
        evals = run["evaluations"]
        reached = next((e["train_s"] for e in evals if e["mean_return"] >= threshold), None)
        lines.append(f"| {run['procs']} | {run['seed']} | {evals[-1]['mean_return']:.0f} | "
                     f"{max(e['mean_return'] for e in evals):.0f} | {evals[-1]['train_s']:.0f} | "
                     f"{'not reached' if reached is None else f'{reached:.0f}'} | "
                     f"{run['timesteps'] / evals[-1]['train_s']:,.0f} |")
    return lines


def _plot(curves: dict[str, dict[int, float]], learning: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for label, throughput in curves.items():
        procs = sorted(throughput)
        axes[0].plot(procs, [throughput[n] / throughput[1] for n in procs], "o-", label=label)
    top = max((max(c) for c in curves.values()), default=2)
    axes[0].plot([1, top], [1, top], "k--", label="linear (efficiency 1)")
    axes[0].set(xlabel="processes (1 torch thread each)", ylabel="speed-up of env steps/s (medians)",
                xticks=list(range(1, top + 1)), title="throughput, same global batch and steps")
    axes[0].legend(fontsize=7)
    for run in sorted(learning, key=lambda r: (r["procs"], r["seed"])):
        evals = run["evaluations"]
        axes[1].plot([e["timesteps"] for e in evals], [e["mean_return"] for e in evals],
                     "-" if run["procs"] == 1 else "--", label=f"{run['procs']} proc, seed {run['seed']}")
    axes[1].set(xlabel="env steps (all ranks)", ylabel="evaluation return", title="learning at the same sample budget")
    if learning:
        axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _labels(runs: list[dict[str, Any]]) -> list[str]:
    return sorted({r.get("label", r["entry"]) for r in runs})


def _report(args: argparse.Namespace) -> None:
    throughput = _load("throughput_")
    learning = _load("learning_")
    profiles = _load("profile_")
    report = " ".join(["python benchmarks/scaling.py", *map(shlex.quote, args.argv)])
    lines = ["# Data-parallel scaling (torchrun, gloo, one torch thread per process)", "",
             f"Produced by `{report}` on {time.strftime('%Y-%m-%d', time.gmtime())} from the runs in "
             "`benchmarks/results/scaling_runs/`, each made by the command listed with its date under \"Commands "
             "and dates\" at the end. Every process count "
             "trains the same global batch for the same env steps: each of n ranks runs n_envs / n envs and trains "
             "on batch_size / n samples of every minibatch. Machine: the 2-core box, SHARED with other jobs while "
             "measuring (load average 10-18 on 2 cores for the n_envs=16 rows, the profile and the learning runs; 2-5 "
             "for the plain `@cpu_linear` and the `@gpu` throughput rows): absolute numbers are noisy; the ratios "
             "are of medians over repeats that alternate the configurations."]
    curves: dict[str, dict[int, float]] = {}
    for label in _labels(throughput):
        table, curves[label] = _throughput_table([r for r in throughput if r.get("label", r["entry"]) == label])
        lines += ["", f"## Throughput: `{label}`", "", *table]
    lines += ["", "collect / update / grad all-reduce / all collectives: rank-mean share of the learn() wall time "
              "(the update includes its all-reduces; an all-reduce's time includes waiting for the slower rank; all "
              "collectives adds the advantage-moment all-reduce of every minibatch and the per-rollout ones)."]
    for record in profiles:
        lines += ["", f"## Where the time goes: `{record.get('label', record['entry'])}`, {record['procs']} processes "
                  "(a barrier before each gradient all-reduce separates waiting from the all-reduce)", "",
                  "| rank | wall (s) | collect | update | waiting for the other rank | gradient all-reduce | "
                  "all collectives | gradient all-reduces | ms per gradient all-reduce |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for rank, r in enumerate(record["ranks"]):
            lines.append(f"| {rank} | {r['wall_s']:.1f} | {r['collect_s'] / r['wall_s']:.0%} | "
                         f"{r['train_s'] / r['wall_s']:.0%} | {r['wait_s'] / r['wall_s']:.0%} | "
                         f"{r['allreduce_s'] / r['wall_s']:.0%} | {r.get('collectives_s', 0) / r['wall_s']:.0%} | "
                         f"{r['allreduces']} | "
                         f"{1000 * r['allreduce_s'] / max(r['allreduces'], 1):.2f} |")
    for record in _load("collectives_"):
        lines += ["", f"## One all-reduce alone: `{record['label']}`, {record['procs']} processes (load average "
                  f"{record['load_average']:.1f} when measured)", "", "| tensor | ms per all-reduce (median) |",
                  "|---|---|", *(f"| {name} | {1000 * t:.3f} |" for name, t in record["latency_s"].items())]
    if learning:
        lines += ["", f"## Learning: `{_labels(learning)[0]}`, {learning[0]['timesteps']:,} env steps in total at "
                  "every process count", "", *_learning_table(learning, args.threshold), "",
                  f"Deterministic evaluations of 5 episodes on rank 0 every {_eval_spacing(learning)} steps (and at "
                  "the end); training time excludes evaluation."]
    lines += ["", "## Commands and dates", "", "| command | date | runs |", "|---|---|---:|"]
    made: dict[tuple[str, str], list[int]] = {}  # (command, date) -> [runs, of which reconstructed]
    for path in sorted(RUNS.glob("*.json")):
        record = json.loads(path.read_text())
        counts = made.setdefault((record.get("command", "not recorded"), record.get("date", "not recorded")), [0, 0])
        counts[0] += 1
        counts[1] += bool(record.get("command_reconstructed"))
    for (command, date), (runs, rebuilt) in sorted(made.items(), key=lambda item: (item[0][1], item[0][0])):
        lines.append(f"| `{command}`{' (reconstructed)' if rebuilt else ''} | {date} | {runs} |")
    reconstructed = any(rebuilt for _, rebuilt in made.values())
    if reconstructed:
        lines += ["", "Reconstructed: runs made before the records kept their command line. The command is "
                  "docs/distributed.md's for that run kind with the record's entry, overrides, seeds and steps "
                  "(`--timesteps` as the steps run; learn() rounds a budget up to whole rollouts, so it reproduces "
                  "them); the date is that of the commit that added the record."]
    (RESULTS / "scaling.md").write_text("\n".join(lines) + "\n")
    _plot(curves, learning, RESULTS / "scaling.png")
    print("\n".join(lines))


def _eval_spacing(runs: list[dict[str, Any]]) -> str:
    steps = [e["timesteps"] for e in runs[0]["evaluations"]]
    return f"{steps[1] - steps[0]:,}" if len(steps) > 1 else "n/a"


# ------------------------------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("throughput", "learning", "profile", "collectives", "report", "worker", "collectives_worker"):
        p = sub.add_parser(name)
        p.add_argument("--entry", default=DEFAULT_ENTRY)
        p.add_argument("--procs", type=int, nargs="+", default=[1, 2] if name != "profile" else [2])
        p.add_argument("--timesteps", type=int, default=150_000 if name == "learning" else 20_480)
        p.add_argument("--repeats", type=int, default=3)
        p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--eval-freq", type=int, default=10_000 if name == "learning" else 0)
        p.add_argument("--eval-episodes", type=int, default=5)
        p.add_argument("--threshold", type=float, default=1500.0)
        p.add_argument("--algo", choices=("scalable_ppo", "sb3"), default="scalable_ppo")
        p.add_argument("--split-wait", action="store_true")
        p.add_argument("--out", default=None)
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a hyperparameter of the entry (n_envs is the total over all processes)")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded with each run (_stamp) and in the report
    {"worker": _worker, "throughput": _throughput, "learning": _learning, "profile": _profile,
     "collectives": _collectives, "collectives_worker": _collectives_worker, "report": _report}[args.command](args)


if __name__ == "__main__":
    main()
