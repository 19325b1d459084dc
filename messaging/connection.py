"""Opening connections to RabbitMQ: parameters, identity, TLS and the connect retry."""

from __future__ import annotations

import logging
import os
import random
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingConnection

from messaging.errors import (
    ChannelError,
    ConfigurationError,
    ConnectionClosed,
    ConnectionFailed,
    MessagingError,
    PublishRejected,
    QueueLocked,
    QueueNotFound,
    QueueTypeMismatch,
)
from messaging.retry import connect_retrying
from messaging.settings import Settings, redact_url

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


class _ExpectedOutcomes(logging.Filter):
    """Drop pika's warnings for nacks and returns: warren turns them into its own errors
    (a full metadata queue nacks on purpose, for back-pressure), so they are not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not message.startswith(("Message was Nack'ed", "Published message was returned"))


class _ExpectedChannelCloses(logging.Filter):
    """Drop pika's warnings for 404/405 channel closes: warren probes queues passively on
    purpose (does a worker's control queue still exist?) and reads the answer from them."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("Received remote Channel.Close (404)" in text or "Received remote Channel.Close (405)" in text)


_thread_state = threading.local()


class _EventsWarrenReports(logging.Filter):
    """Keep pika's own failure reports out of the log: warren reports each connection event once.

    pika logs one refused connect or lost socket up to seven times, at ERROR and with
    tracebacks, and then raises; warren turns what it raises into one line of its own
    (``link lost ...; reconnecting``, ``cannot reach the broker ...``, a
    ``ConnectionFailed``). So pika's ERROR records are dropped on every thread, and its
    warnings too on threads that report their connection's events themselves (a
    publisher's I/O thread, which is handed pika's errors as values, not raised ones).
    With ``messaging`` at DEBUG (``--verbose``) those records stay visible, as DEBUG,
    tracebacks included: the detail behind a warren line when it is needed.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        threshold = logging.WARNING if getattr(_thread_state, "reports_own_events", False) else logging.ERROR
        if record.levelno < threshold:
            return True
        if not logging.getLogger("messaging").isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def report_connection_events_here() -> None:
    """Mark the calling thread as the one that reports its connection's events (see above)."""
    _thread_state.reports_own_events = True


logging.getLogger("pika.adapters.blocking_connection").addFilter(_ExpectedOutcomes())
logging.getLogger("pika.channel").addFilter(_ExpectedChannelCloses())
# A logger's filters do not see its children's records: give every pika module logger the filter.
for _name in [n for n in logging.root.manager.loggerDict if n == "pika" or n.startswith("pika.")]:
    logging.getLogger(_name).addFilter(_EventsWarrenReports())

#: pika errors after which retrying the same connect cannot help.
_FATAL_CONNECT_ERRORS = (
    pika.exceptions.ProbableAuthenticationError,
    pika.exceptions.ProbableAccessDeniedError,
    pika.exceptions.AuthenticationError,
)


def connection_name(role: str) -> str:
    """Name shown in the management UI's Connections tab: role, host and pid."""
    return f"warren-{role}@{socket.gethostname()}:{os.getpid()}"


def node_address(url: str) -> str:
    """``host:port`` of an AMQP URL: how logs, errors and ``node`` properties name a broker node."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    default = 5671 if parts.scheme == "amqps" else 5672
    return f"{parts.hostname or 'localhost'}:{port or default}"


#: This process's draw of a first node, per length of a URL list (see :func:`first_node`).
_first_nodes: dict[int, int] = {}
_first_nodes_lock = threading.Lock()


def first_node(settings: Settings) -> int:
    """Index of the node of ``settings.amqp_urls`` this process's connections try first.

    ``amqp_node_order=random``: one node drawn at random, once per process, so every
    connection a process opens starts on the same node (a collector's queues and its
    connections share a node, and a node's loss takes down whole processes, not a piece of
    each) while the processes of a deployment spread over the nodes. ``given``: the first.
    """
    count = len(settings.amqp_urls)
    if settings.amqp_node_order == "given" or count < 2:
        return 0
    with _first_nodes_lock:
        if count not in _first_nodes:
            _first_nodes[count] = random.SystemRandom().randrange(count)
        return _first_nodes[count]


def failover_order(items: Sequence[_T], lost: int | None, first: int = 0) -> list[_T]:
    """``items`` in the order to try them: from ``items[first]`` on, round the list; after
    losing ``items[lost]``, starting with the one after it and ending with it (a node that
    just failed is the least likely to answer)."""
    if not items:
        return []
    start = (lost + 1) % len(items) if lost is not None else first % len(items)
    return [*items[start:], *items[:start]]


def parameters(settings: Settings, role: str, url: str | None = None) -> pika.URLParameters:
    """pika parameters with warren's heartbeat, blocked timeout, TLS and client name.

    Args:
        url: one of ``settings.amqp_urls`` (default: the first).
    """
    url = settings.amqp_urls[0] if url is None else url
    params = pika.URLParameters(url)
    params.heartbeat = settings.heartbeat_s
    params.blocked_connection_timeout = settings.blocked_connection_timeout_s
    params.connection_attempts = 1  # retries are ours (tenacity), with jitter and a budget
    params.socket_timeout = 10.0
    params.client_properties = {
        "connection_name": connection_name(role),
        "product": "warren",
        "warren_role": role,
    }
    if url.startswith("amqps://"):
        try:
            context = ssl.create_default_context(cafile=settings.amqp_ca_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(
                f"amqp_ca_file {settings.amqp_ca_file!r} is not a usable CA bundle: {exc}"
            ) from None
        params.ssl_options = pika.SSLOptions(context, server_hostname=params.host)
    return params


@dataclass(frozen=True)
class BrokerAddress:
    """One broker node of the settings' URL list: its position, ``host:port`` and pika parameters."""

    index: int
    node: str
    params: pika.URLParameters


def broker_addresses(settings: Settings, role: str) -> list[BrokerAddress]:
    """Every node of ``settings.amqp_url``, in the order given.

    Raises:
        ConfigurationError: a URL pika cannot parse, or an unusable CA bundle.
    """
    addresses = []
    for index, url in enumerate(settings.amqp_urls):
        try:
            params = parameters(settings, role, url)
        except ValueError as exc:  # pika's URL parsing
            raise ConfigurationError(f"amqp_url {redact_url(url)} cannot be used: {exc}") from None
        addresses.append(BrokerAddress(index, node_address(url), params))
    return addresses


@dataclass(frozen=True)
class Connected:
    """A new blocking connection and the node it reached."""

    connection: BlockingConnection
    address: BrokerAddress

    @property
    def node(self) -> str:
        return self.address.node


def connect(settings: Settings, role: str, *, timeout_s: float | None = None) -> BlockingConnection:
    """Open a blocking connection to the first node that answers (see :func:`open_connection`)."""
    return open_connection(settings, role, timeout_s=timeout_s).connection


def open_connection(
    settings: Settings, role: str, *, timeout_s: float | None = None, lost: int | None = None
) -> Connected:
    """Open a blocking connection, retrying with jittered backoff for ``timeout_s``.

    Each attempt tries every node of ``settings.amqp_url`` in turn (:func:`failover_order`:
    from this process's :func:`first_node`; after losing node ``lost``, the next one
    first), so a dead node costs one refused
    connect, and the backoff only starts once no node answered.

    Raises:
        ConnectionFailed: no node accepted a connection in time, or the broker refused the
            credentials; the message names the URLs with their passwords hidden.
    """
    budget = settings.connect_timeout_s if timeout_s is None else timeout_s
    addresses = broker_addresses(settings, role)
    started = time.monotonic()
    attempts = 0

    def attempt() -> Connected:
        nonlocal attempts
        attempts += 1
        error: BaseException | None = None
        for address in failover_order(addresses, lost, first_node(settings)):
            try:
                return Connected(BlockingConnection(address.params), address)
            except (pika.exceptions.AMQPError, OSError) as exc:
                if not is_retryable_connect_error(exc):
                    raise  # a refusal of the credentials: every node shares them
                logger.debug("%s: node %s did not answer: %s", role, address.node, failure_reason(exc))
                error = exc
        assert error is not None
        raise error

    def retrying(attempt_number: int, error: BaseException, wait_s: float) -> None:
        # One warning per outage (the first failed attempt); the attempts after it only at DEBUG.
        level = logging.WARNING if attempt_number == 1 else logging.DEBUG
        logger.log(
            level,
            "%s: cannot reach the broker at %s (%s); retrying for up to %g s (attempt %d, next in %.1f s)",
            role,
            settings.redacted_url,
            failure_reason(error),
            budget,
            attempt_number,
            wait_s,
        )

    try:
        connected: Connected = connect_retrying(
            timeout_s=budget, retry_if=is_retryable_connect_error, on_retry=retrying
        )(attempt)
    except _FATAL_CONNECT_ERRORS as exc:
        if is_retryable_connect_error(exc):  # the retry budget ran out on cut handshakes
            raise ConnectionFailed(
                f"could not connect to {settings.redacted_url} within {budget:g} s: {exc!r}"
            ) from None
        raise ConnectionFailed(f"broker at {settings.redacted_url} refused the credentials or vhost: {exc!r}") from None
    except (pika.exceptions.AMQPError, OSError) as exc:
        elapsed = time.monotonic() - started
        raise ConnectionFailed(
            f"could not connect to {settings.redacted_url} after {attempts} attempts in {elapsed:.1f} s: "
            f"{failure_reason(exc)}"
        ) from None
    return connected


def failure_reason(exc: BaseException) -> str:
    """What went wrong, from the innermost error pika wraps (a refused socket is two levels down)."""
    for _ in range(5):
        inner = getattr(exc, "exception", None)
        if not isinstance(inner, BaseException) and exc.args and isinstance(exc.args[0], BaseException):
            inner = exc.args[0]
        if not isinstance(inner, BaseException):
            break
        exc = inner
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_retryable_connect_error(exc: BaseException) -> bool:
    """Whether a failed connection attempt is worth another try (an outage, not a refusal)."""
    if not isinstance(exc, (pika.exceptions.AMQPConnectionError, OSError)):
        return False
    if isinstance(exc, _FATAL_CONNECT_ERRORS):
        # pika says "probable" auth/vhost error whenever the socket closes during the
        # handshake, which also happens while a broker shuts down or boots. Only an explicit
        # refusal from the broker is final; a cut handshake is retried like any outage.
        return not any(word in str(exc) for word in ("ACCESS_REFUSED", "NOT_ALLOWED", "access to vhost"))
    return True


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Translate pika's exceptions raised inside the block into warren's tree."""
    try:
        yield
    except (pika.exceptions.AMQPError, OSError) as exc:
        raise translate(exc, what) from None


def translate(exc: BaseException, what: str) -> MessagingError:
    """The warren error for a pika (or socket) exception; ``what`` says what was being done.

    For callers that receive pika's exceptions as values (the callbacks of an
    asynchronous connection) rather than as raised errors.
    """
    if isinstance(exc, pika.exceptions.UnroutableError):
        return QueueNotFound(f"{what}: no queue to route to (it does not exist)")
    if isinstance(exc, pika.exceptions.NackError):
        return PublishRejected(f"{what}: the broker rejected the message (queue full or resource alarm)")
    if isinstance(exc, pika.exceptions.ChannelClosedByBroker):
        if exc.reply_code == 404:
            return QueueNotFound(f"{what}: {exc.reply_text}")
        if exc.reply_code == 405:
            return QueueLocked(f"{what}: {exc.reply_text}")
        if exc.reply_code == 406 and "x-queue-type" in str(exc.reply_text):
            return QueueTypeMismatch(
                f"{what}: the queue exists with another queue type ({exc.reply_text}). Every process of a "
                "deployment must use the same WARREN_QUEUE_TYPE (--queue-type), and a queue cannot change "
                "type: delete it, or use another WARREN_PREFIX, to switch"
            )
        if exc.reply_code == 406 and "x-queue-leader-locator" in str(exc.reply_text):
            return QueueTypeMismatch(
                f"{what}: the quorum queue exists without warren's leader placement ({exc.reply_text}): it was "
                "declared by an older warren. Delete it, or use another WARREN_PREFIX"
            )
        return ChannelError(f"{what}: channel closed by broker ({exc.reply_code} {exc.reply_text})")
    if isinstance(
        exc,
        (
            pika.exceptions.AMQPConnectionError,
            pika.exceptions.ChannelWrongStateError,
            pika.exceptions.ChannelClosed,
            OSError,
        ),
    ):
        return ConnectionClosed(f"{what}: connection lost ({exc!r})")
    if isinstance(exc, pika.exceptions.AMQPChannelError):
        return ChannelError(f"{what}: {exc!r}")
    return MessagingError(f"{what}: {exc!r}")
