"""ConfirmedPublisher on the real broker: order, window, back-pressure, failures, reconnects."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from messaging import (
    BrokerLink,
    ChannelError,
    ConfirmedPublisher,
    ConnectionFailed,
    Names,
    PublishRejected,
    QueueDecl,
    QueueNotFound,
    Settings,
    StreamStalled,
    StreamStopped,
    Subscription,
    stats,
)
from messaging.unconfirmed import NACKS_BEFORE_REOPEN
from tests import broker_admin

pytestmark = pytest.mark.rabbitmq


def _full_queue_decl(name: str, length: int) -> QueueDecl:
    return QueueDecl(name, arguments={"x-max-length": length, "x-overflow": "reject-publish"})


def _read_all(settings: Settings, queue: str, *, idle_s: float = 2.0) -> list[int]:
    """Every message body of ``queue`` as an int, in arrival order, until ``idle_s`` without one."""
    seen = []
    with BrokerLink(settings, "test-reader") as reader:
        sub = reader.subscribe(QueueDecl(queue), prefetch=200, declare=False)
        while (delivery := sub.get(idle_s)) is not None:
            seen.append(int(delivery.envelope.body))
            delivery.ack()
    return seen


def _publisher_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("warren-publisher-")]


@pytest.fixture
def opened(settings: Settings) -> Iterator[ConfirmedPublisher]:
    with ConfirmedPublisher(settings, "test-publisher", window=64) as publisher:
        yield publisher


def test_messages_arrive_in_publish_order(settings: Settings, opened: ConfirmedPublisher) -> None:
    # Given a queue and a publisher with a window of 64
    queue = f"{settings.prefix}.order"
    opened.declare(QueueDecl(queue))
    # When 5,000 messages are published and flushed
    for i in range(5000):
        opened.publish(queue, str(i).encode())
    opened.flush(30)
    # Then a reader gets every one once, in publish order
    assert _read_all(settings, queue) == list(range(5000))


def test_publish_does_not_wait_for_confirms_and_flush_waits_for_all(
    settings: Settings, opened: ConfirmedPublisher, link: BrokerLink
) -> None:
    queue = f"{settings.prefix}.flush"
    opened.declare(QueueDecl(queue))
    most_unconfirmed = 0
    for i in range(1000):
        opened.publish(queue, str(i).encode(), headers={"kind": "data"})
        most_unconfirmed = max(most_unconfirmed, opened.unconfirmed)
    # publish() returned with many messages in flight (a synchronous confirm allows one)...
    assert most_unconfirmed > 1
    assert most_unconfirmed <= 64
    # ...and after flush() none is left, every one stored
    opened.flush(30)
    assert opened.unconfirmed == 0
    assert link.queue_depth(queue) == 1000


def test_a_full_queue_blocks_publish_until_stopped_and_a_reader_then_gets_everything_once(
    settings: Settings,
) -> None:
    # Given a queue of 5 that refuses more, nobody reading, and a publisher with a window of 8
    queue = f"{settings.prefix}.full"
    published: list[int] = []
    outcome: list[BaseException] = []
    stop = threading.Event()
    with ConfirmedPublisher(settings, "test-full", window=8) as publisher:
        publisher.declare(_full_queue_decl(queue, 5))

        def publish_many() -> None:
            try:
                for i in range(100):
                    publisher.publish(queue, str(i).encode(), stop=stop)
                    published.append(i)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=publish_many)
        thread.start()
        # When the window is exhausted, publish blocks (5 stored, 8 refused and waiting)
        broker_admin.wait_until(lambda: len(published) == 13 and publisher.unconfirmed == 8, 10, "a full window")
        thread.join(0.5)
        assert thread.is_alive() and len(published) == 13
        # and stop turns the wait into StreamStopped, promptly
        stopped_at = time.monotonic()
        stop.set()
        thread.join(5)
        assert not thread.is_alive() and time.monotonic() - stopped_at < 2
        assert len(outcome) == 1 and isinstance(outcome[0], StreamStopped)
        assert publisher.nacks >= 8
        # Then, as a reader makes room, the refused ones go through; the stream ends with a
        # final message published after a flush, as readers of a nacked stream need
        got: list[int] = []
        with BrokerLink(settings, "test-full-reader") as reader_link:
            sub = reader_link.subscribe(QueueDecl(queue), prefetch=1, declare=False)
            reading = threading.Thread(target=lambda: got.extend(_drain(sub, until=999)))
            reading.start()
            publisher.flush(20)
            publisher.publish(queue, b"999")
            publisher.flush(20)
            reading.join(20)
    assert got[:5] == [0, 1, 2, 3, 4]  # stored before any nack: in order
    assert sorted(got[5:-1]) == list(range(5, 13))  # each refused one exactly once
    assert got[-1] == 999


def test_the_transport_counts_publishes_confirms_nacks_and_their_latency_for_metrics(settings: Settings) -> None:
    # Given counting on (as a role serving /metrics has it) and a queue of 3 that refuses more
    stats.enable()
    role = f"test-counted-{settings.prefix}"
    queue = f"{settings.prefix}.counted"
    with ConfirmedPublisher(settings, role, window=16) as publisher:
        publisher.declare(_full_queue_decl(queue, 3))
        # When 10 messages are published: 3 stored, the rest nacked until a reader makes room
        for i in range(10):
            publisher.publish(queue, str(i).encode())
        broker_admin.wait_until(lambda: publisher.nacks >= 7, 10, "the full queue's nacks")
        with BrokerLink(settings, "test-counted-reader") as reader_link:
            sub = reader_link.subscribe(QueueDecl(queue), prefetch=1, declare=False)
            reading = threading.Thread(target=lambda: _drain(sub, until=9))
            reading.start()
            publisher.flush(20)
            reading.join(20)
        nacks = publisher.nacks
    # Then the role's counters hold each message once, and every nack the broker sent
    counts = stats.snapshot()[role]
    assert (counts.published, counts.confirmed, counts.nacked, counts.reconnects) == (10, 10, nacks, 0)
    assert sum(counts.confirm_buckets) == 10
    # A nacked message is confirmed after at least one backoff: its latency counts from publish()
    assert counts.confirm_seconds > 7 * 0.001


def _drain(sub: Subscription, *, until: int) -> list[int]:
    """Bodies read one at a time (a slow reader making room), up to the one equal to ``until``."""
    got = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        delivery = sub.get(1.0)
        if delivery is None:
            continue
        got.append(int(delivery.envelope.body))
        delivery.ack()
        if got[-1] == until:
            break
    return got


def test_a_queue_nobody_reads_stalls_the_publisher(settings: Settings) -> None:
    queue = f"{settings.prefix}.stalled"
    with ConfirmedPublisher(settings, "test-stall", window=4, stall_timeout_s=1.0) as publisher:
        publisher.declare(_full_queue_decl(queue, 2))
        started = time.monotonic()
        with pytest.raises(StreamStalled, match=queue):
            for i in range(100):
                publisher.publish(queue, str(i).encode())
            publisher.flush(10)
        assert 1.0 <= time.monotonic() - started < 5
        # The failure sticks: nothing more is accepted
        with pytest.raises(StreamStalled):
            publisher.publish(queue, b"late")


def test_publishing_to_a_missing_queue_fails_with_queue_not_found(
    settings: Settings, opened: ConfirmedPublisher
) -> None:
    missing = f"{settings.prefix}.nobody-declared-this"
    opened.publish(missing, b"lost")
    with pytest.raises(QueueNotFound, match=missing):
        opened.flush(10)
    with pytest.raises(QueueNotFound):
        opened.publish(missing, b"again")


def test_declaring_an_existing_queue_with_other_arguments_is_a_channel_error(
    settings: Settings, opened: ConfirmedPublisher
) -> None:
    queue = f"{settings.prefix}.declared"
    opened.declare(_full_queue_decl(queue, 5))
    with pytest.raises(ChannelError, match="PRECONDITION_FAILED"):
        opened.declare(_full_queue_decl(queue, 6))
    # The refusal closed only the declaring channel: publishing goes on
    opened.publish(queue, b"1")
    opened.flush(10)


def test_a_connection_closed_by_the_broker_loses_nothing(
    settings: Settings, amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a publisher sending 3,000 messages
    queue = f"{settings.prefix}.cut"
    role = f"test-cut-{settings.prefix}"
    caplog.set_level(logging.WARNING)
    ours = f"warren-{role}@"
    stats.enable()  # the reconnect is counted for /metrics too
    with ConfirmedPublisher(settings, role, window=64) as publisher:
        publisher.declare(QueueDecl(queue))
        # (the management API lists a new connection after a few seconds)
        listed = lambda: any(n.startswith(ours) for n in broker_admin.connection_names(amqp_url))  # noqa: E731
        broker_admin.wait_until(listed, 20, "the publisher's connection in the management API")
        closed: list[int] = []
        closer = threading.Thread(
            target=lambda: closed.append(broker_admin.close_connections(amqp_url, lambda n: n.startswith(ours)))
        )
        for i in range(3000):
            publisher.publish(queue, str(i).encode())
            if i == 1000:
                # When the broker closes its connection in the middle, while messages are in flight
                closer.start()
        closer.join(20)
        assert closed == [1]
        # Then it reconnects, sends again what was unconfirmed, and ends with nothing unconfirmed
        publisher.flush(30)
        assert publisher.unconfirmed == 0
        assert publisher.reconnects == 1
    assert stats.snapshot()[role].reconnects == 1
    got = _read_all(settings, queue)
    assert set(got) == set(range(3000))  # none lost (duplicates allowed: at least once)
    first_seen = list(dict.fromkeys(got))
    assert first_seen == list(range(3000))  # resent in publish order
    # One warning per event, and none of pika's own error lines or tracebacks
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("messaging")]
    assert len([m for m in warnings if "lost its connection" in m]) == 1
    assert len([m for m in warnings if "reconnected" in m]) == 1
    assert [r.getMessage() for r in caplog.records if r.name.startswith("pika")] == []


class _Forwarder:
    """A TCP forwarder to the broker that a test can take down: a broker outage for one client
    only, without touching the shared broker."""

    def __init__(self, amqp_url: str) -> None:
        parts = urlsplit(amqp_url)
        self._target = (parts.hostname or "localhost", parts.port or 5672)
        self._server = socket.create_server(("127.0.0.1", 0))
        port = self._server.getsockname()[1]
        self.url = urlunsplit(parts._replace(netloc=f"{parts.username}:{parts.password}@127.0.0.1:{port}"))
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="test-forwarder", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # taken down
            upstream = socket.create_connection(self._target)
            self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, sink), name="test-forwarder", daemon=True).start()

    def take_down(self) -> None:
        """Refuse new connections and cut the open ones."""
        # shutdown() first: close() alone leaves a listener blocked in accept() listening
        self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        for sock in self._sockets:
            # shutdown() first: close() alone does not wake a thread blocked in recv() on the
            # socket, so the connection stayed up until a heartbeat noticed (once 17 s in CI).
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        sink.close()


def test_an_outage_longer_than_the_connect_budget_fails_the_publisher(
    settings: Settings, amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a publisher whose broker is reachable only through a forwarder, with a 2 s budget
    caplog.set_level(logging.WARNING)
    forwarder = _Forwarder(amqp_url)
    queue = f"{settings.prefix}.outage"
    with ConfirmedPublisher(settings.replace(amqp_url=forwarder.url, connect_timeout_s=2), "test-outage") as publisher:
        publisher.declare(QueueDecl(queue))
        publisher.publish(queue, b"1")
        publisher.flush(10)
        # When the broker becomes unreachable for good
        publisher.publish(queue, b"2")
        lost_at = time.monotonic()  # before: the publisher may notice the loss the moment it happens
        forwarder.take_down()
        # Then waiting for confirms ends with ConnectionFailed once the budget is spent
        with pytest.raises(ConnectionFailed, match="within 2 s"):
            publisher.flush(30)
        assert 2 <= time.monotonic() - lost_at < 2 + 3
        with pytest.raises(ConnectionFailed):
            publisher.publish(queue, b"3")
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("messaging")]
    assert len([m for m in warnings if "lost its connection" in m]) == 1
    assert [r.getMessage() for r in caplog.records if r.name.startswith("pika")] == []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_broker_that_is_not_there_fails_open_within_the_connect_timeout(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    nowhere = settings.replace(amqp_url=f"amqp://guest:guest@127.0.0.1:{_free_port()}/%2F", connect_timeout_s=2)
    publisher = ConfirmedPublisher(nowhere, "test-nowhere")
    started = time.monotonic()
    with pytest.raises(ConnectionFailed, match="within 2 s"):
        publisher.open()
    assert time.monotonic() - started < 2 + 3
    assert _publisher_threads() == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("pika")] == []


def test_refused_credentials_fail_open_at_once(settings: Settings) -> None:
    parts = urlsplit(settings.amqp_url)
    netloc = f"{parts.username}:not-the-password@{parts.hostname}:{parts.port or 5672}"
    wrong = urlunsplit(parts._replace(netloc=netloc))
    publisher = ConfirmedPublisher(settings.replace(amqp_url=wrong, connect_timeout_s=10), "test-refused")
    started = time.monotonic()
    with pytest.raises(ConnectionFailed, match="refused the credentials") as raised:
        publisher.open()
    assert time.monotonic() - started < 3  # not retried for the 10 s budget
    assert "not-the-password" not in str(raised.value)


def test_close_leaves_no_thread_behind(settings: Settings) -> None:
    queue = f"{settings.prefix}.threads"
    before = set(threading.enumerate())
    for round_ in range(3):
        with ConfirmedPublisher(settings, f"test-threads-{round_}") as publisher:
            publisher.declare(QueueDecl(queue))
            publisher.publish(queue, b"1")
            assert len(_publisher_threads()) == 1
    assert set(threading.enumerate()) - before == set()
    assert _publisher_threads() == []


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_nacks_in_a_row_reopen_the_channel_and_the_refused_messages_still_arrive_once(
    settings: Settings, link: BrokerLink, queue_type: str
) -> None:
    # Given a full queue of either type that refuses publishes (reject-publish: each one is
    # nacked), filled one confirmed message at a time (a quorum queue applies its limit
    # once a publish is in its log: a burst can end over the limit), and nobody reading
    queue = f"{settings.prefix}.nacked-{queue_type}"
    decl = Names("unused", queue_type).durable_decl(queue, {"x-max-length": 1, "x-overflow": "reject-publish"})
    link.declare(decl)
    filled = 0
    with pytest.raises(PublishRejected):
        while filled < 10:
            link.publish(queue, b"-1", persistent=True)
            filled += 1
    with ConfirmedPublisher(settings, "test-nacked", window=8) as publisher:
        publisher.declare(decl)
        # When a publisher sends 6 messages the broker nacks again and again
        for i in range(6):
            publisher.publish(queue, str(i).encode())
        # Then it reopens its channel after NACKS_BEFORE_REOPEN nacks in a row, more than once
        broker_admin.wait_until(lambda: publisher.channel_reopens >= 2, 30, "the channel reopened after nacks")
        assert publisher.nacks >= 2 * NACKS_BEFORE_REOPEN
        # and once a reader makes room, every message arrives, none twice
        got: list[int] = []
        with BrokerLink(settings, "test-nacked-reader") as reader_link:
            sub = reader_link.subscribe(QueueDecl(queue), prefetch=1, declare=False)
            reading = threading.Thread(target=lambda: got.extend(_drain(sub, until=5)))
            reading.start()
            publisher.flush(30)
            reading.join(30)  # _drain ends within 20 s
            sub.close()  # what it was sent but did not take goes back to the queue, for _read_all
            tail = _read_all(settings, queue, idle_s=1.0)
            reader_link.delete_queue(queue)
    assert filled >= 1
    assert sorted(n for n in got + tail if n >= 0) == list(range(6))


def test_a_link_reopens_its_confirm_channel_after_nacks_in_a_row_before_giving_up(
    settings: Settings, link: BrokerLink
) -> None:
    # Given a full queue that nacks every publish
    queue = f"{settings.prefix}.link-nacked"
    link.declare(_full_queue_decl(queue, 1))
    link.publish(queue, b"0", persistent=True)
    # When a confirmed publish is refused
    with pytest.raises(PublishRejected):
        link.publish(queue, b"1", persistent=True)
    # Then the link sent it NACKS_BEFORE_REOPEN times, reopened its channel and sent it once more
    assert link.channel_reopens == 1
    # and once there is room again, the same link publishes on its new channel
    link.delete_queue(queue)
    link.declare(_full_queue_decl(queue, 1))
    link.publish(queue, b"2", persistent=True)
    assert link.queue_depth(queue) == 1
