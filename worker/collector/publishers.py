"""The publisher connection a collector's tasks share, one task after the other.

Each task publishes its metadata stream through a :class:`~messaging.ConfirmedPublisher`
(a connection with its own I/O thread). Opening one per task put a connection handshake,
5-20 ms, between every task and the next (docs/performance.md, "Collection at scale").
The worker keeps the last task's publisher for the next one instead, if it is still
sound: a task that ended with its messages confirmed gives it back, and one whose
publisher failed (a deleted or never-drained metadata queue, a broker lost for longer
than the reconnect budget) closes it, so the next task opens a fresh one. A task stuck in
plug-in code keeps its publisher; the next task gets another.
"""

from __future__ import annotations

import logging
import threading

from messaging import ConfirmedPublisher, MessagingError, Settings

logger = logging.getLogger(__name__)

#: How long a publisher handed back, or closed, waits for the confirms of what it published.
CONFIRM_WAIT_S = 5.0


class KeptPublisher:
    """At most one idle publisher, kept between tasks (see the module docstring). Thread-safe.

    Args:
        settings: the worker's transport settings.
        role: the publisher's role in the broker's connection names.
        stall_timeout_s: how long a publisher whose messages are all refused waits before it fails.
    """

    def __init__(self, settings: Settings, role: str, *, stall_timeout_s: float) -> None:
        self.settings = settings
        self.role = role
        self.stall_timeout_s = stall_timeout_s
        self._lock = threading.Lock()
        self._idle: ConfirmedPublisher | None = None
        self._closed = False

    def take(self) -> ConfirmedPublisher:
        """The kept publisher, or a new one.

        Raises:
            MessagingError: no connection could be opened.
        """
        with self._lock:
            publisher, self._idle = self._idle, None
        if publisher is not None:
            return publisher
        return ConfirmedPublisher(self.settings, self.role, stall_timeout_s=self.stall_timeout_s).open()

    def give_back(self, publisher: ConfirmedPublisher, queue: str, *, sound: bool) -> None:
        """A task is over with ``publisher``, which published to ``queue``: keep it for the next, or close it.

        Kept only if ``sound`` (the task did not lose its reader or its broker) and every
        message it published is confirmed within :data:`CONFIRM_WAIT_S`.
        """
        close_wait_s = CONFIRM_WAIT_S
        if sound:
            try:
                publisher.forget(queue)  # not declared again after a reconnect: the task is over
                publisher.flush(CONFIRM_WAIT_S)
            except MessagingError as exc:
                logger.info("not reusing the publisher of a task that ended with: %s", exc.message)
                sound, close_wait_s = False, 0.0  # waited for its confirms already
        with self._lock:
            keep = sound and not self._closed and self._idle is None
            if keep:
                self._idle = publisher
        if not keep:
            publisher.close(close_wait_s)

    def close(self) -> None:
        """The worker stops: close the kept publisher; publishers given back later are closed."""
        with self._lock:
            self._closed = True
            publisher, self._idle = self._idle, None
        if publisher is not None:
            publisher.close(CONFIRM_WAIT_S)
