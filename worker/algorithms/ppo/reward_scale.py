"""Reward scaling for PPO: rewards divided by the running standard deviation of their discounted sums.

What Stable-Baselines3's ``VecNormalize`` does to rewards (and RL Zoo's ``normalize: True``),
done on the learner: the value function then learns returns of about unit size whatever the
env's reward scale, so its loss does not dominate the gradient clip that the policy's loss
shares. The sums run forward through each chunk per env from 0 at the chunk's start (and
after each episode's end); with a discount of 0.9-0.99 a chunk of 32-128 rows is most of
their horizon. The statistics take an update's chunks after the update, so every batch is
scaled as the value function saw the previous ones; they are in the learner's checkpoint.
"""

from __future__ import annotations

import math

import numpy as np

from worker.plugins.contract import Chunk

__all__ = ["RewardScale"]


class RewardScale:
    """The running variance of discounted reward sums (parallel Welford), and the scale it gives."""

    def __init__(self, discount: float) -> None:
        self.discount = discount
        self.mean = 0.0
        self.var = 1.0
        self.count = 1e-4

    @property
    def scale(self) -> float:
        """What rewards are divided by."""
        return math.sqrt(self.var + 1e-8)

    def update(self, chunk: Chunk) -> None:
        """Take the discounted sums of ``chunk``'s valid rewards into the statistics."""
        running = np.zeros(chunk.num_envs, dtype=np.float64)
        sums = []
        ended = np.logical_or(np.logical_or(chunk.terminated, chunk.truncated), ~np.asarray(chunk.valid))
        for t in range(chunk.steps):
            running = running * self.discount + np.asarray(chunk.reward[t], dtype=np.float64)
            sums.append(running[chunk.valid[t]])
            running[ended[t]] = 0.0
        values = np.concatenate(sums) if sums else np.zeros(0)
        n = len(values)
        if n == 0:
            return
        mean, var = float(values.mean()), float(values.var())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.var = (self.var * self.count + var * n + delta**2 * self.count * n / total) / total
        self.count = total
