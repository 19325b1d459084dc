"""Fault tests on real processes: killed workers, cut connections, slow readers, long tasks, SIGTERM."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from messaging import BrokerLink, MetadataConsumer, Names, RemoteError, RpcClient, Settings
from messaging.errors import QueueNotFound, RpcTimeout
from tests import broker_admin
from tests.fault_report import record, scaled
from tests.faults.conftest import Cluster, LearnerStandIn
from tests.procs import Proc
from tests.tasks import random_policy_cfg, start_task
from worker.cli.exit_codes import ExitCode

pytestmark = [pytest.mark.rabbitmq, pytest.mark.fault]


def _busy_worker(client: RpcClient, names: Names, workers: dict[str, Proc]) -> str | None:
    for worker_id, proc in workers.items():
        if not proc.alive():
            continue
        try:
            info = client.call(names.collector_control(worker_id), {"name": "resource"}, timeout_s=3)
        except (QueueNotFound, RpcTimeout, RemoteError):
            continue
        if info["busy"]:
            return worker_id
    return None


def test_collectors_killed_mid_task_lose_no_confirmed_data(
    cluster: Cluster, settings: Settings, link: BrokerLink
) -> None:
    # Given 3 collectors, a coordinator, and this test playing the learner
    kills = scaled(2, 8)
    budget = scaled(200_000, 1_000_000)  # seconds of collection: time for the kills
    cluster.write_job(
        # Few envs and long tasks, so that a kill lands in the middle of one
        f"[env]\ncollector_env_num = 4\n[collector]\nn_sample = 4096\n"
        f"[coordinator]\ncollect_tasks = 2\neval_interval_s = 10000.0\nmax_run_ahead_samples = 1000000\n"
        f"max_env_steps = {budget}\n"
    )
    cluster.write_initial_policy()
    workers = {f"c{i}": cluster.collector(f"c{i}") for i in range(3)}
    coordinator = cluster.coordinator("--stop-value", "100000")
    names = cluster.names
    broker_admin.wait_until(lambda: link.queue_exists(names.learner_data("main")), 30, "the learner queue")
    learner = LearnerStandIn(link, names.learner_data("main"), cluster.data)
    received = learner.received
    rng = random.Random(7)
    killed = 0
    next_kill = time.monotonic() + rng.uniform(0.5, 1.5)
    deadline = time.monotonic() + 240

    with RpcClient(settings, "test-probe") as client:
        # When busy collectors are SIGKILLed at random moments (and replaced)
        while coordinator.alive() and time.monotonic() < deadline:
            learner.take(0.2)
            if killed < kills and time.monotonic() > next_kill:
                victim = _busy_worker(client, names, workers)
                if victim is not None:
                    workers.pop(victim).kill()
                    killed += 1
                    spare = f"c{len(workers) + killed + 2}"
                    workers[spare] = cluster.collector(spare)
                next_kill = time.monotonic() + rng.uniform(0.5, 1.5)
    while learner.take(1.0):
        pass
    # Then the coordinator finished its budget on its own (no hang), re-running the lost tasks
    assert coordinator.wait(5) == 3, coordinator.log()[-2000:]
    summary = cluster.summary(coordinator)
    assert killed == kills
    assert summary["tasks_rerun"] >= 1
    # and every data_id that reached us names a complete, decodable file
    assert learner.unreadable == []
    final_files = [p for p in cluster.data.iterdir() if not p.name.startswith(".")]
    for path in final_files:
        learner.store.read(path.name, wait_s=0)  # raises CorruptFile on a partial file under a final name
    duplicates = len(received) - len(set(received))
    record(
        "collector SIGKILL mid-task",
        faults=killed,
        tasks_completed=summary["tasks_done"],
        tasks_rerun=summary["tasks_rerun"],
        data_ids_received=len(received),
        files_readable=len(received) - len(learner.unreadable),
        duplicate_deliveries=duplicates,
        files_on_volume=len(final_files),
    )


def test_a_worker_whose_connections_are_cut_reconnects_and_carries_on(
    cluster: Cluster, settings: Settings, amqp_url: str
) -> None:
    cluster.collector("c0")
    names = cluster.names
    start = start_task("cut-1", random_policy_cfg(2, n_sample=3000))
    with RpcClient(settings, "test-client") as client:
        started = client.call(names.collector_tasks, start)
        # Both the worker's connection and its task thread's: the management API lists a
        # new connection only after its next statistics interval.
        broker_admin.wait_until(
            lambda: sum(n.startswith("warren-collector-c0") for n in broker_admin.connection_names(amqp_url)) >= 2,
            30,
            "the worker's connections to be listed",
        )
        with BrokerLink(settings, "test-reader") as reader:
            consumer = MetadataConsumer(reader, started["metadata_queue"], prefetch=8)
            first = consumer.get(10.0)
            assert first is not None
            first.ack()
            # When the broker closes every connection of the worker
            cut = broker_admin.close_connections(amqp_url, lambda n: n.startswith("warren-collector-c0"))
            assert cut >= 2
            # Then the stream goes on to the end of the task
            last = first.message
            while not last.get("collector_done"):
                item = consumer.get(20.0)
                assert item is not None, "the stream stopped after the cut"
                last = item.message
                item.ack()
        assert last["cur_sample"] >= 3000
        # And the worker serves its control queue again
        broker_admin.wait_until(lambda: cluster.link.queue_exists(started["control_queue"]), 15, "control queue")
        finish = client.call(started["control_queue"], {"name": "collector_close_task"})
        assert finish["collector_done"] is True
    log = cluster.procs[0].log()
    assert "link reconnected" in log and cluster.procs[0].alive()
    record("connections cut by the broker", faults=cut, tasks_completed=1, worker_alive=True)


def test_nobody_reading_holds_the_collector_back_and_drops_nothing(cluster: Cluster, settings: Settings) -> None:
    worker = cluster.collector("c0")
    n_sample = 3000
    start = start_task("slow-1", random_policy_cfg(2, n_sample=n_sample, traj_len=8))
    with RpcClient(settings, "test-client") as client:
        started = client.call(cluster.names.collector_tasks, start)
        # When nobody reads for a while
        time.sleep(1.0)
        rss_before = _rss_kb(worker.pid)
        time.sleep(scaled(4, 20))
        rss_after = _rss_kb(worker.pid)
        depth = cluster.link.queue_depth(started["metadata_queue"])
        # Then the queue holds exactly its bound and the worker's memory does not grow with the backlog
        assert depth == settings.metadata_queue_length
        assert rss_after - rss_before < 20_000, (rss_before, rss_after)
        # And once read, every sample is there without a gap, the final info last (a chunk the
        # full queue refused and that was sent again can come after a later one)
        with BrokerLink(settings, "test-reader") as reader:
            consumer = MetadataConsumer(reader, started["metadata_queue"], prefetch=8)
            chunks: list[tuple[int, int]] = []
            items = 0
            while True:
                item = consumer.get(10.0)
                assert item is not None
                message = item.message
                item.ack()
                items += 1
                if "data_id" in message:
                    chunks.append((message["cur_sample"], message["sample_count"]))
                elif message["collector_done"]:
                    break
        expected = 0
        for cur_sample, count in sorted(chunks):
            expected += count
            assert cur_sample == expected, sorted(chunks)
        assert expected == message["cur_sample"] >= n_sample
        client.call(started["control_queue"], {"name": "collector_close_task"})
    record(
        "slow consumer (nobody reads)",
        queue_bound=depth,
        rss_growth_kb=rss_after - rss_before,
        items_consumed=items,
        samples_lost=0,
    )


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_task_many_heartbeats_long_keeps_its_connections(cluster: Cluster, settings: Settings) -> None:
    # Given 1 s heartbeats (the broker drops a silent peer after ~2 s)
    worker = cluster.collector("c0", WARREN_HEARTBEAT_S="1")
    start = start_task("long-1", random_policy_cfg(1, n_sample=1_000_000, traj_len=256))
    seconds = scaled(8, 30)
    with RpcClient(settings, "test-client") as client:
        started = client.call(cluster.names.collector_tasks, start)
        with BrokerLink(settings, "test-reader") as reader:
            consumer = MetadataConsumer(reader, started["metadata_queue"], prefetch=8)
            end = time.monotonic() + seconds
            items = 0
            while time.monotonic() < end:
                if (item := consumer.get(0.5)) is not None:
                    item.ack()
                    items += 1
        finish = client.call(started["control_queue"], {"name": "collector_close_task"})
    # Then the task ran for many heartbeat intervals on the same connections
    assert finish["duration"] >= seconds - 1 and items > 0
    assert "reconnecting" not in worker.log() and "link lost" not in worker.log()
    record("long task (heartbeat 1 s)", task_seconds=round(finish["duration"], 1), reconnects=0, items=items)


def test_sigterm_to_every_role_exits_cleanly_and_leaves_nothing_unacked(
    cluster: Cluster, settings: Settings, amqp_url: str
) -> None:
    cluster.write_job("[coordinator]\ncollect_tasks = 2\n")
    learner = cluster.learner()
    collectors = [cluster.collector(f"c{i}") for i in range(2)]
    coordinator = cluster.coordinator("--stop-value", "100000")
    broker_admin.wait_until(lambda: len(cluster.records("task")) >= 3, 90, "a few finished tasks")
    exits: dict[str, int] = {}
    started = time.monotonic()
    # When each role gets one SIGTERM mid-task
    for name, proc in (
        ("coordinator", coordinator),
        ("learner", learner),
        ("c0", collectors[0]),
        ("c1", collectors[1]),
    ):
        proc.signal(signal.SIGTERM)
        exits[name] = proc.wait(40)
    # Then each exits on its own with its clean code, within the grace period
    assert exits == {"coordinator": ExitCode.TERMINATED, "learner": 0, "c0": 0, "c1": 0}, exits
    assert time.monotonic() - started < 4 * 40
    # and no message of this run stays unacknowledged anywhere
    vhost = broker_admin.vhost_of(amqp_url)

    def unacked() -> int:
        queues = broker_admin.api(amqp_url, "GET", "/api/queues/" + vhost.replace("/", "%2F"))
        ours = [q for q in queues if q["name"].startswith(settings.prefix + ".")]
        return sum(int(q.get("messages_unacknowledged", 0)) for q in ours)

    broker_admin.wait_until(lambda: unacked() == 0, 15, "no unacked messages")
    record(
        "SIGTERM to every role",
        faults=4,
        clean_exits=sum(1 for c in exits.values() if c in (0, ExitCode.TERMINATED)),
        unacked=0,
    )
