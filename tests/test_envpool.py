"""EnvPoolVecEnv: SB3's VecEnv contract over EnvPool (episode ends, bootstrapping, episode records, seeding)."""

from __future__ import annotations

import sys
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_ppo_scale import ScalablePPO
from sb3_ppo_scale.envs import ENVPOOL_EXTRA_HINT, EnvPoolVecEnv, make_envpool_vec_env

from tests.helpers import import_envpool, max_param_diff


def test_missing_envpool_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "envpool", None)  # `import envpool` raises ImportError
    with pytest.raises(ImportError, match=r"pip install sb3-ppo-scale\[envpool\]"):
        make_envpool_vec_env("CartPole-v1", 2, seed=0)
    assert "sb3-ppo-scale[envpool]" in ENVPOOL_EXTRA_HINT


envpool = import_envpool()

CARTPOLE_20 = {"max_episode_steps": 20}  # CartPole with a 20-step limit: both terminations and truncations


class OneEnvPoolEnv(gym.Env):
    """One EnvPool env behind Gymnasium's API (reset() issues EnvPool's reset step): the reference for SB3's contract.

    Wrapped in Monitor and DummyVecEnv, this is how SB3 itself would deliver EnvPool's dynamics.
    """

    def __init__(self, task: str, seed: int, **options: Any) -> None:
        self.task, self.options = task, options
        self._pool = self._make(seed)
        self.observation_space = spaces.Box(
            self._pool.observation_space.low.astype(np.float32),
            self._pool.observation_space.high.astype(np.float32),
            dtype=np.float32,
        )
        self.action_space = self._pool.action_space
        self._started = False

    def _make(self, seed: int) -> Any:
        return envpool.make(self.task, env_type="gymnasium", num_envs=1, seed=seed, **self.options)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self._pool, self._started = self._make(seed), False
        if self._started:  # after an episode end EnvPool's next step is the reset (its action is ignored)
            obs, _, _, _, info = self._pool.step(np.zeros((1, *self.action_space.shape), self.action_space.dtype))
            assert info["elapsed_step"][0] == 0
        else:
            obs, _ = self._pool.reset()
            self._started = True
        return obs[0].astype(np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, _ = self._pool.step(np.asarray([action], self.action_space.dtype))
        return obs[0].astype(np.float32), float(reward[0]), bool(terminated[0]), bool(truncated[0]), {}


def reference_vec_env(task: str, n_envs: int, seed: int, **options: Any) -> DummyVecEnv:
    return DummyVecEnv([lambda i=i: Monitor(OneEnvPoolEnv(task, seed + i, **options)) for i in range(n_envs)])


def single_env_episodes(task: str, seed: int, actions: np.ndarray, **options: Any) -> tuple[list, list, np.ndarray]:
    """EnvPool's own account of one env fed ``actions`` in order (a dummy action for each reset step).

    :return: (games as (raw return, length), training-episode lengths, observation after each action).
    """
    pool = envpool.make(task, env_type="gymnasium", num_envs=1, seed=seed, **options)
    pool.reset()
    games, lengths, observations = [], [], []
    game_return, game_length = 0.0, 0
    for action in actions:
        obs, reward, terminated, truncated, info = pool.step(np.asarray([action], pool.action_space.dtype))
        game_return += float(info["reward"][0] if "reward" in info else reward[0])
        game_length += 1
        if terminated[0] or truncated[0]:
            lengths.append(int(info["elapsed_step"][0]))
            if truncated[0] or info.get("terminated", terminated)[0]:
                games.append((round(game_return, 6), game_length))
                game_return, game_length = 0.0, 0
            obs, *_ = pool.step(np.zeros((1, *pool.action_space.shape), pool.action_space.dtype))  # reset step
        observations.append(obs[0])
    return games, lengths, np.asarray(observations)


def random_actions(space: spaces.Space, n_steps: int, n_envs: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if isinstance(space, spaces.Discrete):
        return rng.integers(0, space.n, size=(n_steps, n_envs))
    return rng.uniform(space.low, space.high, size=(n_steps, n_envs, *space.shape)).astype(np.float32)


def run_adapter(env: EnvPoolVecEnv, actions: np.ndarray) -> tuple[list[list], np.ndarray, np.ndarray, int]:
    """Step ``env`` with ``actions``: (episode records per env, observations, dones, terminal observations seen)."""
    env.reset()
    records: list[list] = [[] for _ in range(env.num_envs)]
    observations, dones, n_terminal = [], [], 0
    for step_actions in actions:
        obs, rewards, done, infos = env.step(step_actions)
        assert obs.dtype == env.observation_space.dtype and rewards.dtype == np.float32
        for i, info in enumerate(infos):
            assert ("terminal_observation" in info) == bool(done[i])
            n_terminal += "terminal_observation" in info
            if "episode" in info:
                records[i].append((info["episode"]["r"], info["episode"]["l"]))
        observations.append(obs.copy())
        dones.append(done)
    return records, np.asarray(observations), np.asarray(dones), n_terminal


@pytest.mark.parametrize(
    ("task", "options", "n_steps"),
    [("CartPole-v1", CARTPOLE_20, 120), ("Hopper-v5", {}, 150), ("Breakout-v5", {}, 300)],
)
def test_episodes_match_envpool_own_episodes(task: str, options: dict, n_steps: int) -> None:
    n_envs, seed = 3, 7
    env = make_envpool_vec_env(task, n_envs, seed=seed, **options)
    actions = random_actions(env.action_space, n_steps, n_envs, seed=1)
    records, observations, dones, n_terminal = run_adapter(env, actions)
    n_episodes = 0
    for i in range(n_envs):
        games, lengths, reference_obs = single_env_episodes(task, seed + i, actions[:, i], **env.envpool_options)
        assert records[i] == games
        np.testing.assert_array_equal(observations[:, i], reference_obs.astype(env.observation_space.dtype))
        assert int(dones[:, i].sum()) == len(lengths)
        # every action SB3 sent was applied: finished lengths + the running one add up to the steps taken
        assert sum(length for _, length in games) + env.episodes.lengths[i] == n_steps
        n_episodes += len(games)
    assert n_episodes >= n_envs  # the run saw episode ends
    assert env.reset_steps == n_terminal == int(dones.sum())


def test_atari_life_loss_ends_training_episode_not_game() -> None:
    env = make_envpool_vec_env("Breakout-v5", 2, seed=0)
    records, _, dones, _ = run_adapter(env, random_actions(env.action_space, 300, 2, seed=0))
    assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
    assert int(dones.sum()) > sum(len(r) for r in records) > 0  # 5 lives: more training episodes than games


def test_gymnasium_atari_ids_map_to_envpool_tasks() -> None:
    env = make_envpool_vec_env("PongNoFrameskip-v4", 1, seed=0)
    assert env.task_id == "Pong-v5"
    assert env.envpool_options["max_episode_steps"] == 100_000 and env.envpool_options["repeat_action_probability"] == 0
    assert env.envpool_options["episodic_life"] and env.envpool_options["reward_clip"]
    sticky = make_envpool_vec_env("ALE/Pong-v5", 1, seed=0, noop_max=10)
    assert sticky.envpool_options["repeat_action_probability"] == 0.25 and sticky.envpool_options["noop_max"] == 10
    assert env.reset().shape == (1, 4, 84, 84)


@pytest.mark.parametrize("bad", [{"env_id": "NoSuchEnv-v0"}, {"n_envs": 0}, {"n_envs": True}, {"seed": 1.7},
                                 {"seed": "1"}, {"seed": None}])
def test_bad_arguments(bad: dict) -> None:
    """n_envs=True was one env; seed 1.7 and "1" were int()-ed to 1, silently; None was int()'s TypeError."""
    kwargs = {"env_id": "CartPole-v1", "n_envs": 2, "seed": 0, **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        make_envpool_vec_env(**kwargs)


def test_reseeding_takes_ints_only() -> None:
    env = make_envpool_vec_env("CartPole-v1", 2, seed=np.int64(3))
    assert env.seed(np.int32(5)) == [5, 6] and env.seed(None) == [None, None]
    with pytest.raises(ValueError, match=r"seed must be an int \(env i is seeded with seed \+ i\), got 2.5"):
        env.seed(2.5)


@pytest.mark.parametrize("algo", [PPO, ScalablePPO])
def test_rollout_buffer_equals_sb3_dummy_vec_env(algo: type[PPO]) -> None:
    """Same dynamics through SB3's own DummyVecEnv + Monitor: identical buffer (bootstrapped rewards, episode
    starts, returns, advantages), identical parameters after the update, identical episode records."""
    n_envs, n_steps = 4, 64
    kwargs = dict(n_steps=n_steps, batch_size=64, n_epochs=2, gamma=0.9, seed=3, device="cpu")
    models = []
    for env in (make_envpool_vec_env("CartPole-v1", n_envs, seed=11, **CARTPOLE_20),
                reference_vec_env("CartPole-v1", n_envs, seed=11, **CARTPOLE_20)):
        model = algo("MlpPolicy", env, **kwargs)
        model.learn(n_steps * n_envs)
        models.append(model)
    ours, reference = (m.rollout_buffer for m in models)
    for field in ("observations", "actions", "rewards", "episode_starts", "values", "returns", "advantages"):
        np.testing.assert_allclose(getattr(ours, field), getattr(reference, field), rtol=1e-6, atol=1e-6, err_msg=field)
    assert max_param_diff(*models) == 0.0
    episodes = [[(e["r"], e["l"]) for e in m.ep_info_buffer] for m in models]
    assert episodes[0] == episodes[1]
    lengths = [length for _, length in episodes[0]]
    assert 20 in lengths and min(lengths) < 20  # both truncations (bootstrapped) and terminations happened
    # truncations were bootstrapped: some stored rewards exceed CartPole's 1.0
    assert ours.rewards.max() > 1.0


def test_vec_normalize_and_save_load(tmp_path: Any) -> None:
    n_envs, n_steps = 2, 128
    env = VecNormalize(make_envpool_vec_env("Pendulum-v1", n_envs, seed=0), gamma=0.9)
    model = ScalablePPO("MlpPolicy", env, n_steps=n_steps, batch_size=64, n_epochs=1, gamma=0.9, seed=0, device="cpu")
    model.learn(2 * n_steps * n_envs)
    # VecNormalize saw the reset batch and every step's observations (terminal observations are not counted)
    assert env.obs_rms.count == pytest.approx(1e-4 + n_envs * (1 + 2 * n_steps))
    assert env.ret_rms.count > n_envs * n_steps
    model.save(tmp_path / "model.zip")
    env.save(str(tmp_path / "vecnormalize.pkl"))
    new_env = VecNormalize.load(str(tmp_path / "vecnormalize.pkl"), make_envpool_vec_env("Pendulum-v1", n_envs, seed=5))
    new_env.training = False
    loaded = ScalablePPO.load(tmp_path / "model.zip", env=new_env, device="cpu")
    np.testing.assert_array_equal(new_env.obs_rms.mean, env.obs_rms.mean)
    obs = new_env.reset()
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    assert max_param_diff(model, loaded) == 0.0


def test_seeding_rule_and_reseed() -> None:
    first = make_envpool_vec_env("CartPole-v1", 3, seed=4).reset()
    np.testing.assert_array_equal(first, make_envpool_vec_env("CartPole-v1", 3, seed=4).reset())
    np.testing.assert_array_equal(first[1], make_envpool_vec_env("CartPole-v1", 1, seed=5).reset()[0])  # seed + i
    env = make_envpool_vec_env("CartPole-v1", 3, seed=0)
    assert env.seed(4) == [4, 5, 6]
    np.testing.assert_array_equal(env.reset(), first)


def test_short_scalable_ppo_run_on_halfcheetah() -> None:
    th.manual_seed(0)
    env = make_envpool_vec_env("HalfCheetah-v5", 4, seed=0, max_episode_steps=100)
    assert env.observation_space.dtype == np.float32 and env.observation_space.shape == (17,)
    model = ScalablePPO("MlpPolicy", env, n_steps=128, batch_size=256, n_epochs=2, seed=0, device="cpu")
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(1024)
    assert [e["l"] for e in model.ep_info_buffer] == [100] * 8  # 4 envs x 256 steps: 2 episodes each
    assert all(np.isfinite(e["r"]) for e in model.ep_info_buffer)
    assert model.rollout_buffer.observations.dtype == np.float32
    assert any(not th.equal(a, b) for a, b in zip(before, model.policy.parameters()))


def test_cnn_policy_on_pong_frames() -> None:
    env = make_envpool_vec_env("Pong-v5", 2, seed=0)
    model = PPO("CnnPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(32)
    frames = model.rollout_buffer.observations
    assert frames.shape[-3:] == (4, 84, 84) and frames.size == 32 * 4 * 84 * 84
    assert frames.dtype == np.uint8 and frames.max() > frames.min()
