"""The replay ratio off-policy learners keep, and the learner base class that keeps it (DQN, SAC).

Apart from :mod:`worker.rl.replay` so that the feed can pick the buffer a job's
observations need: columns as they are (:class:`~worker.rl.replay.ReplayBuffer`), or frame
stacks with each frame once (:class:`~worker.rl.frame_replay.FrameReplay`).
"""

from __future__ import annotations

import numpy as np

from worker.plugins.contract import Chunk, Learner
from worker.rl.frame_replay import FrameReplay
from worker.rl.replay import Columns, ReplayBuffer, transitions

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

    def add(self, chunk: Chunk) -> int:
        """Take a chunk's valid transitions in; returns how many."""
        if self.frame_stack:
            if self.buffer is None:
                self.buffer = FrameReplay(self.capacity, chunk)
            assert isinstance(self.buffer, FrameReplay)
            added = self.buffer.add(chunk)
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

    def sample(self, batch_size: int) -> Columns:
        """A uniform batch for one train step, paid for from the credit."""
        assert self.buffer is not None
        self.credit -= 1.0
        return self.buffer.sample(batch_size, self.rng)


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
