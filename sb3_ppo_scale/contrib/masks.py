"""Action masks: their expected layout for an action space, and the check that turns a bad mask into a clear error.

sb3-contrib flattens a mask per observation to ``mask_dims`` booleans: ``n`` for ``Discrete(n)``, ``sum(nvec)`` for
``MultiDiscrete(nvec)`` (one block per sub-action), ``2 * n`` for ``MultiBinary(n)`` (one pair per bit). A mask of
another size fails deep in a reshape; a row (or sub-action block) with no True entry gives the masked distribution
nothing to sample from (every logit at -1e8), so the policy silently samples a forbidden action. Both are refused
here, naming the argument.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper


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
    ``mask_dims`` entries each, with at least one allowed action in every row and sub-action block."""
    blocks = mask_blocks(action_space)
    mask_dims = sum(blocks)
    array = np.asarray(masks)
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


class MaskCheckingVecEnv(VecEnvWrapper):
    """Passes everything through to ``venv``; the masks its envs' ``action_masks()`` return are checked first
    (:func:`check_action_masks`), so a bad mask is a clear error before the policy samples from it.

    :param venv: the training VecEnv.
    :param action_space: the model's action space (what the masks must fit).
    """

    def __init__(self, venv: VecEnv, action_space: spaces.Space) -> None:
        super().__init__(venv)
        self._action_space = action_space

    def reset(self) -> Any:
        return self.venv.reset()

    def step_wait(self) -> Any:
        return self.venv.step_wait()

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
        result = self.venv.env_method(method_name, *args, indices=indices, **kwargs)
        if method_name == "action_masks":
            check_action_masks(np.stack(result), self._action_space, len(result), "env.action_masks()")
        return result
