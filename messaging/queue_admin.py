"""Looking at and removing queues and exchanges over a link: passive declares and deletes.

A mixin of :class:`~messaging.link.BrokerLink`, kept apart so the link's module stays
about its connection; every operation runs on a fresh channel (a 404 closes only that
one) through the link's reconnect handling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pika.adapters.blocking_connection import BlockingConnection

from messaging.connection import translated
from messaging.errors import QueueLocked, QueueNotFound


class QueueAdmin:
    """Queue inspection and removal; the host class provides the connection and recovery."""

    def _ensure(self) -> BlockingConnection:
        raise NotImplementedError

    def _with_recovery(self, what: Callable[[], Any]) -> Any:
        raise NotImplementedError

    def forget(self, queue: str) -> None:
        raise NotImplementedError

    def queue_depth(self, queue: str) -> int | None:
        """Ready messages in ``queue``, or ``None`` if it does not exist."""
        counts = self._queue_counts(queue)
        return None if counts is None else counts[0]

    def queue_consumers(self, queue: str) -> int | None:
        """Consumers attached to ``queue``, or ``None`` if it does not exist."""
        counts = self._queue_counts(queue)
        return None if counts is None else counts[1]

    def _queue_counts(self, queue: str) -> tuple[int, int] | None:
        """(ready messages, consumers) of ``queue`` by a passive declare, or ``None``."""

        def run() -> tuple[int, int] | None:
            channel = self._ensure().channel()
            try:
                with translated(f"inspecting queue {queue}"):
                    frame = channel.queue_declare(queue, passive=True)
            except QueueNotFound:
                return None  # the broker closed that channel with the 404
            with translated("closing a channel"):
                channel.close()
            return int(frame.method.message_count), int(frame.method.consumer_count)

        result: tuple[int, int] | None = self._with_recovery(run)
        return result

    def queue_exists(self, queue: str) -> bool:
        """Whether ``queue`` exists, including another connection's exclusive queue."""
        try:
            return self.queue_depth(queue) is not None
        except QueueLocked:
            return True

    def delete_queue(self, queue: str) -> None:
        """Delete a queue and its messages (no error if it is already gone)."""

        def run() -> None:
            channel = self._ensure().channel()
            with translated(f"deleting queue {queue}"):
                channel.queue_delete(queue)
                channel.close()

        self._with_recovery(run)
        self.forget(queue)

    def exchange_exists(self, exchange: str) -> bool:
        """Whether ``exchange`` exists, by a passive declare on a fresh channel (a 404 closes only that one)."""

        def run() -> bool:
            channel = self._ensure().channel()
            try:
                with translated(f"inspecting exchange {exchange}"):
                    channel.exchange_declare(exchange, passive=True)
            except QueueNotFound:  # the broker's 404, whatever it names
                return False
            with translated("closing a channel"):
                channel.close()
            return True

        found: bool = self._with_recovery(run)
        return found

    def delete_exchange(self, exchange: str) -> None:
        """Delete an exchange (no error if it is already gone)."""

        def run() -> None:
            channel = self._ensure().channel()
            with translated(f"deleting exchange {exchange}"):
                channel.exchange_delete(exchange)
                channel.close()

        self._with_recovery(run)
