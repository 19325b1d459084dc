"""Batches as a learner on a GPU makes them, run here on the CPU: the same stacks and the same updates as numpy's.

The GPU paths differ from the CPU's in where arrays live, not in what they hold: image
replay restacked from frame numbers (:class:`~worker.rl.device_frames.DeviceFrames`), PPO's
batch held as tensors. On the CPU device they must give exactly what the numpy paths give.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.rl_builders import bound, chunk_fields, flat_spaces
from tests.unit.test_frame_replay import StackingEnvs
from worker.plugins.spaces import Spaces
from worker.rl.chunks import ChunkLayout, read_chunk
from worker.rl.device_frames import DeviceFrames
from worker.rl.frame_replay import FrameReplay

CPU = torch.device("cpu")


def replay_of(chunks: int, capacity: int = 1000, episode: int = 7, steps: int = 10) -> FrameReplay:
    envs = StackingEnvs(envs=3, episode=episode, reset_fill="repeat", seed=chunks)
    made = [envs.chunk(steps=steps, first_id=100 * i) for i in range(chunks)]
    replay = FrameReplay(capacity=capacity, first=made[0])
    for chunk in made:
        replay.add(chunk)
    return replay


@pytest.mark.parametrize("resident", [False, True])
def test_stacks_restacked_from_frame_numbers_are_those_the_cpu_replay_serves(resident: bool) -> None:
    replay = replay_of(4)
    device_frames = DeviceFrames(replay, CPU, resident=resident)
    want = replay.sample(500, np.random.default_rng(0))
    got = device_frames.batch(replay.sample_slots(500, np.random.default_rng(0)))  # the same draws
    assert set(got) == set(want)
    for name, column in want.items():
        assert isinstance(got[name], torch.Tensor)
        np.testing.assert_array_equal(got[name].numpy(), column)
    assert got["obs"].dtype == torch.uint8  # frames stay uint8 until the model converts them
    assert device_frames.nbytes == (replay.frames.nbytes if resident else 0)


def test_a_resident_ring_follows_the_replay_across_its_wrap_and_past_a_whole_ring_between_syncs() -> None:
    envs = StackingEnvs(envs=2, episode=1, reset_fill="repeat", seed=3)
    chunks = [envs.chunk(steps=8, first_id=100 * i) for i in range(40)]
    replay = FrameReplay(capacity=40, first=chunks[0])
    device_frames = DeviceFrames(replay, CPU, resident=True)
    for i, chunk in enumerate(chunks):
        replay.add(chunk)
        if i < 10 or i % 7 == 0:  # synced after each chunk, then only now and then (more than a ring apart)
            device_frames.sync()
    device_frames.sync()
    np.testing.assert_array_equal(device_frames.ring.numpy(), replay.frames)  # type: ignore[union-attr]
    assert replay.frames_added > 2 * replay.frame_capacity


def test_a_dqn_step_on_a_restacked_tensor_batch_is_the_step_on_the_numpy_batch() -> None:
    spaces = Spaces(gym.spaces.Box(0, 255, (4, 36, 36), np.uint8), gym.spaces.Discrete(6))

    def learner() -> Any:
        algo = bound(
            "dqn", spaces, model_name="nature_cnn", model={"features": 16},
            replay_capacity=500, learning_starts=0, batch_size=16, train_steps_per_sample=1.0,
        )  # fmt: skip
        made = algo.make_learner(seed=0)
        envs = StackingEnvs(envs=2, episode=5, reset_fill="repeat", side=36)
        for _ in range(3):
            chunk = envs.chunk(steps=6, first_id=0)
            made.add(dataclasses.replace(chunk, action=chunk.action % 6))
        return made

    numpy_side, tensor_side = learner(), learner()
    frames = DeviceFrames(tensor_side.feed.buffer, CPU, resident=False)
    for _ in range(3):
        expected = numpy_side.learn(numpy_side.feed.buffer.sample(16, numpy_side.feed.rng))
        got = tensor_side.learn(frames.batch(tensor_side.feed.buffer.sample_slots(16, tensor_side.feed.rng)))
        assert got == pytest.approx(expected, rel=1e-6)
    for name, weight in numpy_side.actor_weights().items():
        torch.testing.assert_close(tensor_side.actor_weights()[name], weight, rtol=0, atol=0)


@pytest.mark.parametrize("settings", [{}, {"normalize_obs": True}, {"correction": "vtrace", "max_lag": 2}])
def test_a_ppo_update_on_a_batch_of_tensors_is_the_update_on_the_numpy_batch(settings: dict[str, Any]) -> None:
    spaces = flat_spaces()
    algo = bound(
        "ppo", spaces, model={"hidden_sizes": [16]}, backend="torch", batch_steps=64, minibatch_size=16, epochs=2,
        **settings,
    )  # fmt: skip
    layout = ChunkLayout.of(spaces, algo.columns())
    chunks = [read_chunk(chunk_fields(layout, spaces, 32, 2, seed=i), layout, spaces, 0) for i in range(2)]
    numpy_side, tensor_side = algo.make_learner(seed=0), algo.make_learner(seed=0)
    # what a learner on a GPU does, here on the CPU
    tensor_side.tensor_batches = True  # type: ignore[attr-defined]
    for learner in (numpy_side, tensor_side):
        for chunk in chunks:
            learner.add(chunk)
    for _ in range(2):  # the second on the statistics and weights the first left
        expected, got = numpy_side.update(), tensor_side.update()
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-7)
        for learner in (numpy_side, tensor_side):
            for chunk in chunks:
                learner.add(chunk)
    for name, weight in numpy_side.actor_weights().items():
        torch.testing.assert_close(tensor_side.actor_weights()[name], weight)
