"""Confirmed publishing with a window of unconfirmed messages: the caller never waits per message.

A synchronous confirm costs a broker round trip per message (~1 ms with persistent
messages: about 1.8k messages/s). :class:`ConfirmedPublisher` instead keeps up to
``window`` messages unconfirmed: :meth:`~ConfirmedPublisher.publish` queues a message
and returns, its own I/O thread sends it and collects the broker's confirms, and
:meth:`~ConfirmedPublisher.flush` waits until everything published so far is confirmed.

Guarantees:

* **At least once.** A message counts as delivered only once the broker confirmed it
  (persistent messages: written to disk). After a lost connection every unconfirmed
  message is sent again, so a reader may see duplicates; warren's bodies carry ids that
  recognise them.
* **Publish order, as far as the broker allows.** Messages are sent, and sent again
  after a loss, in publish order. A nacked message (a full ``reject-publish`` queue:
  back-pressure) is sent again after a backoff and newer ones wait meanwhile; but a
  message sent before the nack arrived, or accepted while an earlier one was nacked
  again (a reader made room in between), can end up ahead of it. Readers must not rely
  on strict order across a nack: a stream signals its end with a final message
  published after a :meth:`~ConfirmedPublisher.flush`.
* **Missing queues are errors.** Messages are ``mandatory``: one the broker cannot
  route (its queue was deleted, by its reader for instance) fails the publisher with
  :class:`~messaging.errors.QueueNotFound`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from types import TracebackType
from typing import Any, Final

import pika

from messaging.codec import CONTENT_TYPE, SCHEMA_VERSION
from messaging.connection import broker_addresses
from messaging.declarations import PendingCall
from messaging.errors import ConfigurationError, ConnectionClosed, ConnectionFailed, MessagingError
from messaging.publisher_io import CLOSE_GRACE_S, PublisherIO
from messaging.settings import Settings
from messaging.topology import QueueDecl
from messaging.unconfirmed import UnconfirmedWindow

logger = logging.getLogger(__name__)

#: Extra time a caller gives the I/O thread beyond its own deadlines before giving up on it.
_GRACE_S: Final = 5.0


class ConfirmedPublisher:
    """Publishes to queues through the default exchange with asynchronous publisher confirms.

    Thread-safe: any thread may publish, flush, declare and close. The connection itself
    lives on the publisher's own thread (``warren-publisher-<role>``), which also keeps
    heartbeats going while the callers are busy elsewhere.

    Args:
        settings: transport settings; ``connect_timeout_s`` is the reconnect budget per outage.
        role: shown in the management UI as ``warren-<role>@host:pid``.
        window: how many messages may be unconfirmed before :meth:`publish` blocks.
        stall_timeout_s: fail with :class:`~messaging.errors.StreamStalled` when the
            broker nacks everything for this long (a full queue nobody reads);
            ``None`` retries as long as the caller waits.
    """

    def __init__(
        self, settings: Settings, role: str, *, window: int = 128, stall_timeout_s: float | None = None
    ) -> None:
        if window < 1:
            raise ConfigurationError(f"window must be >= 1, got {window!r}")
        if stall_timeout_s is not None and stall_timeout_s <= 0:
            raise ConfigurationError(f"stall_timeout_s must be > 0, got {stall_timeout_s!r}")
        self.settings = settings
        self.role = role
        self.window = window
        self.stall_timeout_s = stall_timeout_s
        # What the publishing threads share with the I/O thread: unconfirmed messages, failure.
        self._shared = UnconfirmedWindow(window, role, id_prefix=f"{uuid.uuid4().hex[:12]}-")
        self._schema_headers: dict[str, Any] = {"schema": SCHEMA_VERSION}
        self._io: PublisherIO | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------

    def open(self) -> ConfirmedPublisher:
        """Start the I/O thread and wait until it can publish.

        Raises:
            ConfigurationError: the TLS settings cannot be used.
            ConnectionFailed: no connection within ``settings.connect_timeout_s``, or the
                broker refused the credentials.
        """
        if self._closed:
            raise ConnectionClosed(f"{self.role} publisher is closed; open a new one")
        if self._io is not None:
            return self
        addresses = broker_addresses(self.settings, self.role)
        io = PublisherIO(addresses, self.settings, self.role, self._shared, stall_timeout_s=self.stall_timeout_s)
        self._io = io
        self._thread = threading.Thread(target=io.run, name=f"warren-publisher-{self.role}", daemon=True)
        self._thread.start()
        waited = io.opened.wait(self.settings.connect_timeout_s + _GRACE_S)
        failure = self._shared.failure
        if waited and failure is None:
            return self
        self._closed = True
        self._shared.close()
        self._stop_io(CLOSE_GRACE_S + _GRACE_S)
        if failure is not None:
            raise type(failure)(failure.message) from None
        raise ConnectionFailed(f"{self.role} publisher: no connection to {self.settings.redacted_url} in time")

    def close(self, timeout_s: float = 5.0) -> None:
        """Wait up to ``timeout_s`` for outstanding confirms, then close the connection.

        Messages still unconfirmed then are dropped, and their count is logged. Safe to
        call more than once, and on a publisher that failed.
        """
        if self._closed or self._io is None:
            self._closed = True
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        if self._shared.failure is None:
            try:
                self._shared.wait_confirmed(timeout_s, stop=None)
            except MessagingError as exc:
                logger.debug("%s publisher: confirms before close: %s", self.role, exc.message)
        dropped = self._shared.close()
        if dropped:
            logger.warning("%s publisher closed with %d unconfirmed messages dropped", self.role, dropped)
        self._stop_io(max(deadline - time.monotonic(), 0.0) + CLOSE_GRACE_S + 1.0)

    def _stop_io(self, join_s: float) -> None:
        assert self._io is not None and self._thread is not None
        self._io.call_threadsafe(self._io.shutdown)
        self._thread.join(join_s)
        if self._thread.is_alive():
            logger.warning("%s publisher's I/O thread did not stop within %.1f s", self.role, join_s)

    def __enter__(self) -> ConfirmedPublisher:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- topology -------------------------------------------------------------------------

    def declare(self, decl: QueueDecl) -> None:
        """Declare a queue now, and again after every reconnect (idempotent).

        Waits for the broker's answer, up to ``settings.connect_timeout_s`` while
        reconnecting.

        Raises:
            ChannelError: the broker refused the declaration (``PRECONDITION_FAILED``:
                the queue exists with other arguments); :class:`QueueLocked` for another
                connection's exclusive queue.
            MessagingError: the publisher failed, or no answer came in time.
        """
        io = self._require_open()
        call = PendingCall()
        io.call_threadsafe(functools.partial(io.declare, decl, call))
        wait_s = self.settings.connect_timeout_s + _GRACE_S
        if not call.wait(wait_s):
            raise ConnectionClosed(f"declaring queue {decl.name}: no answer within {wait_s:g} s")
        if call.error is not None:
            raise type(call.error)(call.error.message) from None

    def forget(self, queue: str) -> None:
        """Stop redeclaring ``queue`` after reconnects."""
        io = self._require_open()
        io.call_threadsafe(functools.partial(io.forget, queue))

    # -- publishing -----------------------------------------------------------------------

    def publish(
        self,
        queue: str,
        body: bytes,
        *,
        persistent: bool = True,
        headers: dict[str, Any] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """Queue ``body`` for ``queue``; returns at once unless ``window`` messages are unconfirmed.

        Then it waits for room: for confirms, or for ``stop``.

        Raises:
            StreamStopped: ``stop`` was set while waiting for room.
            QueueNotFound: a message could not be routed (its queue does not exist).
            StreamStalled: the broker nacked everything for ``stall_timeout_s``.
            ConnectionFailed: the connection was lost and not restored within the budget.
            MessagingError: another failure of the publisher, or it is closed.
        """
        io = self._require_open()
        properties = pika.BasicProperties(
            content_type=CONTENT_TYPE,
            delivery_mode=pika.DeliveryMode.Persistent if persistent else pika.DeliveryMode.Transient,
            headers={**self._schema_headers, **headers} if headers else self._schema_headers,
        )
        if self._shared.put(queue, body, properties, stop=stop):
            io.call_threadsafe(io.on_new_messages)

    def flush(self, timeout_s: float, *, stop: threading.Event | None = None) -> None:
        """Wait until every message published so far is confirmed by the broker.

        Raises:
            PublishTimeout: some were still unconfirmed after ``timeout_s``.
            StreamStopped: ``stop`` was set first.
            MessagingError: the publisher failed (see :meth:`publish`).
        """
        self._require_open()
        self._shared.wait_confirmed(timeout_s, stop=stop)

    @property
    def unconfirmed(self) -> int:
        """Messages published but not yet confirmed (including those waiting to be sent or resent)."""
        return self._shared.unconfirmed

    @property
    def nacks(self) -> int:
        """Messages the broker refused so far (each resend counts again): back-pressure felt."""
        return 0 if self._io is None else self._io.nacks

    @property
    def reconnects(self) -> int:
        return 0 if self._io is None else self._io.reconnects

    @property
    def channel_reopens(self) -> int:
        """Channels given up after nacks in a row (a quorum queue's channel stuck after a leader loss)."""
        return 0 if self._io is None else self._io.channel_reopens

    @property
    def node(self) -> str | None:
        """``host:port`` of the broker node the publisher is connected to; ``None`` while disconnected."""
        return None if self._io is None else self._io.node

    def _require_open(self) -> PublisherIO:
        if self._io is None or self._closed:
            raise ConnectionClosed(f"{self.role} publisher is {'closed' if self._closed else 'not open'}")
        return self._io
