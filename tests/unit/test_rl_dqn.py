"""Replay buffer and DQN learner core."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from worker.errors import CorruptFile
from worker.rl.config import LearnerSpec
from worker.rl.dqn import DQNLearner, ReplayBuffer
from worker.rl.policy import DQNPolicy


def chunk(start: int, k: int, obs_dim: int = 3) -> dict[str, np.ndarray]:
    """A ``[k, 1]`` chunk (one env) whose obs rows are filled with ``start, start+1, ...``."""
    ids = np.arange(start, start + k, dtype=np.float32)
    return {
        "obs": np.repeat(ids[:, None], obs_dim, axis=1)[:, None, :],
        "next_obs": np.repeat(ids[:, None] + 0.5, obs_dim, axis=1)[:, None, :],
        "action": (np.arange(k) % 2).astype(np.int64)[:, None],
        "reward": np.ones((k, 1), np.float32),
        "done": np.zeros((k, 1), bool),
        "truncated": np.zeros((k, 1), bool),
        "valid": np.ones((k, 1), bool),
    }


# -- replay buffer -------------------------------------------------------------------


def test_replay_buffer_wraps_around_and_keeps_the_newest() -> None:
    buf = ReplayBuffer(5, 3)

    buf.add(chunk(0, 3))
    buf.add(chunk(3, 3))

    assert len(buf) == 5 and buf.total_added == 6
    assert sorted(buf.obs[:, 0].tolist()) == [1, 2, 3, 4, 5]  # transition 0 was overwritten
    np.testing.assert_array_equal(buf.next_obs[:, 0], buf.obs[:, 0] + 0.5)


def test_chunk_larger_than_capacity_keeps_its_tail() -> None:
    buf = ReplayBuffer(4, 3)

    added = buf.add(chunk(0, 10))

    assert added == 10 and len(buf) == 4
    assert sorted(buf.obs[:, 0].tolist()) == [6, 7, 8, 9]


def test_sample_returns_tensors_of_the_stored_transitions() -> None:
    buf = ReplayBuffer(100, 3)
    buf.add(chunk(0, 10))

    batch = buf.sample(32, np.random.default_rng(0))

    assert batch["obs"].shape == batch["next_obs"].shape == (32, 3)
    assert batch["obs"].dtype == torch.float32 and batch["action"].dtype == torch.int64
    assert batch["done"].dtype == torch.bool and batch["reward"].shape == (32,)
    assert set(batch["obs"][:, 0].tolist()) <= set(range(10))
    torch.testing.assert_close(batch["next_obs"], batch["obs"] + 0.5)


def test_sample_arrays_draws_the_same_transitions_as_sample_as_fresh_numpy_arrays() -> None:
    buf = ReplayBuffer(100, 3)
    buf.add(chunk(0, 10))

    arrays = buf.sample_arrays(32, np.random.default_rng(0))
    tensors = buf.sample(32, np.random.default_rng(0))

    assert {k: (v.shape, v.dtype.name) for k, v in arrays.items()} == {
        "obs": ((32, 3), "float32"),
        "next_obs": ((32, 3), "float32"),
        "action": ((32,), "int64"),
        "reward": ((32,), "float32"),
        "done": ((32,), "bool"),
    }
    for name, array in arrays.items():
        np.testing.assert_array_equal(array, tensors[name].numpy())
    np.testing.assert_array_equal(arrays["next_obs"], arrays["obs"] + 0.5)
    # copies: the learner may write into a batch without touching the buffer
    arrays["obs"][:] = -1.0
    assert (buf.obs[:10] >= 0.0).all()


@pytest.mark.parametrize("method", ["sample", "sample_arrays"])
def test_sampling_an_empty_buffer_is_an_error(method: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        getattr(ReplayBuffer(10, 3), method)(4, np.random.default_rng(0))


def _broken(**changes: Any) -> dict[str, Any]:
    good: dict[str, Any] = chunk(0, 4)
    for key, value in changes.items():
        if value is None:
            del good[key]
        else:
            good[key] = value
    return good


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (_broken(obs=None), "'obs' must be a numpy array"),
        (_broken(valid=None), "'valid' must be a numpy array"),
        (_broken(reward=[1.0, 1.0, 1.0, 1.0]), "'reward' must be a numpy array"),
        (_broken(obs=np.zeros((4, 1, 2), np.float32)), "'obs' has shape"),
        (_broken(next_obs=np.zeros((3, 1, 3), np.float32)), "'next_obs' has shape"),
        (_broken(action=np.zeros((4, 1), np.float32)), "'action' has shape"),
        (_broken(done=np.zeros((4, 1), np.int64)), "'done' has shape"),
        (_broken(valid=np.ones(4, bool)), "'obs' has shape"),
        (_broken(obs=np.full((4, 1, 3), np.nan, np.float32)), "'obs' holds NaN"),
        (_broken(action=np.array([[0], [1], [2], [0]])), "actions must lie in [0, 2)"),
        (_broken(action=np.array([[0], [-1], [0], [0]])), "actions must lie in"),
    ],
)
def test_malformed_chunks_are_refused_whole(bad: dict[str, Any], message: str) -> None:
    buf = ReplayBuffer(10, 3, n_actions=2)

    with pytest.raises(CorruptFile) as info:
        buf.add(bad)

    assert message in info.value.message
    assert len(buf) == 0 and buf.total_added == 0


def test_only_valid_rows_of_a_many_env_chunk_are_stored_in_time_then_env_order() -> None:
    # Given a [3 steps, 2 envs] chunk whose env 1 takes a reset step at t=1
    obs = np.arange(6, dtype=np.float32).reshape(3, 2, 1).repeat(3, axis=2)
    good = {
        "obs": obs,
        "next_obs": obs + 0.5,
        "action": np.zeros((3, 2), np.int64),
        "reward": np.ones((3, 2), np.float32),
        "done": np.array([[False, True], [False, False], [False, False]]),
        "truncated": np.zeros((3, 2), bool),
        "valid": np.array([[True, True], [True, False], [True, True]]),
    }
    buf = ReplayBuffer(10, 3)
    # When it is added, the invalid row is left out
    assert buf.add(good) == 5 and len(buf) == 5
    assert buf.obs[:5, 0].tolist() == [0, 1, 2, 4, 5]
    assert buf.done[:5].tolist() == [False, True, False, False, False]


def test_read_only_arrays_from_the_codec_are_accepted() -> None:
    good = chunk(0, 4)
    for array in good.values():
        array.flags.writeable = False
    buf = ReplayBuffer(10, 3)

    assert buf.add(good) == 4 and len(buf) == 4


# -- learner -------------------------------------------------------------------------


def fixed_batch(n: int = 64) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "obs": torch.randn(n, 4, generator=gen),
        "next_obs": torch.randn(n, 4, generator=gen),
        "action": torch.randint(0, 2, (n,), generator=gen),
        "reward": torch.randn(n, generator=gen),
        "done": torch.rand(n, generator=gen) < 0.2,
    }


@pytest.mark.parametrize("double_dqn", [True, False])
def test_train_step_reduces_loss_on_a_fixed_batch(double_dqn: bool) -> None:
    spec = LearnerSpec(hidden_sizes=(64,), lr=1e-2, target_update_interval=10**6, double_dqn=double_dqn)
    learner = DQNLearner(spec, obs_dim=4, n_actions=2, seed=0)
    batch = fixed_batch()

    first = learner.train_step(batch)
    for _ in range(200):
        last = learner.train_step(batch)

    assert learner.iter == 201
    assert last["loss"] < 0.5 * first["loss"]
    assert set(first) == {"loss", "q_mean", "grad_norm"}
    assert all(isinstance(v, float) for v in last.values())


def test_target_net_is_synced_every_target_update_interval() -> None:
    learner = DQNLearner(LearnerSpec(hidden_sizes=(8,), target_update_interval=3), 4, 2, seed=0)
    batch = fixed_batch()

    def synced() -> bool:
        online, target = learner.q_net.state_dict(), learner.target_net.state_dict()
        return all(torch.equal(online[k], target[k]) for k in online)

    assert synced()
    learner.train_step(batch)
    learner.train_step(batch)
    assert not synced()
    learner.train_step(batch)
    assert synced()


def test_soft_target_update_moves_the_target_part_way() -> None:
    learner = DQNLearner(LearnerSpec(hidden_sizes=(8,), target_update_interval=1, tau=0.5), 4, 2, seed=0)
    before = {k: v.clone() for k, v in learner.target_net.state_dict().items()}

    learner.train_step(fixed_batch())

    online = learner.q_net.state_dict()
    for key, old in before.items():
        torch.testing.assert_close(learner.target_net.state_dict()[key], 0.5 * old + 0.5 * online[key])


def test_policy_state_drives_a_collector_policy_like_the_learner() -> None:
    spec = LearnerSpec(hidden_sizes=(16, 16))
    learner = DQNLearner(spec, 4, 2, seed=1)
    learner.train_step(fixed_batch())
    policy = DQNPolicy(4, 2, spec.hidden_sizes)

    state = learner.policy_state()
    policy.load_state_dict(state)

    obs = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    expected = learner.q_net(torch.from_numpy(obs)).argmax(dim=1).numpy()
    np.testing.assert_array_equal(policy.act(obs, eps=0.0), expected)
    # a copy: training on does not change what was handed out
    learner.train_step(fixed_batch())
    assert not all(torch.equal(state[k], v) for k, v in learner.q_net.state_dict().items())


def test_same_seed_gives_same_initial_weights_without_touching_global_rng() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)

    a = DQNLearner(LearnerSpec(hidden_sizes=(8,)), 4, 2, seed=5).policy_state()
    b = DQNLearner(LearnerSpec(hidden_sizes=(8,)), 4, 2, seed=5).policy_state()

    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(torch.rand(1), expected_next)
