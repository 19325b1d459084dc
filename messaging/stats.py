"""Plain counters of the transport, for whoever exports metrics.

messaging knows no metrics library. Once :func:`enable` was called, every
:class:`~messaging.publisher.ConfirmedPublisher` and :class:`~messaging.link.BrokerLink`
adds what it does to the :class:`LinkStats` of its role (the role in its connection
name: ``collector-c0-task``, ``coordinator-relay``...), and a reader (warren's
``/metrics``, :mod:`worker.telemetry`) takes a :func:`snapshot` when it is scraped.

Until then nothing is counted: a process that serves no metrics pays one ``None`` check
per batch of confirms. The counters are process-wide, as the links of one role are:
a collector opens a new task publisher for every task, and they all add to one
``collector-<id>-task`` entry.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

#: Upper bounds (seconds) of the confirm latency buckets; one more bucket holds the rest.
CONFIRM_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class LinkCounts:
    """What the links of one role did since counting was enabled (a :func:`snapshot` entry)."""

    published: int
    """Messages handed to a confirmed publisher (sent, or waiting to be)."""
    confirmed: int
    """Messages the broker confirmed (acked)."""
    nacked: int
    """Nacks received (a full queue's back-pressure); each resend that is nacked counts again."""
    reconnects: int
    """Connections lost and reopened."""
    confirm_buckets: tuple[int, ...]
    """Confirmed messages per latency bucket of :data:`CONFIRM_BUCKETS_S`, the last one above them all."""
    confirm_seconds: float
    """Sum of the confirm latencies: from ``publish()`` to the broker's ack, resends included."""


class LinkStats:
    """The counters of one role's links; thread-safe (publishers of a role may overlap)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._published = 0
        self._confirmed = 0
        self._nacked = 0
        self._reconnects = 0
        self._buckets = [0] * (len(CONFIRM_BUCKETS_S) + 1)
        self._confirm_seconds = 0.0

    def published(self, count: int) -> None:
        with self._lock:
            self._published += count

    def confirmed(self, latencies_s: Iterable[float]) -> None:
        """Messages acked by the broker, each with its latency."""
        with self._lock:
            for latency in latencies_s:
                self._buckets[bisect.bisect_left(CONFIRM_BUCKETS_S, latency)] += 1
                self._confirm_seconds += latency
                self._confirmed += 1

    def nacked(self, count: int) -> None:
        with self._lock:
            self._nacked += count

    def reconnected(self) -> None:
        with self._lock:
            self._reconnects += 1

    def counts(self) -> LinkCounts:
        with self._lock:
            return LinkCounts(
                self._published,
                self._confirmed,
                self._nacked,
                self._reconnects,
                tuple(self._buckets),
                self._confirm_seconds,
            )


_lock = threading.Lock()
_enabled = False
_links: dict[str, LinkStats] = {}


def enable() -> None:
    """Start counting, for the links opened from now on (call it before the role opens any)."""
    global _enabled
    _enabled = True


def disable() -> None:
    """Stop counting for the links opened from now on (links already open keep counting).

    For measuring what counting costs (``python -m benchmarks --cases metrics``); a role
    that serves metrics never turns it off.
    """
    global _enabled
    _enabled = False


def enabled() -> bool:
    return _enabled


def link_stats(role: str) -> LinkStats | None:
    """The counters a link of ``role`` adds to; ``None`` while counting is off."""
    if not _enabled:
        return None
    with _lock:
        stats = _links.get(role)
        if stats is None:
            stats = _links[role] = LinkStats()
        return stats


def snapshot() -> dict[str, LinkCounts]:
    """Every role's counts so far."""
    with _lock:
        links = dict(_links)
    return {role: stats.counts() for role, stats in links.items()}
