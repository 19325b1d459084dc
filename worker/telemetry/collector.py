"""What a collector worker counts for its ``/metrics``: its tasks, and what their rollouts produced.

Two places count. The worker's service counts tasks started and ended (on its handler
threads); each task's :class:`~worker.collector.sink.BrokerSink` counts chunks, samples,
bytes and env steps (on the task's thread), through a :class:`TaskMeter`. The sink is
built deep inside a task's run, so it finds the process's metrics through
:func:`installed` rather than through every constructor on the way there (a process has
one ``/metrics``, as it has one registry); without metrics it gets the no-op base
classes here, and counting costs a method call per chunk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from worker.protocol import FinishInfo

if TYPE_CHECKING:
    from worker.config import CollectorConfig
    from worker.telemetry.metrics import MetricsEndpoint

#: Upper bounds (seconds) of the task duration buckets: tens of ms (a 2,048-sample task) to minutes.
TASK_DURATION_BUCKETS_S: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
KINDS: Final = ("collect", "eval")


def kind_of(eval_flag: bool) -> str:
    return "eval" if eval_flag else "collect"


class TaskMeter:
    """One task's counting, fed by its sink (this base counts nothing)."""

    def chunk_written(self, path: Path, meta: Mapping[str, Any]) -> None:
        """A step file was written: ``meta`` is the chunk's metadata (counters, ``policy_iter``)."""

    def chunk_published(self) -> None:
        """The metadata naming the last chunk written was published."""

    def info(self, info: Mapping[str, Any]) -> None:
        """A collector info (its counters) was published."""

    def confirmed(self) -> None:
        """The broker confirmed everything the task published so far."""


class CollectorMetrics:
    """A collector worker's metrics; this base counts nothing (a worker without ``/metrics``)."""

    def task_started(self, eval_flag: bool) -> None:
        """The worker took a start task."""

    def task_ended(self, finish: FinishInfo) -> None:
        """A task the worker ran is over (closed, abandoned or stopped): its finish info."""

    def task_meter(self) -> TaskMeter:
        """The meter of a task about to run."""
        return _NO_METER

    def close(self) -> None:
        """Stop serving ``/metrics`` (if it was served)."""


_NO_METER: Final = TaskMeter()
_installed: CollectorMetrics = CollectorMetrics()


def install(metrics: CollectorMetrics) -> None:
    """Make ``metrics`` the process's: the sinks of the tasks started from now on count into it."""
    global _installed
    _installed = metrics


def installed() -> CollectorMetrics:
    """The process's collector metrics (no-op until :func:`install`)."""
    return _installed


def collector_metrics(config: CollectorConfig) -> CollectorMetrics:
    """The worker's metrics, serving ``/metrics`` already when ``config.metrics_port`` asks for it.

    Raises:
        ConfigurationError: the metrics address cannot be served.
    """
    if not config.metrics_port:
        return CollectorMetrics()
    from worker.telemetry.metrics import MetricsEndpoint

    endpoint = MetricsEndpoint("collector", config.worker_id)
    metrics = PrometheusCollectorMetrics(endpoint)
    endpoint.serve(config.metrics_addr, config.metrics_port)
    return metrics


class PrometheusCollectorMetrics(CollectorMetrics):
    """:class:`CollectorMetrics` as Prometheus counters of ``endpoint``."""

    def __init__(self, endpoint: MetricsEndpoint) -> None:
        self.endpoint = endpoint
        e, values = endpoint, endpoint.label_values
        env_steps = e.counter("warren_env_steps_total", "Env steps the worker's tasks ran.", ["kind"])
        episodes = e.counter("warren_episodes_total", "Episodes the worker's tasks finished.", ["kind"])
        started = e.counter("warren_tasks_started_total", "Start tasks the worker took.", ["kind"])
        finished = e.counter(
            "warren_tasks_finished_total", "Tasks that ran to their end (collector_done, no error).", ["kind"]
        )
        failed = e.counter("warren_tasks_failed_total", "Tasks that ended with an error.", ["kind"])
        stopped = e.counter(
            "warren_tasks_stopped_total",
            "Tasks ended before their end without an error (closed early, worker shutdown, reader gone).",
            ["kind"],
        )
        duration = e.histogram(
            "warren_task_duration_seconds", "Run time of the worker's tasks.", TASK_DURATION_BUCKETS_S, ["kind"]
        )
        self.env_steps = {kind: env_steps.labels(*values, kind) for kind in KINDS}
        self.episodes = {kind: episodes.labels(*values, kind) for kind in KINDS}
        self.started = {kind: started.labels(*values, kind) for kind in KINDS}
        self.finished = {kind: finished.labels(*values, kind) for kind in KINDS}
        self.failed = {kind: failed.labels(*values, kind) for kind in KINDS}
        self.stopped = {kind: stopped.labels(*values, kind) for kind in KINDS}
        self.duration = {kind: duration.labels(*values, kind) for kind in KINDS}
        self.samples = e.counter("warren_samples_written_total", "Samples (transitions) written to step files.").labels(
            *values
        )
        self.bytes = e.counter("warren_step_file_bytes_written_total", "Bytes of step files written.").labels(*values)
        self.chunks_published = e.counter(
            "warren_chunks_published_total", "Step files whose data metadata was published."
        ).labels(*values)
        self.chunks_confirmed = e.counter(
            "warren_chunks_confirmed_total",
            "Step files whose data metadata the broker confirmed (counted when a task's data is confirmed, "
            "before its last info).",
        ).labels(*values)
        self.policy_version = e.gauge(
            "warren_policy_version", "Learner iteration of the policy the newest chunk was collected with."
        ).labels(*values)
        self.busy = e.gauge("warren_collector_busy", "1 while the worker runs a task, else 0.").labels(*values)

    def task_started(self, eval_flag: bool) -> None:
        self.started[kind_of(eval_flag)].inc()
        self.busy.set(1)

    def task_ended(self, finish: FinishInfo) -> None:
        kind = kind_of(finish.eval_flag)
        if finish.error is not None:
            self.failed[kind].inc()
        elif finish.collector_done:
            self.finished[kind].inc()
        else:
            self.stopped[kind].inc()
        self.duration[kind].observe(finish.duration)
        self.busy.set(0)

    def task_meter(self) -> TaskMeter:
        return _PrometheusTaskMeter(self)

    def close(self) -> None:
        self.endpoint.close()


class _PrometheusTaskMeter(TaskMeter):
    """Turns a task's growing counters (``cur_step``, ``cur_episode``) into counter increments."""

    def __init__(self, metrics: PrometheusCollectorMetrics) -> None:
        self.metrics = metrics
        self._steps = 0
        self._episodes = 0
        self._unconfirmed = 0

    def _count(self, message: Mapping[str, Any]) -> None:
        kind = kind_of(bool(message.get("eval_flag")))
        steps, episodes = int(message.get("cur_step", 0)), int(message.get("cur_episode", 0))
        if steps > self._steps:
            self.metrics.env_steps[kind].inc(steps - self._steps)
            self._steps = steps
        if episodes > self._episodes:
            self.metrics.episodes[kind].inc(episodes - self._episodes)
            self._episodes = episodes

    def chunk_written(self, path: Path, meta: Mapping[str, Any]) -> None:
        m = self.metrics
        m.samples.inc(int(meta.get("sample_count", 0)))
        with contextlib.suppress(OSError):  # the learner took it already: its size is lost, nothing else
            m.bytes.inc(path.stat().st_size)
        m.policy_version.set(int(meta.get("policy_iter", 0)))
        self._count(meta)

    def chunk_published(self) -> None:
        self.metrics.chunks_published.inc()
        self._unconfirmed += 1

    def info(self, info: Mapping[str, Any]) -> None:
        self._count(info)

    def confirmed(self) -> None:
        if self._unconfirmed:
            self.metrics.chunks_confirmed.inc(self._unconfirmed)
            self._unconfirmed = 0
