"""What each exact trim of ScalablePPO's CPU update buys: ``train()`` with every trim, against ``train()`` with one
switched off, on the same collected rollout.

The trims (each leaves parameters and Adam state equal to SB3 PPO's, tests/test_parity.py):

- ``flat Adam``: the CPU Adam step on flat buffers (sb3_ppo_scale/core/update/flat_adam.py);
- ``gradient ops``: ``zero_grad`` without torch's per-call profiler range, and ``clip_grad_norm_``'s per-tensor
  calls batched (sb3_ppo_scale/core/update/gradient_ops.py);
- ``fused evaluation``: a diagonal-Gaussian or categorical policy's ``evaluate_actions`` without module dispatch or
  Distribution objects (sb3_ppo_scale/core/policy/evaluation.py).

One model per config of benchmarks/end_to_end.py, one rollout collected, then ``train()`` calls alternating between
all trims on and each one off (the order reversed every repeat), one torch thread, the process pinned to one core.
ratio: the call's time with the trim off over the adjacent call's with all on, median [min, max] over repeats.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/studies/update_trims.py [--configs ...] [--repeats 15] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import end_to_end  # noqa: E402

from sb3_ppo_scale.core.update import step as update_step  # noqa: E402
from sb3_ppo_scale.core.policy.evaluation import FusedEvaluator  # noqa: E402


@contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    original = target.__dict__[name]
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


def _without_flat_adam() -> Any:
    return _patched(update_step, "flat_blocker", lambda optimizer, parameters: "switched off")


def _without_gradient_ops() -> Any:
    @contextmanager
    def both() -> Iterator[None]:
        with _patched(update_step, "clip_grad_norm", th.nn.utils.clip_grad_norm_), \
                _patched(update_step, "gradient_clearer", lambda optimizer: optimizer.zero_grad):
            yield
    return both()


def _without_fused_evaluation() -> Any:
    return _patched(FusedEvaluator, "blocker", staticmethod(lambda policy: "switched off"))


#: trim -> a context manager factory that switches it off
TRIMS: dict[str, Callable[[], Any]] = {
    "flat Adam": _without_flat_adam,
    "gradient ops": _without_gradient_ops,
    "fused evaluation": _without_fused_evaluation,
}


def _timed_train(model: Any) -> float:
    start = time.perf_counter()
    model.train()
    return time.perf_counter() - start


def measure(config: str, repeats: int, seed: int = 0) -> list[str]:
    """Table rows for ``config``: the update with all trims, and each trim's ratio."""
    model = end_to_end.build_model("scalable_ppo", config, seed)
    _, callback = model._setup_learn(model.n_steps * model.n_envs, None)
    callback.init_callback(model)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    model.train()  # warm-up
    per_1k = 1000 / (model.n_steps * model.n_envs)
    with_all: list[float] = []
    rows = []
    for trim, switched_off in TRIMS.items():
        ratios = []
        for repeat in range(repeats):
            pair = {}
            for off in ((False, True) if repeat % 2 else (True, False)):
                if off:
                    with switched_off():
                        pair[off] = _timed_train(model)
                else:
                    pair[off] = _timed_train(model)
            ratios.append(pair[True] / pair[False])
            with_all.append(pair[False])
        rows.append(f"| {config} | {trim} | {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] |")
        print(rows[-1], flush=True)
    return [f"| {config} | (all on: update s / 1k env steps) | {statistics.median(with_all) * per_1k:.3f} |", *rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+",
                        choices=["hopper_sb3_defaults", "halfcheetah_zoo", "demo", "envs16", "cartpole_zoo", "atari_pong"],
                        default=["hopper_sb3_defaults", "demo", "envs16"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--core", type=end_to_end._core_argument, default=end_to_end.default_core(),
                        help="the CPU core this process is pinned to (default: the highest it may use); 'none'")
    parser.add_argument("--out", type=Path, default=end_to_end.ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    th.set_num_threads(1)
    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    end_to_end._filter_known_warnings()
    rows = ["| config | trim switched off | update time with it off / with all on: median [min, max] |",
            "|---|---|---|"]
    for config in args.configs:
        rows += measure(config, args.repeats)
    note = (f"ScalablePPO's `train()` on one collected rollout per config ({', '.join(args.configs)}; "
            "benchmarks/end_to_end.py's configs), alternating calls with every trim on and with one switched off, "
            f"{args.repeats} pairs per trim, {end_to_end._pinning_text(args.core)}. A ratio above 1: the update takes "
            "that much longer without the trim. Every trim keeps the numbers SB3 PPO's update computes "
            "(tests/test_parity.py).")
    argv = list(sys.argv[1:] if argv is None else argv)
    lines = [*end_to_end.header("The CPU update's exact trims, one at a time", argv, note, "update_trims.py"), *rows]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "update_trims.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
