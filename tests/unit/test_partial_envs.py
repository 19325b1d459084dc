"""CartPoleNoVel-v1 and PendulumNoVel-v1: the full envs, seen without their velocities."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from worker.envs.gymnasium import GymnasiumEnvs
from worker.envs.partial import CARTPOLE_NO_VELOCITY, PENDULUM_NO_VELOCITY
from worker.job import JobConfig
from worker.plugins.binding import make_env_context


@pytest.mark.parametrize(
    ("partial_id", "full_id", "keep"),
    [(CARTPOLE_NO_VELOCITY, "CartPole-v1", [0, 2]), (PENDULUM_NO_VELOCITY, "Pendulum-v1", [0, 1])],
)
def test_a_partially_observed_env_is_the_full_one_seen_without_its_velocities(
    partial_id: str, full_id: str, keep: list[int]
) -> None:
    # Given the env and its full version, reset on the same seed
    partial, full = gym.make(partial_id), gym.make(full_id)
    obs, _ = partial.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    full.action_space.seed(5)
    # Then every observation is the full one's positions only, its bounds those of the kept entries
    box = full.observation_space
    assert isinstance(box, gym.spaces.Box)
    assert partial.observation_space == gym.spaces.Box(box.low[keep], box.high[keep], dtype=box.dtype)
    np.testing.assert_array_equal(obs, full_obs[keep])
    # and the same actions give the same rewards, ends and time limit
    for _ in range(600):
        action = full.action_space.sample()
        obs, reward, terminated, truncated, _ = partial.step(action)
        full_obs, full_reward, full_terminated, full_truncated, _ = full.step(action)
        np.testing.assert_array_equal(obs, full_obs[keep])
        assert (reward, terminated, truncated) == (full_reward, full_terminated, full_truncated)
        if terminated or truncated:
            break
    assert terminated or truncated


def test_warrens_env_plugin_makes_them_and_a_job_takes_their_ids() -> None:
    envs = GymnasiumEnvs().make_vector_env(make_env_context(CARTPOLE_NO_VELOCITY, 4, seed=0))
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (4, 2)
    envs.close()
    # CartPole's threshold is kept; Pendulum has none, so its job gives a stop value
    assert JobConfig.load(None, **{"env.id": CARTPOLE_NO_VELOCITY}).env.stop_value == 475.0
    job = JobConfig.load(None, **{"env.id": PENDULUM_NO_VELOCITY, "env.stop_value": -200.0, "algorithm.name": "sac"})
    assert job.spaces is not None and job.spaces.observation.shape == (2,)
