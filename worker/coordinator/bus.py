"""The few broker operations the coordinator makes, behind one small interface.

:class:`CoordinatorBus` is what the coordinator's rooms call; :class:`BrokerBus` is the
real thing on one :class:`~messaging.BrokerLink` and an :class:`~messaging.RpcClient`
sharing it (the coordinator is one thread). Unit tests give the coordinator an in-memory
bus instead, so its decisions are tested without a broker.
"""

from __future__ import annotations

from typing import Any, Protocol

from messaging import (
    BrokerConnectionError,
    BrokerLink,
    ConfirmedPublisher,
    MetadataConsumer,
    MetadataItem,
    QueueDecl,
    QueueDeleter,
    RpcClient,
    Settings,
)

#: Stream items a task's reader holds unacked (the coordinator acks each once handled).
STREAM_PREFETCH = 64
#: Forwarded data messages the relay may have unconfirmed before a forward waits.
RELAY_WINDOW = 256


class MetadataStream(Protocol):
    """A task's metadata queue, read in order with manual acks."""

    def get(self, timeout_s: float) -> MetadataItem | None:
        """The next item, or ``None`` after ``timeout_s`` without one."""
        ...

    def close(self) -> None:
        """Stop reading; unacked items go back to the queue."""
        ...


class CoordinatorBus(Protocol):
    """Sending tasks, reading replies and streams, forwarding data, looking at queues."""

    def open(self, *decls: QueueDecl) -> None:
        """Connect and declare the queues the coordinator relies on."""
        ...

    def send(self, queue: str, body: dict[str, Any], *, timeout_s: float, durable: bool = False) -> str:
        """Publish a request (expiring after ``timeout_s``); returns its correlation id.

        ``durable``: persistent and confirmed, so it survives a broker restart in its queue.

        Raises:
            QueueNotFound: nobody serves ``queue`` (a dead worker's control queue); for a
                request that is not durable, :meth:`poll` raises it instead.
        """
        ...

    def broadcast(self, body: dict[str, Any], *, timeout_s: float) -> str:
        """Send a request to every collector (their roster exchange); returns the id for :meth:`gathered`."""
        ...

    def gathered(self, correlation_id: str, *, done: bool = False) -> list[dict[str, Any]]:
        """Results of the replies to a :meth:`broadcast` that arrived since the last look; never blocks."""
        ...

    def poll(self, correlation_id: str) -> dict[str, Any] | None:
        """The reply's result if it arrived, else ``None``; never blocks.

        Raises:
            RemoteError: the worker refused the request.
            QueueNotFound: the request came back: nobody serves its queue.
        """
        ...

    def abandon(self, correlation_id: str) -> None:
        """Give up on a request: a late reply is dropped."""
        ...

    def stray_replies(self) -> list[dict[str, Any]]:
        """Results of successful replies no request waited for since the last look (each once)."""
        ...

    def stream(self, queue: str) -> MetadataStream:
        """Start reading a task's metadata queue.

        Raises:
            QueueNotFound: the queue does not exist.
        """
        ...

    def forward(self, queue: str, body: bytes) -> None:
        """Publish ``body`` persistently to ``queue``, without waiting for the broker's confirm."""
        ...

    def confirm_forwarded(self, timeout_s: float) -> None:
        """Wait until the broker confirmed everything forwarded so far.

        Raises:
            MessagingError: not confirmed in time, or the publisher failed.
        """
        ...

    def consumers(self, queue: str) -> int:
        """Consumers attached to ``queue`` (0 if it does not exist)."""
        ...

    def exists(self, queue: str) -> bool:
        """Whether ``queue`` exists (also another connection's exclusive queue)."""
        ...

    def depth(self, queue: str) -> int:
        """Ready messages in ``queue`` (0 if it does not exist)."""
        ...

    def delete(self, queue: str) -> None:
        """Have ``queue`` and its messages deleted soon; returns at once, never fails.

        Deleting can take seconds on a degraded cluster: it happens elsewhere, retried
        until done (see :class:`~messaging.QueueDeleter`), and nothing waits for it.
        """
        ...

    def wait(self, seconds: float) -> None:
        """Let the connection work for up to ``seconds`` (replies, deliveries, heartbeats)."""
        ...

    def close(self) -> None:
        """Close everything; deletions still pending get :data:`DELETE_AT_CLOSE_S` to finish."""
        ...


#: How long queue deletions still pending at the end may take.
DELETE_AT_CLOSE_S = 10.0


class BrokerBus:
    """:class:`CoordinatorBus` on one broker link of the coordinator's thread, plus a relay and a deleter.

    The relay to the learner's queue is a :class:`~messaging.ConfirmedPublisher` (its own
    connection and thread): forwarding returns at once, and one wait per loop turn
    collects the confirms of everything forwarded in it. Queue deletions go to a
    :class:`~messaging.QueueDeleter` (its own connection and thread), so the loop never
    waits for one.
    """

    def __init__(self, settings: Settings, role: str = "coordinator") -> None:
        self.settings = settings
        self.role = role
        self.link = BrokerLink(settings, role)
        self.client = RpcClient(settings, role, link=self.link)
        self.relay = self._new_relay()
        self.deleter = QueueDeleter(settings, f"{role}-deleter")

    def _new_relay(self) -> ConfirmedPublisher:
        return ConfirmedPublisher(self.settings, f"{self.role}-relay", window=RELAY_WINDOW)

    def open(self, *decls: QueueDecl) -> None:
        self.link.open()
        for decl in decls:
            self.link.declare(decl)
        self.relay.open()
        self.deleter.start()

    def send(self, queue: str, body: dict[str, Any], *, timeout_s: float, durable: bool = False) -> str:
        return self.client.send(queue, body, timeout_s=timeout_s, durable=durable)

    def broadcast(self, body: dict[str, Any], *, timeout_s: float) -> str:
        return self.client.broadcast(self.link.names.collector_roster, body, timeout_s=timeout_s)

    def gathered(self, correlation_id: str, *, done: bool = False) -> list[dict[str, Any]]:
        return self.client.gathered(correlation_id, done=done)

    def poll(self, correlation_id: str) -> dict[str, Any] | None:
        return self.client.poll(correlation_id)

    def abandon(self, correlation_id: str) -> None:
        self.client.abandon(correlation_id)

    def stray_replies(self) -> list[dict[str, Any]]:
        return self.client.stray_replies()

    def stream(self, queue: str) -> MetadataStream:
        return MetadataConsumer(self.link, queue, prefetch=STREAM_PREFETCH)

    def forward(self, queue: str, body: bytes) -> None:
        try:
            self.relay.publish(queue, body, persistent=True)
        except BrokerConnectionError:
            self._replace_relay()
            raise

    def confirm_forwarded(self, timeout_s: float) -> None:
        try:
            self.relay.flush(timeout_s)
        except BrokerConnectionError:
            self._replace_relay()
            raise

    def _replace_relay(self) -> None:
        # A publisher that lost the broker for longer than its reconnect budget stays failed:
        # start a fresh one for the next turn (the unconfirmed items go back to their streams).
        self.relay.close(timeout_s=0.0)
        self.relay = self._new_relay()
        self.relay.open()

    def consumers(self, queue: str) -> int:
        return self.link.queue_consumers(queue) or 0

    def exists(self, queue: str) -> bool:
        return self.link.queue_exists(queue)

    def depth(self, queue: str) -> int:
        return self.link.queue_depth(queue) or 0

    def delete(self, queue: str) -> None:
        self.deleter.request(queue)

    def wait(self, seconds: float) -> None:
        self.link.process_events(seconds)

    def close(self) -> None:
        self.relay.close()
        self.client.close()
        self.link.close()
        self.deleter.close(DELETE_AT_CLOSE_S)
