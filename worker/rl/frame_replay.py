"""Replay for frame-stack observations with each frame stored once (Atari DQN: ~8 KB a transition, not 56 KB).

A transition of stacked frames holds ``obs`` and ``next_obs``, ``2 x K`` frames of which
only one is new: storing both stacks as they are keeps every frame ``2 x K`` times. Here
frames go into one ring of single frames, and a transition keeps the frames' sequence
numbers instead (``K`` for ``obs``, ``K`` for ``next_obs``); a sampled batch gathers its
stacks from the ring. This is what Dopamine, DQN Zoo and RLlib do, with one difference:
nothing here assumes how an env builds its stacks. A row's stack is linked to the
previous row's when its older ``K - 1`` frames *are* the previous stack's newest ones
(compared, not assumed), so the first row of a chunk and the rows after a reset, however
the env filled them, store their whole stack, and every other row one frame.

Frames and transitions age out of their rings in the order they came, so a transition
whose oldest frame has been overwritten is dead. A chunk of ``T`` steps per env adds
``(K + T) / T`` frames per transition when only its first row is a whole stack; the frame
ring holds :data:`FRAMES_PER_TRANSITION` (1.125: chunks of 32 steps or more, Atari's
episodes) per transition plus one chunk's worst case, so that no transition dies on such
data. With shorter chunks or many more resets the oldest transitions die first, and
:meth:`FrameReplay.sample` draws only live ones (:attr:`FrameReplay.dead` counts the
draws it had to repeat).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.plugins.contract import Chunk
from worker.rl.replay import Columns, ReplayBuffer, transitions

__all__ = ["FRAMES_PER_TRANSITION", "FrameReplay", "frame_replay_bytes_per_transition"]

_SEQ = np.dtype(np.int64)
#: Rounds of redrawing dead transitions before the newest ones stand in for them.
_REDRAWS = 8


#: Frame slots per transition slot: (K + T) / T for stacks of K = 4 and chunks of T >= 32 steps.
FRAMES_PER_TRANSITION = 1.125


def frame_replay_bytes_per_transition(frame_bytes: int, stack: int, other_bytes: int) -> int:
    """Bytes per transition of a :class:`FrameReplay`: its frame slots, two stacks of sequence numbers, the rest.

    Args:
        frame_bytes: bytes of one frame (``H x W`` for uint8).
        stack: frames per stack (``K``).
        other_bytes: action, reward, done and extras.
    """
    return math.ceil(frame_bytes * FRAMES_PER_TRANSITION) + (2 * stack + 1) * _SEQ.itemsize + other_bytes


class FrameReplay:
    """A replay ring of transitions whose ``obs`` are uint8 frame stacks ``[K, H, W]`` (newest frame last).

    Args:
        capacity: transitions kept.
        first: the first chunk, whose shapes size the rings (it is not added; call :meth:`add`).
    """

    def __init__(self, capacity: int, first: Chunk) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        obs = np.asarray(first.obs)
        if obs.ndim != 5:
            raise ValueError(f"frame replay needs [T + 1, N, K, H, W] observations, got shape {obs.shape}")
        self.stack = int(obs.shape[2])
        self.frame_shape = (int(obs.shape[3]), int(obs.shape[4]))
        envs = first.num_envs
        worst_chunk = (first.steps + 1) * envs * self.stack
        self.frame_capacity = math.ceil(capacity * FRAMES_PER_TRANSITION) + worst_chunk
        self.frames = np.zeros((self.frame_capacity, *self.frame_shape), dtype=obs.dtype)
        self.frames_added = 0
        """Frames ever written; a frame's sequence number is its position in this count."""
        example = self._columns(first, np.zeros((first.steps + 1, envs, self.stack), dtype=_SEQ))
        self.transitions = ReplayBuffer.for_columns(capacity, example)
        self.capacity = capacity
        self.dead = 0
        """Sampled transitions that had lost a frame and were drawn again."""

    def __len__(self) -> int:
        return len(self.transitions)

    @property
    def total_added(self) -> int:
        return self.transitions.total_added

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes + self.transitions.nbytes

    # -- in ------------------------------------------------------------------------------

    def add(self, chunk: Chunk) -> int:
        """Take a chunk's valid transitions in (frames once each); returns how many."""
        stacks = np.asarray(chunk.obs)
        if stacks.shape[2:] != (self.stack, *self.frame_shape) or stacks.dtype != self.frames.dtype:
            raise ValueError(
                f"observations {stacks.shape[2:]} {stacks.dtype} do not fit this replay's "
                f"{(self.stack, *self.frame_shape)} {self.frames.dtype}"
            )
        rows, envs = stacks.shape[:2]
        seq = np.empty((rows, envs, self.stack), dtype=_SEQ)
        seq[0] = self._push(stacks[0].reshape(-1, *self.frame_shape)).reshape(envs, self.stack)
        for row in range(1, rows):
            # Linked: this stack's older frames are the previous stack's newest, frame for frame.
            linked = (stacks[row, :, :-1] == stacks[row - 1, :, 1:]).reshape(envs, -1).all(axis=1)
            if linked.any():
                seq[row, linked, :-1] = seq[row - 1, linked, 1:]
                seq[row, linked, -1] = self._push(stacks[row, linked, -1])
            fresh = ~linked
            if fresh.any():
                whole = stacks[row, fresh].reshape(-1, *self.frame_shape)
                seq[row, fresh] = self._push(whole).reshape(-1, self.stack)
        return self.transitions.add(self._columns(chunk, seq))

    def _push(self, frames: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        """Write ``frames`` into the ring; returns their sequence numbers."""
        count = len(frames)
        first = self.frames_added
        slots = np.arange(first, first + count, dtype=_SEQ) % self.frame_capacity
        self.frames[slots] = frames
        self.frames_added += count
        return np.arange(first, first + count, dtype=_SEQ)

    @staticmethod
    def _columns(chunk: Chunk, seq: npt.NDArray[np.int64]) -> Columns:
        """The chunk's transitions with frame numbers for observations (``obs_seq``, ``next_obs_seq``)."""
        out = transitions(chunk, seq)
        obs_seq, next_seq = out.pop("obs"), out.pop("next_obs")
        out["obs_seq"], out["next_obs_seq"] = obs_seq, next_seq
        out["oldest_seq"] = np.minimum(obs_seq.min(axis=1), next_seq.min(axis=1))
        return out

    # -- out -----------------------------------------------------------------------------

    def sample(self, batch_size: int, rng: np.random.Generator) -> Columns:
        """A uniform batch of live transitions, with ``obs`` and ``next_obs`` rebuilt as ``[B, K, H, W]`` stacks.

        Raises:
            ValueError: the buffer is empty.
        """
        out = self.sample_slots(batch_size, rng)
        for name in ("obs", "next_obs"):
            out[name] = self.frames[out.pop(f"{name}_slots")]
        return out

    def sample_slots(self, batch_size: int, rng: np.random.Generator) -> Columns:
        """:meth:`sample`'s batch (the same draws) with its stacks as ``[B, K]`` positions in :attr:`frames`.

        ``obs_slots`` and ``next_obs_slots`` in place of ``obs`` and ``next_obs``: a learner on a
        GPU sends only the frames they name and restacks them there
        (:class:`~worker.rl.device_frames.DeviceFrames`).

        Raises:
            ValueError: the buffer is empty.
        """
        size = len(self.transitions)
        if size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        columns = self.transitions.columns
        oldest_alive = self.frames_added - self.frame_capacity
        idx = rng.integers(0, size, size=batch_size)
        for _ in range(_REDRAWS):
            dead = columns["oldest_seq"][idx] < oldest_alive
            if not dead.any():
                break
            self.dead += int(dead.sum())
            idx[dead] = rng.integers(0, size, size=int(dead.sum()))
        else:  # the newest transitions are always live: they stand in
            dead = columns["oldest_seq"][idx] < oldest_alive
            idx[dead] = np.resize(self.transitions.newest(min(int(dead.sum()), size)), int(dead.sum()))
        out = {name: np.take(column, idx, axis=0) for name, column in columns.items() if not name.endswith("seq")}
        for name in ("obs", "next_obs"):
            out[f"{name}_slots"] = np.take(columns[f"{name}_seq"], idx, axis=0) % self.frame_capacity
        return out
