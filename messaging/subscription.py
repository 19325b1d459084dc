"""What a consumer receives: envelopes, deliveries to settle, and subscriptions to fetch them from.

A :class:`Subscription` belongs to one :class:`~messaging.link.BrokerLink` and is used
only from that link's thread; the link re-attaches it to a fresh channel after a
reconnect.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from messaging.connection import translated
from messaging.errors import ConnectionClosed, MessagingError
from messaging.topology import QueueDecl

logger = logging.getLogger(__name__)


class SubscriptionOwner(Protocol):
    """What a subscription needs of the link that owns it (:class:`~messaging.link.BrokerLink`)."""

    def process_events(self, time_limit_s: float = 0.0) -> None: ...

    def resubscribe(self, sub: Subscription) -> None: ...

    def unsubscribe(self, sub: Subscription) -> None: ...

    @property
    def generation(self) -> int: ...


@dataclass(frozen=True)
class Envelope:
    """A message as it arrived: raw body and the AMQP properties warren uses."""

    body: bytes
    queue: str
    correlation_id: str | None = None
    reply_to: str | None = None
    content_type: str | None = None
    message_id: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    redelivered: bool = False


class Delivery:
    """A received message that must be settled (acked or nacked) exactly once."""

    def __init__(self, envelope: Envelope, settle: Callable[[bool, bool], None]) -> None:
        self.envelope = envelope
        self._settle = settle
        self.settled = False

    def ack(self) -> None:
        """Tell the broker the message is handled; it will not be redelivered."""
        self._once(ack=True, requeue=False)

    def nack(self, *, requeue: bool) -> None:
        """Give the message back (``requeue``) or dead-letter it (``requeue=False``)."""
        self._once(ack=False, requeue=requeue)

    def _once(self, *, ack: bool, requeue: bool) -> None:
        if self.settled:
            return
        self.settled = True
        self._settle(ack, requeue)


class Subscription:
    """A consumer on one queue whose deliveries are fetched with :meth:`get`."""

    def __init__(self, link: SubscriptionOwner, decl: QueueDecl, *, prefetch: int, declare: bool) -> None:
        self.decl = decl
        self.prefetch = prefetch
        self.declare = declare
        self._link = link
        self._buffer: collections.deque[Delivery] = collections.deque()
        self._channel: BlockingChannel | None = None
        self._generation = 0
        self._tag: str | None = None
        self._cancelled_by_broker = False
        self._error: MessagingError | None = None
        self.paused = False
        self.closed = False

    @property
    def queue(self) -> str:
        return self.decl.name

    def get(self, timeout_s: float) -> Delivery | None:
        """Wait up to ``timeout_s`` for the next delivery; ``None`` on timeout.

        Raises:
            BrokerConnectionError: the connection was lost and could not be restored.
            QueueNotFound: the queue does not exist (and this subscription does not declare it).
        """
        deadline = time.monotonic() + timeout_s
        polled = False
        if self._error is not None and not self._buffer:
            raise self._error
        while not self._buffer:
            remaining = deadline - time.monotonic()
            if self.closed or (remaining <= 0 and polled):
                return None
            # Even with no time left, look at the socket once: get(0) must see what arrived.
            self._link.process_events(min(max(remaining, 0.0), 1.0))
            polled = True
            if self._cancelled_by_broker:
                self._cancelled_by_broker = False
                logger.warning("consumer on %s was cancelled by the broker; resubscribing", self.queue)
                self._link.resubscribe(self)
        return self._buffer.popleft()

    def take_buffered(self) -> list[Delivery]:
        """The deliveries already received, without touching the connection."""
        taken = list(self._buffer)
        self._buffer.clear()
        return taken

    def pause(self) -> None:
        """Cancel the consumer but keep the channel, so deliveries in hand can still be acked.

        Deliveries received but not yet taken with :meth:`get` go back to the queue.
        """
        if self.paused or self.closed:
            return
        self.paused = True
        channel, tag = self._channel, self._tag
        self._tag = None
        while self._buffer:
            self._buffer.popleft().nack(requeue=True)
        if channel is not None and channel.is_open and tag is not None:
            with translated(f"pausing the consumer on {self.queue}"):
                channel.basic_cancel(tag)

    def resume(self) -> None:
        """Consume again after :meth:`pause`."""
        if not self.paused or self.closed:
            return
        self.paused = False
        if self._channel is not None and self._channel.is_open:
            self._consume(self._channel, self._generation)
        else:
            self._link.resubscribe(self)

    def close(self) -> None:
        """Cancel the consumer; unsettled buffered deliveries go back to the queue."""
        if self.closed:
            return
        self.closed = True
        self._link.unsubscribe(self)

    # -- used by BrokerLink -------------------------------------------------------

    def _lost(self, error: MessagingError) -> None:
        """The queue could not be consumed again after a reconnect: :meth:`get` raises ``error``."""
        self._channel, self._tag = None, None
        self._error = error

    def _attach(self, channel: BlockingChannel, generation: int) -> None:
        self._error = None
        self._buffer.clear()
        self._channel = channel
        self._generation = generation
        with translated(f"setting prefetch for {self.queue}"):
            channel.basic_qos(prefetch_count=self.prefetch)
            channel.add_on_cancel_callback(self._on_cancel)
        if not self.paused:
            self._consume(channel, generation)

    def _consume(self, channel: BlockingChannel, generation: int) -> None:
        def on_message(ch: BlockingChannel, method: Any, props: Any, body: bytes) -> None:
            envelope = _envelope(self.queue, method, props, body)
            tag = method.delivery_tag
            self._buffer.append(Delivery(envelope, _settler(self._link, ch, tag, generation)))

        with translated(f"consuming from {self.queue}"):
            self._tag = channel.basic_consume(self.queue, on_message_callback=on_message)

    def _detach(self) -> None:
        channel, tag = self._channel, self._tag
        self._channel, self._tag = None, None
        for delivery in self._buffer:
            delivery.settled = True  # the channel close below requeues them
        self._buffer.clear()
        if channel is not None and channel.is_open:
            try:
                if tag is not None:
                    channel.basic_cancel(tag)
                channel.close()
            except pika.exceptions.AMQPError:
                logger.debug("closing the channel of %s failed", self.queue, exc_info=True)

    def _on_cancel(self, _frame: Any) -> None:
        self._cancelled_by_broker = True


def _settler(
    owner: SubscriptionOwner, channel: BlockingChannel, tag: int, generation: int
) -> Callable[[bool, bool], None]:
    """How a delivery received on ``channel`` is acked or nacked later (on the owner's thread)."""

    def settle(ack: bool, requeue: bool) -> None:
        if generation != owner.generation or not channel.is_open:
            # The channel died since delivery: the broker requeued the message already.
            logger.warning("delivery %s on a closed channel was not settled (it was requeued)", tag)
            return
        try:
            with translated("settling a delivery"):
                if ack:
                    channel.basic_ack(tag)
                else:
                    channel.basic_nack(tag, requeue=requeue)
        except ConnectionClosed:
            logger.warning("connection lost before delivery %s was settled; it will be redelivered", tag)

    return settle


def _envelope(queue: str, method: Any, props: Any, body: bytes) -> Envelope:
    return Envelope(
        body=body,
        queue=queue,
        correlation_id=props.correlation_id,
        reply_to=props.reply_to,
        content_type=props.content_type,
        message_id=props.message_id,
        headers=dict(props.headers or {}),
        redelivered=bool(method.redelivered),
    )
