"""Episodes in progress, captured at a rollout boundary and put back on resume, so that a resumed run continues
them step for step instead of resetting its envs.

An env's episode state is the state of each layer of its wrapper chain, outermost first:

- the layers of :data:`LAYER_ATTRIBUTES` (SB3's ``Monitor`` and Atari wrappers, Gymnasium's ``TimeLimit``,
  ``OrderEnforcing``, ``PassiveEnvChecker`` and other common wrappers, the classic-control envs and ``Taxi``, and the
  envs of the contrib configs: rl_zoo3's velocity-masking wrapper of the ``<Env>NoVel`` ids and sb3-contrib's
  ``InvalidActionEnv*`` masking envs): those attributes, deep-copied;
- Gymnasium's MuJoCo envs (classes defined in ``gymnasium.envs.mujoco``): a copy of the whole ``MjData``, put back
  with ``mujoco.mj_copyData``. A copy of the integration state alone (``mj_getState``) is not enough: the envs read
  body positions that ``mj_step`` left from before its last integration (Ant's and Humanoid's rewards), and
  ``mj_forward`` would recompute them from the new state;
- ALE's ``AtariEnv`` without sticky actions (``repeat_action_probability=0``, the ``NoFrameskip-v4`` ids): the
  emulator's state with its RNG (``cloneState(include_rng=True)``). With sticky actions (the ``ALE/...-v5`` ids) the
  next step may repeat the emulator's previous action, which ALE's state does not hold, so there is no episode state;
- any layer whose class defines ``get_episode_state()`` and ``set_episode_state(state)`` (your own env or wrapper
  can opt in this way): what those return and take.

The env's ``np_random`` is not part of it (the checkpoint restores it for every env). Model parameters an env
changes itself (domain randomisation) are not captured. An env with any other layer has no episode state
(:func:`capture_episodes` says which layer); the resumed run then resets it, as before.

Vectorised: an SB3 ``DummyVecEnv`` (its envs live in this process), or a ``SubprocVecEnv`` whose envs are each
wrapped, outermost, in :class:`EpisodeState` (it captures and restores its env inside the worker process), under the
wrappers of :data:`VEC_ATTRIBUTES` (``VecNormalize``'s running discounted return per env, ``returns``, and the last
raw observation and reward; ``VecFrameStack``'s stacked frames; ``VecMonitor``'s running returns and lengths; ``VecTransposeImage``). Any other VecEnv (EnvPool, a
``SubprocVecEnv`` without the wrapper, ...) has no episode state here.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control import (
    AcrobotEnv,
    CartPoleEnv,
    Continuous_MountainCarEnv,
    MountainCarEnv,
    PendulumEnv,
)
from gymnasium.envs.toy_text import TaxiEnv
from gymnasium.wrappers import (
    ClipAction,
    FlattenObservation,
    FrameStackObservation,
    NormalizeObservation,
    NormalizeReward,
    OrderEnforcing,
    PassiveEnvChecker,
    RecordEpisodeStatistics,
    RescaleAction,
    TimeAwareObservation,
)
from stable_baselines3.common.atari_wrappers import (
    AtariWrapper,
    ClipRewardEnv,
    EpisodicLifeEnv,
    FireResetEnv,
    MaxAndSkipEnv,
    NoopResetEnv,
    WarpFrame,
)
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    SubprocVecEnv,
    VecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
)


def _name(cls: type) -> str:
    """A class by name (checkpoints keep names, so a class that cannot be imported still loads)."""
    return f"{cls.__module__}.{cls.__qualname__}"


_STATELESS: tuple[str, ...] = ()
#: Layer classes (by :func:`_name`) -> the attributes that hold an episode's state (the class's other attributes
#: are set at construction and do not change while it runs). By name, because rl_zoo3 replaces
#: ``gymnasium.wrappers.TimeLimit`` with its own subclass when it is imported.
LAYER_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    _name(Monitor): ("rewards", "needs_reset", "episode_returns", "episode_lengths", "episode_times", "total_steps",
                     "current_reset_info"),
    "gymnasium.wrappers.common.TimeLimit": ("_elapsed_steps",),
    "rl_zoo3.gym_patches.PatchedTimeLimit": ("_elapsed_steps",),  # TimeLimit with another step(), no other state
    _name(OrderEnforcing): ("_has_reset",),
    _name(PassiveEnvChecker): ("checked_reset", "checked_step", "checked_render"),
    # Gymnasium's other common wrappers (a Transform* wrapper's function is the user's, so it is not among them)
    _name(ClipAction): _STATELESS,
    _name(RescaleAction): _STATELESS,
    _name(FlattenObservation): _STATELESS,
    _name(RecordEpisodeStatistics): ("episode_count", "episode_returns", "episode_lengths", "episode_start_time",
                                     "return_queue", "length_queue", "time_queue"),
    _name(NormalizeObservation): ("obs_rms", "_update_running_mean"),
    _name(NormalizeReward): ("return_rms", "discounted_reward", "_update_running_mean"),
    _name(TimeAwareObservation): ("timesteps",),
    _name(FrameStackObservation): ("obs_queue", "stacked_obs"),
    _name(CartPoleEnv): ("state", "steps_beyond_terminated"),
    _name(PendulumEnv): ("state", "last_u"),
    _name(AcrobotEnv): ("state",),
    _name(MountainCarEnv): ("state",),
    _name(Continuous_MountainCarEnv): ("state",),
    _name(TaxiEnv): ("s", "lastaction", "fickle_step", "taxi_orientation"),
    # the contrib configs' envs: rl_zoo3's <Env>NoVel-v<k> wrapper (a fixed mask), and sb3-contrib's masking envs,
    # which draw the next target from their action space's RNG (so the space, with its RNG, is episode state) and
    # the masked actions from NumPy's global RNG (which the checkpoint restores)
    "rl_zoo3.wrappers.MaskVelocityWrapper": _STATELESS,
    **{f"sb3_contrib.common.envs.invalid_actions_env.{name}": ("state", "current_step", "num_resets", "invalid_actions",
                                                              "action_space")
       for name in ("InvalidActionEnvDiscrete", "InvalidActionEnvMultiDiscrete", "InvalidActionEnvMultiBinary")},
    # SB3's Atari wrappers (AtariWrapper is the outer one of the others)
    _name(AtariWrapper): _STATELESS,
    _name(ClipRewardEnv): _STATELESS,
    _name(WarpFrame): _STATELESS,
    _name(FireResetEnv): _STATELESS,
    _name(NoopResetEnv): _STATELESS,
    _name(EpisodicLifeEnv): ("lives", "was_real_done"),
    _name(MaxAndSkipEnv): ("_obs_buffer",),
}
#: VecEnv wrappers -> the attributes that change while episodes run
VEC_ATTRIBUTES: dict[type, tuple[str, ...]] = {
    VecNormalize: ("returns", "old_obs", "old_reward"),
    VecFrameStack: ("stacked_obs",),
    VecTransposeImage: (),
    VecMonitor: ("episode_returns", "episode_lengths", "episode_count"),
}
#: Gymnasium's MuJoCo envs: the module their classes are defined in starts with this
MUJOCO_MODULE = "gymnasium.envs.mujoco."
#: the Arcade Learning Environment's Gymnasium envs (``AtariEnv``)
ALE_MODULE = "ale_py."


def _opted_in(layer: Any) -> bool:
    return callable(getattr(type(layer), "get_episode_state", None)) and \
        callable(getattr(type(layer), "set_episode_state", None))


def _is_mujoco(layer: Any) -> bool:
    return type(layer).__module__.startswith(MUJOCO_MODULE) and hasattr(layer, "data") and hasattr(layer, "model")


def _is_ale(layer: Any) -> bool:
    return type(layer).__module__.startswith(ALE_MODULE) and hasattr(layer, "ale")


def _layers(env: gym.Env) -> list[Any]:
    """``env``'s wrapper chain, outermost first, down to the unwrapped env."""
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _capture_layer(layer: Any) -> tuple[dict[str, Any] | None, str]:
    """(the layer's episode state, "") or (None, why it has none)."""
    if _opted_in(layer):
        return {"custom": layer.get_episode_state()}, ""
    if _is_mujoco(layer):
        return {"mjdata": copy.copy(layer.data)}, ""  # MjData's copy is a full, independent one
    if _is_ale(layer):
        if layer.ale.getFloat("repeat_action_probability") > 0:
            return None, (f"{_name(type(layer))} repeats actions (sticky actions), and the emulator's previous action "
                          "is not part of ALE's state")
        return {"ale": layer.ale.cloneState(include_rng=True)}, ""  # the emulator and its RNG
    names = LAYER_ATTRIBUTES.get(_name(type(layer)))
    if names is None:
        return None, f"{_name(type(layer))} is not a layer whose episode state is known"
    return {name: copy.deepcopy(getattr(layer, name, None)) for name in names}, ""


def _restore_layer(layer: Any, state: dict[str, Any]) -> None:
    if "custom" in state:
        layer.set_episode_state(state["custom"])
    elif "mjdata" in state:
        import mujoco

        mujoco.mj_copyData(layer.data, layer.model, state["mjdata"])
    elif "ale" in state:
        layer.ale.restoreState(state["ale"])
    else:
        for name, value in state.items():
            setattr(layer, name, copy.deepcopy(value))


def capture_env(env: gym.Env) -> tuple[list[Any] | None, str]:
    """(each layer's episode state, outermost first; "") or (None, the first layer that has none)."""
    states = []
    for layer in _layers(env):
        state, why = _capture_layer(layer)
        if state is None:
            return None, why
        states.append((_name(type(layer)), state))
    return states, ""


def layer_names(env: gym.Env) -> list[str]:
    """The classes of ``env``'s layers, outermost first (what :func:`restore_env` checks a capture against)."""
    return [_name(type(layer)) for layer in _layers(env)]


def restore_env(env: gym.Env, states: list[Any]) -> bool:
    """Put ``states`` (from :func:`capture_env`) back into ``env``, a fresh env built as the captured one was; False
    (nothing changed) when its layers are not the captured ones."""
    if layer_names(env) != [name for name, _ in states]:
        return False
    for layer, (_, state) in zip(_layers(env), states):
        _restore_layer(layer, state)
    return True


class EpisodeState(gym.Wrapper):
    """The episode state of the env it wraps, reachable from another process: wrap each env of a ``SubprocVecEnv``
    in it, outermost (``make_vec_env(..., vec_env_cls=SubprocVecEnv, wrapper_class=EpisodeState)``), and checkpoints
    capture and restore its episodes through ``env_method``. Steps and resets pass through unchanged; in a
    ``DummyVecEnv`` it is a layer without state of its own."""

    def capture_episode_state(self) -> tuple[list[Any] | None, str]:
        """:func:`capture_env` of the wrapped env."""
        return capture_env(self.env)

    def episode_state_layers(self) -> list[str]:
        """:func:`layer_names` of the wrapped env."""
        return layer_names(self.env)

    def restore_episode_state(self, states: list[Any]) -> bool:
        """:func:`restore_env` into the wrapped env."""
        return restore_env(self.env, states)


LAYER_ATTRIBUTES[_name(EpisodeState)] = _STATELESS


def vec_layers(venv: VecEnv) -> list[VecEnv]:
    """``venv`` and each VecEnv it wraps, outermost first (the last is the base VecEnv)."""
    layers = [venv]
    while hasattr(layers[-1], "venv"):
        layers.append(layers[-1].venv)
    return layers


def _wrapped_in_episode_state(base: VecEnv) -> bool:
    """A SubprocVecEnv whose every env is an :class:`EpisodeState` (its outermost layer)."""
    return type(base) is SubprocVecEnv and all(cls is EpisodeState for cls in base.get_attr("__class__"))


def capture_episodes(venv: VecEnv) -> tuple[dict[str, Any] | None, str]:
    """The episode state of every env of ``venv`` and of its VecEnv wrappers, or (None, why not)."""
    layers = vec_layers(venv)
    wrappers, base = layers[:-1], layers[-1]
    for wrapper in wrappers:
        if type(wrapper) not in VEC_ATTRIBUTES:
            return None, f"VecEnv wrapper {type(wrapper).__name__} is not one whose episode state is known"
    if _wrapped_in_episode_state(base):
        captured = base.env_method("capture_episode_state")
    elif type(base) is SubprocVecEnv:
        return None, "SubprocVecEnv: its envs are in other processes; wrap each, outermost, in EpisodeState"
    elif type(base) is DummyVecEnv:
        captured = [capture_env(env) for env in base.envs]
    else:
        return None, f"{type(base).__name__}: only a DummyVecEnv's or SubprocVecEnv's envs can be captured"
    envs = []
    for states, why in captured:
        if states is None:
            return None, why
        envs.append(states)
    vec = [(_name(type(w)), {name: copy.deepcopy(getattr(w, name, None)) for name in VEC_ATTRIBUTES[type(w)]})
           for w in wrappers]
    return {"vec": vec, "envs": envs}, ""


def restore_episodes(venv: VecEnv, captured: dict[str, Any]) -> bool:
    """Put the episodes of :func:`capture_episodes` back into ``venv`` (built and reset as the captured one was);
    False, with nothing changed, when ``venv`` is not made of the same layers."""
    layers = vec_layers(venv)
    wrappers, base = layers[:-1], layers[-1]
    if [_name(type(w)) for w in wrappers] != [name for name, _ in captured["vec"]] \
            or base.num_envs != len(captured["envs"]):
        return False
    in_workers = _wrapped_in_episode_state(base)
    if in_workers:
        built = base.env_method("episode_state_layers")
    elif type(base) is DummyVecEnv:
        built = [layer_names(env) for env in base.envs]
    else:
        return False
    if any(names != [name for name, _ in states] for names, states in zip(built, captured["envs"])):
        return False
    for index, states in enumerate(captured["envs"]):
        if in_workers:
            base.env_method("restore_episode_state", states, indices=[index])
        else:
            restore_env(base.envs[index], states)
    for wrapper, (_, state) in zip(wrappers, captured["vec"]):
        for name, value in state.items():
            setattr(wrapper, name, copy.deepcopy(value))
    return True
