"""Deleting queues off the caller's thread: a thread of its own, with its own connection.

Deleting a queue can take seconds on a degraded cluster: RabbitMQ 3.10 deletes a quorum
queue that has a member down only after a 5 s wait for that member (measured in
docs/reliability.md), and a durable classic queue whose node is down cannot be deleted
until the node is back. A loop that also starts tasks and reads streams must not wait for
that, so it hands the names to a :class:`QueueDeleter`: :meth:`~QueueDeleter.request`
returns at once, the deleter's thread deletes them one after the other on its own
:class:`~messaging.link.BrokerLink` (created on that thread: one pika connection per
thread), retries what failed with a growing pause, and gives up on a queue after
``give_up_s`` (a classic queue's ``x-expires`` then removes it). What it did is counted
(:class:`DeletionCounts`) and logged: a slow deletion and every give-up as warnings.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import Final

from messaging.errors import MessagingError, QueueNotFound
from messaging.link import BrokerLink
from messaging.settings import Settings

logger = logging.getLogger(__name__)

#: A deletion that takes longer than this is logged as a warning (a member or node is down?).
SLOW_DELETE_S: Final = 1.0
#: Pause before the first retry of a failed deletion, doubled each time up to the maximum.
RETRY_FIRST_S: Final = 0.5
RETRY_MAX_S: Final = 10.0
#: A queue that could not be deleted for this long is given up (and left to the broker).
GIVE_UP_S: Final = 600.0


@dataclass(frozen=True)
class DeletionCounts:
    """What a :class:`QueueDeleter` did so far."""

    requested: int = 0
    deleted: int = 0
    """Deletions done (also of queues that were gone already)."""
    retried: int = 0
    """Failed attempts that were tried again later."""
    given_up: int = 0
    slow: int = 0
    """Deletions that took more than :data:`SLOW_DELETE_S`."""
    pending: int = 0
    longest_s: float = 0.0
    """The longest single deletion."""


@dataclass
class _Job:
    queue: str
    requested_at: float
    due: float
    attempts: int = 0


class QueueDeleter:
    """Deletes the queues it is asked to, on its own thread and connection; see the module docstring.

    Args:
        settings: transport settings (the deleter opens its own connection with them).
        role: its connection's name in the management UI is ``warren-<role>@...``.
        give_up_s: stop retrying a queue after this long.
    """

    def __init__(self, settings: Settings, role: str, *, give_up_s: float = GIVE_UP_S) -> None:
        self.settings = settings
        self.role = role
        self.give_up_s = give_up_s
        self._jobs: collections.deque[_Job] = collections.deque()
        self._queued: set[str] = set()
        self._cond = threading.Condition()
        self._closing = False
        self._deadline = float("inf")
        self._counts = DeletionCounts()
        self._thread = threading.Thread(target=self._main, name=f"{role}-deleter", daemon=True)

    # -- the caller's side ----------------------------------------------------------

    def start(self) -> QueueDeleter:
        self._thread.start()
        return self

    def request(self, queue: str) -> None:
        """Delete ``queue`` soon; returns at once. A queue already waiting is not asked twice."""
        with self._cond:
            if self._closing:
                logger.warning("%s: asked to delete %s while closing; left to the broker", self.role, queue)
                return
            if queue in self._queued:
                return
            now = time.monotonic()
            self._jobs.append(_Job(queue, now, now))
            self._queued.add(queue)
            self._count(requested=1)
            self._cond.notify()

    def pending(self) -> list[str]:
        """Queues not deleted yet (waiting, being deleted, or waiting for a retry)."""
        with self._cond:
            return sorted(self._queued)

    @property
    def counts(self) -> DeletionCounts:
        with self._cond:
            return dataclasses.replace(self._counts, pending=len(self._queued))

    def close(self, timeout_s: float) -> list[str]:
        """Delete what is pending for up to ``timeout_s``, then stop; returns the queues left undeleted.

        Retries still happen meanwhile (without waiting past the deadline). What is left
        is logged with its names: the broker removes a classic queue by its ``x-expires``.
        """
        with self._cond:
            self._closing = True
            self._deadline = time.monotonic() + timeout_s
            self._cond.notify()
        if self._thread.ident is not None:
            self._thread.join(timeout_s + 1.0)
        left = self.pending()
        counts = self.counts
        if left:
            shown = ", ".join(left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
            logger.warning(
                "%s: %d queues not deleted within %.0f s at shutdown (left to the broker): %s",
                self.role,
                len(left),
                timeout_s,
                shown,
            )
        logger.info(
            "%s: %d queues deleted (%d retries, %d slow, longest %.2f s, %d given up, %d left)",
            self.role,
            counts.deleted,
            counts.retried,
            counts.slow,
            counts.longest_s,
            counts.given_up,
            len(left),
        )
        return left

    # -- the deleter's thread -------------------------------------------------------

    def _count(self, **add: int) -> None:
        # Under self._cond.
        self._counts = dataclasses.replace(
            self._counts, **{name: getattr(self._counts, name) + value for name, value in add.items()}
        )

    def _next(self) -> _Job | None:
        """The next job that is due, waiting for one; None when closing and nothing is left in time."""
        with self._cond:
            while True:
                now = time.monotonic()
                if self._closing and (not self._jobs or now >= self._deadline):
                    return None
                due = [job for job in self._jobs if job.due <= now]
                if due:
                    job = min(due, key=lambda j: j.due)
                    self._jobs.remove(job)
                    return job
                wake = min((job.due for job in self._jobs), default=now + 1.0)
                if self._closing:
                    wake = min(wake, self._deadline)
                self._cond.wait(max(0.01, wake - now))

    def _main(self) -> None:
        link = BrokerLink(self.settings, self.role)  # created on the thread that uses it
        try:
            while (job := self._next()) is not None:
                self._delete(link, job)
        except Exception:  # a bug here must not take the owner's process down with it
            logger.exception("%s: the queue deleter stopped", self.role)
        finally:
            link.close()

    def _delete(self, link: BrokerLink, job: _Job) -> None:
        job.attempts += 1
        started = time.monotonic()
        try:
            link.delete_queue(job.queue)
        except QueueNotFound as exc:
            if "down or inaccessible" not in exc.message:
                self._done(job, started)  # gone already
                return
            self._retry(job, exc)  # a durable classic queue whose node is down: wait for the node
        except MessagingError as exc:
            self._retry(job, exc)
        else:
            self._done(job, started)

    def _done(self, job: _Job, started: float) -> None:
        took = time.monotonic() - started
        if took > SLOW_DELETE_S:
            logger.warning("%s: deleting %s took %.1f s (a member of it down?)", self.role, job.queue, took)
        else:
            logger.debug("%s: deleted %s in %.3f s", self.role, job.queue, took)
        with self._cond:
            self._queued.discard(job.queue)
            self._count(deleted=1, slow=int(took > SLOW_DELETE_S))
            if took > self._counts.longest_s:
                self._counts = dataclasses.replace(self._counts, longest_s=round(took, 3))

    def _retry(self, job: _Job, error: MessagingError) -> None:
        now = time.monotonic()
        with self._cond:
            if now - job.requested_at >= self.give_up_s:
                self._queued.discard(job.queue)
                self._count(given_up=1)
                logger.error(
                    "%s: gave up deleting %s after %d attempts in %.0f s: %s",
                    self.role,
                    job.queue,
                    job.attempts,
                    now - job.requested_at,
                    error.message,
                )
                return
            pause = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (job.attempts - 1))
            job.due = now + pause
            self._jobs.append(job)
            self._count(retried=1)
        level = logging.WARNING if job.attempts == 1 else logging.DEBUG
        logger.log(
            level, "%s: could not delete %s (%s); trying again in %.1f s", self.role, job.queue, error.message, pause
        )
