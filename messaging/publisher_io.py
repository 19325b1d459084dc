"""The I/O thread of a :class:`~messaging.publisher.ConfirmedPublisher`.

Everything here runs on that one thread: it owns a pika ``SelectConnection`` (pika
connections are not thread-safe), its publishing channel in confirm mode, and the
bookkeeping of sent messages by delivery tag. Other threads reach it only through
:meth:`PublisherIO.call_threadsafe` and through the shared
:class:`~messaging.unconfirmed.UnconfirmedWindow`.

Messages are sent in publish order, at most :class:`~messaging.unconfirmed.SendingWindow`
awaiting their confirm (the whole window until the broker refuses some: then fewer, as
TCP does). A nacked message (a full ``reject-publish`` queue)
is sent again after a jittered backoff, and newer messages wait meanwhile; after
:data:`~messaging.unconfirmed.NACKS_BEFORE_REOPEN` nacks in a row the channel is
reopened first (a quorum queue's channel can stay nacked for ever after a leader loss).
After a lost connection, every unconfirmed message is sent again, in publish order, on
the next one, which tries the other nodes of the URL list first (failover).

It is one piece, over 400 lines: every method is a callback of the one connection on the
one thread, and they share its delivery-tag bookkeeping, timers and outage state.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import pika
import pika.exceptions
import pika.spec
from pika.adapters.select_connection import IOLoop
from pika.channel import Channel

from messaging import stats
from messaging.connection import (
    BrokerAddress,
    failover_order,
    first_node,
    is_retryable_connect_error,
    report_connection_events_here,
    translate,
)
from messaging.declarations import Declarations, PendingCall
from messaging.errors import ConnectionClosed, ConnectionFailed, MessagingError, QueueNotFound, StreamStalled
from messaging.retry import Backoff, connect_backoff
from messaging.settings import Settings
from messaging.topology import QueueDecl
from messaging.unconfirmed import NackStreak, Outbox, Outgoing, SendingWindow, UnconfirmedWindow

logger = logging.getLogger(__name__)

#: Wait before a nacked message is sent again: first ceiling and largest ceiling (jittered).
#: Short at first: a full queue with a reader has room again within a millisecond or two
#: (8 ready messages are under 1 ms of a reader's work), and the stream idles until the
#: retry (25 ms made the metadata stream 0.21x of raw pika); doubling reaches the largest
#: wait within seven retries when nobody reads.
NACK_WAIT_FIRST_S: Final = 0.005
NACK_WAIT_MAX_S: Final = 0.5
#: How long a closing connection may take to hear the broker's Close-Ok.
CLOSE_GRACE_S: Final = 2.0


class PublisherIO:
    """Connection, channel, confirms and reconnects of one publisher, on its own thread.

    Args:
        addresses: the broker nodes to try in turn (:func:`messaging.connection.broker_addresses`).
        settings: for the connect budget and the URL shown in errors.
        role: shown in logs and errors.
        window: shared with the publishing threads.
        stall_timeout_s: fail with :class:`StreamStalled` after only nacks for this long.
    """

    def __init__(
        self,
        addresses: list[BrokerAddress],
        settings: Settings,
        role: str,
        window: UnconfirmedWindow,
        *,
        stall_timeout_s: float | None,
    ) -> None:
        if not addresses:
            raise ValueError("no broker address")
        self.addresses = addresses
        self.settings = settings
        self.role = role
        self.window = window
        self.stall_timeout_s = stall_timeout_s
        self.ioloop = IOLoop()
        self.opened = threading.Event()
        """Set once the publisher could first publish, or failed trying."""
        self.nacks = 0
        self.reconnects = 0
        self._stats = stats.link_stats(role)  # None unless this process exports metrics
        self._conn: pika.SelectConnection | None = None
        self._address = addresses[0]  # the node of the current (or next) connection attempt
        self._to_try: list[BrokerAddress] = []  # the rest of this round of the nodes
        self.node: str | None = None
        """``host:port`` of the node the live connection is on; ``None`` while disconnected."""
        self._channel: Channel | None = None  # set only while publishing is possible
        self._outbox = Outbox()
        self._sending = SendingWindow(window.size)
        self._streak = NackStreak()
        self._nacking_since: float | None = None
        self._reopens_logged_at: float | None = None
        self._nack_backoff = Backoff(NACK_WAIT_FIRST_S, NACK_WAIT_MAX_S)
        self._declarations = Declarations()
        self._connect_backoff = connect_backoff()
        self._last_connect_error: BaseException | None = None
        self._reconnecting = False
        self._stopping = False
        self._timers: dict[str, Any] = {}

    # -- thread entry and requests from other threads ---------------------------------

    def run(self) -> None:
        """The thread's body: connect, then run the I/O loop until :meth:`shutdown`."""
        report_connection_events_here()
        try:
            self._start_outage()
            self._connect()
            self.ioloop.start()
        except Exception as exc:  # the thread's outermost boundary: record, never die silently
            logger.error("%s publisher's I/O thread failed", self.role, exc_info=True)
            self._record_failure(MessagingError(f"{self.role} publisher's I/O thread failed: {exc!r}"))
        finally:
            self.ioloop.close()

    def call_threadsafe(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread; the one method other threads may call."""
        self.ioloop.add_callback_threadsafe(fn)

    def on_new_messages(self) -> None:
        """Take what the publishing threads added to the window and send it."""
        new = self.window.take_new()
        if self._stats is not None:
            self._stats.published(len(new))
        self._outbox.add(new)
        self._send()

    def declare(self, decl: QueueDecl, call: PendingCall) -> None:
        """Declare ``decl`` (now, or once connected) and again after every reconnect."""
        if self.window.failure is not None:
            call.finish(self.window.failure)
            return
        self._declarations.request(decl, call)
        if self._channel is not None and self._conn is not None:
            self._declarations.run_requests(self._conn)

    def forget(self, queue: str) -> None:
        self._declarations.forget(queue)

    def shutdown(self) -> None:
        """Close the connection and stop the loop (bounded by :data:`CLOSE_GRACE_S`)."""
        self._stopping = True
        self._cancel_timers()
        self._declarations.fail_all(ConnectionClosed(f"{self.role} publisher is closed"))
        if self._close_connection():
            self._timers["close"] = self.ioloop.call_later(CLOSE_GRACE_S, self.ioloop.stop)
        else:
            self.ioloop.stop()

    # -- connecting -----------------------------------------------------------------

    def _start_outage(self) -> None:
        # One budget per outage: the first connect, or a loss until the next ready channel.
        self._connect_backoff.reset()
        budget = self.settings.connect_timeout_s
        self._timers["outage"] = self.ioloop.call_later(budget, self._on_outage_expired)

    def _connect(self) -> None:
        self._timers.pop("connect", None)
        if not self._to_try:
            # A new round of every node; after a loss, the lost node comes last.
            lost = self._address.index if self.reconnects else None
            self._to_try = failover_order(self.addresses, lost, first_node(self.settings))
        self._address = self._to_try.pop(0)
        self._conn = pika.SelectConnection(
            self._address.params,
            on_open_callback=self._on_connection_open,
            on_open_error_callback=self._on_connect_failed,
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self.ioloop,
        )

    def _on_connect_failed(self, _conn: Any, error: BaseException) -> None:
        self._conn = None
        if self._stopping:
            self.ioloop.stop()
        elif self.window.failure is None and not is_retryable_connect_error(error):
            url = self.settings.redacted_url
            self._fail(ConnectionFailed(f"broker at {url} refused the credentials or vhost: {error!r}"))
        elif self.window.failure is None:
            self._last_connect_error = error
            logger.debug("%s publisher: node %s did not answer: %r", self.role, self._address.node, error)
            # The next node of this round at once; the backoff only once no node answered.
            wait_s = self._connect_backoff.next_wait() if not self._to_try else 0.0
            self._timers["connect"] = self.ioloop.call_later(wait_s, self._connect)

    def _on_outage_expired(self) -> None:
        self._timers.pop("outage", None)
        budget = self.settings.connect_timeout_s
        last = f": {self._last_connect_error!r}" if self._last_connect_error is not None else ""
        self._fail(ConnectionFailed(f"could not connect to {self.settings.redacted_url} within {budget:g} s{last}"))

    def _on_connection_open(self, conn: pika.SelectConnection) -> None:
        self._open_channel(conn, redeclare=True)

    def _on_connection_closed(self, conn: Any, reason: BaseException) -> None:
        if conn is not self._conn:
            return
        self._conn = None
        self._channel = None
        self.node = None
        self._declarations.connection_lost()
        if self._stopping:
            self.ioloop.stop()
            return
        if self.window.failure is not None:
            return
        logger.warning(
            "%s publisher lost its connection to %s (%s); reconnecting, %d messages unconfirmed",
            self.role,
            self._address.node,
            _describe(reason),
            self.window.unconfirmed,
        )
        self.reconnects += 1
        if self._stats is not None:
            self._stats.reconnected()
        self._reconnecting = True
        self._resend_all()
        if "outage" not in self._timers:
            self._start_outage()
        self._to_try = []  # a new round, starting after the node just lost
        self._connect()

    # -- the publishing channel ---------------------------------------------------------

    def _open_channel(self, conn: pika.SelectConnection, *, redeclare: bool) -> None:
        def on_open(channel: Channel) -> None:
            channel.add_on_close_callback(self._on_channel_closed)
            channel.add_on_return_callback(self._on_return)
            on_confirm_mode = functools.partial(confirm_mode_on, channel)
            channel.confirm_delivery(functools.partial(self._on_confirm, channel), callback=on_confirm_mode)

        def confirm_mode_on(channel: Channel, _frame: Any) -> None:
            self._outbox.new_channel()
            self._sending.new_channel()
            if redeclare:
                self._declarations.redeclare(conn, then=functools.partial(self._on_ready, channel), on_error=self._fail)
            else:
                self._on_ready(channel)

        if conn.is_open:
            conn.channel(on_open_callback=on_open)

    def _on_ready(self, channel: Channel) -> None:
        if not channel.is_open or self._conn is None or self.window.failure is not None or self._stopping:
            return
        self._channel = channel
        first = not self.opened.is_set()
        self.node = self._address.node
        self._to_try = []
        if self._reconnecting:
            self._reconnecting = False
            logger.warning(
                "%s publisher reconnected to %s; resending %d messages", self.role, self.node, self._outbox.waiting
            )
        elif first and len(self.addresses) > 1:
            logger.info("%s publisher connected to %s", self.role, self.node)
        self._cancel_timer("outage")
        self.opened.set()
        self._declarations.run_requests(self._conn)
        self._send()

    def _on_channel_closed(self, channel: Channel, reason: BaseException) -> None:
        if channel is self._channel:
            self._channel = None
        if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            # The broker refused something on the channel itself (a message too large...):
            # sending the same again would be refused again.
            self._fail(translate(reason, f"{self.role} publisher"))

    @property
    def channel_reopens(self) -> int:
        """Publishing channels given up after nacks in a row (see :class:`NackStreak`)."""
        return self._streak.reopens

    def _reopen_channel(self) -> None:
        old, self._channel = self._channel, None
        self._resend_all()
        if old is not None and old.is_open:
            old.close()
        if self._conn is not None:
            self._open_channel(self._conn, redeclare=False)

    # -- sending and confirms -----------------------------------------------------------

    def _send(self) -> None:
        channel = self._channel
        if channel is None:
            return

        def publish(message: Outgoing) -> None:
            channel.basic_publish("", message.queue, message.body, message.properties, mandatory=True)

        try:
            self._outbox.send(publish, in_flight=self._sending.limit)
        except pika.exceptions.AMQPError as exc:
            # The channel is going down; its close callback puts the unconfirmed back in line.
            logger.debug("%s publisher: publish failed on a closing channel: %r", self.role, exc)

    def _on_confirm(self, channel: Channel, frame: Any) -> None:
        if channel is not self._channel:
            return  # a channel given up: its unconfirmed messages are back in line already
        method = frame.method
        confirmed = self._outbox.confirmed(method.delivery_tag, method.multiple)
        if isinstance(method, pika.spec.Basic.Ack):
            self._on_acked(confirmed)
        else:
            if confirmed:
                self._sending.nacked(method.delivery_tag, self._outbox.next_tag)
            self._on_nacked(confirmed)

    def _on_acked(self, messages: list[Outgoing]) -> None:
        if messages:
            self.window.confirmed(len(messages))
            if self._stats is not None:
                now = time.monotonic()
                self._stats.confirmed([now - message.put_at for message in messages])
        self._sending.acked(len(messages))
        self._streak.acked()
        self._nacking_since = None
        self._nack_backoff.reset()
        if self._outbox.waiting:
            self._send()  # room in the sending window: what waited for it goes now

    def _on_nacked(self, messages: list[Outgoing]) -> None:
        if not messages:
            return
        self.nacks += len(messages)
        if self._stats is not None:
            self._stats.nacked(len(messages))
        self._streak.nacked(len(messages))
        self._outbox.refused.extend(messages)
        if self._nacking_since is None:
            self._nacking_since = time.monotonic()
        if not self._stalled() and "nack" not in self._timers:
            self._timers["nack"] = self.ioloop.call_later(self._nack_backoff.next_wait(), self._retry_nacked)

    def _retry_nacked(self) -> None:
        self._timers.pop("nack", None)
        if not self._outbox.refused or self._channel is None or self._stalled():
            return
        # Only once no message sent is awaiting its confirm: one accepted would be sent twice.
        if self._streak.due and not self._outbox.awaiting_confirm:
            self._streak.reopened()
            # INFO once per run of nacks (a full queue nobody reads nacks for long), then DEBUG.
            first = self._reopens_logged_at != self._nacking_since
            self._reopens_logged_at = self._nacking_since
            logger.log(
                logging.INFO if first else logging.DEBUG,
                "%s publisher: %d nacks in a row on %s; reopening the channel before sending again",
                self.role,
                self._streak.limit,
                self.node,
            )
            self._reopen_channel()  # sending resumes, nacked messages first, once it is open
            return
        self._outbox.retry_refused()
        self._send()

    def _stalled(self) -> bool:
        refused = self._outbox.refused
        if self.stall_timeout_s is None or self._nacking_since is None or not refused:
            return False
        if time.monotonic() - self._nacking_since < self.stall_timeout_s:
            return False
        queue = refused[0].queue
        self._fail(StreamStalled(f"{queue} refused every message for {self.stall_timeout_s:g} s: nobody reads it"))
        return True

    def _on_return(self, _channel: Channel, method: Any, properties: Any, _body: bytes) -> None:
        logger.debug("%s publisher: message %s returned: %s", self.role, properties.message_id, method.reply_text)
        self._fail(QueueNotFound(f"publishing to {method.routing_key}: no queue to route to (it does not exist)"))

    def _resend_all(self) -> None:
        """The channel is gone: every unconfirmed message goes back in line, in publish order."""
        self._cancel_timer("nack")
        self._outbox.resend_all()

    # -- failing and closing --------------------------------------------------------------

    def _fail(self, error: MessagingError) -> None:
        """The publisher cannot go on: tell the waiting threads and drop the connection.

        The loop keeps running until :meth:`shutdown`, so requests from other threads
        are still answered (with this error).
        """
        if self.window.failure is not None:
            return
        logger.warning("%s publisher failed: %s", self.role, error.message)
        self._record_failure(error)
        self._cancel_timers()
        self._channel = None
        self._close_connection()

    def _record_failure(self, error: MessagingError) -> None:
        self.window.fail(error)
        self._declarations.fail_all(error)
        self.opened.set()

    def _close_connection(self) -> bool:
        """Start closing the connection; returns whether a close callback will follow."""
        conn = self._conn
        if conn is None or conn.is_closed:
            return False
        if not conn.is_closing:
            conn.close()
        return self._conn is not None  # pika may have reported the close already

    def _cancel_timer(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            self.ioloop.remove_timeout(timer)

    def _cancel_timers(self) -> None:
        for name in list(self._timers):
            self._cancel_timer(name)


def _describe(reason: BaseException) -> str:
    if isinstance(reason, pika.exceptions.ConnectionClosed):
        return f"{reason.reply_code} {reason.reply_text}"
    return repr(reason)
