"""A thread's own link to the broker: one connection, reconnected on loss.

pika connections are not thread-safe, so warren gives every thread that talks to
RabbitMQ its own :class:`BrokerLink`. The only call another thread may make is
:meth:`BrokerLink.call_threadsafe` (pika's ``add_callback_threadsafe``), which is how
acks and replies computed on a worker thread reach the consuming thread.

A link re-establishes itself after a connection loss: it reconnects with the
connect retry policy, redeclares every queue it declared and resubscribes every
subscription. Deliveries received before the loss cannot be acked any more (the
broker has already requeued them); acking one is a logged no-op.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from messaging.codec import CONTENT_TYPE, SCHEMA_VERSION
from messaging.connection import connect, translated
from messaging.errors import BrokerConnectionError, ChannelError, ConnectionClosed, QueueLocked, QueueNotFound
from messaging.settings import Settings
from messaging.topology import Names, QueueDecl

logger = logging.getLogger(__name__)


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

    def __init__(self, link: BrokerLink, decl: QueueDecl, *, prefetch: int, declare: bool) -> None:
        self.decl = decl
        self.prefetch = prefetch
        self.declare = declare
        self._link = link
        self._buffer: collections.deque[Delivery] = collections.deque()
        self._channel: BlockingChannel | None = None
        self._generation = 0
        self._tag: str | None = None
        self._cancelled_by_broker = False
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

    def __iter__(self) -> Iterator[Delivery]:
        while not self.closed:
            delivery = self.get(1.0)
            if delivery is not None:
                yield delivery

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

    def _attach(self, channel: BlockingChannel, generation: int) -> None:
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
            self._buffer.append(Delivery(envelope, self._link._settler(ch, tag, generation)))

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


class BrokerLink:
    """One thread's connection to RabbitMQ, with confirmed publishing and subscriptions.

    Args:
        settings: transport settings.
        role: shown in the management UI as part of the connection name.
        reconnect: restore the link after a connection loss (bounded by
            ``settings.connect_timeout_s`` per outage) instead of raising.
    """

    def __init__(self, settings: Settings, role: str, *, reconnect: bool = True) -> None:
        self.settings = settings
        self.role = role
        self.names = Names(settings.prefix)
        self._reconnect_enabled = reconnect
        self._conn: BlockingConnection | None = None
        self._publish_channel: BlockingChannel | None = None
        self._declared: dict[str, QueueDecl] = {}
        self._subscriptions: list[Subscription] = []
        self._generation = 0
        self._closed = False
        self._one_shot: Subscription | None = None
        self.reconnects = 0

    # -- lifecycle ----------------------------------------------------------------

    def open(self) -> BrokerLink:
        """Connect now (instead of at first use) and declare the dead-letter topology."""
        self._ensure()
        return self

    def close(self) -> None:
        """Close the connection; unsettled deliveries are requeued by the broker."""
        self._closed = True
        conn, self._conn = self._conn, None
        self._publish_channel = None
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except (pika.exceptions.AMQPError, OSError):
                logger.debug("closing the connection failed", exc_info=True)

    def __enter__(self) -> BrokerLink:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def open_channels(self) -> int:
        """Channels this link holds open on its connection (0 when disconnected)."""
        conn = self._conn
        return len(conn._impl._channels) if conn is not None and conn.is_open else 0

    @property
    def is_open(self) -> bool:
        return self._conn is not None and self._conn.is_open

    def _ensure(self) -> BlockingConnection:
        if self._closed:
            raise ConnectionClosed(f"{self.role} link is closed")
        if self._conn is not None and self._conn.is_open:
            return self._conn
        if self._generation > 0:
            logger.warning("%s link reconnecting", self.role)
        self._conn = connect(self.settings, self.role)
        if self._generation > 0:
            logger.warning("%s link reconnected", self.role)
        self._generation += 1
        self._publish_channel = None
        try:
            self._declare_base()
            for decl in self._declared.values():
                self._declare_on(self._conn.channel(), decl)
            for sub in self._subscriptions:
                sub._attach(self._conn.channel(), self._generation)
        except BrokerConnectionError:
            self._drop()
            raise
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._publish_channel = None
        if conn is not None and conn.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                conn.close()

    def _recover(self, error: BrokerConnectionError) -> None:
        """After a connection loss: reconnect, or re-raise when reconnecting is off."""
        if not self._reconnect_enabled or self._closed:
            raise error
        logger.warning("%s link lost (%s)", self.role, error.message)
        self._drop()
        self.reconnects += 1
        self._ensure()

    def _with_recovery(self, what: Callable[[], Any]) -> Any:
        # translated() here too: a pika error raised outside the operations' own blocks
        # (opening a channel on a connection that died while idle) must still be recovered.
        try:
            with translated(f"{self.role} link"):
                return what()
        except ConnectionClosed as exc:
            self._recover(exc)
            with translated(f"{self.role} link"):
                return what()

    # -- topology -----------------------------------------------------------------

    def _declare_base(self) -> None:
        assert self._conn is not None
        channel = self._conn.channel()
        with translated("declaring the dead-letter exchange"):
            channel.exchange_declare(self.names.dead_letter_exchange, exchange_type="fanout", durable=True)
            channel.queue_declare(self.names.dead_letter_queue, durable=True)
            channel.queue_bind(self.names.dead_letter_queue, self.names.dead_letter_exchange)
            channel.close()

    def _declare_on(self, channel: BlockingChannel, decl: QueueDecl) -> None:
        with translated(f"declaring queue {decl.name}"):
            channel.queue_declare(
                decl.name,
                durable=decl.durable,
                exclusive=decl.exclusive,
                auto_delete=decl.auto_delete,
                arguments=decl.arguments,
            )
            channel.close()

    def declare(self, decl: QueueDecl) -> None:
        """Declare a queue now and again after every reconnect (idempotent)."""

        def run() -> None:
            self._declare_on(self._ensure().channel(), decl)

        self._with_recovery(run)
        self._declared[decl.name] = decl

    def forget(self, queue: str) -> None:
        """Stop redeclaring ``queue`` after reconnects."""
        self._declared.pop(queue, None)

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

    # -- publishing ---------------------------------------------------------------

    def publish(
        self,
        queue: str,
        body: bytes,
        *,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        persistent: bool = False,
        expiration_ms: int | None = None,
        headers: dict[str, Any] | None = None,
        mandatory: bool = True,
        message_id: str | None = None,
    ) -> None:
        """Publish to ``queue`` through the default exchange and wait for the broker's confirm.

        With ``mandatory`` (the default) a missing queue is an error at once, not a
        silently dropped message. After a connection loss the message is published
        again on the new connection: delivery is at-least-once.

        Raises:
            QueueNotFound: ``queue`` does not exist.
            PublishRejected: the broker nacked the message (e.g. a full ``reject-publish`` queue).
            BrokerConnectionError: the connection could not be restored.
        """
        props = pika.BasicProperties(
            content_type=CONTENT_TYPE,
            delivery_mode=pika.DeliveryMode.Persistent if persistent else pika.DeliveryMode.Transient,
            correlation_id=correlation_id,
            reply_to=reply_to,
            expiration=str(expiration_ms) if expiration_ms is not None else None,
            headers={"schema": SCHEMA_VERSION, **(headers or {})},
            message_id=message_id,
        )

        def run() -> None:
            channel = self._confirm_channel()
            try:
                with translated(f"publishing to {queue}"):
                    channel.basic_publish("", queue, body, properties=props, mandatory=mandatory)
            except (QueueNotFound, ChannelError):
                # The broker may close the channel on some refusals: start a fresh one next time.
                self._publish_channel = None
                raise

        self._with_recovery(run)

    def _confirm_channel(self) -> BlockingChannel:
        conn = self._ensure()
        if self._publish_channel is None or not self._publish_channel.is_open:
            with translated("opening a publishing channel"):
                channel = conn.channel()
                channel.confirm_delivery()
            self._publish_channel = channel
        return self._publish_channel

    # -- consuming ----------------------------------------------------------------

    def subscribe(self, decl: QueueDecl, *, prefetch: int = 1, declare: bool = True) -> Subscription:
        """Start consuming ``decl.name`` with manual acks and ``prefetch`` unacked messages.

        With ``declare`` the queue is declared first (and after every reconnect);
        without it the queue must already exist.
        """
        sub = Subscription(self, decl, prefetch=prefetch, declare=declare)

        def run() -> None:
            conn = self._ensure()
            if declare:
                self._declare_on(conn.channel(), decl)
            sub._attach(conn.channel(), self._generation)

        self._with_recovery(run)
        if declare:
            self._declared[decl.name] = decl
        self._subscriptions.append(sub)
        return sub

    def resubscribe(self, sub: Subscription) -> None:
        """Re-attach a subscription whose consumer the broker cancelled."""
        sub._detach()

        def run() -> None:
            conn = self._ensure()
            if sub.declare:
                self._declare_on(conn.channel(), sub.decl)
            sub._attach(conn.channel(), self._generation)

        self._with_recovery(run)

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)
        sub._detach()

    def get_one(self, queue: str, timeout_s: float) -> Delivery | None:
        """Wait up to ``timeout_s`` for one message of an existing queue.

        The consumer is paused afterwards; the returned delivery stays unacked until
        settled, so it is redelivered if this thread dies first. One paused consumer (and
        its channel) is kept for the last queue asked for and reused by the next call, so
        repeated calls do not open a channel each.
        """
        sub = self._one_shot
        if sub is None or sub.queue != queue or sub.closed or sub._channel is None or not sub._channel.is_open:
            if sub is not None:
                sub.close()  # an earlier queue's consumer: its deliveries were settled by now
            self._one_shot = None
            sub = self.subscribe(QueueDecl(queue), prefetch=1, declare=False)
            self._one_shot = sub
        try:
            sub.resume()
            return sub.get(timeout_s)
        finally:
            sub.pause()

    def process_events(self, time_limit_s: float = 0.0) -> None:
        """Run the connection's I/O loop for at most ``time_limit_s`` (heartbeats, deliveries)."""

        def run() -> None:
            conn = self._ensure()
            with translated("processing broker events"):
                conn.process_data_events(time_limit=time_limit_s)

        self._with_recovery(run)

    def call_threadsafe(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the link's own thread at its next :meth:`process_events`.

        The only method another thread may call.

        Raises:
            ConnectionClosed: the connection is gone; ``fn`` will not run.
        """
        conn = self._conn
        if conn is None or not conn.is_open:
            raise ConnectionClosed(f"{self.role} link is not connected")
        with translated("scheduling a callback"):
            conn.add_callback_threadsafe(fn)

    # -- settling -----------------------------------------------------------------

    def _settler(self, channel: BlockingChannel, tag: int, generation: int) -> Callable[[bool, bool], None]:
        def settle(ack: bool, requeue: bool) -> None:
            if generation != self._generation or not channel.is_open:
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
