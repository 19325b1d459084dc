"""The coordinator's figures: the run's progress for Prometheus, and its curves for TensorBoard.

The coordinator knows what no single worker does: the run's env steps and samples, every
evaluation, which tasks ran, failed or were run again, how far the learner lags. Its
:class:`RunTelemetry` is told of each task's launch and end and ticks every liveness
check; the run's counters themselves (:class:`~worker.coordinator.stats.RunStats`) are
read when Prometheus scrapes. TensorBoard's x axis here is the run's env steps.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Final

from worker.coordinator.stats import RunStats
from worker.coordinator.task import Kind, Task
from worker.protocol import FinishInfo
from worker.telemetry.collector import TASK_DURATION_BUCKETS_S
from worker.telemetry.tensorboard import ScalarLog, board_for

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram
    from prometheus_client.core import Metric

    from worker.config import CoordinatorConfig
    from worker.telemetry.metrics import MetricsEndpoint

#: Shortest time between two TensorBoard points of the run's rates and counters.
BOARD_INTERVAL_S: Final = 2.0


class RunTelemetry:
    """The run's metrics (``endpoint``) and TensorBoard scalars (``board``); either may be absent.

    Args:
        stats: the run's counters, read at each scrape.
        endpoint: the coordinator's Prometheus endpoint (``None``: no metrics).
        board: the coordinator's TensorBoard log (``None``: no event file).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        stats: RunStats,
        *,
        endpoint: MetricsEndpoint | None = None,
        board: ScalarLog | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stats = stats
        self.endpoint = endpoint
        self.board = board
        self._clock = clock
        self.workers_alive = 0
        """Workers running one of the run's tasks, at the last tick."""
        self.tasks: dict[tuple[str, str], int] = {}
        """The run's tasks by kind and state, at the last tick."""
        self._launched: dict[str, float] = {}
        self._last_point: tuple[float, int, int] | None = None  # time, env steps, samples
        self._next_point = 0.0
        self._counts = _TaskCounters(endpoint) if endpoint is not None else None
        if endpoint is not None:
            endpoint.register(_RunCollector(self, endpoint.label_values))

    @classmethod
    def from_config(cls, config: CoordinatorConfig, stats: RunStats) -> RunTelemetry:
        """What ``config`` asks for: metrics when it has a port, TensorBoard when it has a directory.

        Raises:
            ConfigurationError: the TensorBoard directory cannot be written.
        """
        endpoint = None
        if config.metrics_port:
            from worker.telemetry.metrics import MetricsEndpoint

            endpoint = MetricsEndpoint("coordinator")
        return cls(stats, endpoint=endpoint, board=board_for(config.tensorboard_dir, "coordinator"))

    def serve(self, addr: str, port: int) -> None:
        """Serve ``/metrics`` (nothing without an endpoint).

        Raises:
            ConfigurationError: the address cannot be served.
        """
        if self.endpoint is not None:
            self.endpoint.serve(addr, port)

    # -- what the coordinator reports -----------------------------------------------------

    def task_launched(self, task: Task) -> None:
        self._launched[task.task_id] = self._clock()
        if self._counts is not None:
            self._counts.started[task.kind].inc()

    def task_completed(self, task: Task, finish: FinishInfo | None) -> None:
        """``task`` completed; ``finish`` is its close reply (``None``: its worker gave none)."""
        launched = self._launched.pop(task.task_id, None)
        if self._counts is not None:
            failed = finish is not None and finish.error is not None
            (self._counts.failed if failed else self._counts.finished)[task.kind].inc()
            if task.silenced:  # closed for its silence: it runs again elsewhere (RunStats counts it so too)
                self._counts.rerun[task.kind].inc()
            if launched is not None:  # not a task adopted from an earlier coordinator
                self._counts.duration[task.kind].observe(self._clock() - launched)
        if self.board is None or finish is None or finish.error or not finish.real_episode_count:
            return
        if task.kind is Kind.EVAL:
            values = {
                "eval/return": finish.reward_mean,
                "eval/return_std": finish.reward_std,
                "eval/episode_length": finish.avg_step_per_episode,
            }
        else:
            values = {
                "collect/episode_return": finish.reward_mean,
                "collect/episode_length": finish.avg_step_per_episode,
            }
        self.board.add(values, self.stats.env_steps)

    def task_dropped(self, task: Task, rerun: bool) -> None:
        self._launched.pop(task.task_id, None)
        if rerun and self._counts is not None:
            self._counts.rerun[task.kind].inc()

    def tick(self, tasks: Iterable[Task], workers_alive: int, *, final: bool = False) -> None:
        """The run's state now (from the coordinator's liveness check); a TensorBoard point when due.

        ``final``: the run is over, the point is written whenever the last one was.
        """
        self.workers_alive = workers_alive
        self.tasks = dict(collections.Counter((task.kind.value, task.state.value) for task in tasks))
        now = self._clock()
        if self.board is None or (now < self._next_point and not final):
            return
        self._next_point = now + BOARD_INTERVAL_S
        stats = self.stats
        ratio = stats.replay_ratio()
        values = {
            "run/policy_version": float(stats.policy_iter),
            "run/tasks_done": float(stats.tasks_done),
            "run/tasks_rerun": float(stats.tasks_rerun),
            "run/workers": float(workers_alive),
            "run/held_back": 1.0 if stats.held_back else 0.0,
        }
        if self._last_point is not None:
            then, steps, samples = self._last_point
            if now > then:
                values["throughput/env_steps_per_s"] = (stats.env_steps - steps) / (now - then)
                values["throughput/samples_per_s"] = (stats.samples - samples) / (now - then)
        if ratio is not None:  # the learner's counters seen (unknown where the volume is not)
            values["run/replay_ratio"] = ratio
        self._last_point = (now, stats.env_steps, stats.samples)
        self.board.add(values, stats.env_steps)

    def close(self) -> None:
        """Stop serving and writing (idempotent)."""
        if self.board is not None:
            self.board.close()
        if self.endpoint is not None:
            self.endpoint.close()


class _TaskCounters:
    """The coordinator's task counters, by kind: counted as the tasks come and go."""

    def __init__(self, endpoint: MetricsEndpoint) -> None:
        values = endpoint.label_values

        def by_kind(name: str, doc: str) -> dict[Kind, Counter]:
            family = endpoint.counter(name, doc, ["kind"])
            return {kind: family.labels(*values, kind.value) for kind in Kind}

        self.started = by_kind("warren_tasks_started_total", "Tasks the coordinator launched.")
        self.finished = by_kind("warren_tasks_finished_total", "Tasks completed without an error.")
        self.failed = by_kind("warren_tasks_failed_total", "Tasks completed with an error (env, policy...).")
        self.rerun = by_kind(
            "warren_tasks_rerun_total", "Tasks given up to run again (their worker died, left or was busy, or it hung)."
        )
        duration = endpoint.histogram(
            "warren_task_duration_seconds",
            "From a task's launch to its completion, as the coordinator saw it.",
            TASK_DURATION_BUCKETS_S,
            ["kind"],
        )
        self.duration: dict[Kind, Histogram] = {kind: duration.labels(*values, kind.value) for kind in Kind}


class _RunCollector:
    """The run's counters (:class:`RunStats`) and state as metrics, read at each scrape."""

    def __init__(self, telemetry: RunTelemetry, label_values: tuple[str, str]) -> None:
        self.telemetry = telemetry
        self.values = list(label_values)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats, values, labels = self.telemetry.stats, self.values, ["role", "worker_id"]

        def one(family: CounterMetricFamily | GaugeMetricFamily, value: float) -> Metric:
            family.add_metric(values, value)
            return family

        yield one(
            CounterMetricFamily("warren_run_env_steps", "The run's env steps (collect tasks).", labels=labels),
            stats.env_steps,
        )
        yield one(
            CounterMetricFamily("warren_run_samples", "Samples of the data forwarded to the learner.", labels=labels),
            stats.samples,
        )
        yield one(
            CounterMetricFamily("warren_run_episodes", "Episodes the collect tasks finished.", labels=labels),
            stats.episodes,
        )
        yield one(CounterMetricFamily("warren_run_evals", "Evaluations finished.", labels=labels), stats.evals)
        if stats.last_eval is not None and stats.best_eval is not None:
            yield one(
                GaugeMetricFamily("warren_run_eval_return", "Mean return of the last evaluation.", labels=labels),
                stats.last_eval,
            )
            yield one(
                GaugeMetricFamily("warren_run_best_eval_return", "Best evaluation return so far.", labels=labels),
                stats.best_eval,
            )
        ratio = stats.replay_ratio()
        if ratio is not None:
            yield one(
                GaugeMetricFamily(
                    "warren_run_replay_ratio", "The learner's updates per sample it learned from.", labels=labels
                ),
                ratio,
            )
        yield one(
            GaugeMetricFamily(
                "warren_policy_version", "Newest learner iteration seen in the data and evaluations.", labels=labels
            ),
            stats.policy_iter,
        )
        yield one(
            GaugeMetricFamily(
                "warren_run_held_back", "1 while collect tasks are held back (the learner is behind).", labels=labels
            ),
            1.0 if stats.held_back else 0.0,
        )
        yield one(
            GaugeMetricFamily("warren_run_workers", "Workers running one of the run's tasks.", labels=labels),
            self.telemetry.workers_alive,
        )
        tasks = GaugeMetricFamily(
            "warren_run_tasks",
            "The run's tasks by kind and state (starting, running, closing).",
            labels=[*labels, "kind", "state"],
        )
        for (kind, state), count in sorted(self.telemetry.tasks.items()):
            tasks.add_metric([*values, kind, state], count)
        yield tasks
