"""Restarts: the broker (stop_app/start_app), the coordinator and the learner, mid-run.

The broker restarted is the session's private node (``private_broker``), never the
shared broker on ``WARREN_AMQP_URL``.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from messaging import (
    BrokerLink,
    ConfirmedPublisher,
    MessagingError,
    MetadataConsumer,
    MetadataPublisher,
    Names,
    RpcClient,
    Settings,
)
from tests import broker_admin
from tests.fault_report import record, scaled
from tests.faults.conftest import Cluster
from tests.rabbit_nodes import PrivateNode

pytestmark = [pytest.mark.rabbitmq, pytest.mark.fault]


def _restart_broker(node: PrivateNode, down_s: float) -> float:
    """stop_app, wait, start_app on the private node; returns how long it was unavailable."""
    started = time.monotonic()
    node.stop_app()
    time.sleep(down_s)
    node.start_app()
    return time.monotonic() - started


def test_metadata_confirmed_before_a_broker_restart_is_all_there_after_it(
    private_broker: PrivateNode, private_settings: Settings
) -> None:
    # Given a publisher sending numbered metadata with confirms, through a broker restart
    patient = private_settings.replace(connect_timeout_s=90)
    queue = Names(patient.prefix).metadata_decl("restart", max_length=100_000, expires_s=600)
    confirmed: list[int] = []
    failed: list[int] = []
    stop = threading.Event()

    def publish() -> None:
        with ConfirmedPublisher(patient, "test-publisher") as confirming:
            publisher = MetadataPublisher(confirming, queue)
            i = 0
            while not stop.is_set():
                try:
                    publisher.publish({"data_id": f"d{i}", "policy_iter": i})
                    publisher.flush(patient.connect_timeout_s)  # confirmed: the claim under test
                    confirmed.append(i)
                except MessagingError:
                    failed.append(i)
                    break  # a publisher's failure is final
                i += 1

    thread = threading.Thread(target=publish)
    thread.start()
    broker_admin.wait_until(lambda: len(confirmed) > 200, 30, "some confirmed publishes")
    downtime = _restart_broker(private_broker, scaled(2, 10))
    broker_admin.wait_until(lambda: len(confirmed) > 0 and confirmed[-1] > 0 and len(confirmed) > 400, 90, "more")
    stop.set()
    thread.join(60)
    # Then every confirmed message can be read after the restart
    with BrokerLink(patient, "test-reader") as link:
        consumer = MetadataConsumer(link, queue.name, prefetch=500)
        seen: set[int] = set()
        while (item := consumer.get(2.0)) is not None:
            seen.add(int(item.message["policy_iter"]))
            item.ack()
        link.delete_queue(queue.name)
    lost = sorted(set(confirmed) - seen)
    assert lost == []
    record(
        "broker restart (stop_app/start_app), publisher",
        faults=1,
        downtime_s=round(downtime, 1),
        messages_confirmed=len(confirmed),
        messages_consumed=len(seen),
        confirmed_but_lost=len(lost),
        publish_errors=len(failed),
    )


def test_the_whole_job_survives_a_broker_restart(
    private_broker: PrivateNode, cluster_on_private_broker: Cluster
) -> None:
    # Given a running job whose processes allow a minute of reconnecting
    cluster = cluster_on_private_broker
    patient = {"WARREN_CONNECT_TIMEOUT_S": "90"}
    # (a budget that lasts well past the restart: collection runs at the learner's pace)
    budget = scaled(150_000, 1_000_000)
    cluster.write_job(f"[coordinator]\ncollect_tasks = 2\nmax_time_s = 240.0\nmax_env_steps = {budget}\n")
    learner = cluster._start("learner", ["learner", "--config", str(cluster.job)], **patient)
    collectors = [cluster._start(f"c{i}", ["collector", "--worker-id", f"c{i}"], **patient) for i in range(2)]
    coordinator = cluster._start(
        "coordinator",
        [
            "coordinator",
            "--config",
            str(cluster.job),
            "--run-log",
            str(cluster.run_log),
            "--progress",
            "log",
            "--stop-value",
            "100000",
        ],
        **patient,
    )
    broker_admin.wait_until(lambda: len(cluster.records("task")) >= 2, 90, "the first finished tasks")
    # When the broker application stops and starts again mid-run
    downtime = _restart_broker(private_broker, scaled(2, 10))
    # Then every role reconnects by itself and the run goes on to the end of its budget
    assert coordinator.wait(260) == 3, coordinator.log()[-3000:]
    summary = cluster.summary(coordinator)
    assert summary["env_steps"] >= budget and "budget" in summary["reason"]
    assert learner.alive() and all(c.alive() for c in collectors)
    for proc in (learner, *collectors, coordinator):
        assert "link reconnected" in proc.log()
    record(
        "broker restart (stop_app/start_app), whole job",
        faults=1,
        downtime_s=round(downtime, 1),
        tasks_completed=summary["tasks_done"],
        tasks_rerun=summary["tasks_rerun"],
        run_completed=True,
    )


def test_learner_and_coordinator_restarts_resume_the_run(cluster: Cluster) -> None:
    # Given a run with no budget in sight (so it cannot end before the faults)
    cluster.write_job(
        "[coordinator]\ncollect_tasks = 2\nmax_time_s = 600.0\nmax_env_steps = 1000000000\n"
        "[algorithm]\nlearning_starts = 200\n"
    )
    learner = cluster.learner()
    for i in range(2):
        cluster.collector(f"c{i}")
    coordinator = cluster.coordinator("--stop-value", "100000")
    broker_admin.wait_until(
        lambda: any(r.get("train_iter", 0) > 0 for r in cluster.records("task")), 90, "tasks run on a trained policy"
    )
    # When the learner is killed and started again
    learner.kill()
    time.sleep(1.0)
    learner = cluster.learner()
    broker_admin.wait_until(
        lambda: "resumed from the checkpoint at policy version" in learner.log(), 60, "the learner to resume"
    )
    # and the coordinator is killed mid-run and started again on the same run log, with a budget
    before = cluster.records("checkpoint")[-1]
    coordinator.signal(signal.SIGKILL)
    coordinator.wait(10)
    assert not cluster.records("summary")
    budget = before["env_steps"] + scaled(8_000, 100_000)
    coordinator = cluster.coordinator("--stop-value", "100000", "--max-env-steps", str(budget))
    # Then the run resumes where it was and goes on to the end of its budget
    assert coordinator.wait(260) == 3, coordinator.log()[-3000:]
    summary = cluster.summary(coordinator)
    assert "resumed the run" in coordinator.log()
    assert summary["env_steps"] >= budget
    assert summary["tasks_done"] > before["tasks_done"]
    resumed_iter = int(learner.log().split("resumed from the checkpoint at policy version ")[1].split()[0])
    assert resumed_iter > 0
    record(
        "learner SIGKILL + restart, coordinator SIGKILL + restart",
        faults=2,
        learner_resumed_at_iter=resumed_iter,
        env_steps_at_coordinator_kill=before["env_steps"],
        env_steps_at_end=summary["env_steps"],
        tasks_completed=summary["tasks_done"],
        run_completed=True,
    )


def test_a_start_request_waiting_in_its_queue_survives_a_broker_restart(
    private_broker: PrivateNode, private_settings: Settings, private_link: BrokerLink
) -> None:
    # Given start requests queued while no worker listens: one sent durable (as the
    # coordinator sends starts), one not
    names = Names(private_settings.prefix)
    private_link.declare(names.collector_tasks_decl())
    with RpcClient(private_settings, "restart-client") as client:
        client.send(names.collector_tasks, {"name": "collector_start_task"}, timeout_s=600, durable=True)
        client.send(names.collector_tasks, {"name": "collector_start_task"}, timeout_s=600)
        broker_admin.wait_until(lambda: private_link.queue_depth(names.collector_tasks) == 2, 10, "both queued")
    # When the broker restarts
    _restart_broker(private_broker, 0.5)
    # Then the durable one is still there for the next worker; the other is gone
    broker_admin.wait_until(lambda: private_link.queue_depth(names.collector_tasks) is not None, 60, "the queue back")
    assert private_link.queue_depth(names.collector_tasks) == 1
