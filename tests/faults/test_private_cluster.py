"""The private 3-node cluster the failover tests build on: it forms, a quorum queue survives
``kill -9`` of its leader's node, and the killed node rejoins.

Everything here runs on nodes the test starts itself (``tests.rabbit_nodes``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest

from tests.broker_admin import wait_until
from tests.fault_report import record
from tests.rabbit_nodes import PrivateCluster, PrivateNode

pytestmark = [pytest.mark.fault, pytest.mark.cluster, pytest.mark.timeout(240)]

QUEUE = "smoke-quorum"
MESSAGES = 200


def _connect(node: PrivateNode) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            host="127.0.0.1",
            port=node.ports.amqp,
            credentials=pika.PlainCredentials("guest", "guest"),
            connection_attempts=1,
            socket_timeout=5,
            blocked_connection_timeout=30,
        )
    )


def _read_all(node: PrivateNode, deadline: float) -> tuple[set[str], float]:
    """Every message of the queue, read through ``node``; and when the first one came."""
    seen: set[str] = set()
    first = 0.0
    while len(seen) < MESSAGES and time.monotonic() < deadline:
        try:
            conn = _connect(node)
        except pika.exceptions.AMQPError:
            time.sleep(0.1)  # the node refuses while it syncs with the new leader: retry to the deadline
            continue
        try:
            channel = conn.channel()
            while len(seen) < MESSAGES and time.monotonic() < deadline:
                method, _, body = channel.basic_get(QUEUE, auto_ack=True)
                if method is None:
                    time.sleep(0.05)
                    continue
                first = first or time.monotonic()
                seen.add(body.decode())
        except pika.exceptions.AMQPError:
            time.sleep(0.1)
        finally:
            if conn.is_open:
                conn.close()
    return seen, first


def test_three_nodes_cluster_keep_a_quorum_queue_through_a_leader_kill_and_rejoin(
    start_private_cluster: Callable[[int], PrivateCluster],
) -> None:
    # Given three private nodes, clustered
    cluster = start_private_cluster(3)
    status = cluster.nodes[0].cluster_status()
    assert sorted(status["running_nodes"]) == sorted(n.name for n in cluster.nodes)
    # and a quorum queue holding persistent, confirmed messages, published through node 0
    conn = _connect(cluster.nodes[0])
    channel = conn.channel()
    channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()  # basic_publish now raises unless the broker confirms
    sent = {f"m{i}" for i in range(MESSAGES)}
    for body in sorted(sent):
        channel.basic_publish("", QUEUE, body.encode(), pika.BasicProperties(delivery_mode=2), mandatory=True)
    conn.close()

    def leader_seen_by(node: PrivateNode) -> str:
        return str(node.queue(QUEUE).get("leader") or "")

    wait_until(lambda: bool(leader_seen_by(cluster.nodes[0])), 30, "the queue's leader")
    leader = cluster.node_named(leader_seen_by(cluster.nodes[0]))
    survivor = next(n for n in cluster.nodes if n is not leader)

    # When the leader's node is killed (kill -9 of its Erlang VM)
    killed_at = time.monotonic()
    leader.kill()
    # Then every confirmed message is read back through a surviving node
    seen, first_read = _read_all(survivor, killed_at + 60)
    assert seen == sent
    readable_s = first_read - killed_at
    wait_until(lambda: leader_seen_by(survivor) not in ("", leader.name), 30, "a new leader")
    assert len(cluster.running_nodes(via=survivor)) == 2

    # When the killed node starts again on its data, it rejoins: three running nodes
    restart_s = leader.start()
    rejoin_started = time.monotonic()
    cluster.await_running(3, timeout_s=60)
    rejoin_s = restart_s + time.monotonic() - rejoin_started
    assert sorted(leader.cluster_status()["running_nodes"]) == sorted(n.name for n in cluster.nodes)
    record(
        "private 3-node cluster: kill -9 of a quorum queue leader's node, restart",
        faults=1,
        cluster_start_s=round(cluster.timings["start_s"], 1),
        kill_to_first_read_s=round(readable_s, 2),
        restart_and_rejoin_s=round(rejoin_s, 1),
        messages_confirmed=len(sent),
        confirmed_but_lost=len(sent - seen),
    )
    print(
        f"3 nodes up {cluster.timings['start_s']:.1f} s; kill -> first read {readable_s:.2f} s; "
        f"restart + rejoin {rejoin_s:.1f} s"
    )
