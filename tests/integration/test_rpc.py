"""RPC over the real broker: replies, errors, timeouts, routing failures, long handlers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from messaging import (
    BrokerLink,
    Names,
    QueueNotFound,
    RemoteError,
    Request,
    RequestRefused,
    RpcClient,
    RpcServer,
    RpcTimeout,
    Settings,
    encode,
)
from tests import broker_admin

pytestmark = pytest.mark.rabbitmq


def echo_handler(request: Request) -> dict[str, Any]:
    body = request.body
    if body.get("name") == "refuse":
        raise RequestRefused("refused on purpose", {"message": "task name error"})
    if body.get("name") == "crash":
        raise RuntimeError("handler bug")
    if body.get("name") == "sleep":
        time.sleep(float(body["seconds"]))
    return {"echo": body, "redelivered": request.envelope.redelivered}


@pytest.fixture
def server(settings: Settings) -> Iterator[RpcServer]:
    names = Names(settings.prefix)
    srv = RpcServer(settings, "test-server", threads=2)
    srv.add_queue(names.collector_tasks_decl(), echo_handler)
    srv.start(wait_s=10)
    yield srv
    srv.stop(5)
    assert srv.error is None


@pytest.fixture
def client(settings: Settings, server: RpcServer) -> Iterator[RpcClient]:
    with RpcClient(settings, "test-client") as rpc:
        yield rpc


def test_call_returns_the_handlers_result(client: RpcClient, settings: Settings) -> None:
    # Given a server echoing requests, when we call it, then the reply carries our body.
    queue = Names(settings.prefix).collector_tasks
    for i in range(20):
        assert client.call(queue, {"name": "x", "i": i})["echo"] == {"name": "x", "i": i}


def test_task_error_becomes_a_structured_error_reply(client: RpcClient, settings: Settings) -> None:
    with pytest.raises(RemoteError) as info:
        client.call(Names(settings.prefix).collector_tasks, {"name": "refuse"})
    assert info.value.message == "refused on purpose"
    assert info.value.result == {"message": "task name error"}


def test_handler_crash_is_an_error_reply_and_the_server_keeps_serving(client: RpcClient, settings: Settings) -> None:
    queue = Names(settings.prefix).collector_tasks
    with pytest.raises(RemoteError, match="internal error: RuntimeError"):
        client.call(queue, {"name": "crash"})
    assert client.call(queue, {"name": "after"})["echo"]["name"] == "after"


def test_a_quick_handler_answers_on_the_io_thread_and_leaves_the_rest_to_the_handler(
    settings: Settings, link: BrokerLink
) -> None:
    # Given a server whose quick handler takes "quick", passes on the rest and has a bug
    queue = Names(settings.prefix).collector_tasks
    answered_on: list[str] = []

    def quick(body: Any) -> dict[str, Any] | None:
        if body.get("name") == "quick-bug":
            raise RuntimeError("quick handler bug")
        if body.get("name") != "quick":
            return None
        answered_on.append(threading.current_thread().name)
        return {"quick": True}

    srv = RpcServer(settings, "quick-server")
    srv.add_queue(Names(settings.prefix).collector_tasks_decl(), echo_handler, quick=quick)
    srv.start(wait_s=10)
    try:
        with RpcClient(settings, "test-client") as client:
            # When we call it with each kind of request
            assert client.call(queue, {"name": "quick"}) == {"quick": True}
            assert client.call(queue, {"name": "slow"})["echo"] == {"name": "slow"}
            assert client.call(queue, {"name": "quick-bug"})["echo"] == {"name": "quick-bug"}
    finally:
        srv.stop(5)
    # Then only "quick" was answered by the I/O thread, and every request was acked (an
    # unacked one would be back in the queue now that the server is gone)
    assert answered_on == ["quick-server-io"]
    assert link.queue_depth(queue) == 0
    assert srv.error is None


def test_call_to_a_missing_queue_fails_at_once(client: RpcClient, settings: Settings) -> None:
    started = time.monotonic()
    with pytest.raises(QueueNotFound):
        client.call(f"{settings.prefix}.nobody-serves-this", {"name": "x"}, timeout_s=10)
    assert time.monotonic() - started < 5


def test_timeout_then_late_reply_is_dropped(client: RpcClient, settings: Settings) -> None:
    queue = Names(settings.prefix).collector_tasks
    with pytest.raises(RpcTimeout):
        client.call(queue, {"name": "sleep", "seconds": 1.0}, timeout_s=0.3)
    # The late reply arrives while we wait for the next call and must not be taken for it.
    assert client.call(queue, {"name": "next"})["echo"]["name"] == "next"
    assert client.dropped_replies == 1
    # and it can be read once, for a caller that has to undo what the late call did
    assert [r["echo"]["name"] for r in client.stray_replies()] == ["sleep"]
    assert client.stray_replies() == []


def test_after_a_timeout_the_next_request_goes_out_on_a_fresh_channel(client: RpcClient, settings: Settings) -> None:
    # (RabbitMQ 3.10 can leave a channel silently dropping what it publishes to a quorum
    # queue after a leader change: without confirms, only the missing reply shows it.)
    queue = Names(settings.prefix).collector_tasks
    assert client.call(queue, {"name": "first"})["echo"]["name"] == "first"
    before = client.link._plain_channel()
    with pytest.raises(RpcTimeout):
        client.call(queue, {"name": "sleep", "seconds": 1.0}, timeout_s=0.3)
    assert client.call(queue, {"name": "next"})["echo"]["name"] == "next"
    assert client.link._plain_channel() is not before
    assert not before.is_open


def test_expired_request_is_never_run(settings: Settings, link: BrokerLink) -> None:
    # Given a request that waits in the queue longer than its expiration (no server yet)
    names = Names(settings.prefix)
    link.declare(names.collector_tasks_decl())
    ran: list[Any] = []
    with RpcClient(settings, "test-client") as client:
        with pytest.raises(RpcTimeout):
            client.call(names.collector_tasks, {"name": "stale"}, timeout_s=0.3)
        # When a server starts afterwards
        srv = RpcServer(settings, "late-server")

        def record(request: Request) -> dict[str, Any]:
            ran.append(request.body)
            return {"ok": 1}

        srv.add_queue(names.collector_tasks_decl(), record)
        srv.start(wait_s=10)
        try:
            assert client.call(names.collector_tasks, {"name": "fresh"}, timeout_s=5) == {"ok": 1}
        finally:
            srv.stop(5)
    # Then only the fresh request was executed
    assert ran == [{"name": "fresh"}]


def _dead_letters(link: BrokerLink, names: Names, count: int) -> list[bytes]:
    bodies = []
    for _ in range(count):
        delivery = link.get_one(names.dead_letter_queue, 5.0)
        assert delivery is not None, "expected a dead letter"
        bodies.append(delivery.envelope.body)
        delivery.ack()
    return bodies


def test_undecodable_request_is_answered_and_dead_lettered(
    server: RpcServer, client: RpcClient, settings: Settings, link: BrokerLink
) -> None:
    names = Names(settings.prefix)
    # Garbage with a reply_to: an error reply and a dead letter.
    client._ensure_replies()
    client._waiting.add("garbage-1")
    link.publish(names.collector_tasks, b"\xc1\xc1", correlation_id="garbage-1", reply_to=client.reply_queue)
    with pytest.raises(RemoteError, match="undecodable request"):
        client.wait("garbage-1", timeout_s=5)
    # A valid body with no reply_to cannot be answered: dead letter only.
    link.publish(names.collector_tasks, encode({"name": "x"}), correlation_id="no-reply")
    assert _dead_letters(link, names, 2) == [b"\xc1\xc1", encode({"name": "x"})]
    # And the server still serves.
    assert client.call(names.collector_tasks, {"name": "ok"})["echo"] == {"name": "ok"}


def test_handler_three_times_longer_than_heartbeat_keeps_the_connection(settings: Settings, link: BrokerLink) -> None:
    # Given heartbeats of 2 s and a handler that works for 7 s
    fast = settings.replace(heartbeat_s=2)
    names = Names(fast.prefix)
    srv = RpcServer(fast, "slow-server")
    srv.add_queue(names.collector_tasks_decl(), echo_handler)
    srv.start(wait_s=10)
    try:
        with RpcClient(fast, "test-client") as client:
            reply = client.call(names.collector_tasks, {"name": "sleep", "seconds": 7}, timeout_s=20)
        # Then the request was answered once, on the same consuming connection
        assert reply["redelivered"] is False
        assert srv.reconnects == 0
        assert link.queue_depth(names.collector_tasks) == 0
    finally:
        srv.stop(5)


def test_client_and_server_recover_when_the_broker_closes_their_connections(
    settings: Settings, server: RpcServer, client: RpcClient, amqp_url: str
) -> None:
    queue = Names(settings.prefix).collector_tasks
    assert client.call(queue, {"name": "before"})["echo"]["name"] == "before"
    ours = ("warren-test-server@", "warren-test-client@")
    broker_admin.wait_until(
        lambda: sum(n.startswith(ours) for n in broker_admin.connection_names(amqp_url)) >= 2,
        15,
        "the management API to list our connections",
    )
    closed = broker_admin.close_connections(amqp_url, lambda name: name.startswith(ours))
    assert closed >= 2  # the client's and the server's
    # The next calls reconnect transparently (a call in flight during the cut may time out).
    results = []
    for i in range(5):
        try:
            results.append(client.call(queue, {"name": "after", "i": i}, timeout_s=10)["echo"]["i"])
        except RpcTimeout:
            continue
    assert results and results[-1] == 4
    broker_admin.wait_until(lambda: server.reconnects >= 1, 10, "the server to reconnect")
    assert client.link.reconnects >= 1


def test_concurrent_clients_each_get_their_own_replies(settings: Settings, server: RpcServer) -> None:
    queue = Names(settings.prefix).collector_tasks
    errors: list[BaseException] = []

    def run(worker: int) -> None:
        try:
            with RpcClient(settings, f"client{worker}") as rpc:
                for i in range(25):
                    assert rpc.call(queue, {"w": worker, "i": i})["echo"] == {"w": worker, "i": i}
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
