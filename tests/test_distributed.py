"""Data-parallel ScalablePPO (sb3_ppo_scale.distributed) with 2 gloo processes on localhost.

Each group of checks spawns its 2 ranks once (torch.multiprocessing, a module-scoped fixture) and the tests check
what the ranks wrote:

- exactness: after a 2-rank update, the parameters equal (to 1e-6) those of one process that trains on the
  concatenation of both ranks' rollouts with the same minibatch composition (the union of the ranks' local
  minibatches, rebuilt from each rank's NumPy RNG state), with target_kl firing, grad_accum_steps > 1 and
  objective="kl_penalty";
- learn() on Pendulum-v1 and CartPole-v1 (VecNormalize): identical parameters on both ranks (the debug checksum
  runs after every update), global num_timesteps and gradient steps, per-rank env seeds, merged VecNormalize
  statistics, rank 0's checkpoint loading in this (plain) process;
- bad set-ups: mismatched hyperparameters across ranks, batch_size not divisible by the world size, cuda_graphs
  with gloo;
- the CLI under torchrun (one small run).
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch as th
import torch.distributed as dist
import torch.multiprocessing as mp
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import VecNormalize

from sb3_ppo_scale import PrioritizedRolloutBuffer, ScalablePPO
from sb3_ppo_scale import distributed as dp
from sb3_ppo_scale.core.update.step import LOCAL
from tests.helpers import GivenOrderHooks

WORLD = 2
N_STEPS, N_ENVS = 32, 2  # 64 samples per rank
#: 48 global = 24 per rank: local minibatches of 24, 24 and 16 (a short last one)
EXACT_KWARGS = dict(n_steps=N_STEPS, batch_size=48, n_epochs=3, learning_rate=3e-3, device="cpu")
#: exactness variants: name -> ScalablePPO kwargs
VARIANTS: dict[str, dict[str, Any]] = {
    "clip": {},
    "target_kl": dict(target_kl=0.0005),
    "grad_accum": dict(grad_accum_steps=3),
    "kl_penalty": dict(objective="kl_penalty", kl_penalty_target=1e-4),  # beta adapts (doubles)
    # the value head's statistics fold the returns of both ranks (Pendulum's action box is [-2, 2])
    "recipe_terms": dict(normalize_value=True, mean_bound_coef=0.1, clip_range_vf=0.2),
}
#: float32 sums in another order (all-reduce of per-rank gradients, float64 advantage moments) then Adam steps
ATOL = 1e-6


def _spawn(worker: Any, out: Path, *args: Any) -> list[Any]:
    """Run ``worker(rank, out, *args)`` on 2 gloo ranks; returns what each rank pickled to ``out/rank<r>.pkl``.

    The ranks meet through a file (torch's FileStore), not a TCP port: a port found free and then closed could be
    taken by another process (the other pytest worker's ranks) before rank 0 bound it."""
    rendezvous = out / f"rendezvous-{uuid.uuid4().hex}"
    mp.spawn(_bootstrap, args=(rendezvous, worker, out, args), nprocs=WORLD, join=True)
    return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(WORLD)]


def _bootstrap(rank: int, rendezvous: Path, worker: Any, out: Path, args: tuple) -> None:
    th.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), **{dp.CHECK_SYNC_ENV: "1"})
    dist.init_process_group("gloo", init_method=rendezvous.as_uri(), rank=rank, world_size=WORLD)
    try:
        result = worker(rank, out, *args)
    finally:
        dist.destroy_process_group()
    # a process group kept alive past destroy_process_group leaves gloo threads that abort the process at exit
    assert _gloo_threads() == [], f"rank {rank}: gloo threads outlive destroy_process_group: {_gloo_threads()}"
    (out / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def _gloo_threads() -> list[str]:
    """Names of this process's gloo threads (Linux /proc; empty elsewhere)."""
    tasks = Path("/proc/self/task")
    names = [_thread_name(t) for t in tasks.iterdir()] if tasks.exists() else []
    return [name for name in names if "gloo" in name]


def _thread_name(task: Path) -> str:
    """A thread's name, or "" when it ended between listing and reading (it is then not a live gloo thread)."""
    try:
        return (task / "comm").read_text().strip()
    except FileNotFoundError:
        return ""


def _state(model: ScalablePPO) -> dict[str, th.Tensor]:
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}


# ------------------------------------------------------------------------------------------------ exactness
#: The rollout buffer fields a union update is rebuilt from (PPO's; the contrib tests add masks / LSTM states).
BUFFER_FIELDS = ("observations", "actions", "rewards", "returns", "episode_starts", "values", "log_probs", "advantages")


class _CaptureLastRollout(BaseCallback):
    """Keeps, at the end of every rollout, what the next update starts from (the buffer's ``fields``)."""

    def __init__(self, fields: tuple[str, ...] = BUFFER_FIELDS) -> None:
        super().__init__()
        self.fields = fields

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        model, buffer = self.model, self.model.rollout_buffer
        self.captured = dict(
            params=_state(model), optimizer=copy.deepcopy(model.policy.optimizer.state_dict()),
            objective=model._objective.state_dict(), numpy_state=np.random.get_state(),
            progress=model._current_progress_remaining, grad_steps_before=model._n_grad_steps,
            buffer={k: getattr(buffer, k).copy() for k in self.fields},
        )


def _exactness_worker(rank: int, out: Path) -> dict[str, Any]:
    results = {}
    for name, kwargs in VARIANTS.items():
        model = ScalablePPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=N_ENVS), seed=0, **EXACT_KWARGS, **kwargs)
        capture = _CaptureLastRollout()
        model.learn(2 * WORLD * N_STEPS * N_ENVS, callback=capture)  # two rollouts and two updates, both global
        results[name] = dict(capture.captured, final=_state(model), n_grad_steps=model._n_grad_steps,
                             beta=model.kl_beta)
    return results


class _UnionBuffer(GivenOrderHooks, RolloutBuffer):
    """The concatenation of the ranks' rollouts (env axis), trained in a given order (RolloutHooks)."""


def _union_orders(states: list[tuple], n_local: int, local_batch: int, n_epochs: int):
    """Each epoch: the ranks' own permutations, interleaved minibatch by minibatch (rank r's indices + r * n_local)."""
    draws = []
    for state in states:
        rng = np.random.RandomState()
        rng.set_state(state)
        draws.append([rng.permutation(n_local) for _ in range(n_epochs)])
    for epoch in range(n_epochs):
        parts = []
        for start in range(0, n_local, local_batch):
            parts += [draws[r][epoch][start : start + local_batch] + r * n_local for r in range(len(states))]
        yield th.from_numpy(np.concatenate(parts))


def _single_process_reference(name: str, ranks: list[dict[str, Any]]) -> ScalablePPO:
    """One process, one update on the union of both ranks' last rollouts, from rank 0's state before it."""
    kwargs = dict(EXACT_KWARGS, **VARIANTS[name], batch_size=EXACT_KWARGS["batch_size"])
    model = ScalablePPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=N_ENVS), seed=1, **kwargs)
    first = ranks[0]
    model.policy.load_state_dict(first["params"])
    model.policy.optimizer.load_state_dict(first["optimizer"])
    model._objective.load_state_dict(first["objective"])
    model._current_progress_remaining = first["progress"]
    model.set_logger(Logger(folder=None, output_formats=[]))
    union = _UnionBuffer(N_STEPS, model.observation_space, model.action_space, device="cpu", n_envs=WORLD * N_ENVS)
    for key in first["buffer"]:
        setattr(union, key, np.concatenate([r["buffer"][key] for r in ranks], axis=1))
    union.full = True
    union.orders = _union_orders([r["numpy_state"] for r in ranks], N_STEPS * N_ENVS,
                                 EXACT_KWARGS["batch_size"] // WORLD, EXACT_KWARGS["n_epochs"])
    model.rollout_buffer = union
    model._n_grad_steps = 0
    model.train()
    return model


def _all_checks_worker(rank: int, out: Path) -> dict[str, Any]:
    """Every check that needs ranks, in one spawn (starting processes is most of the cost)."""
    return dict(exactness=_exactness_worker(rank, out), learn=_learn_worker(rank, out),
                mismatch=_mismatch_worker(rank, out), vec_normalize_mismatch=_vec_normalize_mismatch_worker(rank))


@pytest.fixture(scope="module")
def spawned(tmp_path_factory) -> tuple[list[dict[str, Any]], Path]:
    out = tmp_path_factory.mktemp("ranks")
    return _spawn(_all_checks_worker, out), out


@pytest.fixture(scope="module")
def exactness(spawned) -> list[dict[str, Any]]:
    return [r["exactness"] for r in spawned[0]]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_two_ranks_update_equals_one_process_on_the_union(exactness, name: str) -> None:
    ranks = [r[name] for r in exactness]
    assert not np.array_equal(ranks[0]["buffer"]["observations"], ranks[1]["buffer"]["observations"])  # own seeds
    reference = _single_process_reference(name, ranks)
    for key, value in reference.policy.state_dict().items():
        for rank in ranks:
            assert th.equal(rank["final"][key], ranks[0]["final"][key])  # bitwise identical across ranks
        th.testing.assert_close(ranks[0]["final"][key], value, rtol=0, atol=ATOL)
    moved = max(float((ranks[0]["final"][k] - ranks[0]["params"][k]).abs().max()) for k in ranks[0]["params"])
    assert moved > 100 * ATOL  # the update did change the parameters
    steps = ranks[0]["n_grad_steps"] - ranks[0]["grad_steps_before"]  # the last update's optimizer steps
    assert ranks[1]["n_grad_steps"] - ranks[1]["grad_steps_before"] == steps == reference._n_grad_steps
    assert steps < 9 if name == "target_kl" else steps == 9  # 3 minibatches x 3 epochs unless the KL stop fired
    if name == "recipe_terms":  # both ranks' returns folded in: 2 rollouts x 2 ranks x 64 samples
        assert float(ranks[0]["final"]["value_net.moments"][2]) == 2 * WORLD * N_STEPS * N_ENVS
    if name == "kl_penalty":  # beta adapted on the all-reduced KL: same on both ranks and in the reference
        assert ranks[0]["beta"] == ranks[1]["beta"] == pytest.approx(reference.kl_beta, rel=1e-6)
        assert ranks[0]["beta"] != 1.0


# ------------------------------------------------------------------------------------------------ learn()
def _learn_worker(rank: int, out: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    pendulum = ScalablePPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=64, n_epochs=2, seed=3, device="cpu",
                           objective="clip_kl_penalty", target_kl=0.05)
    pendulum.learn(512)
    results["pendulum"] = dict(params=_state(pendulum), timesteps=pendulum.num_timesteps,
                               grad_steps=pendulum._n_grad_steps, beta=pendulum.kl_beta)
    prioritized = ScalablePPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=64, n_epochs=2, seed=3, device="cpu",
                              rollout_buffer_class=PrioritizedRolloutBuffer,
                              rollout_buffer_kwargs=dict(capacity=128, high_fraction=0.5))
    prioritized.learn(512)
    results["prioritized"] = dict(params=_state(prioritized), timesteps=prioritized.num_timesteps,
                                  grad_steps=prioritized._n_grad_steps,
                                  retained=prioritized.rollout_buffer.n_retained)
    env = VecNormalize(make_vec_env("CartPole-v1", n_envs=2))
    cartpole = ScalablePPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu",
                           grad_accum_steps=2)
    all_reduce, calls = dp.dist.all_reduce, []
    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return all_reduce(tensor, *args, **kwargs)

    dp.dist.all_reduce = counting
    try:
        cartpole.learn(1024)
    finally:
        dp.dist.all_reduce = all_reduce
    obs_rms = env.obs_rms
    results["cartpole"] = dict(params=_state(cartpole), timesteps=cartpole.num_timesteps,
                               grad_steps=cartpole._n_grad_steps, obs_rms=(obs_rms.mean, obs_rms.var, obs_rms.count),
                               ret_rms=(env.ret_rms.mean, env.ret_rms.var, env.ret_rms.count),
                               first_obs=cartpole.rollout_buffer.observations[0].copy(),
                               outputs=len(cartpole.logger.output_formats), all_reduces=calls,
                               n_parameters=sum(p.numel() for p in cartpole.policy.parameters()))
    if rank == 0:
        cartpole.save(out / "cartpole.zip")
    dist.barrier()
    resumed = ScalablePPO.load(out / "cartpole.zip", env=env, device="cpu")  # every rank, rank 0's file
    resumed.learn(512, reset_num_timesteps=False)
    dp.assert_parameters_in_sync(resumed)
    results["resumed"] = dict(timesteps=resumed.num_timesteps, params=_state(resumed))
    return results


@pytest.fixture(scope="module")
def learned(spawned) -> tuple[list[dict[str, Any]], Path]:
    return [r["learn"] for r in spawned[0]], spawned[1]


@pytest.mark.parametrize("env_id", ["pendulum", "cartpole"])
def test_learn_keeps_parameters_identical_and_counts_global_steps(learned, env_id: str) -> None:
    ranks = [r[env_id] for r in learned[0]]
    for key, value in ranks[0]["params"].items():
        assert th.equal(value, ranks[1]["params"][key])
    total = 512 if env_id == "pendulum" else 1024
    assert ranks[0]["timesteps"] == ranks[1]["timesteps"] == total  # global: both ranks' steps
    # per update, every rank trains on batch_size / 2 of every minibatch: one step per global minibatch
    updates, per_update = (512 // 128, 2 * 2) if env_id == "pendulum" else (1024 // 256, 2 * 4)
    if env_id == "cartpole":
        assert ranks[0]["grad_steps"] == ranks[1]["grad_steps"] == updates * per_update
    else:  # target_kl may stop early, on both ranks at the same minibatch
        assert ranks[0]["grad_steps"] == ranks[1]["grad_steps"] <= updates * per_update
        assert ranks[0]["beta"] == ranks[1]["beta"]


def test_one_all_reduce_carries_a_minibatch_gradients_and_statistics(learned) -> None:
    """Per rollout: the step count and stop flag, the VecNormalize statistics; per update: the sample-count check;
    per logical minibatch: the advantage moments, then ONE collective with the flattened gradients and the stats."""
    rank = learned[0][0]["cartpole"]
    rollouts, minibatches = 4, 32
    sizes = rank["all_reduces"]
    assert len(sizes) == 2 * rollouts + rollouts + 2 * minibatches
    gradient_collectives = [n for n in sizes if n > rank["n_parameters"]]
    assert len(gradient_collectives) == minibatches
    assert len(set(gradient_collectives)) == 1  # the flattened gradients + the stats vector, every time


def test_prioritized_buffer_works_per_rank(learned) -> None:
    """Each rank keeps its own retained pool and draws its own order; the update stays one global step."""
    ranks = [r["prioritized"] for r in learned[0]]
    for key, value in ranks[0]["params"].items():
        assert th.equal(value, ranks[1]["params"][key])
    assert ranks[0]["timesteps"] == ranks[1]["timesteps"] == 512
    assert ranks[0]["retained"] == ranks[1]["retained"] > 0  # earlier samples kept by each rank's pool
    # rollouts 2..4 train on 64 current + retained samples per rank: more minibatches than the first one
    assert ranks[0]["grad_steps"] == ranks[1]["grad_steps"] > 4 * 2 * 2


def test_ranks_collect_with_their_own_seeds_and_merge_vecnormalize(learned) -> None:
    ranks = [r["cartpole"] for r in learned[0]]
    assert not np.array_equal(ranks[0]["first_obs"], ranks[1]["first_obs"])
    for key in ("obs_rms", "ret_rms"):
        mean0, var0, count0 = ranks[0][key]
        mean1, var1, count1 = ranks[1][key]
        assert np.array_equal(mean0, mean1) and np.array_equal(var0, var1) and count0 == count1
    # every rank's steps once (VecNormalize also counts the 2 reset observations of each rank)
    assert ranks[0]["obs_rms"][2] == pytest.approx(1e-4 + 1024 + WORLD * 2)
    assert ranks[0]["ret_rms"][2] == pytest.approx(1e-4 + 1024)
    assert ranks[1]["outputs"] == 0  # rank 1 logs nothing


def test_every_rank_resumes_from_rank_0_checkpoint(learned) -> None:
    ranks = [r["resumed"] for r in learned[0]]
    assert ranks[0]["timesteps"] == ranks[1]["timesteps"] == 1024 + 512
    for key, value in ranks[0]["params"].items():
        assert th.equal(value, ranks[1]["params"][key])
        assert not th.equal(value, learned[0][0]["cartpole"]["params"][key])


def test_checkpoint_saved_by_rank_0_loads_in_a_single_process(learned) -> None:
    ranks, out = learned
    model = ScalablePPO.load(out / "cartpole.zip", device="cpu")
    assert model.num_timesteps == 1024 and model.seed == 0 and model.n_envs == 2
    for key, value in model.policy.state_dict().items():
        assert th.equal(value, ranks[1]["cartpole"]["params"][key])
    assert model._reducer is LOCAL  # the single-process reducer, nothing of the ranks' process group


# ------------------------------------------------------------------------------------------------ errors
def _mismatch_worker(rank: int, out: Path) -> str:
    model = ScalablePPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, device="cpu",
                        learning_rate=3e-4 if rank == 0 else 1e-3)
    try:
        model.learn(64)
    except ValueError as error:
        return str(error)
    return "no error"


def _vec_normalize_mismatch_worker(rank: int) -> str:
    """VecNormalize on rank 0 only: its statistics' merge after each rollout would wait for a collective rank 1 never
    makes (a hang until the 30-minute timeout); the hyperparameter check refuses it first."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    env = make_vec_env("CartPole-v1", n_envs=1)
    model = ScalablePPO("MlpPolicy", VecNormalize(env) if rank == 0 else env, n_steps=32, batch_size=32, device="cpu")
    try:
        model.learn(64)
    except ValueError as error:
        return str(error)
    return "no error"


def test_mismatched_hyperparameters_fail_on_every_rank(spawned) -> None:
    for message in (r["vec_normalize_mismatch"] for r in spawned[0]):
        assert "hyperparameters differ across ranks" in message and "VecNormalize: rank 0 {" in message
    for message in (r["mismatch"] for r in spawned[0]):
        assert "hyperparameters differ across ranks" in message and "lr_schedule" in message
        assert "batch_size" not in message


def test_bad_set_ups_are_value_errors_naming_the_argument() -> None:
    model = SimpleNamespace(batch_size=63, grad_accum_steps=1, n_steps=64, n_envs=1, cuda_graphs=False,
                            device=th.device("cpu"))
    with pytest.raises(ValueError, match=r"batch_size must be divisible by the world size \(2 processes\).*63"):
        dp.check_data_parallel(model, 2, "gloo")
    model.batch_size, model.grad_accum_steps = 64, 40
    with pytest.raises(ValueError, match="grad_accum_steps must be <= batch_size / world_size = 32"):
        dp.check_data_parallel(model, 2, "gloo")
    model.batch_size, model.grad_accum_steps = 130, 1  # a single process would train on the whole rollout
    with pytest.raises(ValueError, match=r"batch_size / world_size = 65 must be <= n_steps \* n_envs = 64 "
                                         r"\(each rank's rollout\), got batch_size=130"):
        dp.check_data_parallel(model, 2, "gloo")
    model.batch_size = 64
    model.grad_accum_steps, model.cuda_graphs = 1, True
    with pytest.raises(ValueError, match="cuda_graphs=True needs CUDA devices and the NCCL backend.*'gloo'"):
        dp.check_data_parallel(model, 2, "gloo")
    with pytest.raises(ValueError, match="cuda_graphs=True is not supported in data-parallel training"):
        dp.check_data_parallel(model, 2, "nccl")
    model.cuda_graphs = False
    with pytest.raises(ValueError, match="the NCCL backend needs the policy on CUDA"):
        dp.check_data_parallel(model, 2, "nccl")
    dp.check_data_parallel(model, 2, "gloo")  # a good set-up passes


# ------------------------------------------------------------------------------------------------ pieces
def test_single_process_is_untouched() -> None:
    model = ScalablePPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, device="cpu", seed=0)
    assert not dp.is_distributed() and dp.rank() == 0 and dp.is_main_process()
    assert dp.attach(model) is model._reducer and model._reducer.world_size == 1
    assert dp.local_batch_size(model, 32) == 32 and dp.rank_device(th.device("cpu")) == th.device("cpu")
    assert dp.rank_seed(5, 4, rank_=2) == 13 and dp.rank_seed(None, 4) is None


def test_vecnormalize_moments_merge_like_one_process_seeing_both_ranks() -> None:
    rng = np.random.default_rng(0)
    base = RunningMeanStd(shape=(3,))
    base.update(rng.normal(2.0, 3.0, size=(50, 3)))
    snapshot = dp._snapshot(base)
    seen = [rng.normal(5.0, 0.5, size=(40, 3)), rng.normal(-1.0, 2.0, size=(70, 3))]
    ranks = []
    for data in seen:
        rms = copy.deepcopy(base)
        rms.update(data)
        ranks.append(rms)
    total = sum(dp.new_moments(rms, snapshot) for rms in ranks)
    merged = copy.deepcopy(base)
    dp.apply_moments(merged, snapshot, total)
    expected = copy.deepcopy(base)
    expected.update(np.concatenate(seen))
    np.testing.assert_allclose(merged.mean, expected.mean, rtol=1e-12)
    np.testing.assert_allclose(merged.var, expected.var, rtol=1e-10)
    assert merged.count == pytest.approx(expected.count)


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_train_under_torchrun(tmp_path) -> None:
    run = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "sb3_ppo_scale", "train", "--env", "CartPole-v1", "--n-timesteps", "2048", "--eval-freq", "1024",
               "--eval-episodes", "1", "--no-progress", "--log-dir", str(run), ]
    env = dict(os.environ, OMP_NUM_THREADS="1", **{dp.CHECK_SYNC_ENV: "1"})
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("saved ") == 1  # only rank 0 saves and evaluates
    model = ScalablePPO.load(run / "model.zip", device="cpu")
    assert model.num_timesteps == 2048  # both ranks' steps
    assert (run / "final_eval.json").is_file() and (run / "evaluations.npz").is_file()
    monitors = sorted(p.name for p in (run / "monitor").iterdir())
    assert monitors == [f"{i}.monitor.csv" for i in range(8)]  # rank 0's 8 envs only


def test_cli_mistake_that_needs_ranks_leaves_no_run_folder(tmp_path) -> None:
    """A batch_size no world size divides is refused before training, as single-process mistakes are: one line per
    rank, exit code 2, no run folder left behind."""
    run = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "sb3_ppo_scale", "train", "--env", "CartPole-v1", "--set", "batch_size=255", "--n-timesteps",
               "2048", "--no-progress", "--log-dir", str(run)]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                          timeout=300)
    assert done.returncode != 0
    assert "sb3-ppo-scale train: error: batch_size must be divisible by the world size (2 processes)" in done.stderr
    assert not run.exists()
