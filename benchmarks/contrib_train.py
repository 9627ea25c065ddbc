"""train() throughput of the Scalable contrib classes against sb3-contrib's, at the same config.

For each case (rl_zoo3's ppo_lstm entries for CartPoleNoVel-v1 and PendulumNoVel-v1, with VecNormalize as the zoo,
and its Atari entry on Pong; a masking env for MaskablePPO), every model is built with the same seed and collects one rollout with its own
``collect_rollouts`` (the Scalable classes collect exactly as contrib's do). Then each model's ``train()`` is timed
``--repeats`` times, interleaved (contrib, ours, ours batched, contrib, ...), each call on a fresh copy of the
collected rollout (restored outside the timing: contrib's buffer flattens itself in place on first use), after one
untimed warm-up call each. Samples/s = ``n_epochs * n_steps * n_envs / seconds`` of ``train()``; the table gives the
medians and each class's ratio to the contrib class's median. One torch thread (``OMP_NUM_THREADS=1``,
``torch.set_num_threads(1)``).

    OMP_NUM_THREADS=1 python benchmarks/contrib_train.py [--repeats 5] [--cases cartpole_novel,pendulum_novel,atari_cnnlstm,masking]

Writes ``benchmarks/results/contrib/train_cpu.md`` (``--out`` to change the folder); ``--device cuda`` times the
models on the GPU (``train_cuda.md``; the envs stay on the CPU), and adds each ``sequence_length`` variant with
``cuda_graphs=True``.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch as th
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.logger import configure
from stable_baselines3.common.utils import get_linear_fn
from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine_line, sync  # noqa: E402
from sb3_contrib import MaskablePPO, RecurrentPPO  # noqa: E402
from sb3_contrib.common.envs import InvalidActionEnvDiscrete  # noqa: E402

from sb3_ppo_scale import ScalableMaskablePPO, ScalableRecurrentPPO  # noqa: E402


def _zoo_lstm_kwargs() -> dict[str, Any]:
    """rl_zoo3 ppo_lstm.yml's policy_kwargs of both NoVel entries."""
    return dict(ortho_init=False, activation_fn=th.nn.ReLU, lstm_hidden_size=64, enable_critic_lstm=True,
                net_arch=dict(pi=[64], vf=[64]))


@dataclass
class Case:
    """One benchmark configuration: the env, its model arguments, and the classes to time (label -> class, kwargs)."""

    name: str
    make_env: Callable[[], Any]
    model_kwargs: dict[str, Any]
    policy: str
    classes: dict[str, tuple[type, dict[str, Any]]] = field(default_factory=dict)


def _novel_env(env_id: str, n_envs: int) -> Callable[[], Any]:
    def make() -> Any:
        import rl_zoo3.import_envs  # noqa: F401  (registers the NoVel envs)

        return VecNormalize(make_vec_env(env_id, n_envs=n_envs, seed=0))

    return make


def _atari_env(env_id: str, n_envs: int) -> Callable[[], Any]:
    def make() -> Any:
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        return VecFrameStack(make_atari_env(env_id, n_envs=n_envs, seed=0,
                                            wrapper_kwargs=dict(terminal_on_life_loss=False)), n_stack=4)

    return make


def _recurrent(sequence_lengths: tuple[int, ...]) -> dict[str, tuple[type, dict[str, Any]]]:
    """RecurrentPPO, ScalableRecurrentPPO (default, batched) and the batched class with exact-size minibatches of
    ``L``-step chunks for each ``L`` in ``sequence_lengths`` (opt-in, not RecurrentPPO's sampling)."""
    classes = {"RecurrentPPO": (RecurrentPPO, {}), "ScalableRecurrentPPO": (ScalableRecurrentPPO, {}),
               "ScalableRecurrentPPO(batched_sequences=True)": (ScalableRecurrentPPO, {"batched_sequences": True})}
    for length in sequence_lengths:
        classes[f"ScalableRecurrentPPO(batched_sequences=True, sequence_length={length})"] = (
            ScalableRecurrentPPO, {"batched_sequences": True, "sequence_length": length})
    return classes


CASES = {
    "cartpole_novel": Case(  # rl_zoo3 ppo_lstm.yml CartPoleNoVel-v1 (tuned)
        "CartPoleNoVel-v1 (zoo ppo_lstm: 8 envs x 32 steps, batch 256, 20 epochs, LSTM 64)",
        _novel_env("CartPoleNoVel-v1", 8),
        dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
             learning_rate=get_linear_fn(1e-3, 0.0, 1.0), clip_range=get_linear_fn(0.2, 0.0, 1.0),
             policy_kwargs=_zoo_lstm_kwargs()),
        "MlpLstmPolicy", _recurrent((8, 32))),
    "pendulum_novel": Case(  # rl_zoo3 ppo_lstm.yml PendulumNoVel-v1
        "PendulumNoVel-v1 (zoo ppo_lstm: 4 envs x 1024 steps, batch 128, 10 epochs, gSDE, LSTM 64)",
        _novel_env("PendulumNoVel-v1", 4),
        dict(n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0, learning_rate=1e-3,
             clip_range=0.2, use_sde=True, sde_sample_freq=4, policy_kwargs=_zoo_lstm_kwargs()),
        "MlpLstmPolicy", _recurrent((8, 32))),
    "atari_cnnlstm": Case(  # rl_zoo3 ppo_lstm.yml atari entry, on Pong
        "PongNoFrameskip-v4 (zoo ppo_lstm atari: 8 envs x 128 steps, batch 256, 4 epochs, CnnLstm, LSTM 128)",
        _atari_env("PongNoFrameskip-v4", 8),
        dict(n_steps=128, n_epochs=4, batch_size=256, learning_rate=get_linear_fn(2.5e-4, 0.0, 1.0),
             clip_range=get_linear_fn(0.1, 0.0, 1.0), vf_coef=0.5, ent_coef=0.01,
             policy_kwargs=dict(enable_critic_lstm=False, lstm_hidden_size=128)),
        "CnnLstmPolicy", _recurrent((8, 32))),
    "masking": Case(  # contrib's documented masking test env, at MaskablePPO's defaults but a shorter rollout
        "InvalidActionEnvDiscrete(dim=80, n_invalid_actions=60) (MaskablePPO defaults, 4 envs x 512 steps)",
        lambda: make_vec_env(lambda: InvalidActionEnvDiscrete(dim=80, n_invalid_actions=60), n_envs=4, seed=0),
        dict(n_steps=512), "MlpPolicy",
        {"MaskablePPO": (MaskablePPO, {}), "ScalableMaskablePPO": (ScalableMaskablePPO, {})}),
}


def collected(cls: type, case: Case, extra: dict[str, Any], device: str) -> tuple[Any, Any]:
    """A model of ``cls`` with one collected rollout, and a pristine copy of its rollout buffer."""
    model = cls(case.policy, case.make_env(), seed=0, device=device, **case.model_kwargs, **extra)
    model.set_logger(configure(None, []))
    total, callback = model._setup_learn(model.n_steps * model.n_envs, None)
    callback.on_training_start(locals(), globals())
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    model._update_current_progress_remaining(model.num_timesteps, total)
    return model, copy.deepcopy(model.rollout_buffer)


def timed_train(model: Any, pristine: Any) -> float:
    """Seconds of one ``train()`` on a fresh copy of the collected rollout (copied outside the timing; on CUDA the
    device is synchronised before the clock stops)."""
    model.rollout_buffer = copy.deepcopy(pristine)
    sync(str(model.device))
    start = time.perf_counter()
    model.train()
    sync(str(model.device))
    return time.perf_counter() - start


def on_device(classes: dict[str, tuple[type, dict[str, Any]]], device: str) -> dict[str, tuple[type, dict[str, Any]]]:
    """The classes to time on ``device``: on CUDA, each ``sequence_length`` variant also with ``cuda_graphs=True``
    (chunks through contrib's loop at every step, the update replayed from CUDA graphs)."""
    if not device.startswith("cuda"):
        return classes
    graphed = {f"ScalableRecurrentPPO(sequence_length={extra['sequence_length']}, cuda_graphs=True)":
               (cls, {"sequence_length": extra["sequence_length"], "cuda_graphs": True})
               for cls, extra in classes.values() if "sequence_length" in extra}
    return {**classes, **graphed}


def run_case(case: Case, repeats: int, device: str = "cpu") -> list[tuple[str, float, list[float]]]:
    """``(label, median samples/s, all samples/s)`` per class, timed interleaved."""
    classes = on_device(case.classes, device)
    models = {label: collected(cls, case, extra, device) for label, (cls, extra) in classes.items()}
    for model, pristine in models.values():
        timed_train(model, pristine)  # warm-up, untimed
    seconds: dict[str, list[float]] = {label: [] for label in models}
    for _ in range(repeats):
        for label, (model, pristine) in models.items():
            seconds[label].append(timed_train(model, pristine))
    rows = []
    for label, (model, _) in models.items():
        samples = model.n_epochs * model.n_steps * model.n_envs
        rates = [samples / s for s in seconds[label]]
        rows.append((label, statistics.median(rates), rates))
    return rows


def report(results: dict[str, list[tuple[str, float, list[float]]]], repeats: int, load: float,
           device: str = "cpu") -> str:
    """The markdown table; ``load``: the box's 1-minute load average when the run started (about 0: a quiet box)."""
    lines = [
        f"# train() samples/s: Scalable contrib classes against sb3-contrib's ({device}, one CPU thread)",
        "",
        f"{datetime.date.today()}, {machine_line(device)}; `OMP_NUM_THREADS=1 python benchmarks/contrib_train.py "
        f"--repeats {repeats}{'' if device == 'cpu' else f' --device {device}'}`. Median of {repeats} interleaved "
        "train() calls per class after one untimed warm-up, each on a fresh copy of the same collected rollout; "
        f"samples/s = n_epochs * n_steps * n_envs / seconds. 1-minute load average when it started: {load:.2f}.",
        "",
        "| case | class | train() samples/s (median) | x contrib | all runs |",
        "|---|---|---:|---:|---|",
    ]
    for case_name, rows in results.items():
        base = rows[0][1]
        for label, rate, rates in rows:
            runs = ", ".join(f"{r:,.0f}" for r in rates)
            lines.append(f"| {CASES[case_name].name} | {label} | {rate:,.0f} | {rate / base:.2f} | {runs} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--device", default="cpu", help="torch device of the models (default cpu)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "contrib")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if os.environ.get("OMP_NUM_THREADS") != "1":
        print("note: run with OMP_NUM_THREADS=1 for the documented one-thread figures", file=sys.stderr)
    th.set_num_threads(1)
    load = os.getloadavg()[0]
    results = {}
    for name in cases:
        results[name] = run_case(CASES[name], args.repeats, args.device)
        for label, rate, _ in results[name]:
            print(f"{name:16s} {label:45s} {rate:10,.0f} samples/s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    text = report(results, args.repeats, load, args.device)
    (args.out / f"train_{args.device.split(':')[0]}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
