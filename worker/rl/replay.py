"""A replay ring buffer of transitions, with one preallocated numpy column per field.

Off-policy algorithms (DQN, SAC) feed it the valid transitions of each chunk and sample
uniform batches from it. Columns keep the dtypes of the spaces (uint8 observations stay
uint8), so memory is what the data needs: ``capacity x bytes per transition``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.plugins.contract import Chunk

Columns = dict[str, npt.NDArray[Any]]


def transitions(chunk: Chunk, obs: Any = None) -> Columns:
    """A chunk's valid transitions as flat ``[k, ...]`` columns.

    ``obs`` and ``next_obs`` (``obs.<key>`` and ``next_obs.<key>`` for ``Dict`` spaces),
    ``action``, ``reward``, ``done`` (terminated: no bootstrap; a truncated step keeps
    its next observation as a bootstrap state), and the chunk's extras.

    Args:
        chunk: the chunk.
        obs: ``[T + 1, N, ...]`` rows to use in place of ``chunk.obs`` (the frame numbers
            :class:`~worker.rl.frame_replay.FrameReplay` keeps instead of frames).
    """
    valid = chunk.valid.reshape(-1)
    steps = chunk.steps
    rows = chunk.obs if obs is None else obs
    out: Columns = {}

    def flat(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return array.reshape(-1, *array.shape[2:])[valid]

    if isinstance(rows, dict):
        for key, value in rows.items():
            out[f"obs.{key}"] = flat(value[:steps])
            out[f"next_obs.{key}"] = flat(value[1:])
    else:
        out["obs"] = flat(rows[:steps])
        out["next_obs"] = flat(rows[1:])
    out["action"] = flat(chunk.action)
    out["reward"] = flat(chunk.reward)
    out["done"] = flat(chunk.terminated)
    for name, value in chunk.extras.items():
        out[name] = flat(value)
    return out


class ReplayBuffer:
    """Fixed-capacity ring buffer; the oldest transitions are overwritten first.

    Args:
        capacity: transitions kept.
        layout: column name -> (per-transition shape, dtype), as :func:`transitions` makes them.
    """

    def __init__(self, capacity: int, layout: Mapping[str, tuple[tuple[int, ...], Any]]) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.columns: Columns = {
            name: np.zeros((capacity, *shape), dtype=dtype) for name, (shape, dtype) in layout.items()
        }
        self._pos = 0
        self._size = 0
        self.total_added = 0
        """Transitions ever added, including overwritten ones."""

    @classmethod
    def for_columns(cls, capacity: int, example: Mapping[str, npt.NDArray[Any]]) -> ReplayBuffer:
        """A buffer whose columns are shaped like those of ``example`` (flat ``[k, ...]`` arrays)."""
        return cls(capacity, {name: (tuple(a.shape[1:]), a.dtype) for name, a in example.items()})

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        return sum(column.nbytes for column in self.columns.values())

    def add(self, batch: Mapping[str, npt.NDArray[Any]]) -> int:
        """Append ``k`` transitions (every column, ``[k, ...]``); one slice copy per column (two where it wraps).

        Returns:
            ``k``.

        Raises:
            ValueError: the columns differ from the buffer's, or their lengths differ.
        """
        if set(batch) != set(self.columns):
            raise ValueError(f"transitions have columns {sorted(batch)}; the buffer holds {sorted(self.columns)}")
        n = len(batch["reward"])
        if any(len(a) != n for a in batch.values()):
            raise ValueError("transition columns differ in length")
        k = min(n, self.capacity)  # only the newest ``capacity`` would survive anyway
        first = min(k, self.capacity - self._pos)
        for name, values in batch.items():
            store, newest = self.columns[name], values[n - k :]
            store[self._pos : self._pos + first] = newest[:first]
            store[: k - first] = newest[first:]
        self._pos = (self._pos + k) % self.capacity
        self._size = min(self._size + k, self.capacity)
        self.total_added += n
        return n

    def newest(self, count: int) -> npt.NDArray[np.int64]:
        """Ring positions of the ``count`` newest transitions, newest first (``count <= len(self)``)."""
        return (self._pos - 1 - np.arange(count, dtype=np.int64)) % self.capacity

    def sample(self, batch_size: int, rng: np.random.Generator) -> Columns:
        """Uniformly sample ``batch_size`` transitions (with replacement) as new arrays.

        ``np.take`` per column rather than fancy indexing, which costs two to three times
        more for these few rows; sampling is once per train step.

        Raises:
            ValueError: the buffer is empty.
        """
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        idx = rng.integers(0, self._size, size=batch_size)
        return {name: np.take(column, idx, axis=0) for name, column in self.columns.items()}


def regroup(batch: Mapping[str, npt.NDArray[Any]], prefix: str) -> Any:
    """``batch[prefix]``, or ``{key: batch[prefix.key]}`` for the columns of a ``Dict`` space."""
    if prefix in batch:
        return batch[prefix]
    dotted = prefix + "."
    return {name[len(dotted) :]: value for name, value in batch.items() if name.startswith(dotted)}
