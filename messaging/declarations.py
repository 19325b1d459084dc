"""Queue declarations of a publisher's I/O thread: when asked, and again on every new connection.

Each declaration runs on a channel of its own: the broker closes the channel of a
refused declaration (``PRECONDITION_FAILED``: the queue exists with other arguments;
``RESOURCE_LOCKED``: another connection's exclusive queue), and that must not take the
publishing channel, with its unconfirmed messages, down with it.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
from pika.channel import Channel

from messaging.connection import translate
from messaging.errors import MessagingError
from messaging.topology import QueueDecl

#: Called once a declaration is done: with ``None``, or with the broker's refusal.
OnDone = Callable[[MessagingError | None], None]


class PendingCall:
    """A request from another thread that waits for the I/O thread's answer."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: MessagingError | None = None

    def finish(self, error: MessagingError | None = None) -> None:
        self.error = error
        self._done.set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


class Declarations:
    """The queues one publisher declares, and the requests to declare more, one at a time."""

    def __init__(self) -> None:
        self.declared: dict[str, QueueDecl] = {}
        self._requests: collections.deque[tuple[QueueDecl, PendingCall]] = collections.deque()
        self._current: tuple[QueueDecl, PendingCall] | None = None

    def request(self, decl: QueueDecl, call: PendingCall) -> None:
        """Queue a request; :meth:`run_requests` carries it out once connected."""
        self._requests.append((decl, call))

    def forget(self, queue: str) -> None:
        self.declared.pop(queue, None)

    def run_requests(self, conn: pika.SelectConnection) -> None:
        """Declare the requested queues on ``conn``, one after the other."""
        if self._current is not None or not self._requests:
            return
        request = self._current = self._requests[0]
        decl, call = request

        def done(error: MessagingError | None) -> None:
            if self._current is not request:
                return  # given up meanwhile (publisher failed or closed)
            self._current = None
            self._requests.popleft()
            if error is None:
                self.declared[decl.name] = decl
            call.finish(error)
            self.run_requests(conn)

        declare_queue(conn, decl, done)

    def redeclare(
        self, conn: pika.SelectConnection, *, then: Callable[[], None], on_error: Callable[[MessagingError], None]
    ) -> None:
        """Declare every declared queue again on a new connection, then call ``then``."""
        _declare_in_turn(conn, list(self.declared.values()), then, on_error)

    def connection_lost(self) -> None:
        # The request under way stays first in line, for the next connection.
        self._current = None

    def fail_all(self, error: MessagingError) -> None:
        self._current = None
        while self._requests:
            self._requests.popleft()[1].finish(error)


def _declare_in_turn(
    conn: pika.SelectConnection,
    decls: list[QueueDecl],
    then: Callable[[], None],
    on_error: Callable[[MessagingError], None],
) -> None:
    if not decls:
        then()
        return

    def done(error: MessagingError | None) -> None:
        if error is not None:
            on_error(error)
        else:
            _declare_in_turn(conn, decls[1:], then, on_error)

    declare_queue(conn, decls[0], done)


def declare_queue(conn: pika.SelectConnection, decl: QueueDecl, on_done: OnDone) -> None:
    """Declare ``decl`` on a channel of its own; ``on_done`` is not called if the connection goes."""
    what = f"declaring queue {decl.name}"

    def on_open(channel: Channel) -> None:
        channel.add_on_close_callback(on_close)
        channel.queue_declare(
            decl.name,
            durable=decl.durable,
            exclusive=decl.exclusive,
            auto_delete=decl.auto_delete,
            arguments=decl.arguments,
            callback=functools.partial(declared, channel),
        )

    def declared(channel: Channel, _frame: Any, fanouts: tuple[str, ...] = decl.fanouts) -> None:
        if not fanouts:
            channel.close()
            on_done(None)
            return
        exchange, rest = fanouts[0], fanouts[1:]

        def bind(_frame: Any) -> None:
            channel.queue_bind(decl.name, exchange, callback=lambda f: declared(channel, f, rest))

        channel.exchange_declare(exchange, exchange_type="fanout", durable=True, callback=bind)

    def on_close(_channel: Channel, reason: BaseException) -> None:
        # Closed by us after the declaration, or with the connection (the reconnect redoes it).
        if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            on_done(translate(reason, what))

    if conn.is_open:
        conn.channel(on_open_callback=on_open)
