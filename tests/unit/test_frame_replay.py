"""Replay of frame stacks with each frame stored once: the exact stacks back, ~1/7 of the bytes, nothing stale."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

from tests.rl_builders import bound
from worker.plugins import Spaces
from worker.plugins.contract import Chunk
from worker.rl.frame_replay import FrameReplay, frame_replay_bytes_per_transition
from worker.rl.replay import ReplayBuffer, transitions
from worker.rl.replay_feed import ReplayFeed

STACK, SIDE = 4, 16


class StackingEnvs:
    """``N`` fake envs of numbered frames stacked newest last; a reset fills the stack as the env chooses."""

    def __init__(self, envs: int, episode: int, reset_fill: str, seed: int = 0, side: int = SIDE) -> None:
        self.rng = np.random.default_rng(seed)
        self.side = side
        self.episode, self.reset_fill = episode, reset_fill
        self.age = np.zeros(envs, dtype=np.int64)
        self.stacks = np.stack([self._reset_stack() for _ in range(envs)])

    def _frame(self) -> np.ndarray:
        return self.rng.integers(0, 256, (self.side, self.side), dtype=np.uint8)

    def _reset_stack(self) -> np.ndarray:
        first = self._frame()
        if self.reset_fill == "repeat":  # ale-py: the reset frame in every slot
            return np.stack([first] * STACK)
        return np.stack([np.zeros_like(first)] * (STACK - 1) + [first])  # zero padding

    def chunk(self, steps: int, first_id: int) -> Chunk:
        """``steps`` steps; each transition's action is a unique id so a sample can be checked against its source."""
        envs = len(self.stacks)
        obs = np.empty((steps + 1, envs, STACK, self.side, self.side), dtype=np.uint8)
        done = np.zeros((steps, envs), dtype=bool)
        valid = np.ones((steps, envs), dtype=bool)
        obs[0] = self.stacks
        for t in range(steps):
            for e in range(envs):
                if t > 0 and done[t - 1, e]:  # NEXT_STEP autoreset: this step is the reset
                    self.stacks[e] = self._reset_stack()
                    valid[t, e] = False
                    self.age[e] = 0
                else:
                    self.stacks[e] = np.concatenate([self.stacks[e, 1:], self._frame()[None]])
                    self.age[e] += 1
                    done[t, e] = self.age[e] >= self.episode
            obs[t + 1] = self.stacks
        ids = first_id + np.arange(steps * envs, dtype=np.int64).reshape(steps, envs)
        zeros = np.zeros((steps, envs), dtype=np.float32)
        return Chunk(obs, ids, zeros, done, np.zeros_like(done), valid, {}, 0)


def expected_by_id(chunks: list[Chunk]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for chunk in chunks:
        cols = transitions(chunk)
        for i, action in enumerate(cols["action"]):
            out[int(action)] = (cols["obs"][i], cols["next_obs"][i])
    return out


@pytest.mark.parametrize("reset_fill", ["repeat", "zeros"])
def test_every_sampled_stack_is_the_one_the_env_made_across_resets_and_chunk_boundaries(reset_fill: str) -> None:
    envs = StackingEnvs(envs=3, episode=7, reset_fill=reset_fill)
    chunks = [envs.chunk(steps=10, first_id=100 * i) for i in range(4)]
    replay = FrameReplay(capacity=1000, first=chunks[0])
    for chunk in chunks:
        replay.add(chunk)
    want = expected_by_id(chunks)
    assert len(replay) == len(want)  # the reset steps are not transitions
    batch = replay.sample(3000, np.random.default_rng(0))
    assert {int(a) for a in batch["action"]} == set(want)  # 3,000 draws of ~110 reach every one
    for action, obs, next_obs in zip(batch["action"], batch["obs"], batch["next_obs"], strict=True):
        np.testing.assert_array_equal(obs, want[int(action)][0])
        np.testing.assert_array_equal(next_obs, want[int(action)][1])
    assert replay.dead == 0


def test_frames_are_kept_once_so_replay_takes_about_a_quarter_of_the_stacked_bytes() -> None:
    envs = StackingEnvs(envs=4, episode=1000, reset_fill="repeat")
    chunk = envs.chunk(steps=64, first_id=0)
    deduplicated = FrameReplay(capacity=10_000, first=chunk)
    stacked = ReplayBuffer.for_columns(10_000, transitions(chunk))
    # 1.125 frame slots and 9 frame numbers a transition, against two whole stacks (8 frames)
    assert deduplicated.nbytes / stacked.nbytes < 0.2
    per_transition = frame_replay_bytes_per_transition(SIDE * SIDE, STACK, 8 + 4 + 1)
    worst_chunk = 65 * 4 * STACK * SIDE * SIDE
    assert deduplicated.nbytes == pytest.approx(10_000 * per_transition + worst_chunk, rel=0.01)


def test_transitions_whose_frames_were_overwritten_are_never_served() -> None:
    # Given episodes of one step (a whole new stack every other row) and a small replay:
    # frames arrive ~3x faster than its frame ring was sized for, so old transitions lose frames
    envs = StackingEnvs(envs=2, episode=1, reset_fill="repeat", seed=3)
    chunks = [envs.chunk(steps=8, first_id=100 * i) for i in range(30)]
    replay = FrameReplay(capacity=40, first=chunks[0])
    for chunk in chunks:
        replay.add(chunk)
    want = expected_by_id(chunks)
    # When sampling a lot, then every stack served is the true one, and some draws were redone
    batch = replay.sample(2000, np.random.default_rng(1))
    for action, obs, next_obs in zip(batch["action"], batch["obs"], batch["next_obs"], strict=True):
        np.testing.assert_array_equal(obs, want[int(action)][0])
        np.testing.assert_array_equal(next_obs, want[int(action)][1])
    assert replay.dead > 0


def test_a_chunk_of_other_frames_is_refused_and_the_replay_keeps_what_it_had() -> None:
    envs = StackingEnvs(envs=2, episode=5, reset_fill="repeat")
    first = envs.chunk(steps=4, first_id=0)
    replay = FrameReplay(capacity=100, first=first)
    replay.add(first)
    other = Chunk(
        np.zeros((5, 2, STACK, SIDE, SIDE + 1), dtype=np.uint8), first.action, first.reward,
        first.terminated, first.truncated, first.valid, {}, 0,
    )  # fmt: skip
    with pytest.raises(ValueError, match="do not fit this replay"):
        replay.add(other)
    assert len(replay) == len(transitions(first)["action"])


def test_dqn_on_frame_stacks_feeds_a_frame_replay_and_on_flat_observations_a_column_replay() -> None:
    spaces = Spaces(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6))
    algo = bound(
        "dqn", spaces, model_name="nature_cnn", model={"features": 32},
        replay_capacity=1000, learning_starts=0, batch_size=8, train_steps_per_sample=1.0,
    )  # fmt: skip
    learner = algo.make_learner(seed=0)
    assert learner.feed.frame_stack  # type: ignore[attr-defined]
    envs = StackingEnvs(envs=2, episode=5, reset_fill="repeat", side=84)
    for _ in range(2):
        chunk = envs.chunk(steps=6, first_id=0)
        learner.add(dataclasses.replace(chunk, action=chunk.action % 6))  # ids as actions of Discrete(6)
    assert isinstance(learner.feed.buffer, FrameReplay)  # type: ignore[attr-defined]
    metrics = learner.update()  # a train step on stacks rebuilt from single frames
    assert np.isfinite(metrics["loss"])
    flat = ReplayFeed(10, 0, 1.0, seed=0)
    assert not flat.frame_stack
