"""What a role logs when the broker closes its connections: warren's own lines, not pika's.

pika logs each lost connection at ERROR (a refused reconnect up to seven times, with
tracebacks) and then raises; warren reports the same event once, as a warning. Only
``--verbose`` brings pika's records (and tracebacks) back, as DEBUG.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from messaging import BrokerLink, Names, RpcClient, Settings
from tests import broker_admin
from tests.procs import Proc, role_env, wait_for_queue
from tests.tasks import random_policy_cfg, start_task

pytestmark = pytest.mark.rabbitmq


def test_a_collector_cut_off_by_the_broker_logs_one_warning_per_connection_and_no_traceback(
    settings: Settings, amqp_url: str, link: BrokerLink, tmp_path: Path
) -> None:
    # Given a collector at the default log level, running a long task (three connections:
    # the worker's, its handler thread's and the task's publisher)
    for sub in ("data", "policy"):
        (tmp_path / sub).mkdir()
    worker_id = f"logs-{settings.prefix}"
    env = role_env(settings, WARREN_PATH_DATA=str(tmp_path / "data"), WARREN_PATH_POLICY=str(tmp_path / "policy"))
    proc = Proc(["collector", "--worker-id", worker_id], env=env, log=tmp_path / "collector.log")
    ours = f"warren-collector-{worker_id}"
    tasks = Names(settings.prefix).collector_tasks
    try:
        wait_for_queue(link, tasks)
        with RpcClient(settings, "test-client") as client:
            client.call(tasks, start_task("logs-1", random_policy_cfg(2, n_sample=10**6)))
            broker_admin.wait_until(
                lambda: sum(n.startswith(ours) for n in broker_admin.connection_names(amqp_url)) >= 3,
                30,
                "the collector's connections in the management API",
            )
            # When the broker closes all of them
            closed = broker_admin.close_connections(amqp_url, lambda n: n.startswith(ours))
            assert closed >= 3
            # Then each is reported lost and reconnected by warren
            broker_admin.wait_until(lambda: proc.log().count("reconnected") >= closed, 60, "every reconnect")
    finally:
        proc.signal(15)
        proc.wait(60)
        proc.kill()
    log = proc.log()
    assert log.count("link lost") + log.count("publisher lost its connection") == closed, log
    # And nothing else: no traceback, no line of pika's own
    assert "Traceback" not in log, log
    assert not re.search(r"^\S+ \S+ \w+ \[[^]]*\] pika\.", log, re.MULTILINE), log
