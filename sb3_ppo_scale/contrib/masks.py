"""Action masks: their expected layout for an action space, and the check that turns a bad mask into a clear error.

sb3-contrib flattens a mask per observation to ``mask_dims`` booleans: ``n`` for ``Discrete(n)``, ``sum(nvec)`` for
``MultiDiscrete(nvec)`` (one block per sub-action), ``2 * n`` for ``MultiBinary(n)`` (one pair per bit). A mask of
another size fails deep in a reshape; a row (or sub-action block) with no True entry gives the masked distribution
nothing to sample from (every logit at -1e8), so the policy silently samples a forbidden action. Both are refused
here, naming the argument.

Envs that report their valid actions in ``info`` (Gymnasium's Taxi and many game envs put
them under ``info["action_mask"]``) get the ``action_masks()`` method MaskablePPO reads from
:class:`InfoActionMasker`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import gymnasium as gym
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.utils import get_action_masks
from stable_baselines3.common.vec_env import VecEnv
from torch import nn


def mask_blocks(action_space: spaces.Space) -> list[int]:
    """The sizes of the mask's blocks, one per sub-action (their sum is ``mask_dims``)."""
    if isinstance(action_space, spaces.Discrete):
        return [int(action_space.n)]
    if isinstance(action_space, spaces.MultiDiscrete):
        return [int(n) for n in np.asarray(action_space.nvec).ravel()]
    if isinstance(action_space, spaces.MultiBinary):
        return [2] * int(np.prod(action_space.shape))
    raise ValueError(f"action masks need a Discrete, MultiDiscrete or MultiBinary action space, got {action_space}")


def check_action_masks(masks: Any, action_space: spaces.Space, n_rows: int | None, argument: str) -> None:
    """Raise ValueError naming ``argument`` unless ``masks`` holds ``n_rows`` masks (any count when None) of
    ``mask_dims`` entries each, booleans or numbers (nonzero allows, as sb3-contrib reads them), with at least one
    allowed action in every row and sub-action block. A tensor is read where it lives (sb3-contrib takes one on any
    device, with or without ``requires_grad``)."""
    blocks = mask_blocks(action_space)
    mask_dims = sum(blocks)
    array = masks.detach().cpu().numpy() if isinstance(masks, th.Tensor) else np.asarray(masks)
    if array.dtype.kind not in "biuf":  # str, object (None, ragged rows): a TypeError from inside torch
        raise ValueError(f"{argument} must hold booleans (or numbers: nonzero allows the action), got dtype "
                         f"{array.dtype} ({array.ravel()[:4].tolist()!r}{' ...' if array.size > 4 else ''})")
    rows = n_rows if n_rows is not None else max(array.size // mask_dims, 1)
    if array.size != rows * mask_dims:
        raise ValueError(
            f"{argument} must hold {mask_dims} entries per observation for action space {action_space} "
            f"(shape ({rows}, {mask_dims}) for {rows} observation(s)), got shape {array.shape}"
        )
    allowed = array.reshape(rows, mask_dims).astype(bool)
    starts = np.cumsum([0, *blocks[:-1]])
    any_allowed = np.logical_or.reduceat(allowed, starts, axis=1)  # (rows, n_blocks)
    if not any_allowed.all():
        row, block = np.argwhere(~any_allowed)[0]
        where = f"row {row}" if len(blocks) == 1 else f"row {row}, sub-action {block}"
        raise ValueError(
            f"{argument} allows no action at {where}: every mask row (and every sub-action block of a "
            f"MultiDiscrete/MultiBinary space) needs at least one True entry"
        )


def read_action_masks(env: VecEnv, action_space: spaces.Space) -> np.ndarray:
    """sb3-contrib's ``get_action_masks(env)`` (each env's ``action_masks()``, stacked), checked
    (:func:`check_action_masks`) before the policy samples from them: the lean loop reads each step's masks with it.

    :param env: the training VecEnv.
    :param action_space: the model's action space (what the masks must fit).
    """
    masks = get_action_masks(env)
    check_action_masks(masks, action_space, env.num_envs, "env.action_masks()")
    return masks


@contextmanager
def masks_checked_at_policy_call(policy: nn.Module, action_space: spaces.Space, n_envs: int) -> Iterator[None]:
    """While the block runs, the ``action_masks`` each ``policy(obs, action_masks=...)`` call receives are checked
    (:func:`check_action_masks`, as the env's masks): how MaskablePPO's own collection loop, which reads the masks
    itself, gets the check without another VecEnv around the user's (callbacks see the training env there).

    :param policy: the maskable policy.
    :param action_space: the model's action space (what the masks must fit).
    :param n_envs: how many masks a collection step passes (one per env).
    """
    def check(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        masks = kwargs.get("action_masks")
        if masks is not None:
            check_action_masks(masks, action_space, n_envs, "env.action_masks()")

    handle = policy.register_forward_pre_hook(check, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


class InfoActionMasker(gym.Wrapper):
    """Gives an env that reports its valid actions in ``info[key]`` (Gymnasium's ``Taxi-v4``: ``info["action_mask"]``,
    an int8 array with 1 for each allowed action) the ``action_masks()`` method sb3-contrib's MaskablePPO reads:
    the mask of the last ``reset`` or ``step``, i.e. for the observation the policy acts on next. Use it as an
    ``env_wrapper`` in a config: ``env_wrapper: sb3_ppo_scale.contrib.masks.InfoActionMasker``.

    :param env: the env.
    :param key: the ``info`` key that holds the mask (default ``"action_mask"``).
    """

    def __init__(self, env: gym.Env, key: str = "action_mask") -> None:
        super().__init__(env)
        self._key = key
        self._mask: np.ndarray | None = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._mask = self._read(info)
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._mask = self._read(info)
        return obs, reward, terminated, truncated, info

    def get_episode_state(self) -> np.ndarray | None:
        """The current observation's mask, for a checkpoint to continue the episode
        (:mod:`sb3_ppo_scale.envs.episodes`)."""
        return None if self._mask is None else self._mask.copy()

    def set_episode_state(self, state: np.ndarray | None) -> None:
        """Put back what :meth:`get_episode_state` returned."""
        self._mask = None if state is None else state.copy()

    def action_masks(self) -> np.ndarray:
        """The allowed actions for the current observation (bool, ``mask_dims`` entries)."""
        if self._mask is None:
            raise RuntimeError("InfoActionMasker.action_masks() called before reset()")
        return self._mask

    def _read(self, info: dict[str, Any]) -> np.ndarray:
        if self._key not in info:
            raise ValueError(f"InfoActionMasker: the env's info has no {self._key!r} (key); its keys: {sorted(info)}")
        return np.asarray(info[self._key], dtype=bool)
