"""Columnar chunks: ``T`` steps of ``N`` envs as one array per field, written in place.

A chunk is what a collector ships as one step file and one metadata message: fields of
shape ``[T, N, ...]`` (time first, then env), preallocated once and filled a row per
vector-env step, so the env loop creates no per-step Python objects. ``valid`` marks the
real transitions (a row of an env taking its reset step is not one), ``done`` means
terminated (no bootstrap) and ``truncated`` a time-limit end whose ``next_obs`` is still
a state to bootstrap from.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from worker.rl.envs import VecStep

#: Fields of a chunk, in file order.
FIELDS: Final = ("obs", "next_obs", "action", "reward", "done", "truncated", "valid")


class ChunkBuffer:
    """A preallocated ``[rows, num_envs]`` chunk, filled a step at a time and taken whole.

    Args:
        rows: steps per chunk (``T``).
        num_envs: envs per step (``N``).
        obs_dim: observation size.
    """

    def __init__(self, rows: int, num_envs: int, obs_dim: int) -> None:
        self.rows = rows
        self.num_envs = num_envs
        self.obs = np.zeros((rows, num_envs, obs_dim), dtype=np.float32)
        self.next_obs = np.zeros((rows, num_envs, obs_dim), dtype=np.float32)
        self.action = np.zeros((rows, num_envs), dtype=np.int64)
        self.reward = np.zeros((rows, num_envs), dtype=np.float32)
        self.done = np.zeros((rows, num_envs), dtype=bool)
        self.truncated = np.zeros((rows, num_envs), dtype=bool)
        self.valid = np.zeros((rows, num_envs), dtype=bool)
        self.filled = 0
        """Rows written since the last :meth:`take`."""
        self.samples = 0
        """Valid transitions in those rows."""
        self.started_at = 0.0

    @property
    def full(self) -> bool:
        return self.filled == self.rows

    def age(self, now: float) -> float:
        """Seconds since the first row of the chunk in progress (0 when empty)."""
        return now - self.started_at if self.filled else 0.0

    def add(self, obs: npt.NDArray[np.float32], action: npt.NDArray[np.int64], step: VecStep, now: float) -> None:
        """Write one vector-env step as the next row."""
        t = self.filled
        if t == 0:
            self.started_at = now
        self.obs[t] = obs
        self.next_obs[t] = step.next_obs
        self.action[t] = action
        self.reward[t] = step.reward
        self.done[t] = step.terminated
        self.truncated[t] = step.truncated
        self.valid[t] = step.valid
        self.filled = t + 1
        self.samples += int(step.valid.sum())

    def take(self) -> dict[str, npt.NDArray[np.generic]]:
        """The filled rows as a chunk (copies: the sink may keep them while this buffer refills)."""
        t, self.filled, self.samples = self.filled, 0, 0
        return {name: getattr(self, name)[:t].copy() for name in FIELDS}
