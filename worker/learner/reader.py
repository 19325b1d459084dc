"""Step files read ahead on a thread of their own, so that reading and decompressing them overlaps the updates.

The learner takes a data message, checks it, and hands its read to a :class:`StepReader`;
the read (the file, its lz4, the chunk's checks) runs on the reader's thread while the
learner's thread updates on the device, and the learner takes the results back in the
order it handed the reads over, to learn from them and settle their messages (acks stay on
the learner's thread, which owns the broker link). At most ``depth`` reads are in flight:
the learner takes no more messages than that ahead of what it learned from.

``depth`` 0 reads on the caller's thread, at once, as the learner did before (the CPU
default: there the updates and the reads share the same cores, and nothing is gained).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["StepReader"]

_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass
class _Read(Generic[_T, _R]):
    key: _T
    result: Future[_R]


class StepReader(Generic[_T, _R]):
    """Runs ``read(key)`` on a thread of its own, at most ``depth`` at a time, results in order.

    Args:
        read: what to run for a key (a step file's read and checks); its exception is the result's.
        depth: reads in flight at most; 0: run each at once on the caller's thread.
    """

    def __init__(self, read: Callable[[_T], _R], depth: int) -> None:
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        self.read = read
        self.depth = depth
        self._pending: collections.deque[_Read[_T, _R]] = collections.deque()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="step-reader") if depth else None

    def __len__(self) -> int:
        """Reads handed over whose results were not taken back yet."""
        return len(self._pending)

    @property
    def has_room(self) -> bool:
        """Whether :meth:`submit` may take another read (always, at depth 0: it runs at once)."""
        return self.depth == 0 or len(self._pending) < self.depth

    def submit(self, key: _T) -> None:
        """Start reading ``key`` (at depth 0: read it now).

        Raises:
            RuntimeError: no room (:attr:`has_room`), or the reader is closed.
        """
        if not self.has_room:
            raise RuntimeError(f"{self.depth} reads are in flight already")
        if self._pool is None:
            result: Future[_R] = Future()
            try:
                result.set_result(self.read(key))
            except Exception as exc:
                result.set_exception(exc)
        else:
            result = self._pool.submit(self.read, key)
        self._pending.append(_Read(key, result))

    def ready(self, wait_s: float = 0.0) -> list[tuple[_T, Future[_R]]]:
        """The finished reads at the front of the line, in the order they were handed over.

        Waits up to ``wait_s`` for the first one when none is finished (never when nothing is in flight).
        """
        if self._pending and wait_s > 0:
            _wait(self._pending[0].result, wait_s)
        out = []
        while self._pending and self._pending[0].result.done():
            read = self._pending.popleft()
            out.append((read.key, read.result))
        return out

    def close(self) -> list[_T]:
        """Stop the thread (a read under way finishes first); returns the keys whose results were never taken."""
        left = [read.key for read in self._pending]
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        return left


def _wait(result: Future[_R], wait_s: float) -> None:
    """Wait up to ``wait_s`` for ``result`` to finish (its exception is the taker's to see)."""
    with contextlib.suppress(TimeoutError):
        result.exception(timeout=wait_s)
