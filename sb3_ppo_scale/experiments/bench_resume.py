"""Mid-run checkpoints of ``sb3-ppo-scale bench`` runs: write them, resume from them, and stop bench on a signal.

Per run (``<stem>`` = ``<task>__<label>__seed<k>``, the run JSON's name), in ``<out>/checkpoints/``:

- ``<stem>.pt``: the model's exact-resume checkpoint (:mod:`sb3_ppo_scale.checkpoint`), written at the first rollout
  boundary after every ``--checkpoint-every`` env steps, when SIGTERM/SIGINT stops the run, and when training ends;
- ``<stem>.evaluations.pt`` (the sidecar): what the run JSON needs that the checkpoint does not hold: the
  evaluation callback's :meth:`~sb3_ppo_scale.experiments.pipeline.PeriodicEvalCallback.state` at that checkpoint
  (the evaluations so far with their clocks, when the next is due, the training clocks' totals, the evaluation
  env's RNG), the run's settings (budget, evaluation settings, the entry's hyperparameters), the box it started on
  and the env steps of the checkpoints it was resumed from. It is written just before the checkpoint and keeps the
  state of the checkpoint written before too, keyed by env steps, so a kill between the two writes leaves a pair that
  still matches.

Both are deleted once the run JSON is written. The clocks leave out the time spent capturing and writing
checkpoints (as they leave out evaluation); a resumed run's clocks continue from the totals at its checkpoint, so
the training between that checkpoint and the kill is not counted (the run JSON's ``resumed_at`` lists where).

Signals (:mod:`sb3_ppo_scale.stop_signals`): :func:`run_in_workers` records SIGTERM/SIGINT in the parent and
sends each on to the worker processes as SIGTERM (a second SIGINT would interrupt a run's checkpoint write);
each worker records them between runs (:func:`start_worker`), its run's :class:`RunCheckpoint` stops it with a
checkpoint, and a worker that was told to stop starts no further run.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_scale import stop_signals
from sb3_ppo_scale.checkpoint import ResumableCheckpoint, atomic_write, load_checkpoint, resume_notes
from sb3_ppo_scale.experiments.pipeline import PeriodicEvalCallback

#: env steps between a bench run's checkpoints (``--checkpoint-every``): at 1 000-2 000 env steps/s (MuJoCo, one
#: thread) a kill that gives no time to write one loses at most 1-2 minutes of training; a write of a Hopper-v5 run's
#: checkpoint (1.1 MB) takes 12-40 ms on a busy 2-core box
DEFAULT_CHECKPOINT_EVERY = 100_000
#: bench labels whose runs take no mid-run checkpoint, and why
UNCHECKPOINTED = {
    "recurrent_ppo": "sb3-contrib's RecurrentPPO leaves its LSTM states out of save() and has no hook that would carry "
                     "them over (ScalableRecurrentPPO has one): a resumed run would restart them mid-episode",
}
#: how often (seconds) the parent looks whether a signal asked it to stop
_POLL_S = 0.5


# ------------------------------------------------------------------------------------------------ files
def sidecar_path(checkpoint: Path) -> Path:
    """The sidecar of ``<stem>.pt``: ``<stem>.evaluations.pt`` beside it."""
    return checkpoint.with_suffix(".evaluations.pt")


def read_sidecar(checkpoint: Path) -> dict[str, Any]:
    """The sidecar of ``checkpoint`` (a pickle, like the checkpoint); FileNotFoundError naming both files."""
    path = sidecar_path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} has no {path.name} beside it (the evaluations so far): "
                                f"delete {checkpoint} to start that run anew")
    return th.load(path, map_location="cpu", weights_only=False)


def remove_checkpoint(checkpoint: Path) -> None:
    """Delete ``checkpoint`` and its sidecar (those that exist)."""
    for path in (checkpoint, sidecar_path(checkpoint)):
        path.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------ writing
class RunCheckpoint(ResumableCheckpoint):
    """:class:`~sb3_ppo_scale.checkpoint.ResumableCheckpoint` that writes the sidecar before each checkpoint and
    takes its own time off ``timer``'s clocks.

    :param path: the checkpoint file (``<out>/checkpoints/<stem>.pt``).
    :param every_steps: env steps between checkpoints (>= 1).
    :param timer: the run's evaluation callback (its state goes into the sidecar).
    :param run: what the sidecar keeps for the run JSON: ``settings``, ``box``, ``resumed_at``.
    :param on_disk: (env steps, timer state) of the checkpoint already on disk (a resumed run's), or None.
    """

    def __init__(self, path: Path, every_steps: int, timer: PeriodicEvalCallback, run: dict[str, Any],
                 on_disk: tuple[int, dict[str, Any]] | None = None) -> None:
        super().__init__(path, every_steps)
        self.timer, self.run = timer, run
        self._on_disk = on_disk
        self._timer_at_boundary: dict[str, Any] | None = None
        self._timing = False

    @contextmanager
    def _off_the_clocks(self) -> Iterator[None]:
        """Leave the time of the block out of the run's training clocks (nested blocks count once)."""
        if self._timing:
            yield
            return
        self._timing, wall, cpu = True, time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self._timing = False
            self.timer.exclude(time.perf_counter() - wall, time.process_time() - cpu)

    def _on_training_start(self) -> None:
        super()._on_training_start()
        if stop_signals.received() is not None and self._signal is None:  # it came before learn() installed handlers
            self._signal = stop_signals.received()

    def _on_rollout_start(self) -> None:
        with self._off_the_clocks():
            self._timer_at_boundary = self.timer.state()  # before the timer evaluates at this boundary
            super()._on_rollout_start()

    def _on_rollout_end(self) -> None:
        with self._off_the_clocks():
            super()._on_rollout_end()

    def _write(self, boundary: dict[str, Any]) -> None:
        with self._off_the_clocks():
            timer_state = self._timer_at_boundary if boundary is self._boundary else self.timer.state()
            steps = int(boundary["counters"]["num_timesteps"])
            kept = dict([self._on_disk]) if self._on_disk is not None else {}
            atomic_write({"run": self.run, "timer_at": {**kept, steps: timer_state}}, sidecar_path(self.path))
            super()._write(boundary)
            self._on_disk = (steps, timer_state)


# ------------------------------------------------------------------------------------------------ resuming
def resume(checkpoint: Path, env: VecEnv, cls: type, timer: PeriodicEvalCallback
           ) -> tuple[BaseAlgorithm, dict[str, Any], tuple[int, dict[str, Any]]]:
    """The model of ``checkpoint`` on ``env`` (``cls``: the run's algorithm class), ``timer`` restored to that
    checkpoint, the sidecar's run record with this resume added to ``resumed_at``, and (env steps, timer state) of
    the checkpoint. ValueError when the sidecar holds no state for the checkpoint's env steps."""
    sidecar = read_sidecar(checkpoint)
    model = load_checkpoint(checkpoint, env, device="cpu", cls=cls)
    steps = int(model.num_timesteps)
    timer_state = sidecar["timer_at"].get(steps)
    if timer_state is None:
        raise ValueError(f"{sidecar_path(checkpoint)} holds no evaluations for the {steps} env steps of {checkpoint} "
                         f"(it has {sorted(sidecar['timer_at'])}): delete both to start that run anew")
    timer.restore(timer_state)
    run = {**sidecar["run"], "resumed_at": [*sidecar["run"]["resumed_at"], steps]}
    notes = "; ".join(resume_notes(model))
    print(f"resuming {checkpoint} at {steps} of {model._total_timesteps} env steps" + (f" ({notes})" if notes else ""),
          flush=True)
    return model, run, (steps, timer_state)


# ------------------------------------------------------------------------------------------------ processes
def start_worker() -> None:
    """Initializer of bench's worker processes: SIGTERM/SIGINT are recorded (a run stops with its checkpoint; no
    further run starts) instead of ending the process, whose death would break the pool and its other runs."""
    stop_signals.install(what="this bench worker (its run writes a checkpoint)")


def stop_requested() -> bool:
    """Whether a stop signal reached this process."""
    return stop_signals.received() is not None


def run_in_workers(function: Callable[..., str], jobs: Sequence[tuple[Any, ...]], workers: int) -> bool:
    """``function(*job)`` for each job in ``workers`` spawned processes, printing each result as it comes; returns
    whether a signal stopped them (then the jobs not started are dropped and the running ones stopped)."""
    if not jobs:
        return False
    forward = lambda: [child.pid for child in mp.active_children() if child.pid is not None]  # noqa: E731
    with stop_signals.handling(forward_to=forward, forward_as=signal.SIGTERM, what="bench and its runs (checkpoints)"), \
            ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                initializer=start_worker) as pool:
        pending = {pool.submit(function, *job) for job in jobs}
        while pending:
            done, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
            for future in done:
                _report(future)
            if stop_requested():
                for future in pending:
                    future.cancel()  # those not handed to a worker yet
    return stop_requested()


def _report(future: Future) -> None:
    """Print a finished job's result (a cancelled one's: nothing); a pool that broke because a signal ended a worker
    before it could handle signals (while it started) is said so, anything else raised."""
    if future.cancelled():
        return
    try:
        print("done:", future.result(), flush=True)
    except BrokenProcessPool:
        if not stop_requested():
            raise
        print("the worker pool broke (a worker ended on the signal while it started, before it could handle it); a "
              "run it had in progress keeps its last checkpoint", file=sys.stderr, flush=True)
