"""The metadata stream: a task's data and collector-info messages, in order, through the broker.

This replaces DI-engine's in-memory ``Queue(8)``. The publisher sends persistent messages
with publisher confirms to a durable per-task queue, so what was confirmed survives a
crash of the collector or a broker restart. The queue holds at most
``metadata_queue_length`` ready messages and *rejects* further publishes: the
:class:`~messaging.publisher.ConfirmedPublisher` then sends them again after a backoff,
and once its window of unconfirmed messages is full the collector is held back, as the
seed's bounded queue did. A consumer gets messages in publish order (see the publisher's
note on order across nacks) and acks each one after it has handled it; an unacked message
is redelivered if the consumer dies.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from messaging.codec import decode, encode
from messaging.errors import DecodeError, StreamStopped
from messaging.link import BrokerLink
from messaging.publisher import ConfirmedPublisher
from messaging.subscription import Delivery, Subscription
from messaging.topology import QueueDecl

__all__ = ["MetadataConsumer", "MetadataItem", "MetadataPublisher", "StreamStopped"]

logger = logging.getLogger(__name__)


class MetadataPublisher:
    """Publishes one task's metadata, confirmed and in order, with back-pressure.

    :meth:`publish` encodes and queues without waiting for the broker; it blocks only
    while the publisher's window is full (the queue is full and nobody reads it). A queue
    that stays full fails the publisher with :class:`~messaging.errors.StreamStalled`
    after its ``stall_timeout_s``.

    Args:
        publisher: the publishing thread's (open) confirmed publisher.
        decl: the task's metadata queue (see :meth:`messaging.topology.Names.metadata_decl`);
            declared now through the publisher, and again after its reconnects.
        stop: set it to make a publisher blocked on a full queue give up with :class:`StreamStopped`.
    """

    def __init__(self, publisher: ConfirmedPublisher, decl: QueueDecl, *, stop: threading.Event | None = None) -> None:
        self.publisher = publisher
        self.decl = decl
        self.stop = stop or threading.Event()
        self.published = 0
        publisher.declare(decl)

    @property
    def queue(self) -> str:
        return self.decl.name

    def publish(self, message: dict[str, Any], *, headers: dict[str, Any] | None = None) -> None:
        """Queue ``message``; block only while the publisher's window is full (until room, or stopped).

        Raises:
            StreamStopped: the stop event was set while waiting for room.
            StreamStalled: the queue stayed full for the publisher's ``stall_timeout_s``.
            QueueNotFound: the queue was deleted (its reader gave the task up).
            MessagingError: encoding or the broker failed.
        """
        body = encode(message, max_bytes=self.publisher.settings.max_message_bytes)
        self.publisher.publish(self.queue, body, headers=headers, stop=self.stop)
        self.published += 1

    def flush(self, timeout_s: float) -> None:
        """Wait until everything published so far is confirmed (stored in the queue).

        Publish a stream's final message after a flush: a message accepted while an
        earlier one was refused by the full queue can overtake it.

        Raises:
            PublishTimeout: not everything was confirmed within ``timeout_s``.
            StreamStopped: the stop event was set first.
            MessagingError: the publisher failed (see :meth:`publish`).
        """
        self.publisher.flush(timeout_s, stop=self.stop)


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
