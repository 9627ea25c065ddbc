"""torch's ``THP_MEM_ALLOC_ENABLE=1`` (CPU tensors of 2 MB or more on transparent huge pages; docs/speed.md suggests it
for CNN policies on a CPU) changes where tensors live, not what is computed: a CnnPolicy trained with and without it
ends with the same parameters. torch reads the variable once, at its first allocation, so each run is a fresh
process."""

from __future__ import annotations

import os
import subprocess
import sys

TRAIN = """
import hashlib

import gymnasium as gym
import numpy as np
import torch as th

from sb3_ppo_scale import ScalablePPO


class Frames(gym.Env):
    '''Atari-sized frames (84x84x4 uint8): a minibatch of 64 is 7.2 MB of float32 input, over the 2 MB threshold.'''

    observation_space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 256, (84, 84, 4), dtype=np.uint8), {}

    def step(self, action):
        self.t += 1
        frame = self.np_random.integers(0, 256, (84, 84, 4), dtype=np.uint8)
        return frame, float(action == 1), False, self.t >= 16, {}


th.set_num_threads(1)
model = ScalablePPO("CnnPolicy", Frames(), n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu")
model.learn(64)
digest = hashlib.sha256()
for tensor in model.policy.state_dict().values():
    digest.update(tensor.numpy().tobytes())
print(digest.hexdigest())
"""


def _parameters_digest(huge_pages: str) -> str:
    env = dict(os.environ, THP_MEM_ALLOC_ENABLE=huge_pages, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", TRAIN], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_huge_pages_change_no_parameter() -> None:
    assert _parameters_digest("1") == _parameters_digest("0")
