"""Env batch bookkeeping and batched policies."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from worker.errors import CollectorError, TaskError
from worker.protocol import PolicySpec
from worker.rl.envs import EnvBatch, make_env
from worker.rl.policy import DQNPolicy, QNetwork, RandomPolicy, limit_torch_threads, make_policy


def test_env_batch_resets_ended_episodes_and_reports_their_return() -> None:
    envs = EnvBatch("CartPole-v1", 2, seed=0)
    try:
        envs.reset()
        returns: list[float] = []
        for _ in range(500):
            obs_before = envs.obs.copy()
            steps = envs.step([0, 1], np.array([0, 0]))  # always push left: episodes end fast
            for step in steps:
                if step.episode_return is not None:
                    returns.append(step.episode_return)
                    # the env was reset: the next obs is a fresh start, not the final obs
                    assert not np.array_equal(envs.obs[step.env_id], step.next_obs)
                else:
                    np.testing.assert_array_equal(envs.obs[step.env_id], step.next_obs)
            assert not np.array_equal(obs_before, envs.obs)
        assert len(returns) >= 10 and all(r >= 1.0 for r in returns)
    finally:
        envs.close()


def test_time_limit_truncation_keeps_the_real_final_obs() -> None:
    envs = EnvBatch("CartPole-v1", 1, seed=0)
    envs._envs[0] = gym.wrappers.TimeLimit(envs._envs[0].unwrapped, max_episode_steps=3)
    try:
        envs.reset()
        steps = [envs.step([0], np.array([i % 2]))[0] for i in range(3)]
        assert [s.truncated for s in steps] == [False, False, True]
        assert not steps[-1].terminated and steps[-1].episode_return == 3.0
        # next_obs is the real third observation (what a plain env shows), not a reset obs
        reference = gym.make("CartPole-v1")
        reference.reset(seed=0)
        for i in range(3):
            final, *_ = reference.step(i % 2)
        reference.close()
        np.testing.assert_array_equal(steps[-1].next_obs, final)
        assert not np.array_equal(envs.obs[0], final)
    finally:
        envs.close()


def test_only_the_first_reset_seeds_the_envs() -> None:
    envs = EnvBatch("CartPole-v1", 1, seed=3)
    try:
        first = envs.reset().copy()
        second = envs.reset().copy()
        fresh = EnvBatch("CartPole-v1", 1, seed=3)
        np.testing.assert_array_equal(fresh.reset(), first)
        fresh.close()
        assert not np.array_equal(first, second)
    finally:
        envs.close()


def test_spawned_policy_seeds_differ_per_task_but_follow_the_batch_seed() -> None:
    a, b = EnvBatch("CartPole-v1", 1, seed=3), EnvBatch("CartPole-v1", 1, seed=3)
    try:
        seeds_a = [a.spawn_seed() for _ in range(3)]
        seeds_b = [b.spawn_seed() for _ in range(3)]
    finally:
        a.close()
        b.close()

    assert seeds_a == seeds_b and len(set(seeds_a)) == 3


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("NoSuchEnv-v0", "unknown env id 'NoSuchEnv-v0'"),
        ("os:system", "unknown env id 'os:system'"),
        ("MountainCarContinuous-v0", "Discrete is required"),
    ],
)
def test_unusable_env_ids_are_task_errors(env_id: str, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        make_env(env_id)


def test_dqn_policy_is_greedy_at_eps_zero_and_random_at_eps_one() -> None:
    policy = DQNPolicy(4, 2, (8,), seed=0)
    obs = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)
    greedy = policy.net(torch.from_numpy(obs)).argmax(dim=1).numpy()

    actions = policy.act(obs, eps=0.0)
    explored = policy.act(obs, eps=1.0)

    assert actions.dtype == np.int64 and actions.shape == (200,)
    np.testing.assert_array_equal(actions, greedy)
    assert 0.3 < float(np.mean(explored == greedy)) < 0.7  # coin flips agree half the time


def test_dqn_policy_refuses_weights_of_another_shape() -> None:
    policy = DQNPolicy(4, 2, (8,))

    with pytest.raises(CollectorError, match="do not fit"):
        policy.load_state_dict(QNetwork(4, 2, (8, 8)).state_dict())
    with pytest.raises(CollectorError, match="do not fit"):
        policy.load_state_dict({"net.0.weight": torch.zeros(8, 4)})


def test_random_policy_covers_all_actions_and_make_policy_picks_by_type() -> None:
    obs_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    act_space = gym.spaces.Discrete(3)

    random_policy = make_policy(PolicySpec("random"), obs_space, act_space, seed=0)
    dqn_policy = make_policy(PolicySpec("dqn", (8,)), obs_space, act_space, seed=0)

    assert isinstance(random_policy, RandomPolicy) and isinstance(dqn_policy, DQNPolicy)
    actions = random_policy.act(np.zeros((300, 4), np.float32), eps=0.0)
    assert set(actions.tolist()) == {0, 1, 2} and actions.dtype == np.int64
    assert dqn_policy.act(np.zeros((5, 4), np.float32), eps=0.0).shape == (5,)


def test_limit_torch_threads_sets_the_pool_size() -> None:
    before = torch.get_num_threads()
    try:
        limit_torch_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
