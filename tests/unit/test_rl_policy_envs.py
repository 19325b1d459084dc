"""Env batch bookkeeping and batched policies."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from worker.errors import CollectorError, TaskError
from worker.protocol import PolicySpec
from worker.rl.envs import VecEnvBatch, make_env
from worker.rl.policy import DQNPolicy, QNetwork, RandomPolicy, limit_torch_threads, make_policy

SHORT = "WarrenShortCartPole-v0"
if SHORT not in gym.registry:
    gym.register(
        SHORT,
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        vector_entry_point="gymnasium.envs.classic_control.cartpole:CartPoleVectorEnv",
        max_episode_steps=3,
    )


def test_cartpole_runs_as_a_native_vector_env_and_others_as_sync() -> None:
    native, sync = VecEnvBatch("CartPole-v1", 2), VecEnvBatch("Acrobot-v1", 2)
    try:
        assert (native.backend, sync.backend) == ("vector_entry_point", "sync")
        assert (native.obs_dim, native.n_actions, sync.obs_dim, sync.n_actions) == (4, 2, 6, 3)
    finally:
        native.close()
        sync.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_the_step_after_an_episode_end_is_a_reset_step_not_a_transition(env_id: str) -> None:
    envs = VecEnvBatch(env_id, 4, seed=0)
    try:
        envs.reset()
        rng = np.random.default_rng(0)
        ended_before = np.zeros(4, dtype=bool)
        episodes: list[float] = []
        for _ in range(600):
            step = envs.step(rng.integers(0, envs.n_actions, 4))
            # exactly the envs that ended an episode last step take their reset step now
            np.testing.assert_array_equal(step.valid, ~ended_before)
            assert not (step.terminated | step.truncated)[~step.valid].any()
            # the policy sees the final observation until the reset step replaces it
            np.testing.assert_array_equal(envs.obs, step.next_obs)
            episodes += [float(r) for r in step.episode_returns[step.ended]]
            ended_before = step.ended
        assert len(episodes) >= 4
    finally:
        envs.close()


def test_a_time_limit_end_is_truncated_not_terminated_and_returns_its_reward() -> None:
    envs = VecEnvBatch(SHORT, 1, seed=0)
    try:
        envs.reset()
        steps = [envs.step(np.array([i % 2])) for i in range(4)]
        assert [bool(s.truncated[0]) for s in steps] == [False, False, True, False]
        assert not any(bool(s.terminated[0]) for s in steps)
        assert steps[2].episode_returns[0] == 3.0 and steps[2].ended[0]
        assert not steps[3].valid[0] and steps[3].reward[0] == 0.0
        # the reset step brings a fresh start, not the final observation again
        assert not np.array_equal(steps[3].next_obs, steps[2].next_obs)
    finally:
        envs.close()


def test_only_the_first_reset_seeds_the_envs() -> None:
    envs = VecEnvBatch("CartPole-v1", 2, seed=3)
    try:
        first = envs.reset().copy()
        second = envs.reset().copy()
        fresh = VecEnvBatch("CartPole-v1", 2, seed=3)
        np.testing.assert_array_equal(fresh.reset(), first)
        fresh.close()
        assert not np.array_equal(first, second)
    finally:
        envs.close()


def test_spawned_policy_seeds_differ_per_task_but_follow_the_batch_seed() -> None:
    a, b = VecEnvBatch("CartPole-v1", 1, seed=3), VecEnvBatch("CartPole-v1", 1, seed=3)
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
    with pytest.raises(TaskError, match=message):
        VecEnvBatch(env_id, 2)


def test_dqn_policy_is_greedy_at_eps_zero_and_random_at_eps_one() -> None:
    policy = DQNPolicy(4, 2, (8,), seed=0)
    obs = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)
    greedy = policy.net(torch.from_numpy(obs)).argmax(dim=1).numpy()

    actions = policy.act(obs, eps=0.0)
    explored = policy.act(obs, eps=1.0)

    assert actions.dtype == np.int64 and actions.shape == (200,)
    np.testing.assert_array_equal(actions, greedy)
    assert 0.3 < float(np.mean(explored == greedy)) < 0.7  # coin flips agree half the time


def test_the_numpy_forward_pass_computes_the_networks_q_values() -> None:
    # Given learner weights loaded into a policy
    weights = QNetwork(4, 3, (16, 16)).state_dict()
    policy = DQNPolicy(4, 3, (16, 16), seed=0)
    policy.load_state_dict(weights)
    obs = np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32)
    # Then its numpy Q-values are the torch network's
    with torch.no_grad():
        expected = policy.net(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(policy.q_values(obs), expected, rtol=1e-5, atol=1e-6)


def test_exploration_picks_every_action_at_the_configured_rate() -> None:
    policy = DQNPolicy(4, 3, (8,), seed=0)
    obs = np.zeros((30_000, 4), np.float32)
    greedy = policy.act(obs, eps=0.0)
    actions = policy.act(obs, eps=0.3)
    changed = float(np.mean(actions != greedy))
    assert 0.18 < changed < 0.22  # 0.3 explore, of which 2/3 pick another action
    assert set(actions.tolist()) == {0, 1, 2}


def test_dqn_policy_refuses_weights_of_another_shape() -> None:
    policy = DQNPolicy(4, 2, (8,))

    with pytest.raises(CollectorError, match="do not fit"):
        policy.load_state_dict(QNetwork(4, 2, (8, 8)).state_dict())
    with pytest.raises(CollectorError, match="do not fit"):
        policy.load_state_dict({"net.0.weight": torch.zeros(8, 4)})


def test_random_policy_covers_all_actions_and_make_policy_picks_by_type() -> None:
    random_policy = make_policy(PolicySpec("random"), 4, 3, seed=0)
    dqn_policy = make_policy(PolicySpec("dqn", (8,)), 4, 3, seed=0)

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
