"""The replay ratio off-policy learners keep, and the learner base class that keeps it (DQN, SAC).

Apart from :mod:`worker.rl.replay` so that the feed can pick the buffer a job's
observations need: columns as they are (:class:`~worker.rl.replay.ReplayBuffer`), or frame
stacks with each frame once (:class:`~worker.rl.frame_replay.FrameReplay`). On a GPU (the
learner's :class:`~worker.plugins.contract.Placement`) it gives batches as tensors there,
image batches restacked there (:class:`~worker.rl.device_frames.DeviceFrames`); on the CPU,
numpy columns, and it imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from worker.plugins.contract import Chunk, Learner, Placement
from worker.rl.frame_replay import FrameReplay
from worker.rl.replay import ReplayBuffer, transitions

if TYPE_CHECKING:
    from worker.rl.device_frames import DeviceFrames

__all__ = ["ReplayFeed", "ReplayLearner"]


class ReplayFeed:
    """Transitions in, batches out at a fixed replay ratio: the account off-policy learners keep.

    Each transition taken in after the first ``learning_starts`` earns
    ``train_steps_per_sample`` train steps; a batch drawn spends one. The learner service
    asks :meth:`wants_data` and :meth:`can_update` to decide between reading and training,
    so the ratio holds however fast data arrives. The buffer is made from the first
    chunk's columns (the learner knows no shapes before).

    The warm-up transitions earn nothing, as in Stable-Baselines3 and cleanrl: were they
    owed, the learner would first take ``learning_starts x train_steps_per_sample`` steps
    on the warm-up data alone (random actions, for SAC), and its policy would settle (its
    entropy brought down to the target) before it had seen an action of its own. On
    LunarLanderContinuous that learned to hover: docs/performance.md.
    """

    def __init__(
        self,
        capacity: int,
        learning_starts: int,
        train_steps_per_sample: float,
        seed: int,
        *,
        frame_stack: bool = False,
        placement: Placement | None = None,
    ) -> None:
        self.capacity = capacity
        self.learning_starts = learning_starts
        self.train_steps_per_sample = train_steps_per_sample
        self.frame_stack = frame_stack
        """Observations are uint8 frame stacks: keep each frame once (:class:`FrameReplay`)."""
        self.buffer: ReplayBuffer | FrameReplay | None = None
        self.rng = np.random.default_rng(seed)
        self.credit = 0.0
        """Train steps owed to the transitions taken in."""
        self.taken = 0
        """Transitions taken in, all told (the buffer holds the newest ``capacity``)."""
        self.placement = placement if placement is not None and not placement.on_cpu else None
        """Where batches go: ``None`` on the CPU (numpy columns, as the numpy steps take them)."""
        self.device_frames: DeviceFrames | None = None

    def add(self, chunk: Chunk) -> int:
        """Take a chunk's valid transitions in; returns how many."""
        if self.frame_stack:
            if self.buffer is None:
                self.buffer = FrameReplay(self.capacity, chunk)
                self.device_frames = self._device_frames(self.buffer)
            assert isinstance(self.buffer, FrameReplay)
            added = self.buffer.add(chunk)
            if self.device_frames is not None:
                self.device_frames.sync()
        else:
            columns = transitions(chunk)
            if self.buffer is None:
                self.buffer = ReplayBuffer.for_columns(self.capacity, columns)
            assert isinstance(self.buffer, ReplayBuffer)
            added = self.buffer.add(columns)
        earning = max(0, self.taken + added - max(self.taken, self.learning_starts))
        self.taken += added
        self.credit += earning * self.train_steps_per_sample
        return added

    def _warm(self) -> bool:
        return self.buffer is not None and len(self.buffer) >= self.learning_starts

    def wants_data(self) -> bool:
        return not self._warm() or self.credit < 1.0

    def can_update(self) -> bool:
        return self._warm() and self.credit >= 1.0

    def sample(self, batch_size: int) -> Any:
        """A uniform batch for one train step, paid for from the credit.

        Numpy columns on the CPU; on a GPU, the same columns as tensors there.
        """
        assert self.buffer is not None
        self.credit -= 1.0
        if self.placement is None:
            return self.buffer.sample(batch_size, self.rng)
        if self.device_frames is not None:
            assert isinstance(self.buffer, FrameReplay)
            return self.device_frames.batch(self.buffer.sample_slots(batch_size, self.rng))
        from worker.rl.placement import to_device, torch_device

        return to_device(self.buffer.sample(batch_size, self.rng), torch_device(self.placement))

    def _device_frames(self, replay: FrameReplay) -> DeviceFrames | None:
        """The GPU side of image replay (``None`` on the CPU); resident where ``learner.device_replay`` asks."""
        if self.placement is None:
            return None
        from worker.rl.device_frames import DeviceFrames
        from worker.rl.placement import torch_device

        return DeviceFrames(replay, torch_device(self.placement), resident=self.placement.device_replay)


class ReplayLearner(Learner):
    """A learner that trains from a :class:`ReplayFeed` (DQN, SAC): data in and the pace are the feed's.

    Subclasses set ``self.feed`` and write the train step (``update``, drawing its batch
    with ``self.feed.sample``) and the weights.
    """

    feed: ReplayFeed

    @property
    def replay(self) -> ReplayBuffer | FrameReplay | None:
        return self.feed.buffer

    def add(self, chunk: Chunk) -> int:
        return self.feed.add(chunk)

    def wants_data(self) -> bool:
        return self.feed.wants_data()

    def can_update(self) -> bool:
        return self.feed.can_update()
