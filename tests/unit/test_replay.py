"""The generic replay ring buffer, and a chunk's transitions as it stores them (worker/rl/replay.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from tests.rl_builders import chunk_fields, flat_spaces
from worker.plugins import Chunk, Column, Spaces
from worker.rl.chunks import ChunkLayout, read_chunk
from worker.rl.replay import ReplayBuffer, regroup, transitions
from worker.rl.replay_feed import ReplayFeed

LAYOUT = {
    "obs": ((3,), np.float32),
    "next_obs": ((3,), np.float32),
    "action": ((), np.int64),
    "reward": ((), np.float32),
    "done": ((), np.bool_),
}


def rows(start: int, k: int) -> dict[str, np.ndarray]:
    """``k`` transitions whose obs rows are filled with ``start, start+1, ...``."""
    ids = np.arange(start, start + k, dtype=np.float32)
    return {
        "obs": np.repeat(ids[:, None], 3, axis=1),
        "next_obs": np.repeat(ids[:, None] + 0.5, 3, axis=1),
        "action": (np.arange(k) % 2).astype(np.int64),
        "reward": np.ones(k, np.float32),
        "done": np.zeros(k, bool),
    }


def test_the_buffer_wraps_around_and_keeps_the_newest() -> None:
    buf = ReplayBuffer(5, LAYOUT)

    buf.add(rows(0, 3))
    buf.add(rows(3, 3))

    assert len(buf) == 5 and buf.total_added == 6
    assert sorted(buf.columns["obs"][:, 0].tolist()) == [1, 2, 3, 4, 5]  # transition 0 was overwritten
    np.testing.assert_array_equal(buf.columns["next_obs"][:, 0], buf.columns["obs"][:, 0] + 0.5)


def test_a_batch_larger_than_the_capacity_keeps_its_tail() -> None:
    buf = ReplayBuffer(4, LAYOUT)

    added = buf.add(rows(0, 10))

    assert added == 10 and len(buf) == 4 and buf.total_added == 10
    assert sorted(buf.columns["obs"][:, 0].tolist()) == [6, 7, 8, 9]


def test_samples_are_fresh_numpy_arrays_of_stored_transitions() -> None:
    buf = ReplayBuffer(100, LAYOUT)
    buf.add(rows(0, 10))

    batch = buf.sample(32, np.random.default_rng(0))
    again = buf.sample(32, np.random.default_rng(0))

    assert {k: (v.shape, v.dtype.name) for k, v in batch.items()} == {
        "obs": ((32, 3), "float32"),
        "next_obs": ((32, 3), "float32"),
        "action": ((32,), "int64"),
        "reward": ((32,), "float32"),
        "done": ((32,), "bool"),
    }
    assert set(batch["obs"][:, 0].tolist()) <= set(range(10))
    np.testing.assert_array_equal(batch["next_obs"], batch["obs"] + 0.5)  # rows stay whole
    for name in batch:  # the same generator state draws the same transitions
        np.testing.assert_array_equal(batch[name], again[name])
    # copies: the learner may write into a batch without touching the buffer
    batch["obs"][:] = -1.0
    assert (buf.columns["obs"][:10] >= 0.0).all()


def test_sampling_an_empty_buffer_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(10, LAYOUT).sample(4, np.random.default_rng(0))


def test_transitions_of_another_layout_are_refused_and_nothing_is_stored() -> None:
    buf = ReplayBuffer(10, LAYOUT)
    with pytest.raises(ValueError, match="transitions have columns"):
        buf.add({k: v for k, v in rows(0, 2).items() if k != "done"})
    uneven = rows(0, 3)
    uneven["reward"] = uneven["reward"][:2]
    with pytest.raises(ValueError, match="differ in length"):
        buf.add(uneven)
    assert len(buf) == 0 and buf.total_added == 0
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        ReplayBuffer(0, LAYOUT)


def test_a_chunks_transitions_are_its_valid_rows_in_time_then_env_order() -> None:
    # Given a [3 steps, 2 envs] chunk whose env 1 ends an episode at t = 0 and takes its reset step at t = 1
    spaces = flat_spaces(3, 2)
    layout = ChunkLayout.of(spaces)
    fields = chunk_fields(layout, spaces, 3, 2)
    fields["obs"] = np.arange(8, dtype=np.float32).reshape(4, 2, 1).repeat(3, axis=2)
    fields["done"][0, 1] = True
    fields["valid"][1, 1] = False
    fields["truncated"][2, 0] = True
    # When its transitions are taken
    columns = transitions(read_chunk(fields, layout, spaces, 0))
    # Then the reset step is left out, and each next observation is the row after
    assert columns["obs"][:, 0].tolist() == [0, 1, 2, 4, 5]
    assert columns["next_obs"][:, 0].tolist() == [2, 3, 4, 6, 7]
    # done is "terminated": a truncated step keeps its next observation as a state to bootstrap from
    assert columns["done"].tolist() == [False, True, False, False, False]
    assert set(columns) == {"obs", "next_obs", "action", "reward", "done"}


def test_dict_observations_and_extras_become_columns_of_their_own_in_their_dtypes() -> None:
    spaces = Spaces(
        gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (2, 2), np.uint8), "pos": gym.spaces.Discrete(3)}),
        gym.spaces.Discrete(2),
    )
    layout = ChunkLayout.of(spaces, {"logp": Column(())})
    columns = transitions(read_chunk(chunk_fields(layout, spaces, 4, 2), layout, spaces, 0))
    assert set(columns) == {
        "obs.image", "next_obs.image", "obs.pos", "next_obs.pos", "action", "reward", "done", "logp",
    }  # fmt: skip
    assert columns["obs.image"].dtype == np.uint8 and columns["obs.image"].shape == (8, 2, 2)
    buf = ReplayBuffer.for_columns(16, columns)
    buf.add(columns)
    assert buf.columns["obs.image"].dtype == np.uint8  # images stay a byte per pixel in memory
    assert buf.nbytes == 16 * (4 + 4 + 8 + 8 + 8 + 4 + 1 + 4)
    batch = buf.sample(5, np.random.default_rng(0))
    assert set(regroup(batch, "obs")) == {"image", "pos"} and regroup(batch, "action") is batch["action"]


def test_the_feed_owes_train_steps_at_the_replay_ratio_for_the_transitions_after_learning_starts() -> None:
    spaces = flat_spaces()
    layout = ChunkLayout.of(spaces)
    feed = ReplayFeed(capacity=100, learning_starts=10, train_steps_per_sample=0.25, seed=0)

    def chunk(seed: int) -> Chunk:  # 4 steps x 2 envs, all valid: 8 transitions
        return read_chunk(chunk_fields(layout, spaces, 4, 2, seed=seed), layout, spaces, 0)

    assert feed.add(chunk(0)) == 8 and feed.credit == 0.0  # warm-up transitions earn nothing
    assert not feed.can_update() and feed.wants_data()
    feed.add(chunk(1))  # 16 transitions: the 6 after the first 10 earn 1.5 train steps
    assert feed.credit == 1.5 and feed.can_update() and not feed.wants_data()
    assert len(feed.sample(3)["reward"]) == 3
    assert feed.credit == 0.5 and not feed.can_update() and feed.wants_data()
    feed.add(chunk(2))  # 8 more, all after learning starts: 2 more
    drawn = [feed.sample(3) for _ in range(2)]
    assert all(len(batch["reward"]) == 3 for batch in drawn)
    assert feed.credit == 0.5 and not feed.can_update()
