"""Frame stacks stored once per frame (worker/rl/chunks.py): exact stacks back across resets, bad tables refused."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import pytest

from tests.rl_builders import chunk_fields
from worker.errors import CorruptFile
from worker.plugins import Spaces
from worker.rl.chunks import ChunkBuffer, ChunkLayout, is_frame_stack, read_chunk
from worker.rl.envs import VecStep

K, SIDE = 4, 16
STACKS = Spaces(gym.spaces.Box(0, 255, (K, SIDE, SIDE), np.uint8), gym.spaces.Discrete(3))
LAYOUT = ChunkLayout.of(STACKS)


class FakeStacks:
    """Frame stacks of ``n`` envs as a frame-stacking env makes them: episodes of random length, a new stack at reset.

    ``padding`` says how a reset stack is filled: ``zero`` (ale-py: zeros, then the reset frame)
    or ``repeat`` (the reset frame ``K`` times). Steps follow next-step autoreset: the step
    after an episode's end returns the reset stack.
    """

    def __init__(self, n: int, padding: str, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.n, self.padding = n, padding
        self.stacks = np.stack([self._reset_stack() for _ in range(n)])
        self.left = self.rng.integers(1, 12, n)
        self.after_end = np.zeros(n, bool)

    def _frame(self) -> npt.NDArray[np.uint8]:
        return self.rng.integers(0, 4, (SIDE, SIDE), dtype=np.uint8)  # few values: coincidences happen

    def _reset_stack(self) -> npt.NDArray[np.uint8]:
        frame = self._frame()
        if self.padding == "zero":
            return np.concatenate([np.zeros((K - 1, SIDE, SIDE), np.uint8), frame[None]])
        return np.repeat(frame[None], K, axis=0)

    def step(self) -> VecStep:
        valid = ~self.after_end
        ended = np.zeros(self.n, bool)
        for i in range(self.n):
            if self.after_end[i]:
                self.stacks[i] = self._reset_stack()
                self.left[i] = self.rng.integers(1, 12)
            else:
                self.stacks[i] = np.concatenate([self.stacks[i, 1:], self._frame()[None]])
                self.left[i] -= 1
                ended[i] = self.left[i] == 0
        truncated = ended & (self.rng.random(self.n) < 0.5)
        self.after_end = ended
        return VecStep(
            next_obs=self.stacks.copy(),
            reward=np.zeros(self.n, np.float32),
            terminated=ended & ~truncated,
            truncated=truncated,
            valid=valid,
            ended=ended,
            episode_returns=np.zeros(self.n),
        )


def collect(env: FakeStacks, rows: int, chunks: int) -> list[tuple[dict[str, Any], npt.NDArray[np.uint8]]]:
    """``chunks`` chunks of ``rows`` rows as a rollout fills them, each with the stacks the env gave."""
    buffer = ChunkBuffer(LAYOUT, rows=rows, num_envs=env.n)
    obs = env.stacks.copy()
    out = []
    for _ in range(chunks):
        seen = [obs]
        for _ in range(rows):
            step = env.step()
            buffer.add(obs, np.zeros(env.n, np.int64), {}, step, now=0.0)
            obs = np.asarray(step.next_obs)
            seen.append(obs)
        out.append((buffer.take(obs), np.stack(seen)))
    return out


def test_a_uint8_stack_of_grey_frames_is_a_frame_stack_and_other_images_are_not() -> None:
    assert is_frame_stack(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))
    assert not is_frame_stack(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8))  # channels last
    assert not is_frame_stack(gym.spaces.Box(0, 1, (4, 84, 84), np.float32))
    assert not is_frame_stack(gym.spaces.Box(0, 255, (4, 4), np.uint8))
    assert LAYOUT.frame_fields == ("obs",) and LAYOUT.fields["obs"].stored_shape == (SIDE, SIDE)


@pytest.mark.parametrize("padding", ["zero", "repeat"])
def test_stacks_rebuilt_from_single_frames_are_the_envs_own_across_resets_and_truncations(padding: str) -> None:
    # Given chunks of 4 envs whose episodes end (terminated or truncated) every few steps
    env = FakeStacks(4, padding, seed=7)
    for fields, stacks in collect(env, rows=16, chunks=6):
        # the file holds one frame per row and env, and heads only where a stack is not the shifted previous one
        assert fields["obs"].shape == (17, 4, SIDE, SIDE)
        assert fields["obs@heads"].shape[1:] == (K - 1, SIDE, SIDE)
        assert len(fields["obs@at"]) < 17 * 4 / 2
        # When the learner reads it, every stack is the one the env gave, bit for bit
        chunk = read_chunk(fields, LAYOUT, STACKS, 0)
        assert isinstance(chunk.obs, np.ndarray) and chunk.obs.shape == stacks.shape
        np.testing.assert_array_equal(chunk.obs, stacks)


def test_every_chunk_starts_with_the_full_stack_of_every_env() -> None:
    (fields, _), (later, _) = collect(FakeStacks(3, "zero", seed=1), rows=8, chunks=2)
    for f in (fields, later):
        assert f["obs@at"][:3].tolist() == [[0, 0], [0, 1], [0, 2]]


def test_a_long_episode_stores_a_quarter_of_the_stacked_bytes() -> None:
    env = FakeStacks(2, "zero", seed=3)
    env.left[:] = 10**6  # no episode ends
    ((fields, stacks),) = collect(env, rows=128, chunks=1)
    stored = fields["obs"].nbytes + fields["obs@heads"].nbytes + fields["obs@at"].nbytes
    assert stored < 0.27 * stacks.nbytes


def corrupt(fields: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    bad = dict(fields)
    if value is None:
        del bad[name]
    else:
        bad[name] = value
    return bad


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("obs", np.zeros((17, 2, SIDE, SIDE - 1), np.uint8), "field 'obs' is"),  # a frame of another size
        ("obs", np.zeros((17, 2, K, SIDE, SIDE), np.uint8), "field 'obs' is"),  # stacks, not frames
        ("obs@heads", np.zeros((2, K, SIDE, SIDE), np.uint8), "'obs@heads' is"),  # heads of another depth
        ("obs@heads", None, "frame tables"),
        ("obs@at", np.array([[0, 1], [0, 0]], np.int32), "every env's row 0 first"),  # out of order
        ("obs@at", np.array([[0, 0], [0, 2]], np.int32), "every env's row 0 first"),  # an env that is not there
        ("obs@at", np.array([[0, 0]], np.int32), "'obs@at' is"),  # fewer places than heads
        ("obs@extra", np.zeros((1, 2), np.int32), "frame tables"),
    ],
)
def test_a_chunk_whose_frames_disagree_with_the_layout_is_refused(name: str, value: Any, message: str) -> None:
    fields = chunk_fields(LAYOUT, STACKS, 16, 2)
    fields["obs@heads"], fields["obs@at"] = fields["obs@heads"][:2], fields["obs@at"][:2]
    read_chunk(fields, LAYOUT, STACKS, 0)  # (the good one passes)
    with pytest.raises(CorruptFile, match=message):
        read_chunk(corrupt(fields, name, value), LAYOUT, STACKS, 0)


def test_ale_pong_stacks_come_back_exactly_through_episode_ends() -> None:
    pytest.importorskip("ale_py")
    from worker.envs.gymnasium import GymnasiumEnvs
    from worker.plugins.binding import make_env_context
    from worker.plugins.registry import import_env_packages
    from worker.rl.envs import VecEnvBatch

    import_env_packages("ale_py")
    # Given Pong cut after 25 agent steps (100 frames), so episodes end inside chunks
    ctx = make_env_context("ALE/Pong-v5", 2, kwargs={"max_num_frames_per_episode": 100}, seed=5)
    batch = VecEnvBatch(GymnasiumEnvs(), ctx)
    try:
        spaces = batch.spaces
        layout = ChunkLayout.of(spaces)
        assert layout.frame_fields == ("obs",)
        buffer = ChunkBuffer(layout, rows=32, num_envs=2)
        obs, ends = np.asarray(batch.reset()), 0
        rng = np.random.default_rng(0)
        for _ in range(3):
            seen = [obs]
            for _ in range(32):
                step = batch.step(rng.integers(0, 6, 2))
                ends += int(step.ended.sum())
                buffer.add(obs, np.zeros(2, np.int64), {}, step, now=0.0)
                obs = np.asarray(step.next_obs)
                seen.append(obs)
            # When each chunk is read back, the stacks are the env's own
            chunk = read_chunk(buffer.take(obs), layout, spaces, 0)
            np.testing.assert_array_equal(chunk.obs, np.stack(seen))
        assert ends >= 6
    finally:
        batch.close()
