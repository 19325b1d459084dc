"""A thread's own link to the broker: one connection, reconnected on loss.

pika connections are not thread-safe, so warren gives every thread that talks to
RabbitMQ its own :class:`BrokerLink`. The only call another thread may make is
:meth:`BrokerLink.call_threadsafe` (pika's ``add_callback_threadsafe``), which is how
acks and replies computed on a worker thread reach the consuming thread.

A link re-establishes itself after a connection loss: it reconnects with the
connect retry policy (to another node of the URL list first, when there are several:
failover), redeclares every queue it declared and resubscribes every subscription.
Deliveries received before the loss cannot be acked any more (the broker has already
requeued them); acking one is a logged no-op.

It is one piece, over 400 lines: every operation of a link (declare, publish, subscribe,
get) goes through the same reconnect-and-restore path, which must know all that the link
declared and subscribed; apart, that state would have to be handed back and forth.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from messaging import stats
from messaging.codec import CONTENT_TYPE, SCHEMA_VERSION
from messaging.connection import BrokerAddress, open_connection, translated
from messaging.errors import BrokerConnectionError, ChannelError, ConnectionClosed, PublishRejected, QueueNotFound
from messaging.queue_admin import QueueAdmin
from messaging.settings import Settings
from messaging.subscription import Delivery, Subscription
from messaging.topology import Names, QueueDecl
from messaging.unconfirmed import NackStreak

logger = logging.getLogger(__name__)

#: Correlation ids of returned messages kept for :meth:`BrokerLink.was_returned`.
_RETURNS_KEPT = 1024


class BrokerLink(QueueAdmin):
    """One thread's connection to RabbitMQ, with confirmed publishing and subscriptions.

    Args:
        settings: transport settings.
        role: shown in the management UI as part of the connection name.
        reconnect: restore the link after a connection loss (bounded by
            ``settings.connect_timeout_s`` per outage) instead of raising.
        declare_dead_letters: declare the prefix's dead-letter exchange and queue on every
            connect (off for a clean-up, which would otherwise bring back what it removes).
    """

    def __init__(
        self, settings: Settings, role: str, *, reconnect: bool = True, declare_dead_letters: bool = True
    ) -> None:
        self.settings = settings
        self.role = role
        self._declare_dead_letters = declare_dead_letters
        self.names = Names.of(settings)
        self._reconnect_enabled = reconnect
        self._conn: BlockingConnection | None = None
        self._publish_channel: BlockingChannel | None = None
        self._unconfirmed_channel: BlockingChannel | None = None
        self._returned: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._declared: dict[str, QueueDecl] = {}
        self._subscriptions: list[Subscription] = []
        self._generation = 0
        self._closed = False
        self._one_shot: Subscription | None = None
        self._address: BrokerAddress | None = None
        self._nacks = NackStreak()
        self._reopen_logged = False
        self.reconnects = 0

    # -- lifecycle ----------------------------------------------------------------

    def open(self) -> BrokerLink:
        """Connect now (instead of at first use) and declare the dead-letter topology (unless told not to)."""
        self._ensure()
        return self

    def close(self) -> None:
        """Close the connection; unsettled deliveries are requeued by the broker."""
        self._closed = True
        self._drop()

    def __enter__(self) -> BrokerLink:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def is_open(self) -> bool:
        return self._conn is not None and self._conn.is_open

    @property
    def node(self) -> str | None:
        """``host:port`` of the broker node the live connection is on; ``None`` while disconnected.

        With several URLs in ``WARREN_AMQP_URL``, which node a process reached (the first that
        answered; after a loss, another one first).
        """
        return self._address.node if self.is_open and self._address is not None else None

    @property
    def generation(self) -> int:
        """Counts the connections this link opened: deliveries of an older one cannot be settled."""
        return self._generation

    def _ensure(self) -> BlockingConnection:
        if self._closed:
            raise ConnectionClosed(f"{self.role} link is closed")
        if self._conn is not None and self._conn.is_open:
            return self._conn
        lost = self._address.index if self._address is not None else None
        connected = open_connection(self.settings, self.role, lost=lost)
        self._conn, self._address = connected.connection, connected.address
        if self._generation > 0:
            logger.warning("%s link reconnected to %s", self.role, connected.node)
        elif len(self.settings.amqp_urls) > 1:
            logger.info("%s link connected to %s", self.role, connected.node)
        self._generation += 1
        self._publish_channel = self._unconfirmed_channel = None
        try:
            if self._declare_dead_letters:
                self._declare_base()
            for decl in self._declared.values():
                self._declare_on(self._conn.channel(), decl)
            for sub in self._subscriptions:
                self._reattach(sub)
        except BrokerConnectionError:
            self._drop()
            raise
        return self._conn

    def _reattach(self, sub: Subscription) -> None:
        """Attach a subscription to the new connection; one whose queue is gone keeps the error.

        A durable classic queue on a node that died is gone from the others until the node
        is back (404, "home node ... is down"). A subscription to a queue someone else
        declared (a task's metadata queue) then raises that at its next
        :meth:`Subscription.get`, and the link's other subscriptions are restored all the
        same; one that declares its own queue fails the reconnect, as its declaration would.
        """
        assert self._conn is not None
        try:
            with translated(f"consuming from {sub.queue}"):
                sub._attach(self._conn.channel(), self._generation)
        except (QueueNotFound, ChannelError) as exc:
            if sub.declare:
                raise
            logger.warning("%s link: cannot consume from %s again: %s", self.role, sub.queue, exc.message)
            sub._lost(exc)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._publish_channel = self._unconfirmed_channel = None
        if conn is not None and conn.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                conn.close()

    def _recover(self, error: BrokerConnectionError) -> None:
        """After a connection loss: reconnect, or re-raise when reconnecting is off."""
        if not self._reconnect_enabled or self._closed:
            raise error
        node = self._address.node if self._address is not None else "the broker"
        logger.warning("%s link lost (%s, on %s); reconnecting", self.role, error.message, node)
        self._drop()
        self.reconnects += 1
        counts = stats.link_stats(self.role)
        if counts is not None:
            counts.reconnected()
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
        decl = self.names.dead_letter_queue_decl()
        with translated(f"declaring the dead-letter exchange and queue {decl.name}"):
            channel.exchange_declare(self.names.dead_letter_exchange, exchange_type="fanout", durable=True)
            channel.queue_declare(decl.name, durable=decl.durable, arguments=decl.arguments)
            channel.queue_bind(decl.name, self.names.dead_letter_exchange)
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
            for exchange in decl.fanouts:
                channel.exchange_declare(exchange, exchange_type="fanout", durable=True)
                channel.queue_bind(decl.name, exchange)
            channel.close()

    def declare(self, decl: QueueDecl, *, remember: bool = True) -> None:
        """Declare a queue now and, with ``remember``, again after every reconnect (idempotent).

        Declare once (``remember=False``) what another connection owns from then on, such as
        the metadata queue of a task run by another thread: redeclaring it after a reconnect,
        when its reader may have deleted it, would bring it back for nobody.
        """

        def run() -> None:
            self._declare_on(self._ensure().channel(), decl)

        self._with_recovery(run)
        if remember:
            self._declared[decl.name] = decl

    def forget(self, queue: str) -> None:
        """Stop redeclaring ``queue`` after reconnects."""
        self._declared.pop(queue, None)

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
        confirm: bool = True,
        exchange: str = "",
    ) -> None:
        """Publish to ``queue`` through the default exchange and wait for the broker's confirm.

        With ``exchange`` the message goes to that exchange instead, ``queue`` being the
        routing key (a fanout exchange ignores it).

        With ``mandatory`` (the default) a missing queue is an error at once, not a
        silently dropped message. After a connection loss the message is published
        again on the new connection: delivery is at-least-once. A nacked message is sent
        again at once, on a new channel after :data:`~messaging.unconfirmed.NACKS_BEFORE_REOPEN`
        nacks in a row (see :class:`~messaging.unconfirmed.NackStreak`), before
        :class:`PublishRejected` is raised.

        ``confirm=False`` skips the wait (one broker round trip) for messages whose loss
        the caller detects anyway, such as RPC requests and replies (the caller times out).
        A ``mandatory`` message the broker cannot route then comes back later, while the
        link processes events: :meth:`was_returned` tells by its correlation id.

        Raises:
            QueueNotFound: ``queue`` does not exist (confirmed publishes only).
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
        )

        def run() -> None:
            channel = self._confirm_channel() if confirm else self._plain_channel()
            try:
                with translated(f"publishing to {exchange or queue}"):
                    channel.basic_publish(exchange, queue, body, properties=props, mandatory=mandatory)
            except (QueueNotFound, ChannelError):
                # The broker may close the channel on some refusals: start a fresh one next time.
                self._publish_channel = self._unconfirmed_channel = None
                raise

        if not confirm:
            self._with_recovery(run)
            return
        for attempt in range(self._nacks.limit + 1):
            try:
                self._with_recovery(run)
            except PublishRejected:
                if attempt == self._nacks.limit:
                    raise
                if self._nacks.nacked():
                    self._reopen_confirm_channel()
            else:
                self._nacks.acked()
                self._reopen_logged = False
                return

    def _reopen_confirm_channel(self) -> None:
        """Give up a channel the broker nacked ``limit`` times in a row (see :class:`NackStreak`)."""
        self._nacks.reopened()
        # INFO once until the next ack (a full queue nobody reads nacks for long), then DEBUG.
        level = logging.DEBUG if self._reopen_logged else logging.INFO
        self._reopen_logged = True
        logger.log(
            level, "%s link: %d nacks in a row on %s; reopening the channel", self.role, self._nacks.limit, self.node
        )
        channel, self._publish_channel = self._publish_channel, None
        if channel is not None and channel.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                channel.close()

    @property
    def channel_reopens(self) -> int:
        """Confirm channels given up after nacks in a row."""
        return self._nacks.reopens

    def was_returned(self, correlation_id: str) -> bool:
        """Whether an unconfirmed ``mandatory`` message with this correlation id came back unroutable."""
        if correlation_id not in self._returned:
            return False
        del self._returned[correlation_id]
        return True

    def _plain_channel(self) -> BlockingChannel:
        conn = self._ensure()
        if self._unconfirmed_channel is None or not self._unconfirmed_channel.is_open:
            with translated("opening a publishing channel"):
                channel = conn.channel()
                channel.add_on_return_callback(self._on_return)
            self._unconfirmed_channel = channel
        return self._unconfirmed_channel

    def renew_unconfirmed_channel(self) -> None:
        """Send the next unconfirmed messages on a fresh channel.

        RabbitMQ 3.10 can leave a channel that talked to a quorum queue across a leader change
        (or opened while the queue had no leader) rejecting everything it publishes there; with
        confirms the nacks show it (see :class:`~messaging.unconfirmed.NackStreak`), without them
        the messages just vanish. A caller that missed an answer it expected calls this.
        """
        channel, self._unconfirmed_channel = self._unconfirmed_channel, None
        if channel is not None and channel.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                channel.close()

    def _on_return(self, _channel: BlockingChannel, method: Any, props: Any, _body: bytes) -> None:
        if props.correlation_id:
            self._returned[props.correlation_id] = None
            while len(self._returned) > _RETURNS_KEPT:
                self._returned.popitem(last=False)
        logger.debug("message to %s returned: %s", method.routing_key, method.reply_text)

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
