"""Preemptible training: the same script starts a run or continues it from its checkpoint (e.g. a requeued SLURM job).

``ResumableCheckpoint`` writes ``<run-dir>/checkpoint.pt`` every ``--checkpoint-every`` env steps, at the end, and
when SIGTERM or SIGINT arrives; then ``learn_resumable`` raises ``TrainingPreempted``, a ``SystemExit`` with code 75
(``PREEMPTED_EXIT_CODE``): a job script requeues on that code. Started again, the script finds the checkpoint and
continues the same budget in the same TensorBoard run (docs/checkpoints.md says what is exact).

    python examples/resume.py [--run-dir runs/resume_demo] [--timesteps 50000] [--checkpoint-every 5000]

    # SLURM: sbatch --signal=TERM@120 --requeue job.sh, with in job.sh:
    #   python examples/resume.py --run-dir $SCRATCH/run; [ $? -eq 75 ] && scontrol requeue $SLURM_JOB_ID

``SB3_PPO_SCALE_SMOKE=1`` (the CI smoke test) trains 4096 steps in a temporary folder and preempts itself once
(a callback sends this process SIGTERM after the first checkpoint), then resumes as a requeued job would.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
from pathlib import Path

import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.checkpoint import ResumableCheckpoint, TrainingPreempted, learn_resumable

SMOKE = os.environ.get("SB3_PPO_SCALE_SMOKE") == "1"


class PreemptOnce(BaseCallback):
    """Smoke mode only: SIGTERM to this process once the first checkpoint exists (as a scheduler would send)."""

    def __init__(self, checkpoint: Path) -> None:
        super().__init__()
        self.checkpoint = checkpoint

    def _on_step(self) -> bool:
        if self.checkpoint.exists():
            os.kill(os.getpid(), signal.SIGTERM)
            self.checkpoint = Path("/nonexistent")  # once
        return True


def train(run_dir: Path, timesteps: int, every: int, seed: int, preempt: bool) -> ScalablePPO:
    """Start or continue the run in ``run_dir``; raises TrainingPreempted when a signal stops it."""
    path = run_dir / "checkpoint.pt"
    env = make_vec_env("CartPole-v1", n_envs=4, seed=seed)
    if path.exists():
        model = ScalablePPO.load_checkpoint(path, env)
        print(f"resuming at {model.num_timesteps} of {timesteps} env steps")
    else:
        model = ScalablePPO("MlpPolicy", env, n_steps=128, batch_size=256, n_epochs=4, learning_rate=1e-3, seed=seed,
                            tensorboard_log=str(run_dir / "tensorboard"))
        print(f"new run in {run_dir}")
    extra = PreemptOnce(path) if preempt and not path.exists() else None
    model = learn_resumable(model, timesteps, ResumableCheckpoint(path, every_steps=every), callback=extra,
                            tb_log_name="ScalablePPO")
    runs = sorted(p.name for p in (run_dir / "tensorboard").iterdir())
    print(f"TensorBoard runs: {', '.join(runs)}")  # a resumed run logs on in its run, not a new ScalablePPO_2
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default=None, help="run folder (default runs/resume_demo; smoke: a temp folder)")
    parser.add_argument("--timesteps", type=int, default=4096 if SMOKE else 50_000, help="budget (default 50000)")
    parser.add_argument("--checkpoint-every", type=int, default=1024 if SMOKE else 5000, help="env steps (default 5000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    th.set_num_threads(1)
    temporary = None if args.run_dir or not SMOKE else tempfile.TemporaryDirectory()
    run_dir = Path(args.run_dir or (temporary.name if temporary is not None else "runs/resume_demo"))
    try:
        model = train(run_dir, args.timesteps, args.checkpoint_every, args.seed, preempt=SMOKE)
    except TrainingPreempted as stopped:
        print(f"preempted: {stopped}")
        if not SMOKE:
            raise  # exit code 75: the job script requeues
        model = train(run_dir, args.timesteps, args.checkpoint_every, args.seed, preempt=False)  # the requeued job
    finally:
        if temporary is not None:
            temporary.cleanup()
    print(f"trained {model.num_timesteps} env steps (budget {args.timesteps})")
    mean, _ = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=args.seed + 1000), n_eval_episodes=3)
    print(f"evaluation return (mean of 3 deterministic episodes): {mean:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
