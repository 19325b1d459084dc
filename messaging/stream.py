"""The metadata stream: a task's data and collector-info messages, in order, through the broker.

This replaces DI-engine's in-memory ``Queue(8)``. The publisher sends persistent messages
with publisher confirms to a durable per-task queue, so what was confirmed survives a
crash of the collector or a broker restart. The queue holds at most
``metadata_queue_length`` ready messages and *rejects* further publishes: the publisher
then waits and retries, which holds the collector back when nobody reads, as the seed's
bounded queue did. A consumer gets messages in publish order and acks each one after it
has handled it; an unacked message is redelivered if the consumer dies.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from messaging.codec import decode, encode
from messaging.errors import DecodeError, PublishRejected, StreamStalled, StreamStopped
from messaging.link import BrokerLink
from messaging.subscription import Delivery, Subscription
from messaging.topology import QueueDecl

__all__ = ["MetadataConsumer", "MetadataItem", "MetadataPublisher", "StreamStopped"]

logger = logging.getLogger(__name__)

#: Back-off while a full metadata queue refuses publishes: first and largest wait.
_FULL_WAIT_FIRST_S = 0.02
_FULL_WAIT_MAX_S = 0.5


class MetadataPublisher:
    """Publishes one task's metadata, confirmed and in order, with back-pressure.

    Args:
        link: the publishing thread's broker link.
        decl: the task's metadata queue (see :meth:`messaging.topology.Names.metadata_decl`).
        stop: set it to make a publisher blocked on a full queue give up with :class:`StreamStopped`.
    """

    def __init__(
        self,
        link: BrokerLink,
        decl: QueueDecl,
        *,
        stop: threading.Event | None = None,
        stall_timeout_s: float | None = None,
    ) -> None:
        self.link = link
        self.decl = decl
        self.stop = stop or threading.Event()
        self.stall_timeout_s = stall_timeout_s
        self.published = 0
        self.full_waits = 0
        link.declare(decl)

    @property
    def queue(self) -> str:
        return self.decl.name

    def publish(self, message: dict[str, Any], *, headers: dict[str, Any] | None = None) -> None:
        """Publish ``message``; block while the queue is full (until read from, or stopped).

        Raises:
            StreamStopped: the stop event was set while waiting for room.
            StreamStalled: the queue stayed full for ``stall_timeout_s`` (nobody reads it).
            QueueNotFound: the queue was deleted (its reader gave the task up).
            MessagingError: encoding or the broker failed.
        """
        body = encode(message, max_bytes=self.link.settings.max_message_bytes)
        wait_s = _FULL_WAIT_FIRST_S
        full_since: float | None = None
        while True:
            try:
                self.link.publish(self.queue, body, persistent=True, headers=headers)
                self.published += 1
                return
            except PublishRejected:
                self.full_waits += 1
            # Full queue: wait for a reader. The link keeps its heartbeats while we wait.
            if self.stop.is_set():
                raise StreamStopped(f"stopped while {self.queue} was full")
            full_since = time.monotonic() if full_since is None else full_since
            if self.stall_timeout_s is not None and time.monotonic() - full_since > self.stall_timeout_s:
                raise StreamStalled(f"{self.queue} stayed full for {self.stall_timeout_s:g} s: nobody reads it")
            deadline = time.monotonic() + wait_s
            while (remaining := deadline - time.monotonic()) > 0 and not self.stop.is_set():
                self.link.process_events(min(remaining, 0.1))
            wait_s = min(wait_s * 2, _FULL_WAIT_MAX_S)


@dataclass(frozen=True)
class MetadataItem:
    """One decoded metadata message; call :meth:`ack` once it is handled."""

    message: dict[str, Any]
    delivery: Delivery

    @property
    def redelivered(self) -> bool:
        return self.delivery.envelope.redelivered

    def ack(self) -> None:
        self.delivery.ack()

    def requeue(self) -> None:
        self.delivery.nack(requeue=True)


class MetadataConsumer:
    """Reads a task's metadata queue in order, with manual acks.

    A message that is not a decodable map is dead-lettered with a log line and skipped,
    never returned and never lost silently.

    Args:
        link: the consuming thread's broker link.
        queue: the metadata queue; it must exist (the collector declares it).
        prefetch: messages delivered ahead of acks; larger reads faster, 1 keeps strict hand-over.
    """

    def __init__(self, link: BrokerLink, queue: str, *, prefetch: int = 16) -> None:
        self.link = link
        self.queue = queue
        self._sub: Subscription = link.subscribe(QueueDecl(queue), prefetch=prefetch, declare=False)
        self.dead_lettered = 0

    def get(self, timeout_s: float) -> MetadataItem | None:
        """The next message, or ``None`` after ``timeout_s`` without one."""
        deadline = time.monotonic() + timeout_s
        while True:
            delivery = self._sub.get(max(0.0, deadline - time.monotonic()))
            if delivery is None:
                return None
            try:
                message = decode(delivery.envelope.body, max_bytes=self.link.settings.max_message_bytes)
            except DecodeError as exc:
                message = exc
            if isinstance(message, dict):
                return MetadataItem(message, delivery)
            self.dead_lettered += 1
            logger.warning("dead-lettering a malformed metadata message on %s: %s", self.queue, message)
            delivery.nack(requeue=False)

    def close(self) -> None:
        """Stop consuming; unacked messages go back to the queue in order."""
        self._sub.close()
