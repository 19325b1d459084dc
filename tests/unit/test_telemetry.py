"""warren's Prometheus metrics and TensorBoard scalars, without a broker.

Scrapes go through prometheus_client's own HTTP server and parser; event files are read
back with tensorboard's EventAccumulator, as TensorBoard reads them.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from messaging import ConfigurationError, Settings
from messaging.stats import CONFIRM_BUCKETS_S, LinkStats
from tests.fake_bus import FakeBus
from tests.observe import scalars
from tests.unit.test_coordinator import data, finished, info, started
from worker.cli import build_parser
from worker.cli.run_plan import metrics_ports
from worker.collector.sink import BrokerSink
from worker.config import CollectorConfig, CoordinatorConfig, LearnerConfig, role_config
from worker.coordinator.loop import Coordinator
from worker.job import JobConfig
from worker.protocol import FinishInfo, Refusal, StartTask
from worker.storage import StepStore
from worker.storage.counters import LearnerCounters, counters_path, write_counters
from worker.telemetry.collector import PrometheusCollectorMetrics
from worker.telemetry.learner import BOARD_INTERVAL_S, LearnerTelemetry
from worker.telemetry.metrics import MetricsEndpoint, cumulative_buckets
from worker.telemetry.tensorboard import ScalarLog

ROOT = Path(__file__).resolve().parents[2]


def samples(endpoint: MetricsEndpoint) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of what a scrape of ``endpoint`` returns now."""
    found = {}
    for family in text_string_to_metric_families(endpoint.exposition().decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(endpoint: MetricsEndpoint, metric: str, /, **labels: str) -> float:
    """The value of the one sample ``metric`` whose labels include ``labels``."""
    hits = [v for (n, lbls), v in samples(endpoint).items() if n == metric and labels.items() <= dict(lbls).items()]
    assert len(hits) == 1, f"{metric} {labels}: {hits}"
    return hits[0]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def endpoint() -> Iterator[MetricsEndpoint]:
    e = MetricsEndpoint("collector", "w7")
    yield e
    e.close()


# -- the endpoint ------------------------------------------------------------------------


def test_a_role_serves_its_metrics_over_http_with_its_role_and_worker_id(endpoint: MetricsEndpoint) -> None:
    metrics = PrometheusCollectorMetrics(endpoint)
    metrics.task_started(eval_flag=False)
    port = endpoint.serve("127.0.0.1", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    started = families["warren_tasks_started"]
    assert started.type == "counter"
    (sample,) = [s for s in started.samples if s.name == "warren_tasks_started_total" and s.labels["kind"] == "collect"]
    assert sample.labels == {"role": "collector", "worker_id": "w7", "kind": "collect"} and sample.value == 1
    assert families["warren_build_info"].samples[0].labels["role"] == "collector"
    assert "process_cpu_seconds" in families  # the client library's process metrics come along
    # Every warren metric carries both labels; counters end in _total, times are in seconds.
    for family in families.values():
        if family.name.startswith("warren_"):
            assert all({"role", "worker_id"} <= s.labels.keys() for s in family.samples), family.name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.name
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name
    endpoint.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_a_metrics_port_that_is_taken_is_a_clear_configuration_error(endpoint: MetricsEndpoint) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            endpoint.serve("127.0.0.1", port)


def test_transport_counters_show_as_publisher_series_with_a_confirm_latency_histogram() -> None:
    stats = LinkStats()
    stats.published(3)
    stats.confirmed([0.0005, 0.003, 20.0])
    stats.nacked(2)
    stats.reconnected()
    counts = stats.counts()
    assert (counts.published, counts.confirmed, counts.nacked, counts.reconnects) == (3, 3, 2, 1)
    assert sum(counts.confirm_buckets) == 3 and counts.confirm_buckets[-1] == 1  # 20 s: above every bound
    buckets = cumulative_buckets(CONFIRM_BUCKETS_S, counts.confirm_buckets)
    assert buckets[0] == ("0.001", 1.0) and buckets[-1] == ("+Inf", 3.0)
    assert [count for _, count in buckets] == sorted(count for _, count in buckets)


# -- the collector ---------------------------------------------------------------------------


class Published:
    """Stands in for a task's metadata publisher (the real one is tested against the broker)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.flushes = 0

    def publish(self, message: dict[str, Any], *, headers: dict[str, Any] | None = None) -> None:
        self.messages.append(message)

    def flush(self, timeout_s: float) -> None:
        self.flushes += 1


def chunk_meta(*, steps: int, samples: int, policy_iter: int) -> dict[str, Any]:
    return {
        "eval_flag": False,
        "policy_iter": policy_iter,
        "unroll_len": 2,
        "env_num": 2,
        "sample_count": samples,
        "cur_episode": steps // 10,
        "cur_sample": steps,
        "cur_step": steps,
    }


def test_a_tasks_sink_counts_env_steps_samples_bytes_and_chunks(tmp_path: Path, endpoint: MetricsEndpoint) -> None:
    metrics = PrometheusCollectorMetrics(endpoint)
    store = StepStore(tmp_path)
    sink = BrokerSink(store, Published(), task_id="t1", buffer_id="main", meter=metrics.task_meter())  # type: ignore[arg-type]
    chunk: dict[str, np.ndarray] = {"obs": np.zeros((2, 2, 4), np.float32), "action": np.zeros((2, 2), np.int64)}
    # When a task writes two chunks (4 steps each) and ends 2 steps later
    sink.add_chunk(chunk, chunk_meta(steps=4, samples=4, policy_iter=3))
    sink.add_chunk(chunk, chunk_meta(steps=8, samples=4, policy_iter=5))
    sizes = sum(store.path(data_id).stat().st_size for data_id in sink.written)
    assert value(endpoint, "warren_chunks_confirmed_total") == 0  # nothing flushed yet
    sink.add_info({"eval_flag": False, "collector_done": True, "cur_episode": 1, "cur_sample": 8, "cur_step": 10})
    # Then the counters add the task's counters up, once each
    assert value(endpoint, "warren_env_steps_total", kind="collect") == 10
    assert value(endpoint, "warren_episodes_total", kind="collect") == 1
    assert value(endpoint, "warren_samples_written_total") == 8
    assert value(endpoint, "warren_step_file_bytes_written_total") == sizes > 0
    assert value(endpoint, "warren_chunks_published_total") == 2
    assert value(endpoint, "warren_chunks_confirmed_total") == 2  # confirmed before the done info
    assert value(endpoint, "warren_policy_version") == 5
    # A second task's counters start again from 0: its meter counts its own increments
    other = BrokerSink(store, Published(), task_id="t2", buffer_id="main", meter=metrics.task_meter())  # type: ignore[arg-type]
    other.add_chunk(chunk, chunk_meta(steps=4, samples=4, policy_iter=6))
    assert value(endpoint, "warren_env_steps_total", kind="collect") == 14


def outcome(*, eval_flag: bool, done: bool, error: str | None = None) -> FinishInfo:
    measured = finished(eval_flag=eval_flag, train_iter=1, steps=10, returns=[1.0])
    return dataclasses.replace(measured, collector_done=done, error=error, duration=0.3)


def test_the_collector_counts_each_task_outcome_by_kind(endpoint: MetricsEndpoint) -> None:
    metrics = PrometheusCollectorMetrics(endpoint)
    for eval_flag, done, error in [(False, True, None), (False, True, "env crashed"), (True, False, None)]:
        metrics.task_started(eval_flag=eval_flag)
        metrics.task_ended(outcome(eval_flag=eval_flag, done=done, error=error))
    assert value(endpoint, "warren_tasks_started_total", kind="collect") == 2
    assert value(endpoint, "warren_tasks_finished_total", kind="collect") == 1
    assert value(endpoint, "warren_tasks_failed_total", kind="collect") == 1
    assert value(endpoint, "warren_tasks_stopped_total", kind="eval") == 1
    assert value(endpoint, "warren_task_duration_seconds_count", kind="collect") == 2
    assert value(endpoint, "warren_task_duration_seconds_sum", kind="collect") == pytest.approx(0.6)
    assert value(endpoint, "warren_collector_busy") == 0


# -- the learner ------------------------------------------------------------------------------


def test_the_learner_writes_the_means_of_its_statistics_to_tensorboard_at_its_iteration(tmp_path: Path) -> None:
    clock = Clock()
    endpoint = MetricsEndpoint("learner")
    telemetry = LearnerTelemetry(endpoint=endpoint, board=ScalarLog(tmp_path / "learner"), clock=clock)
    # When the learner takes in 2 messages of 64 samples and trains 4 steps in its first second
    telemetry.ingested(64, policy_lag=2)
    telemetry.ingested(64, policy_lag=4)
    for step, loss in enumerate([1.0, 2.0, 3.0, 6.0], start=1):
        telemetry.train_step(0.002)
        telemetry.record({"loss": loss, "q_mean": 10.0}, step=step)
    telemetry.backlog(3)  # 3 messages wait in its queue
    clock.now += BOARD_INTERVAL_S
    telemetry.record({"loss": 8.0, "q_mean": 12.0}, step=5)  # the interval is over: one point
    telemetry.close()
    # Then TensorBoard shows one point per interval, each the interval's mean, at the iteration
    board = scalars(tmp_path / "learner")
    assert board["learner/loss"][0] == (5, 4.0)
    assert board["learner/q_mean"][0] == pytest.approx((5, 10.4))
    assert board["learner/policy_lag"][0] == (5, 3.0)
    assert board["learner/samples_waiting"][0] == (5, 192.0)  # 3 messages x 64 samples
    assert board["learner/replay_ratio"][0] == pytest.approx((5, 4 / 128))
    assert board["learner/train_steps_per_s"][0] == pytest.approx((5, 4 / BOARD_INTERVAL_S))
    assert board["learner/train_step_ms"][0] == pytest.approx((5, 2.0))
    # And Prometheus the counters (and the statistics' last means)
    assert value(endpoint, "warren_learner_train_steps_total") == 4
    assert value(endpoint, "warren_learner_train_step_seconds_count") == 4
    assert value(endpoint, "warren_learner_train_step_seconds_bucket", le="0.0025") == 4
    assert value(endpoint, "warren_learner_samples_ingested_total") == 128
    assert value(endpoint, "warren_learner_samples_waiting") == 192
    assert value(endpoint, "warren_learner_policy_lag_iterations") == 3
    assert value(endpoint, "warren_learner_statistic", name="loss") == 4.0


def test_a_learner_without_metrics_or_tensorboard_counts_nothing() -> None:
    telemetry = LearnerTelemetry.from_config(LearnerConfig())
    assert not telemetry.active
    telemetry.ingested(64, policy_lag=1)
    telemetry.train_step(0.1)
    telemetry.record({"loss": 1.0}, step=1)
    assert not telemetry.backlog_due()
    assert (telemetry.samples, telemetry.train_steps) == (0, 0)
    telemetry.close()


def test_a_failing_event_file_ends_the_tensorboard_log_without_stopping_the_role(tmp_path: Path) -> None:
    board = ScalarLog(tmp_path / "run")

    class Broken:
        def add_event(self, event: Any) -> None:
            raise OSError(28, "No space left on device")

        def close(self) -> None:
            raise OSError(28, "No space left on device")

    board._writer.close()
    board._writer = Broken()
    board.add({"a": 1.0}, 1)  # logged, not raised
    board.add({"a": 2.0}, 2)
    board.close()


def test_a_tensorboard_directory_that_cannot_be_made_is_a_configuration_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigurationError, match="cannot write TensorBoard events"):
        ScalarLog(blocker / "learner")


# -- the coordinator ----------------------------------------------------------------------------


def test_the_coordinator_writes_returns_rates_and_task_counts_at_the_runs_env_steps(tmp_path: Path) -> None:
    job = JobConfig.load(None, **{"coordinator.collect_tasks": 1, "coordinator.eval_interval_s": 3600.0})
    config = CoordinatorConfig(
        transport=Settings(prefix="p"),
        job=job,
        progress="off",
        metrics_port=1,  # an endpoint (not served: the test reads it directly)
        tensorboard_dir=tmp_path / "tb",
        path_policy=tmp_path / "policy",
    )
    # The learner's counters, where it writes them: the replay ratio the run reports
    (tmp_path / "policy").mkdir()
    write_counters(
        counters_path(tmp_path / "policy", job.coordinator.policy_name),
        LearnerCounters.now(train_steps=4, samples=128, policy_iter=4),
    )
    bus = FakeBus(idle_workers=1)
    coordinator = Coordinator(config, bus=bus)
    bus.open()
    endpoint = coordinator.telemetry.endpoint
    assert endpoint is not None
    # A collect task: 256 env steps, two episodes of return 10 and 30
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.push(queue, data(task_id, 1, steps=256))
    bus.push(queue, info(task_id, steps=256, done=True))
    coordinator.turn()
    bus.replies[bus.sent[-1].correlation_id] = finished(
        eval_flag=False, train_iter=7, steps=256, returns=[10.0, 30.0]
    ).to_wire()
    coordinator.turn()
    # An eval task with returns 50
    coordinator.schedule.next_eval = 0.0
    coordinator.turn()
    (evaluation,) = [s for s in bus.starts() if StartTask.from_wire(s.body).cfg.eval_flag]
    reply = bus.accept(evaluation, "w2")
    coordinator.turn()
    bus.push(reply.metadata_queue, info(reply.task_id, steps=500, done=True))
    coordinator.turn()
    bus.replies[bus.sent[-1].correlation_id] = finished(
        eval_flag=True, train_iter=9, steps=500, returns=[50.0]
    ).to_wire()
    coordinator.turn()
    coordinator._next_check = 0.0  # the liveness check, with its tick
    coordinator.turn()
    assert value(endpoint, "warren_tasks_started_total", kind="collect") >= 1
    assert value(endpoint, "warren_tasks_finished_total", kind="collect") == 1
    assert value(endpoint, "warren_tasks_finished_total", kind="eval") == 1
    assert value(endpoint, "warren_task_duration_seconds_count", kind="eval") == 1
    assert value(endpoint, "warren_run_env_steps_total") == 256
    assert value(endpoint, "warren_run_samples_total") == 8
    assert value(endpoint, "warren_run_eval_return") == 50.0
    assert value(endpoint, "warren_policy_version") == 9
    assert value(endpoint, "warren_run_tasks", kind="collect", state="starting") == 1  # the next one
    coordinator.telemetry.tick((), 0, final=True)
    coordinator.telemetry.close()
    board = scalars(tmp_path / "tb" / "coordinator")
    assert board["collect/episode_return"] == [(256, 20.0)]
    assert board["collect/episode_length"] == [(256, 128.0)]  # 256 env steps over 2 episodes
    assert board["eval/return"] == [(256, 50.0)]
    assert board["run/tasks_done"][-1] == (256, 2.0)
    assert board["run/policy_version"][-1] == (256, 9.0)
    assert "throughput/env_steps_per_s" in board and "run/replay_ratio" in board


def test_a_task_given_up_to_run_again_is_counted_as_a_rerun(tmp_path: Path) -> None:
    job = JobConfig.load(None, **{"coordinator.collect_tasks": 1, "coordinator.eval_interval_s": 3600.0})
    config = CoordinatorConfig(transport=Settings(prefix="p"), job=job, progress="off", metrics_port=1)
    bus = FakeBus(idle_workers=1)
    coordinator = Coordinator(config, bus=bus)
    bus.open()
    coordinator.turn()
    bus.refuse(bus.starts()[0], Refusal.WORKER_BUSY.value)
    coordinator.turn()
    assert coordinator.telemetry.endpoint is not None
    assert value(coordinator.telemetry.endpoint, "warren_tasks_rerun_total", kind="collect") == 1


# -- settings and processes -----------------------------------------------------------------------


def test_metrics_settings_follow_the_warren_variables_and_flags() -> None:
    env = {"WARREN_METRICS_PORT": "9464", "WARREN_METRICS_ADDR": "0.0.0.0", "WARREN_TENSORBOARD_DIR": "/tb"}
    learner = role_config(LearnerConfig, env)
    assert (learner.metrics_port, learner.metrics_addr, learner.tensorboard_dir) == (9464, "0.0.0.0", Path("/tb"))
    assert role_config(CollectorConfig, {}).metrics_port == 0  # off unless asked for
    assert role_config(CollectorConfig, env, metrics_port=9500).metrics_port == 9500  # a flag wins
    with pytest.raises(ConfigurationError, match="metrics_port"):
        CollectorConfig(metrics_port=70000)
    args = build_parser().parse_args(["learner", "--metrics-port", "9401", "--tensorboard-dir", "tb"])
    assert (args.metrics_port, args.tensorboard_dir) == (9401, Path("tb"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["collector", "--metrics-port", "70000"])


def test_warren_run_gives_each_process_its_own_metrics_port() -> None:
    assert metrics_ports(0, 2) == {}
    assert metrics_ports(9400, 2) == {"coordinator": 9400, "learner": 9401, "collector-0": 9402, "collector-1": 9403}
    with pytest.raises(ConfigurationError, match="above 65535"):
        metrics_ports(65534, 2)


def test_the_coordinator_and_warren_help_load_neither_torch_nor_the_telemetry_libraries(tmp_path: Path) -> None:
    program = f"""
import json, sys
from worker.cli import build_parser
build_parser().format_help()
helped = sorted(m for m in ("torch", "prometheus_client", "tensorboard") if m in sys.modules)
from pathlib import Path
from messaging import Settings
from worker.config import CoordinatorConfig
from worker.coordinator.loop import Coordinator
coordinator = Coordinator(CoordinatorConfig(metrics_port=1, tensorboard_dir=Path({str(tmp_path)!r})))
coordinator.telemetry.close()
print(json.dumps({{"help": helped, "coordinator_torch": "torch" in sys.modules}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert loaded == {"help": [], "coordinator_torch": False}
    assert list((tmp_path / "coordinator").glob("events.out.tfevents.*"))
