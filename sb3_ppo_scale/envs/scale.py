"""One switch for scale on one box: pick the env backend, the env count, the threads and the device from the machine.

:func:`plan_scale` reads the machine (the cores this process may run on, EnvPool, CUDA) and returns a
:class:`ScalePlan`; :func:`make_scale_vec_env` builds the VecEnv it names and prints what it chose. The rules, each
from a measurement (``benchmarks/scale.py``, docs/scale.md):

- **env backend**: EnvPool when it is installed and has the task (C++ threads, no GIL); else, with two or more cores,
  :func:`~sb3_ppo_scale.envs.processes.make_process_vec_env` (several envs per worker process, observations in
  shared memory; on 2 cores it collected no faster than ``DummyVecEnv``: it is meant for boxes with cores to spare);
  else SB3's ``DummyVecEnv``. Every one of them keeps SB3's episode-end contract.
- **env threads / workers**: every core. The envs step while the policy waits, and the policy waits while they step:
  collection has one thing to do at a time, so the envs get all the cores.
- **torch threads**: one during collection (a small policy call per step; more threads only contend with the env
  threads), every core during ``train()`` (``update_threads``: minibatches of 2048 samples ran 1.2-1.7x faster per
  sample on two threads than on one, benchmarks/results/scale/cost_model.md).
- **the CPU update compiled** (``compile_loss=True``) where a C++ compiler is found: on 2 cores the update took 0.23 s
  a rollout against 0.27 s (Hopper) and 0.33 s (HalfCheetah) eager; end to end 1.20x on HalfCheetah and a tie on
  Hopper (benchmarks/results/scale/scale.md, the ``scalable_eager`` rows). The compile is paid once per run: the
  first rollout took 4.3-5.2 s compiled against 0.9-1.8 s eager (``warmup_s`` in scale.json; 9.4 s once). On CUDA
  the update is replayed from CUDA graphs instead.
- **device**: CUDA when there is one (the update with ``cuda_graphs=True``: 2.9-14x SB3's ``train()`` on the H200,
  benchmarks/results/train_phase_cuda.md), else the CPU. With 8 envs or fewer on CUDA, collection runs a CPU copy of the policy (``collect_device="cpu"``:
  2.24x SB3's GPU loop at 1 env and 1.82x at 8 on the H200, but 0.85x at 64, where the GPU step wins).
- **env count**: what the config asks for, else 64 (and at least 4 per core, so every env thread has a queue).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch as th
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_scale.core.checks import cxx_compiler, is_int
from sb3_ppo_scale.envs.processes import available_cores, default_workers, make_process_vec_env
from sb3_ppo_scale.envs.tasks import resolve_task

#: the env backends a plan may name, in the order the rules prefer them
BACKENDS = ("envpool", "processes", "dummy")
#: envs per core below which env threads run out of work while the policy runs
MIN_ENVS_PER_CORE = 4
#: the env count when the config gives none
DEFAULT_N_ENVS = 64
#: at or below this many envs, collection on CUDA runs a CPU copy of the policy (measured on the H200)
CPU_COLLECTION_MAX_ENVS = 8


@dataclass(frozen=True)
class ScalePlan:
    """What :func:`plan_scale` chose, and why.

    :param env_id: the task.
    :param n_envs: envs stepped per rollout step.
    :param backend: one of :data:`BACKENDS`.
    :param env_workers: EnvPool threads or worker processes (1 for ``dummy``).
    :param torch_threads: torch's threads for the process, so for collection's per-step policy call.
    :param update_threads: torch's threads during ``train()`` (ScalablePPO's ``update_threads``).
    :param device: the policy's device, ``"cuda"`` or ``"cpu"``.
    :param collect_device: ScalablePPO's ``collect_device`` (``"auto"``: the policy's device).
    :param compile_loss: ScalablePPO's ``compile_loss``: the CPU update through ``torch.compile``.
    :param cores: the cores the plan was made for.
    :param reasons: one line per choice.
    """

    env_id: str
    n_envs: int
    backend: str
    env_workers: int
    torch_threads: int
    update_threads: int
    device: str
    collect_device: str
    compile_loss: bool
    cores: int
    reasons: tuple[str, ...] = field(default=(), compare=False)

    def model_kwargs(self) -> dict[str, Any]:
        """ScalablePPO's arguments for this plan (device, collection device, update threads, CUDA graphs or the
        compiled loss)."""
        return {"device": self.device, "collect_device": self.collect_device, "update_threads": self.update_threads,
                "cuda_graphs": self.device == "cuda", "compile_loss": self.compile_loss}

    def apply_threads(self) -> None:
        """Set torch's threads for the process (collection's) to :attr:`torch_threads`."""
        th.set_num_threads(self.torch_threads)

    def describe(self) -> str:
        """What was chosen, one line per choice, as ``train --variant scale`` prints it."""
        lines = [f"scale plan for {self.env_id} on {self.cores} core(s):",
                 f"  envs: {self.n_envs} on {self.backend} with {self.env_workers} "
                 f"{'thread(s)' if self.backend == 'envpool' else 'worker(s)'}",
                 f"  torch threads: {self.torch_threads} for collection, {self.update_threads} for train()",
                 f"  device: {self.device} (collect_device={self.collect_device!r}"
                 f"{', cuda_graphs=True' if self.device == 'cuda' else ''}"
                 f"{', compile_loss=True' if self.compile_loss else ''})"]
        return "\n".join(lines + [f"  - {reason}" for reason in self.reasons])


def _envpool_has(env_id: str) -> str | None:
    """None when EnvPool is installed and has ``env_id``; else why not."""
    try:
        resolve_task(env_id, {})
    except ImportError:
        return "EnvPool is not installed (pip install 'sb3-ppo-scale[envpool]')"
    except ValueError:
        return f"EnvPool has no task {env_id!r}"
    return None


def _check_plan_arguments(n_envs: int | None, cores: int | None, device: str, backend: str | None) -> None:
    if n_envs is not None and (not is_int(n_envs) or n_envs < 1):
        raise ValueError(f"n_envs must be None (the plan picks) or an int >= 1, got {n_envs!r}")
    if cores is not None and (not is_int(cores) or cores < 1):
        raise ValueError(f"cores must be None (this process's cores) or an int >= 1, got {cores!r}")
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be None (the plan picks) or one of {', '.join(map(repr, BACKENDS))}, "
                         f"got {backend!r}")
    if device == "cuda" and not th.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA device here; pass device='auto' or 'cpu'")


def _pick_backend(env_id: str, n_envs: int, cores: int, asked: str | None) -> tuple[str, int, str]:
    """(backend, env threads or workers, why): ``asked`` if given, else EnvPool, processes or DummyVecEnv by the rules."""
    missing = _envpool_has(env_id) if asked in (None, "envpool") else f"backend={asked!r} asked for"
    if missing is None:
        return "envpool", cores, f"EnvPool has {env_id}: its C++ threads step the envs on all {cores} core(s)"
    if asked == "envpool":
        raise ValueError(f"backend='envpool' but {missing}")
    if asked == "processes" or (asked is None and cores > 1 and n_envs > 1):
        workers = default_workers(n_envs, cores)
        return "processes", workers, f"{missing}: {workers} worker processes step {n_envs // workers} envs each"
    return "dummy", 1, f"{missing}{'' if asked else '; one core or one env'}: SB3's DummyVecEnv in this process"


def plan_scale(env_id: str, n_envs: int | None = None, cores: int | None = None, device: str = "auto",
               backend: str | None = None) -> ScalePlan:
    """The plan for ``env_id`` on this machine (see the module docstring for the rules).

    :param n_envs: envs per rollout step (default: :data:`DEFAULT_N_ENVS`, raised to
        :data:`MIN_ENVS_PER_CORE` per core).
    :param cores: cores to plan for (default: :func:`available_cores`).
    :param device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
    :param backend: None (the rules pick), or one of :data:`BACKENDS` to compare backends on the same plan.
    :raises ValueError: a bad argument (named), or ``device="cuda"`` without CUDA.
    """
    _check_plan_arguments(n_envs, cores, device, backend)
    cores = cores or available_cores()
    reasons = []
    if n_envs is None:
        n_envs = max(DEFAULT_N_ENVS, MIN_ENVS_PER_CORE * cores)
        reasons.append(f"{n_envs} envs: the default {DEFAULT_N_ENVS}, at least {MIN_ENVS_PER_CORE} per core")
    backend, workers, why = _pick_backend(env_id, n_envs, cores, backend)
    reasons.append(why)
    use_cuda = device == "cuda" or (device == "auto" and th.cuda.is_available())
    collect_device = "cpu" if use_cuda and n_envs <= CPU_COLLECTION_MAX_ENVS else "auto"
    if use_cuda:
        reasons.append("CUDA: policy and update on the GPU, the update replayed from CUDA graphs"
                       + (f"; {n_envs} envs: collection on a CPU copy of the policy" if collect_device == "cpu" else ""))
    compiler = None
    if not use_cuda:
        compiler = cxx_compiler()
        reasons.append(f"CPU: the update compiled by torch.compile with {compiler}" if compiler else
                       "CPU: no C++ compiler found (g++, clang++ or $CXX): the update runs eagerly")
    update_threads = 1 if use_cuda else cores
    return ScalePlan(env_id=env_id, n_envs=n_envs, backend=backend, env_workers=workers, torch_threads=1,
                     update_threads=update_threads, device="cuda" if use_cuda else "cpu", collect_device=collect_device,
                     compile_loss=compiler is not None, cores=cores, reasons=tuple(reasons))


def make_scale_vec_env(env_id: str, n_envs: int | None = None, seed: int = 0, plan: ScalePlan | None = None,
                       env_kwargs: dict[str, Any] | None = None, verbose: int = 1) -> tuple[VecEnv, ScalePlan]:
    """The VecEnv of ``plan`` (default: :func:`plan_scale` for ``env_id`` and ``n_envs``), env ``i`` seeded with
    ``seed + i``, and the plan. Sets torch's threads to the plan's and, with ``verbose >= 1``, prints the plan.

    Pass ``**plan.model_kwargs()`` to ScalablePPO so that the device, the collection device and the update's
    threads follow the plan too.
    """
    plan = plan or plan_scale(env_id, n_envs)
    env_kwargs = dict(env_kwargs or {})
    if plan.backend == "envpool":
        from sb3_ppo_scale.envs.envpool import make_envpool_vec_env

        env: VecEnv = make_envpool_vec_env(env_id, plan.n_envs, seed, num_threads=plan.env_workers, **env_kwargs)
    elif plan.backend == "processes":
        env = make_process_vec_env(env_id, plan.n_envs, n_workers=plan.env_workers, seed=seed, env_kwargs=env_kwargs)
    else:
        env = make_vec_env(env_id, n_envs=plan.n_envs, seed=seed, env_kwargs=env_kwargs)
    plan.apply_threads()
    if verbose >= 1:
        print(plan.describe(), flush=True)
    return env, plan
