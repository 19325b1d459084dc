"""RPC server: consume queues, run handlers off the connection's thread, reply, then ack.

Threads:

* the **I/O thread** owns the consuming connection. It only moves messages: it hands
  each delivery to the handler threads and settles (acks/nacks) what they finished, so
  heartbeats keep flowing however long a handler runs. The one exception is a queue's
  ``quick`` handler (:meth:`RpcServer.add_queue`), which answers requests that take
  microseconds (``resource``) right there, without the two thread hand-offs;
* **handler threads** (``threads`` of them) decode and dispatch to the queue's handler,
  then hand the reply back to the I/O thread, which publishes it and only then acks the
  request. A handler thread waits for that only when its handler asked to know whether
  the reply arrived (a :class:`Reply` with callbacks: that reply is publisher-confirmed
  first); otherwise it takes the next job at once.

A request is acked after its reply was handed to the broker (and confirmed, for a
:class:`Reply` with callbacks); if the process dies before, the broker redelivers it
(at-least-once: handlers must tolerate a repeat). A request that cannot be decoded, has
the wrong content type or no ``reply_to`` is dead-lettered, and answered with an error
when it has a ``reply_to``.

It is one piece, over 400 lines: the I/O thread and the handler threads hand each request
to each other (a job out, its reply and ack back), and the hand-off's bookkeeping (jobs in
flight, paused queues, consumers) is the state both sides of it read.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from messaging import replies
from messaging.codec import CONTENT_TYPE, SCHEMA_VERSION, decode, encode
from messaging.errors import (
    BrokerConnectionError,
    DecodeError,
    EncodeError,
    MessagingError,
    QueueNotFound,
    RequestRefused,
)
from messaging.link import BrokerLink
from messaging.settings import Settings
from messaging.subscription import Delivery, Envelope, Subscription
from messaging.topology import QueueDecl

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    """A decoded request as a handler sees it."""

    body: Any
    envelope: Envelope
    link: BrokerLink
    """The handler thread's own broker link, for any broker work the handler does itself."""


@dataclass
class Reply:
    """What a handler returns when it must know whether its reply reached the caller.

    ``on_sent`` runs after the broker confirmed the reply; ``on_failed`` when it could not be
    delivered (the caller's reply queue is gone, or the connection died). Both run on the
    handler thread, with the handler thread's link usable.
    """

    result: dict[str, Any]
    on_sent: Callable[[], None] | None = None
    on_failed: Callable[[], None] | None = None


Handler = Callable[[Request], "dict[str, Any] | Reply"]

QuickHandler = Callable[[Any], "dict[str, Any] | None"]
"""Answers a decoded request body on the I/O thread, or returns ``None`` to leave it to the handler."""

#: Requests larger than this are never decoded on the I/O thread for a quick handler.
_QUICK_MAX_BYTES = 4096


@dataclass
class _Consumer:
    decl: QueueDecl
    handler: Handler
    prefetch: int
    declare: bool
    quick: QuickHandler | None = None
    subscription: Subscription | None = None
    paused: bool = False


@dataclass
class _Job:
    delivery: Delivery
    handler: Handler
    handed_back: bool = False
    """Set by the handler thread once the job's settle op is queued: the I/O thread finishes it."""


class RpcServer:
    """Serves handlers on queues; see the module docstring for the threading model.

    Args:
        settings: transport settings.
        role: connection name prefix in the management UI.
        threads: handler threads, i.e. how many requests run at the same time.
    """

    def __init__(self, settings: Settings, role: str, *, threads: int = 2) -> None:
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.settings = settings
        self.role = role
        self._consumers: dict[str, _Consumer] = {}
        self._ops: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._io_link: BrokerLink | None = None
        self._io_thread: threading.Thread | None = None
        self._handler_threads = [
            threading.Thread(target=self._handler_loop, name=f"{role}-handler-{i}", daemon=True) for i in range(threads)
        ]
        self._in_flight = 0
        self._stop_timeout_s = 30.0
        self._in_flight_lock = threading.Lock()
        self.error: BaseException | None = None

    # -- configuration (thread-safe) ------------------------------------------------

    def add_queue(
        self,
        decl: QueueDecl,
        handler: Handler,
        *,
        prefetch: int = 1,
        declare: bool = True,
        quick: QuickHandler | None = None,
    ) -> None:
        """Serve ``handler`` on ``decl.name``; may be called before or after :meth:`start`.

        ``quick`` answers the requests it can right on the I/O thread, saving the two thread
        hand-offs of a handler thread (most of a cheap request's time in the worker): it
        gets the decoded body of every small, well-formed request and returns the result, or
        ``None`` to leave the request to ``handler`` (an exception does the same). It must
        return within microseconds: no blocking, no lock that slow code holds, no broker
        work. Its reply is not confirmed; the request is acked after it, as for every reply.
        """
        consumer = _Consumer(decl, handler, prefetch, declare, quick)
        self._submit_op(lambda: self._add(consumer))

    def remove_queue(self, name: str) -> None:
        """Stop consuming ``name``; its unstarted messages go back to the queue."""
        self._submit_op(lambda: self._remove(name))

    def pause(self, name: str) -> None:
        """Stop taking messages from ``name`` until :meth:`resume` (e.g. while busy).

        Ops are applied in order with acks: a pause requested by a handler takes effect
        before that handler's request is acked, so no second message slips in.
        """
        self._submit_op(lambda: self._set_paused(name, True))

    def resume(self, name: str) -> None:
        """Take messages from ``name`` again."""
        self._submit_op(lambda: self._set_paused(name, False))

    # -- lifecycle ------------------------------------------------------------------

    def start(self, *, wait_s: float | None = None) -> None:
        """Start the I/O and handler threads; with ``wait_s``, wait until consuming.

        Raises:
            MessagingError: the server could not connect within ``wait_s``.
        """
        self._io_thread = threading.Thread(target=self._io_loop, name=f"{self.role}-io", daemon=True)
        self._io_thread.start()
        for thread in self._handler_threads:
            thread.start()
        # _started is set once consuming, or once the I/O thread gave up: a connection that
        # failed for good ends the wait at once instead of after wait_s.
        if wait_s is not None and (not self._started.wait(wait_s) or self.error is not None):
            raise (
                self.error
                if isinstance(self.error, MessagingError)
                else MessagingError(f"{self.role} server did not start consuming within {wait_s} s")
            )

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop consuming, let running handlers finish (up to ``timeout_s``), settle, close.

        Requests not yet started go back to their queue; a handler still running after the
        timeout leaves its request unacked, so the broker redelivers it.
        """
        self._stop_timeout_s = timeout_s
        self._stopping.set()
        self._wake()
        if self._io_thread is not None:
            self._io_thread.join(timeout_s + 5.0)

    def join(self, timeout_s: float | None = None) -> None:
        if self._io_thread is not None:
            self._io_thread.join(timeout_s)

    @property
    def reconnects(self) -> int:
        """How often the consuming connection was re-established (0 while it never dropped)."""
        return self._io_link.reconnects if self._io_link is not None else 0

    @property
    def node(self) -> str | None:
        """``host:port`` of the broker node the consuming connection is on; ``None`` while disconnected.

        With several nodes in ``WARREN_AMQP_URL``: which one this server's consumers (and
        so its deliveries and its replies) depend on.
        """
        return self._io_link.node if self._io_link is not None else None

    @property
    def running(self) -> bool:
        return self._io_thread is not None and self._io_thread.is_alive()

    # -- I/O thread -------------------------------------------------------------------

    def _io_loop(self) -> None:
        link = BrokerLink(self.settings, self.role)
        self._io_link = link
        try:
            link.open()
            self._started.set()
            while not self._stopping.is_set():
                try:
                    self._run_ops()
                    link.process_events(0.5)
                    self._dispatch()
                except BrokerConnectionError as exc:
                    # Outages longer than one reconnect budget: keep trying until stopped.
                    logger.error("%s server lost the broker (%s); retrying", self.role, exc.message)
                    self._stopping.wait(2.0)
            self._shutdown(link)
        except BaseException as exc:  # the outermost boundary: log, record, let stop() return
            self.error = exc
            # A broker that cannot be reached is an outage, fully told by its message (the
            # traceback only at DEBUG); any other error here is a bug, and needs its traceback.
            if isinstance(exc, BrokerConnectionError):
                debug = logger.isEnabledFor(logging.DEBUG)
                logger.critical("%s server stopped: %s", self.role, exc.message, exc_info=debug)
            else:
                logger.critical("%s server stopped on an error: %r", self.role, exc, exc_info=True)
        finally:
            self._started.set()
            for _ in self._handler_threads:
                self._jobs.put(None)
            link.close()

    def _shutdown(self, link: BrokerLink) -> None:
        # Stop intake first, so no new message arrives while in-flight work drains; the
        # channels stay open until the end so the in-flight requests can still be acked.
        for consumer in self._consumers.values():
            if consumer.subscription is not None:
                consumer.subscription.pause()
        while True:  # requests not started yet go back to their queue
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.delivery.nack(requeue=True)
                with self._in_flight_lock:
                    self._in_flight -= 1  # counted at dispatch; no handler will finish it
        deadline = time.monotonic() + self._stop_timeout_s
        self._run_ops()  # settle ops finish their jobs: run them before each look at the count
        while self._busy() and time.monotonic() < deadline:
            link.process_events(0.2)
            self._run_ops()
        for consumer in self._consumers.values():
            self._unsubscribe(consumer)

    def _busy(self) -> bool:
        with self._in_flight_lock:
            return self._in_flight > 0

    def _dispatch(self) -> None:
        for consumer in list(self._consumers.values()):
            sub = consumer.subscription
            # Only what process_events already received: polling again here could run a
            # wake-up meant for the next loop turn and leave an op waiting a whole turn.
            for delivery in sub.take_buffered() if sub is not None else []:
                if consumer.quick is not None and self._answer_quick(consumer.quick, delivery):
                    continue
                with self._in_flight_lock:
                    self._in_flight += 1
                self._jobs.put(_Job(delivery, consumer.handler))

    def _answer_quick(self, quick: QuickHandler, delivery: Delivery) -> bool:
        envelope = delivery.envelope
        if len(envelope.body) > _QUICK_MAX_BYTES or _envelope_problem(envelope) is not None:
            return False
        try:
            result = quick(decode(envelope.body))
            body = None if result is None else encode(replies.ok(result), max_bytes=self.settings.max_message_bytes)
        except Exception:  # the handler thread runs it again, and refuses or reports it properly
            logger.debug("quick handler passed on request %s", envelope.correlation_id, exc_info=True)
            return False
        if body is None:
            return False
        self._publish_reply(envelope, body, confirm=False)
        delivery.ack()
        return True

    def _run_ops(self) -> None:
        while True:
            try:
                op = self._ops.get_nowait()
            except queue.Empty:
                return
            op()

    def _submit_op(self, op: Callable[[], None]) -> None:
        self._ops.put(op)
        self._wake()

    def _wake(self) -> None:
        link = self._io_link
        if link is None:
            return
        # When disconnected, the loop runs its ops once reconnected.
        with contextlib.suppress(BrokerConnectionError):
            link.call_threadsafe(lambda: None)

    def _add(self, consumer: _Consumer) -> None:
        self._consumers[consumer.decl.name] = consumer
        self._subscribe(consumer)

    def _remove(self, name: str) -> None:
        consumer = self._consumers.pop(name, None)
        if consumer is not None:
            self._unsubscribe(consumer)

    def _set_paused(self, name: str, paused: bool) -> None:
        consumer = self._consumers.get(name)
        if consumer is None or consumer.paused == paused:
            return
        consumer.paused = paused
        sub = consumer.subscription
        if sub is None:
            self._subscribe(consumer)
        elif paused:
            sub.pause()
        else:
            sub.resume()
        logger.info("%s %s consuming %s", self.role, "paused" if paused else "resumed", name)

    def _subscribe(self, consumer: _Consumer) -> None:
        if consumer.subscription is not None or self._io_link is None:
            return
        consumer.subscription = self._io_link.subscribe(
            consumer.decl, prefetch=consumer.prefetch, declare=consumer.declare
        )
        if consumer.paused:
            consumer.subscription.pause()

    def _unsubscribe(self, consumer: _Consumer) -> None:
        sub, consumer.subscription = consumer.subscription, None
        if sub is not None:
            sub.close()

    # -- handler threads ----------------------------------------------------------

    def _handler_loop(self) -> None:
        # Opened only if a handler uses request.link (connects lazily on first use).
        link = BrokerLink(self.settings, f"{self.role}-handler")
        idle_s = max(1.0, self.settings.heartbeat_s / 3)
        try:
            while True:
                try:
                    job = self._jobs.get(timeout=idle_s)
                except queue.Empty:
                    self._keep_alive(link)
                    continue
                if job is None:
                    return
                try:
                    self._handle(link, job)
                finally:
                    if not job.handed_back:  # _handle failed before queueing the settle op
                        self._job_done()
                        self._wake()
        finally:
            link.close()

    def _job_done(self) -> None:
        with self._in_flight_lock:
            self._in_flight -= 1

    def _keep_alive(self, link: BrokerLink) -> None:
        # An idle handler connection still owes the broker heartbeats.
        if link.is_open:
            try:
                link.process_events(0.0)
            except BrokerConnectionError:
                logger.debug("idle handler link dropped", exc_info=True)

    def _handle(self, link: BrokerLink, job: _Job) -> None:
        envelope = job.delivery.envelope
        problem = _envelope_problem(envelope)
        body: Any = None
        if problem is None:
            try:
                body = decode(envelope.body, max_bytes=self.settings.max_message_bytes)
            except DecodeError as exc:
                problem = f"undecodable request: {exc.message}"
        if problem is not None:
            logger.warning("dead-lettering a request from %s: %s", envelope.queue, problem)
            self._finish(job, replies.error(problem, {"message": "bad request"}), ack=False)
            return
        reply = self._run_handler(job.handler, Request(body, envelope, link))
        if reply.on_sent is None and reply.on_failed is None:
            # Nobody needs the outcome: hand the reply over and take the next job at once.
            self._finish(job, reply.result, ack=True)
            return
        sent = self._finish(job, reply.result, ack=True, confirm=True, wait=True)
        callback = reply.on_sent if sent else reply.on_failed
        if callback is not None:
            try:
                callback()
            except Exception:
                logger.exception("reply callback failed (correlation_id %s)", envelope.correlation_id)

    def _run_handler(self, handler: Handler, request: Request) -> Reply:
        corr = request.envelope.correlation_id
        try:
            result = handler(request)
        except RequestRefused as exc:
            logger.info("task refused (correlation_id %s): %s", corr, exc.message)
            return Reply(replies.error(exc.message, exc.result))
        except Exception as exc:  # a handler bug must not take the worker down
            logger.exception("handler failed (correlation_id %s)", corr)
            message = f"internal error: {type(exc).__name__}: {exc}"
            return Reply(replies.error(message, {"message": "internal error"}))
        if isinstance(result, Reply):
            return Reply(replies.ok(result.result), result.on_sent, result.on_failed)
        return Reply(replies.ok(result))

    def _finish(
        self, job: _Job, reply: dict[str, Any], *, ack: bool, confirm: bool = False, wait: bool = False
    ) -> bool:
        """Have the I/O thread publish ``reply`` (when there is a reply_to), then settle.

        Replies go out on the consuming connection, which keeps its heartbeats however long
        the handler ran; the request is acked after its reply was written to that connection.
        A reply is confirmed by the broker before the request is acked only when ``confirm``
        (a handler that must know whether its reply arrived); otherwise a lost reply is the
        caller's timeout, like a lost request. With ``wait``, returns whether the reply was
        published (and, with ``confirm``, confirmed); without, returns at once (``False``):
        the job then counts as running until the I/O thread settled it.
        """
        delivery = job.delivery
        envelope = delivery.envelope
        try:
            body = encode(reply, max_bytes=self.settings.max_message_bytes)
        except EncodeError as exc:
            logger.error("reply cannot be encoded (correlation_id %s): %s", envelope.correlation_id, exc)
            body = encode(replies.error(f"reply cannot be encoded: {exc.message}"))
        done = threading.Event()
        outcome: list[bool] = [False]

        def on_io_thread() -> None:
            try:
                if envelope.reply_to:
                    outcome[0] = self._publish_reply(envelope, body, confirm=confirm)
                if ack:
                    delivery.ack()
                else:
                    delivery.nack(requeue=False)
            finally:
                self._job_done()
                done.set()

        job.handed_back = True
        self._submit_op(on_io_thread)
        if not wait:
            return False
        if not done.wait(self.settings.connect_timeout_s + 30.0):
            logger.warning("reply to %s not settled in time", envelope.reply_to)
        return outcome[0]

    def _publish_reply(self, envelope: Envelope, body: bytes, *, confirm: bool) -> bool:
        assert envelope.reply_to is not None and self._io_link is not None
        try:
            self._io_link.publish(envelope.reply_to, body, correlation_id=envelope.correlation_id, confirm=confirm)
        except QueueNotFound:
            logger.warning("reply queue %s is gone; the caller will not get its reply", envelope.reply_to)
            return False
        except MessagingError as exc:
            logger.warning("reply to %s could not be published: %s", envelope.reply_to, exc)
            return False
        return True


def _envelope_problem(envelope: Envelope) -> str | None:
    if not envelope.reply_to:
        return "request has no reply_to"
    if not envelope.correlation_id:
        return "request has no correlation_id"
    if envelope.content_type not in (None, "", CONTENT_TYPE):
        return f"request content_type is {envelope.content_type!r}, expected {CONTENT_TYPE!r}"
    schema = envelope.headers.get("schema")
    if schema is not None and schema != SCHEMA_VERSION:
        return f"unsupported schema version {schema!r}"
    return None
