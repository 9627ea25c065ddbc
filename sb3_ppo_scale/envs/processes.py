"""An SB3 ``VecEnv`` over worker processes, several envs per worker, observations in shared memory, for any
Gymnasium env (:class:`ProcessVecEnv`, :func:`make_process_vec_env`).

Built on Gymnasium's vector envs: a ``gymnasium.vector.AsyncVectorEnv(shared_memory=True)`` runs one worker process
per group of envs, and each worker steps its group with a ``SyncVectorEnv`` (same-step autoreset). Observations of
all envs come back through one shared-memory block, laid out ``(n_workers, envs_per_worker, ...)`` and read here as
``(n_envs, ...)``; actions, rewards, episode ends and infos go through each worker's pipe. SB3's ``SubprocVecEnv``
instead runs one process per env and pickles every observation through its pipe.

Gymnasium does not take a ``SyncVectorEnv`` as an ``AsyncVectorEnv`` sub-env as it is, on two counts, so the worker's
env is :class:`WorkerEnvs`, a ``SyncVectorEnv`` subclass that changes two things and steps and resets as its base:

- infos: Gymnasium batches a vector env's infos into arrays with ``_key`` masks, and ``AsyncVectorEnv`` batches the
  workers' infos again; the two levels' masks collide when an episode ends (``ValueError: setting an array element
  with a sequence``) and batching turns Python scalars into NumPy ones. ``WorkerEnvs`` overrides ``_add_info`` (the
  one hook through which both reset and step hand over each env's info) to keep each env's info dict as the env
  returned it, and returns them, already in SB3's form, inside one opaque object that ``AsyncVectorEnv`` passes on;
- ``AsyncVectorEnv.call``/``get_attr`` ask the sub-env for ``get_wrapper_attr``, which only single envs have:
  ``WorkerEnvs`` defines it, and :meth:`WorkerEnvs.for_envs` runs an operation on some of its envs (``get_attr``,
  ``set_attr``, ``env_method`` and ``env_is_wrapped`` go through it, with per-env indices mapped to (worker, slot)).

SB3's episode contract, exactly as ``DummyVecEnv`` gives it (tests/test_process_vec_env.py checks it against one):
a finished env is reset in the same step, its last observation in ``infos[i]["terminal_observation"]``;
``infos[i]["TimeLimit.truncated"]`` is ``truncated and not terminated`` on every step; ``dones`` is ``terminated or
truncated``; rewards are float32; ``reset_infos[i]`` holds the info of env ``i``'s last reset; env ``i`` is reset
with seed ``seed + i`` after ``seed(seed)``. Each env is built by its own env function, as ``DummyVecEnv`` builds it:
:func:`make_process_vec_env` goes through SB3's ``make_vec_env`` (``Monitor`` on each env, so infos carry
``"episode"``; action space ``i`` seeded with ``seed + i``).

Faults: a worker that dies (killed, crashed) makes the next call raise :class:`EnvWorkerError`, naming the worker, its
pid, the envs it hosted and how it ended; the call never hangs (it waits on the workers' pipes and on their process
sentinels together). An exception raised by an env's ``step``/``reset`` ends its worker too (Gymnasium's worker
stops on any error) and is raised as :class:`EnvWorkerError` chained to it. Either way the other workers are stopped
and the VecEnv is closed: resume from the last checkpoint with a new one (docs/envs.md). Exceptions from
``get_attr``/``set_attr``/``env_method`` leave the worker running and are raised as they are (``AttributeError``...).
Workers ignore SIGINT (Ctrl-C reaches the training process alone, which can checkpoint and close them) and die of
SIGTERM.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import connection
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from stable_baselines3.common.env_util import is_wrapped, make_vec_env
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from sb3_ppo_scale.core.checks import is_int

T = TypeVar("T")
#: The info key under which a worker hands its envs' infos to ``AsyncVectorEnv`` (one :class:`WorkerInfos`).
INFO_KEY = "sb3_ppo_scale.worker_infos"


class EnvWorkerError(RuntimeError):
    """An env worker process died or its env raised; the :class:`ProcessVecEnv` is closed.

    ``worker`` is the worker's index, ``pid`` its process id, ``env_indices`` the VecEnv indices of its envs.
    """

    def __init__(self, message: str, worker: int | None, pid: int | None, env_indices: range | None) -> None:
        super().__init__(message)
        self.worker, self.pid, self.env_indices = worker, pid, env_indices


class WorkerInfos:
    """One worker's infos for one reset or step, per env of the worker, in SB3's form: ``infos`` (a step's; the
    reset's in a reset) and ``reset_infos`` (None where the env was not reset)."""

    __slots__ = ("infos", "reset_infos", "_calls")

    def __init__(self, n_envs: int) -> None:
        self._calls: list[list[dict[str, Any]]] = [[] for _ in range(n_envs)]
        self.infos: list[dict[str, Any]] = []
        self.reset_infos: list[dict[str, Any] | None] = []

    def __getstate__(self) -> tuple[list[dict[str, Any]], list[dict[str, Any] | None]]:
        return self.infos, self.reset_infos

    def __setstate__(self, state: tuple[list[dict[str, Any]], list[dict[str, Any] | None]]) -> None:
        self.infos, self.reset_infos = state
        self._calls = []


class WorkerEnvs(SyncVectorEnv):
    """The envs of one worker process: a ``SyncVectorEnv`` with same-step autoreset whose infos are SB3's per-env
    dicts (see the module docstring); ``worker_index`` is its place among the workers."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], worker_index: int) -> None:
        super().__init__(env_fns, copy=False, autoreset_mode=AutoresetMode.SAME_STEP)
        self.worker_index = worker_index

    def _add_info(self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
        """Keep ``env_info`` as it is (step: the env's step info, or ``{"final_obs", "final_info"}`` and then the
        reset info for an env that finished; reset: the reset info)."""
        infos = vector_infos.get(INFO_KEY) or WorkerInfos(self.num_envs)
        infos._calls[env_num].append(env_info)
        return {INFO_KEY: infos}

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, infos = super().reset(**kwargs)
        calls = infos[INFO_KEY]._calls
        infos[INFO_KEY].infos = [info for (info,) in calls]
        infos[INFO_KEY].reset_infos = list(infos[INFO_KEY].infos)
        return obs, infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rewards, terminated, truncated, infos = super().step(actions)
        batch = infos[INFO_KEY]
        for calls, terminal, truncation in zip(batch._calls, terminated, truncated):
            finished = len(calls) == 2  # {"final_obs", "final_info"}, then the info of its reset in this step
            info = calls[0]["final_info"] if finished else calls[0]
            info["TimeLimit.truncated"] = bool(truncation and not terminal)  # as DummyVecEnv, on every step
            if finished:
                info["terminal_observation"] = calls[0]["final_obs"]
            batch.infos.append(info)
            batch.reset_infos.append(calls[1] if finished else None)
        return obs, rewards, terminated, truncated, infos

    def get_wrapper_attr(self, name: str) -> Any:
        """What ``AsyncVectorEnv.call`` reads in the worker: this object's attribute ``name``."""
        return getattr(self, name)

    def env_name(self) -> str:
        """The first env's id (its spec's), else its unwrapped class name: for error messages."""
        env = self.envs[0]
        return env.spec.id if env.spec is not None else type(env.unwrapped).__name__

    def for_envs(self, slots: Sequence[Sequence[int]], operation: Callable[..., Any],
                 *args: Any) -> list[tuple[Any, BaseException | None]]:
        """``operation(env, *args)`` on this worker's envs ``slots[worker_index]``: (result, None) or (None, the
        exception it raised), one per slot (an exception does not end the worker)."""
        results: list[tuple[Any, BaseException | None]] = []
        for slot in slots[self.worker_index]:
            try:
                results.append((operation(self.envs[slot], *args), None))
            except Exception as error:
                results.append((None, error))
        return results


def _get_attr(env: gym.Env, name: str) -> Any:
    return env.get_wrapper_attr(name)  # as DummyVecEnv.get_attr


def _set_attr(env: gym.Env, name: str, value: Any) -> None:
    setattr(env, name, value)  # as DummyVecEnv.set_attr


def _env_method(env: gym.Env, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return env.get_wrapper_attr(name)(*args, **kwargs)  # as DummyVecEnv.env_method


def _make_worker(env_fns: Sequence[Callable[[], gym.Env]], worker_index: int, parent_pid: int) -> WorkerEnvs:
    """A worker's envs. In the worker process (``AsyncVectorEnv`` also builds one in the parent, to read the spaces)
    SIGINT is ignored first, so that Ctrl-C reaches the training process alone, and SIGTERM ends the worker, whatever
    handler a forked worker inherited (e.g. a checkpoint callback's, which would keep it alive)."""
    if os.getpid() != parent_pid:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return WorkerEnvs(env_fns, worker_index)


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_workers(n_envs: int, cores: int | None = None) -> int:
    """The most worker processes, at most one per core (``cores``, default :func:`available_cores`), that split
    ``n_envs`` evenly."""
    cores = available_cores() if cores is None else cores
    return max(w for w in range(1, min(cores, n_envs) + 1) if n_envs % w == 0)


def _check_workers(n_workers: object, n_envs: int) -> int:
    divisors = [w for w in range(1, n_envs + 1) if n_envs % w == 0]
    if not is_int(n_workers) or n_workers not in divisors:
        raise ValueError(f"n_workers must be None (default: the most workers, one per core, that split the envs "
                         f"evenly) or an int that divides n_envs={n_envs}: one of {divisors}; got {n_workers!r}")
    return int(n_workers)  # type: ignore[call-overload]


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "lost its pipe"
    if exitcode < 0:
        return f"killed by signal {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


class ProcessVecEnv(VecEnv):
    """SB3 ``VecEnv`` whose envs run in ``n_workers`` processes, ``num_envs // n_workers`` envs each, observations in
    shared memory (see the module docstring). Build it with :func:`make_process_vec_env`, or, like SB3's
    ``SubprocVecEnv``, from one env function per env (e.g. ``make_vec_env(..., vec_env_cls=ProcessVecEnv)``).

    :param env_fns: one function per env, each returning a new Gymnasium env (picklable by cloudpickle for the
        ``spawn``/``forkserver`` start methods). Env ``i`` runs in worker ``i // envs_per_worker``.
    :param n_workers: worker processes; must divide ``len(env_fns)`` (default: :func:`default_workers`).
    :param start_method: the ``multiprocessing`` start method (default: the platform's; ``fork`` on Linux before
        Python 3.14, which starts workers fastest).
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], n_workers: int | None = None,
                 start_method: str | None = None) -> None:
        n_envs = len(env_fns)
        if n_envs < 1:
            raise ValueError("env_fns must hold at least one env function, got none")
        self.n_workers = default_workers(n_envs) if n_workers is None else _check_workers(n_workers, n_envs)
        self.envs_per_worker = n_envs // self.n_workers
        k = self.envs_per_worker
        worker_fns = [functools.partial(_make_worker, list(env_fns[w * k:(w + 1) * k]), w, os.getpid())
                      for w in range(self.n_workers)]
        self.num_envs = n_envs  # the worker error messages use it before VecEnv.__init__
        self._fault: EnvWorkerError | None = None
        self._stepping = False
        self._async = AsyncVectorEnv(worker_fns, shared_memory=True, copy=True, context=start_method,
                                     autoreset_mode=AutoresetMode.DISABLED)
        self.env_name = "?"
        self.env_name = self._call_workers("env_name")[0]
        single_obs, single_action = (self._call_workers(name)[0] for name in
                                     ("single_observation_space", "single_action_space"))
        super().__init__(n_envs, single_obs, single_action)

    # ------------------------------------------------------------------------------------------------ workers
    @property
    def worker_pids(self) -> list[int | None]:
        """The process id of each worker."""
        return [process.pid for process in self._async.processes]

    def worker_envs(self, worker: int) -> range:
        """The VecEnv indices of worker ``worker``'s envs."""
        return range(worker * self.envs_per_worker, (worker + 1) * self.envs_per_worker)

    def _describe(self, worker: int) -> str:
        envs = self.worker_envs(worker)
        hosted = f"env {envs[0]}" if len(envs) == 1 else f"envs {envs[0]}-{envs[-1]}"
        return f"env worker {worker} (pid {self.worker_pids[worker]}, {hosted} of {self.env_name})"

    def _wait_for_workers(self) -> None:
        """Block until every worker has answered; EnvWorkerError as soon as one has died instead."""
        pipes, processes = self._async.parent_pipes, self._async.processes
        waiting = set(range(self.n_workers))
        while waiting:
            handles = {pipes[w]: w for w in waiting} | {processes[w].sentinel: w for w in waiting}
            for handle in connection.wait(list(handles)):
                worker = handles[handle]
                if handle == processes[worker].sentinel:
                    raise self._died(worker)
                waiting.discard(worker)

    def _died(self, worker: int | None) -> EnvWorkerError:
        """The error for a dead worker (``None``: the first that has ended, if any, after a broken pipe)."""
        processes = self._async.processes
        if worker is None:
            ended = connection.wait([process.sentinel for process in processes], timeout=5.0)
            worker = next((w for w, p in enumerate(processes) if p.sentinel in ended), None)
        if worker is None:
            return self._fail(None, "env worker pipe broke, no worker has ended")
        processes[worker].join(timeout=5.0)
        return self._fail(worker, f"{self._describe(worker)} died: {_exit_reason(processes[worker].exitcode)}")

    def _fail(self, worker: int | None, what: str) -> EnvWorkerError:
        """Stop every worker, close this VecEnv, and the error to raise (kept: later calls raise it again)."""
        self._fault = EnvWorkerError(
            f"{what}; the other workers were stopped and this ProcessVecEnv is closed: resume from the last "
            "checkpoint with a new one", worker, None if worker is None else self.worker_pids[worker],
            None if worker is None else self.worker_envs(worker))
        self._stop_workers()
        return self._fault

    def _stop_workers(self) -> None:
        """End every worker without reading their pipes: SIGTERM, and SIGKILL for one still running after a second
        (an env may catch SIGTERM: SDL does once an env has rendered)."""
        processes = self._async.processes
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(timeout=1.0)
            if process.exitcode is None:
                process.kill()
        self._async._state = AsyncState.DEFAULT  # nothing more is read from the pipes
        self._async.close(terminate=True)  # closes the pipes, joins the processes

    def _guarded(self, operation: Callable[[], T]) -> T:
        """``operation()`` on the workers; a dead or failed worker becomes :class:`EnvWorkerError`."""
        if self._fault is not None:
            raise self._fault
        try:
            return operation()
        except EnvWorkerError:
            raise
        except (OSError, EOFError) as error:  # a pipe to a worker that has ended
            raise self._died(None) from error
        except Exception as error:
            failed = [w for w, pipe in enumerate(self._async.parent_pipes) if pipe is None]
            if not failed:  # not from a worker (e.g. a call while a step is pending)
                raise
            raise self._fail(failed[0], f"{self._describe(failed[0])} raised {type(error).__name__}: {error}; the "
                                        "worker has stopped") from error

    def _call_workers(self, name: str, *args: Any) -> list[Any]:
        """``WorkerEnvs.<name>`` (called with ``args`` if it is a method) in every worker, one result per worker."""
        def call() -> list[Any]:
            self._async.call_async(name, *args)
            self._wait_for_workers()
            return list(self._async.call_wait())
        return self._guarded(call)

    def _for_envs(self, indices: VecEnvIndices, operation: Callable[..., Any], *args: Any) -> list[Any]:
        """``operation(env, *args)`` on the envs of ``indices``, in their order; re-raises an env's exception."""
        ids = list(self._get_indices(indices))
        slots: list[list[int]] = [[] for _ in range(self.n_workers)]
        for index in ids:
            slots[index // self.envs_per_worker].append(index % self.envs_per_worker)
        answers: list[Iterator[tuple[Any, BaseException | None]]] = [
            iter(results) for results in self._call_workers("for_envs", slots, operation, *args)]
        values = []
        for index in ids:
            value, error = next(answers[index // self.envs_per_worker])
            if error is not None:
                raise error
            values.append(value)
        return values

    # ------------------------------------------------------------------------------------------------ layout
    def _flat(self, obs: Any) -> Any:
        """Observations laid out ``(n_workers, envs_per_worker, ...)`` as ``(n_envs, ...)`` (dicts key by key)."""
        if isinstance(obs, dict):
            return {key: self._flat(value) for key, value in obs.items()}
        if isinstance(obs, tuple):
            return tuple(self._flat(value) for value in obs)
        return obs.reshape(self.num_envs, *obs.shape[2:])

    def _per_worker(self, values: Sequence[Any]) -> list[list[Any]]:
        """``values`` (one per env) split into one list per worker."""
        k = self.envs_per_worker
        return [list(values[w * k:(w + 1) * k]) for w in range(self.n_workers)]

    @staticmethod
    def _infos(info: dict[str, Any]) -> list[WorkerInfos]:
        return list(info[INFO_KEY])

    # ------------------------------------------------------------------------------------------------ VecEnv API
    def reset(self) -> VecEnvObs:
        """Reset every env (env ``i`` with the seed and options set by ``seed()``/``set_options()``, used once)."""
        if self._stepping:  # SB3's contract: a pending step is dropped
            self.step_wait()
        options = self._options[0] or None
        if any(option != self._options[0] for option in self._options):
            raise ValueError("options: ProcessVecEnv resets every env with the same options; set_options() gave "
                             "different ones per env")

        def reset() -> tuple[Any, dict[str, Any]]:
            self._async.reset_async(seed=self._per_worker(self._seeds), options=options)
            self._wait_for_workers()
            return self._async.reset_wait()
        obs, info = self._guarded(reset)
        self.reset_infos = [reset_info for batch in self._infos(info) for reset_info in batch.reset_infos]
        self._reset_seeds()
        self._reset_options()
        return self._flat(obs)

    def step_async(self, actions: np.ndarray) -> None:
        """Send each worker its envs' actions (``actions``: one row per env)."""
        actions = np.asarray(actions)
        self._guarded(lambda: self._async.step_async(actions.reshape(self.n_workers, self.envs_per_worker,
                                                                     *actions.shape[1:])))
        self._stepping = True

    def step_wait(self) -> VecEnvStepReturn:
        """(observations, float32 rewards, bool dones, infos) of the step sent by :meth:`step_async`."""
        def receive() -> tuple[Any, ...]:
            self._wait_for_workers()
            return self._async.step_wait()
        self._stepping = False
        obs, rewards, terminated, truncated, info = self._guarded(receive)
        infos = []
        for w, batch in enumerate(self._infos(info)):
            infos.extend(batch.infos)
            for index, reset_info in zip(self.worker_envs(w), batch.reset_infos):
                if reset_info is not None:
                    self.reset_infos[index] = reset_info
        dones = np.logical_or(terminated, truncated).reshape(self.num_envs)
        return self._flat(obs), rewards.reshape(self.num_envs).astype(np.float32), dones, infos

    def close(self) -> None:
        """Stop the workers (nothing to do after a fault, which stopped them)."""
        if self._fault is not None or self._async.closed:
            return
        try:
            self._async.close()
        except Exception:  # a worker died: stop the others
            self._stop_workers()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Each selected env's attribute (through its wrappers, as ``DummyVecEnv``), read in its worker."""
        return self._for_envs(indices, _get_attr, attr_name)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """``setattr(env, attr_name, value)`` on each selected env (its outermost wrapper, as ``DummyVecEnv``)."""
        self._for_envs(indices, _set_attr, attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        """Each selected env's ``method_name(*method_args, **method_kwargs)``, run in its worker."""
        return self._for_envs(indices, _env_method, method_name, method_args, method_kwargs)

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether each selected env is wrapped in ``wrapper_class``."""
        return self._for_envs(indices, is_wrapped, wrapper_class)

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` (``rgb_array`` render mode; else None per env, as ``DummyVecEnv``)."""
        if self.render_mode != "rgb_array":
            return [None] * self.num_envs
        return [frame for frames in self._call_workers("render") for frame in frames]


def make_process_vec_env(env_id: str | Callable[..., gym.Env], n_envs: int, n_workers: int | None = None,
                         seed: int = 0, wrapper_class: Callable[[gym.Env], gym.Env] | None = None,
                         env_kwargs: dict[str, Any] | None = None, monitor_kwargs: dict[str, Any] | None = None,
                         monitor_dir: str | None = None, start_method: str | None = None) -> ProcessVecEnv:
    """A :class:`ProcessVecEnv` of ``n_envs`` envs built as SB3's ``make_vec_env`` builds them (``gym.make(env_id,
    **env_kwargs)`` or ``env_id(**env_kwargs)``, ``Monitor``, then ``wrapper_class``; env ``i`` seeded with
    ``seed + i``), so that ``make_vec_env(env_id, n_envs, seed=seed)`` (a ``DummyVecEnv``) steps the same episodes.

    :param n_workers: worker processes, dividing ``n_envs`` (default: the most, one per core, that split the envs
        evenly: :func:`default_workers`).
    :param monitor_dir: folder for the Monitor CSV files (default: none written).
    :param start_method: see :class:`ProcessVecEnv`.
    """
    if not is_int(n_envs) or n_envs < 1:  # type: ignore[operator]
        raise ValueError(f"n_envs must be an int >= 1, got {n_envs!r}")
    env = make_vec_env(env_id, n_envs, seed=seed, wrapper_class=wrapper_class, env_kwargs=env_kwargs,
                       monitor_dir=monitor_dir, monitor_kwargs=monitor_kwargs,
                       vec_env_cls=ProcessVecEnv,  # type: ignore[arg-type]
                       vec_env_kwargs={"n_workers": n_workers, "start_method": start_method})
    assert isinstance(env, ProcessVecEnv)
    return env


__all__ = ["EnvWorkerError", "ProcessVecEnv", "WorkerEnvs", "available_cores", "default_workers",
           "make_process_vec_env"]
