"""Columnar chunks (worker/rl/chunks.py): laid out from the spaces, filled a step at a time, checked when read back."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from tests.rl_builders import chunk_fields, flat_spaces
from worker.errors import CorruptFile
from worker.plugins import Column, Spaces
from worker.rl.chunks import ChunkBuffer, ChunkLayout, read_chunk
from worker.rl.envs import VecStep

SPACES = flat_spaces(3, 2)
LAYOUT = ChunkLayout.of(SPACES)
DICT_SPACES = Spaces(
    gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (4, 4), np.uint8), "direction": gym.spaces.Discrete(4)}),
    gym.spaces.MultiDiscrete([3, 2]),
)


def test_the_layout_follows_the_spaces_and_the_algorithms_columns() -> None:
    layout = ChunkLayout.of(DICT_SPACES, {"logp": Column(()), "value": Column((2,), "float64")})
    described = {name: (f.shape, f.dtype.name, f.bootstrap_row) for name, f in layout.fields.items()}
    assert described == {
        "obs.direction": ((), "int64", True),
        "obs.image": ((4, 4), "uint8", True),
        "action": ((2,), "int64", False),
        "reward": ((), "float32", False),
        "done": ((), "bool", False),
        "truncated": ((), "bool", False),
        "valid": ((), "bool", False),
        "logp": ((), "float32", False),
        "value": ((2,), "float64", False),
    }
    assert layout.obs_keys == ("direction", "image") and layout.extras == ("logp", "value")
    # one step of 8 envs: 8 x (8 + 16 + 16 + 4 + 1 + 1 + 1 + 4 + 16) bytes, observations counted once
    assert layout.bytes_per_step(8) == 8 * 67


@pytest.mark.parametrize("name", ["reward", "valid", "obs", "obs.extra", "action"])
def test_an_extra_column_may_not_take_a_chunk_fields_name(name: str) -> None:
    with pytest.raises(ValueError, match=f"extra column {name!r} takes the name of a chunk field"):
        ChunkLayout.of(SPACES, {name: Column(())})


def step(n: int, *, reward: float = 1.0, valid: Any = True, terminated: Any = False) -> VecStep:
    valid_a = np.broadcast_to(np.asarray(valid, bool), (n,)).copy()
    term = np.broadcast_to(np.asarray(terminated, bool), (n,)).copy() & valid_a
    return VecStep(
        next_obs=np.zeros((n, 3), np.float32),
        reward=np.full(n, reward, np.float32),
        terminated=term,
        truncated=np.zeros(n, bool),
        valid=valid_a,
        ended=term,
        episode_returns=np.zeros(n),
    )


def test_a_buffer_fills_a_row_per_step_and_closes_the_chunk_with_the_next_observation() -> None:
    # Given a buffer of 3 rows for 2 envs, fed 3 steps (the second a reset step for env 1)
    buffer = ChunkBuffer(LAYOUT, rows=3, num_envs=2)
    observations = [np.full((2, 3), t, np.float32) for t in range(4)]
    for t in range(3):
        buffer.add(observations[t], np.array([t % 2, 1]), {}, step(2, reward=t, valid=[True, t != 1]), now=10.0 + t)
    assert buffer.full and buffer.samples == 5 and buffer.age(12.5) == 2.5
    # When it is taken, closed by the observation that followed
    fields = buffer.take(observations[3])
    # Then there are T rows of each step field and T + 1 of observations, in order
    assert fields["obs"].shape == (4, 2, 3) and fields["action"].shape == (3, 2)
    assert fields["obs"][:, 0, 0].tolist() == [0, 1, 2, 3]
    assert fields["reward"][:, 0].tolist() == [0, 1, 2] and fields["valid"][:, 1].tolist() == [True, False, True]
    assert fields["action"][:, 0].tolist() == [0, 1, 0]
    # and the buffer starts over, while what was taken stays what it was (copies, not views)
    assert buffer.filled == 0 and buffer.samples == 0 and not buffer.full and buffer.age(99.0) == 0.0
    buffer.add(np.full((2, 3), 9, np.float32), np.array([1, 1]), {}, step(2), now=20.0)
    assert fields["obs"][0, 0, 0] == 0.0 and fields["action"][0, 0] == 0


def test_a_partly_filled_chunk_is_taken_with_its_rows_only() -> None:
    buffer = ChunkBuffer(LAYOUT, rows=8, num_envs=1)
    for t in range(2):
        buffer.add(np.full((1, 3), t, np.float32), np.array([0]), {}, step(1), now=0.0)
    fields = buffer.take(np.full((1, 3), 2, np.float32))
    assert fields["obs"][:, 0, 0].tolist() == [0, 1, 2] and fields["reward"].shape == (2, 1)


def test_dict_observations_and_extras_go_to_their_own_fields() -> None:
    layout = ChunkLayout.of(DICT_SPACES, {"logp": Column(())})
    buffer = ChunkBuffer(layout, rows=2, num_envs=2)
    for t in range(2):
        obs = {"image": np.full((2, 4, 4), t, np.uint8), "direction": np.array([t, 3])}
        buffer.add(obs, np.array([[0, 1], [2, 0]]), {"logp": np.array([-0.5, -1.0 * t])}, step(2), now=0.0)
    fields = buffer.take({"image": np.full((2, 4, 4), 7, np.uint8), "direction": np.array([2, 2])})
    assert fields["obs.image"].dtype == np.uint8 and fields["obs.image"][:, 0, 0, 0].tolist() == [0, 1, 7]
    assert fields["obs.direction"][:, 1].tolist() == [3, 3, 2]
    assert fields["logp"].tolist() == [[-0.5, -0.0], [-0.5, -1.0]]
    chunk = read_chunk(fields, layout, DICT_SPACES, policy_version=4)
    assert isinstance(chunk.obs, dict) and set(chunk.obs) == {"image", "direction"}
    assert chunk.extras["logp"].shape == (2, 2) and chunk.policy_version == 4
    rows: Any = chunk.obs_rows(1, 3)
    assert rows["direction"].tolist() == [[1, 3], [2, 2]]


def good(steps: int = 4, envs: int = 1, layout: ChunkLayout = LAYOUT, spaces: Spaces = SPACES) -> dict[str, Any]:
    return chunk_fields(layout, spaces, steps, envs)


def _broken(**changes: Any) -> dict[str, Any]:
    fields = good()
    for key, value in changes.items():
        if value is None:
            del fields[key]
        else:
            fields[key] = value
    return fields


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (_broken(obs=None), r"sample chunk lacks fields \['obs'\]"),
        (_broken(valid=None), r"lacks fields \['valid'\]"),
        (_broken(valid=np.ones(4, bool)), r"'valid' must be a \[T, N\] array"),
        (_broken(reward=[1.0, 1.0, 1.0, 1.0]), "field 'reward' is list"),
        (
            _broken(obs=np.zeros((4, 1, 3), np.float32)),
            r"field 'obs' is \(4, 1, 3\) float32; the job's spaces make it \(5, 1, 3\)",
        ),
        (_broken(obs=np.zeros((5, 1, 2), np.float32)), r"field 'obs' is \(5, 1, 2\)"),
        (_broken(obs=np.zeros((5, 1, 3), np.float64)), r"field 'obs' is \(5, 1, 3\) float64"),
        (_broken(action=np.zeros((4, 1), np.float32)), r"field 'action' is \(4, 1\) float32"),
        (_broken(done=np.zeros((4, 1), np.int64)), r"field 'done' is \(4, 1\) int64"),
        (_broken(reward=np.zeros((3, 1), np.float32)), r"field 'reward' is \(3, 1\)"),
        (_broken(obs=np.full((5, 1, 3), np.nan, np.float32)), "field 'obs' holds NaN or infinite values"),
        (_broken(reward=np.array([[1.0], [np.inf], [0.0], [0.0]], np.float32)), "'reward' holds NaN"),
        (_broken(action=np.array([[0], [1], [2], [0]])), r"actions must lie in \[0, 1\], got 0\.\.2"),
        (_broken(action=np.array([[0], [-1], [0], [0]])), r"actions must lie in \[0, 1\]"),
    ],
)
def test_malformed_chunks_are_refused_whole(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(CorruptFile, match=message):
        read_chunk(bad, LAYOUT, SPACES, 0)


def test_a_chunk_that_is_not_a_map_is_corrupt() -> None:
    with pytest.raises(CorruptFile, match="must be a map of fields, got list"):
        read_chunk([1, 2], LAYOUT, SPACES, 0)  # type: ignore[arg-type]


def test_what_lies_in_a_reset_step_is_not_checked() -> None:
    # (the row after an episode end holds the env's reset step: its reward and action are not data)
    fields = good()
    fields["valid"][2, 0] = False
    fields["reward"][2, 0] = np.nan
    fields["action"][2, 0] = 99
    chunk = read_chunk(fields, LAYOUT, SPACES, 0)
    assert chunk.steps == 4 and chunk.num_envs == 1


@pytest.mark.parametrize(
    ("action_space", "bad_action", "message"),
    [
        (gym.spaces.Discrete(3, start=1), np.array([[1], [3], [4], [2]]), r"actions must lie in \[1, 3\]"),
        (gym.spaces.MultiDiscrete([2, 3]), np.array([[[0, 2]], [[1, 3]], [[0, 0]], [[0, 0]]]), "MultiDiscrete"),
        (gym.spaces.MultiBinary(2), np.array([[[0, 1]], [[2, 0]], [[0, 0]], [[1, 1]]], np.int8), "must be 0 or 1"),
        (
            gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            np.array([[[0.0, np.nan]], [[0, 0]], [[0, 0]], [[0, 0]]], np.float32),
            "field 'action' holds NaN",
        ),
    ],
)
def test_actions_outside_the_action_space_are_refused(
    action_space: gym.Space[Any], bad_action: np.ndarray, message: str
) -> None:
    spaces = Spaces(gym.spaces.Box(-1, 1, (3,), np.float32), action_space)
    layout = ChunkLayout.of(spaces)
    fields = good(layout=layout, spaces=spaces)
    read_chunk(fields, layout, spaces, 0)  # (the good one passes)
    fields["action"] = bad_action.astype(layout.fields["action"].dtype)
    with pytest.raises(CorruptFile, match=message):
        read_chunk(fields, layout, spaces, 0)


def test_read_only_arrays_from_the_codec_are_accepted_and_stay_read_only() -> None:
    fields = good()
    for array in fields.values():
        array.flags.writeable = False
    chunk = read_chunk(fields, LAYOUT, SPACES, 7)
    assert chunk.policy_version == 7 and not chunk.reward.flags.writeable
    assert chunk.obs_rows(0, 2).shape == (2, 1, 3)  # type: ignore[union-attr]
