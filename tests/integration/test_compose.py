"""docker-compose.yml's warren services, run as local processes against the local broker.

No Docker engine runs here, so each service's ``command`` and ``environment`` (with the
.env.example values substituted, as compose does) are run as ``warren`` processes, the
image's entrypoint. Only what ties them to a Docker host is swapped: the broker URL
(host ``rabbitmq`` and the .env credentials) for the test's vhost, the queue prefix for
the test's own, and the named volume's mount point for a temporary directory.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from messaging import BrokerLink, Names, Settings
from tests.broker_admin import api, connections, prometheus_url, vhost_of, wait_until
from tests.compose import (
    duration_s,
    load_compose,
    named_mounts,
    read_env_file,
    service_command,
    service_environment,
)
from tests.observe import free_port, scalars, scrape, total
from tests.procs import Proc
from tests.rabbit_nodes import PrivateNode
from worker.job import JobConfig
from worker.storage import PolicyStore

pytestmark = pytest.mark.rabbitmq

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
EXAMPLE = read_env_file()
#: Wall-time budget given to the coordinator through WARREN_MAX_TIME_S, as a user would in .env.
RUN_BUDGET_S = 20


class ComposeStack:
    """Starts docker-compose.yml services as local ``warren`` processes; kills them all at the end."""

    def __init__(self, settings: Settings, workdir: Path, variables: Mapping[str, str]) -> None:
        self.settings = settings
        self.workdir = workdir
        self.compose = load_compose(variables)
        self.variables = variables
        self.procs: list[Proc] = []
        self.metrics_ports: dict[int, int] = {}
        """``{pid: port}`` of each process's /metrics."""

    def service(self, name: str) -> dict[str, Any]:
        service: dict[str, Any] = self.compose["services"][name]
        return service

    def local_path(self, name: str, value: str) -> str:
        for target, volume in named_mounts(self.service(name), self.compose["volumes"]).items():
            if value == target or value.startswith(target + "/"):
                return str(self.workdir / volume) + value[len(target) :]
        return value

    def start(self, name: str, index: int = 0) -> Proc:
        service = self.service(name)
        env = service_environment(service)
        url = urlsplit(env["WARREN_AMQP_URL"])
        # The compose URL points at the rabbitmq service with the .env account ...
        assert url.hostname == "rabbitmq"
        assert (url.username, url.password) == (
            self.variables["RABBITMQ_DEFAULT_USER"],
            self.variables["RABBITMQ_DEFAULT_PASS"],
        )
        # ... here it is the test broker's vhost, and the test's own prefix.
        env["WARREN_AMQP_URL"] = self.settings.amqp_url
        env["WARREN_PREFIX"] = self.settings.prefix
        # Each container has its own network namespace for the metrics port; processes on
        # one machine share one: a free port each, on the loopback address.
        assert env["WARREN_METRICS_PORT"] and env["WARREN_METRICS_ADDR"] == "0.0.0.0"
        port = free_port()
        env["WARREN_METRICS_PORT"], env["WARREN_METRICS_ADDR"] = str(port), "127.0.0.1"
        env = {key: self.local_path(name, value) for key, value in env.items()}
        args = [self.local_path(name, arg) for arg in service_command(service)]
        proc = Proc(args, env=env, log=self.workdir / f"{name}-{index}.log")
        self.procs.append(proc)
        self.metrics_ports[proc.pid] = port
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            proc.kill()


@pytest.fixture
def stack_factory(settings: Settings, tmp_path: Path) -> Iterator[Any]:
    stacks: list[ComposeStack] = []

    def make(**overrides: str) -> ComposeStack:
        stack = ComposeStack(settings, tmp_path, {**EXAMPLE, **overrides})
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.kill_all()


def collector_connection(amqp_url: str, pid: int) -> tuple[str, str] | None:
    """``(worker id, connection name)`` of the collector process ``pid``'s main connection."""
    pattern = re.compile(rf"^warren-collector-(?P<id>[A-Za-z0-9_.-]*-{pid}-[0-9a-f]{{4}})@[^@]+:{pid}$")
    for conn in connections(amqp_url):
        name = conn.get("client_properties", {}).get("connection_name", "")
        match = pattern.match(name)
        if match:
            return match.group("id"), name
    return None


def read_run_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_compose_services_train_together(stack_factory: Any, settings: Settings) -> None:
    stack = stack_factory(WARREN_MAX_TIME_S=str(RUN_BUDGET_S))
    replicas = int(stack.service("collector")["scale"])
    assert replicas >= 2
    learner = stack.start("learner")
    collectors = [stack.start("collector", i) for i in range(replicas)]
    # The job's time budget starts with the coordinator: let the workers come up first (on a
    # loaded machine, importing torch alone can take most of the budget).
    wait_until(
        lambda: all(collector_connection(settings.amqp_url, c.pid) for c in collectors), 120, "collectors to connect"
    )
    coordinator = stack.start("coordinator")
    # While the job trains, the coordinator's /metrics shows the run going on
    coordinator_port = stack.metrics_ports[coordinator.pid]

    def counting() -> bool:
        assert coordinator.alive(), coordinator.log()[-3000:]
        return total(scrape(coordinator_port), "warren_run_env_steps_total", role="coordinator") > 0

    wait_until(counting, 60, "the coordinator's env steps in its /metrics")

    code = coordinator.wait(RUN_BUDGET_S + 45)
    assert code in (0, 3), coordinator.log()  # 0: stop value reached, 3: budget spent; never a crash
    volume = stack.workdir / "warren-data"
    records = read_run_log(volume / "runs" / "run.jsonl")
    tasks = [r for r in records if r["kind"] == "task"]
    (summary,) = [r for r in records if r["kind"] == "summary"]
    assert tasks, coordinator.log()
    assert summary["env_steps"] > 0 and summary["samples"] > 0
    # Every replica took tasks: each has its own id, so each got its own control queue.
    workers = summary["workers_seen"]
    assert len(workers) == replicas, workers
    names = Names(settings.prefix)
    # A fresh link: one left idle through the run would have missed its heartbeats.
    with BrokerLink(settings, "test-check") as link:
        for worker_id in workers:
            assert link.queue_exists(names.collector_control(worker_id)), worker_id
    policy = PolicyStore(volume / "policy").read(JobConfig().coordinator.policy_name)
    assert policy is not None and policy.iter > 0, learner.log()
    assert summary["policy_iter"] > 0
    # Each collector's /metrics counts its own work, under its worker id
    counted = {}
    for proc in collectors:
        found = scrape(stack.metrics_ports[proc.pid])
        assert found is not None, proc.log()
        (worker_id,) = {s.labels["worker_id"] for s in found if s.name == "warren_collector_busy"}
        counted[worker_id] = total(found, "warren_env_steps_total", role="collector", kind="collect")
        assert total(found, "warren_chunks_confirmed_total") > 0, worker_id
        assert total(found, "warren_tasks_finished_total", kind="collect") > 0, worker_id
        # The transport's counters: the task publishers' confirms, with their latency
        assert total(found, "warren_publisher_messages_confirmed_total") > 0, worker_id
        assert total(found, "warren_publisher_confirm_latency_seconds_count") > 0, worker_id
    assert set(counted) == set(workers) and all(steps > 0 for steps in counted.values()), counted
    # What the collectors counted is at least what the coordinator read of it (it may have
    # closed a task before reading its last item)
    assert sum(counted.values()) >= summary["env_steps"], (counted, summary["env_steps"])
    learned = scrape(stack.metrics_ports[learner.pid])
    assert total(learned, "warren_learner_train_steps_total", role="learner") > 0, learner.log()[-2000:]
    assert total(learned, "warren_policy_version", role="learner") > 0

    # docker compose stop: SIGTERM to every container, SIGKILL after its stop_grace_period.
    stopping = [*((c, "collector") for c in collectors), (learner, "learner")]
    signalled = time.monotonic()
    for proc, _ in stopping:
        proc.signal(signal.SIGTERM)
    for proc, name in stopping:
        grace = duration_s(stack.service(name)["stop_grace_period"])
        assert proc.wait(max(0.1, signalled + grace - time.monotonic())) == 0, proc.log()
    # TensorBoard: the coordinator's curves at the run's env steps, the learner's at its iterations
    board = volume / "runs" / "tensorboard"
    run_curves, learner_curves = scalars(board / "coordinator"), scalars(board / "learner")
    evals = [r for r in records if r["kind"] == "eval"]
    # (TensorBoard keeps scalars as 32-bit floats)
    assert [v for _, v in run_curves["eval/return"]] == pytest.approx([r["reward_mean"] for r in evals])
    assert [s for s, _ in run_curves["eval/return"]] == [r["env_steps"] for r in evals]
    assert run_curves["run/tasks_done"][-1][1] == summary["tasks_done"]
    assert {"learner/loss", "learner/q_mean", "learner/replay_ratio", "learner/policy_lag"} <= learner_curves.keys()
    iterations = [step for step, _ in learner_curves["learner/loss"]]
    assert iterations == sorted(iterations) and iterations[-1] > 0
    with BrokerLink(settings, "test-check") as link:
        for worker_id in workers:
            assert not link.queue_exists(names.collector_control(worker_id)), worker_id


def test_management_api_lists_a_collector_by_name_with_its_consumers(
    stack_factory: Any, settings: Settings, amqp_url: str
) -> None:
    collector = stack_factory().start("collector")
    found: list[tuple[str, str]] = []

    def connected() -> bool:
        assert collector.alive(), collector.log()
        hit = collector_connection(amqp_url, collector.pid)
        if hit:
            found.append(hit)
        return hit is not None

    wait_until(connected, 30, "the collector's connection in the management API")
    worker_id, connection_name = found[-1]
    names = Names(settings.prefix)
    wanted = {names.collector_tasks, names.collector_control(worker_id)}
    vhost = quote(vhost_of(amqp_url), safe="")
    listed: dict[str, str] = {}

    def consuming() -> bool:
        # A consumer's channel_details.connection_name is the broker's name of the connection
        # ("peer -> node"); the client-provided name is on the connection record.
        ours = {
            conn["name"]: conn["client_properties"]["connection_name"]
            for conn in connections(amqp_url)
            if conn.get("client_properties", {}).get("connection_name", "").startswith(f"warren-collector-{worker_id}")
        }
        for consumer in api(amqp_url, "GET", f"/api/consumers/{vhost}"):
            queue = consumer["queue"]["name"]
            details = consumer.get("channel_details")
            if not isinstance(details, dict):
                continue  # [] until the channel's first statistics reach the management database
            owner = ours.get(details.get("connection_name", ""))
            if queue in wanted and owner is not None:
                listed[queue] = owner
        return set(listed) == wanted

    wait_until(consuming, 30, f"consumers on {sorted(wanted)}")
    assert all(owner.endswith(f":{collector.pid}") for owner in listed.values()), listed
    (record,) = [
        c for c in connections(amqp_url) if c.get("client_properties", {}).get("connection_name") == connection_name
    ]
    assert record["client_properties"].get("product") == "warren"
    assert record.get("user_provided_name", connection_name) == connection_name  # the UI's Connections tab


def test_prometheus_endpoint_reports_warren_queues(
    settings: Settings, amqp_url: str, request: pytest.FixtureRequest
) -> None:
    # Decided from what the broker has, as scripts/test does for the management API: its own
    # endpoint when it has the plugin (WARREN_PROMETHEUS_URL, or the listener its management
    # API lists), else a private node of this session, which has it. Only an endpoint the
    # broker says it has and that does not answer is a failure.
    try:
        endpoint = prometheus_url(amqp_url)
    except (OSError, ValueError):
        endpoint = None  # no management API to ask either: the private node has both
    if endpoint is None:
        node: PrivateNode = request.getfixturevalue("private_broker")
        node.ensure_running()
        endpoint, amqp_url = node.prometheus_url, node.amqp_url
        settings = settings.replace(amqp_url=amqp_url)
    names = Names(settings.prefix)
    with BrokerLink(settings, "test") as link:
        link.declare(names.collector_tasks_decl())
        try:
            check_prometheus_endpoint(endpoint, amqp_url, names.collector_tasks)
        finally:
            link.delete_queue(names.collector_tasks)


def check_prometheus_endpoint(endpoint: str, amqp_url: str, queue: str) -> None:
    vhost = quote(vhost_of(amqp_url), safe="")
    url = f"{endpoint}/metrics/detailed?vhost={vhost}&family=queue_coarse_metrics"
    try:
        urllib.request.urlopen(endpoint + "/metrics", timeout=5).close()
    except (urllib.error.URLError, OSError) as exc:
        if CI:
            raise
        pytest.skip(f"the broker lists a Prometheus endpoint at {endpoint}, which does not answer: {exc}")
    needle = f'rabbitmq_detailed_queue_messages_ready{{vhost="{vhost_of(amqp_url)}",queue="{queue}"}}'

    def reported() -> bool:
        with urllib.request.urlopen(url, timeout=10) as response:
            body: bytes = response.read()
        return needle in body.decode()

    wait_until(reported, 30, f"{queue} in {url}")
