"""The learner's figures, fed from its loop: Prometheus metrics and TensorBoard scalars.

The learner calls one method per event (a train step, data taken in, a policy written,
its backlog looked at) and :meth:`LearnerTelemetry.record` with whatever dict of losses
and statistics its algorithm's update returned: nothing here knows DQN. Every call is
cheap enough for every train step (a few plain additions, on the learner's thread):
Prometheus reads the counters when it scrapes, and TensorBoard gets the means of each
interval of :data:`BOARD_INTERVAL_S`, at the learner's iteration (its x axis). Each
interval also gives the learner's busy share (seconds in updates over the interval's), and
on a GPU the device's utilisation and memory (:class:`~worker.telemetry.device.DeviceMonitor`).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Final

from worker.telemetry.tensorboard import Means, ScalarLog, board_for

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from worker.config import LearnerConfig
    from worker.telemetry.device import DeviceMonitor
    from worker.telemetry.metrics import MetricsEndpoint

#: Seconds between two TensorBoard points of the learner (and two updates of its mean statistics).
BOARD_INTERVAL_S: Final = 1.0
#: Seconds between two looks at the learner's queue (a broker round trip each).
BACKLOG_INTERVAL_S: Final = 2.0
#: Upper bounds (seconds) of the train step duration buckets.
TRAIN_STEP_BUCKETS_S: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
#: Why a data message was skipped (:meth:`LearnerTelemetry.skipped`).
SKIP_REASONS: Final = ("duplicate", "missing", "corrupt", "stale")


class LearnerTelemetry:
    """Counts and means of the learner; serves them on ``endpoint`` and writes them to ``board``.

    Args:
        endpoint: the learner's Prometheus endpoint (``None``: no metrics).
        board: the learner's TensorBoard log (``None``: no event file).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        *,
        endpoint: MetricsEndpoint | None = None,
        board: ScalarLog | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self.board = board
        self.active = endpoint is not None or board is not None
        """Whether anything reads the figures: without, every call returns at once."""
        self._clock = clock
        self.train_steps = 0
        self.train_seconds = 0.0
        self.train_buckets = [0] * (len(TRAIN_STEP_BUCKETS_S) + 1)
        self.samples = 0
        self.messages = 0
        self.skips = dict.fromkeys(SKIP_REASONS, 0)
        self.policies_written = 0
        self.policy_version = 0
        self.samples_waiting = 0.0
        self.policy_lag = 0.0
        """Mean policy lag of the data taken in during the last interval."""
        self.step = 0
        """The learner's newest iteration: the x of TensorBoard points."""
        self.statistics: dict[str, float] = {}
        """Each statistic's mean over the last interval (what Prometheus shows)."""
        self.busy = 0.0
        """Share of the last interval's wall time spent in updates (the rest, the learner waited or read)."""
        self.device: DeviceMonitor | None = None
        """The learner's GPU, sampled once an interval (``None``: on the CPU)."""
        self.device_figures: dict[str, float] = {}
        """The GPU's newest sample (:meth:`DeviceMonitor.sample`)."""
        self._means = Means()
        self._lags = Means()
        self._next_board = clock() + BOARD_INTERVAL_S
        self._next_backlog = clock()
        # time, train steps, their seconds and the samples at the end of the last interval
        self._last_point: tuple[float, int, float, int] = (clock(), 0, 0.0, 0)
        if endpoint is not None:
            endpoint.register(_LearnerCollector(self, endpoint.label_values))

    @classmethod
    def from_config(cls, config: LearnerConfig) -> LearnerTelemetry:
        """What ``config`` asks for: metrics when it has a port, TensorBoard when it has a directory.

        Raises:
            ConfigurationError: the TensorBoard directory cannot be written.
        """
        endpoint = None
        if config.metrics_port:
            from worker.telemetry.metrics import MetricsEndpoint

            endpoint = MetricsEndpoint("learner")
        return cls(endpoint=endpoint, board=board_for(config.tensorboard_dir, "learner"))

    def serve(self, addr: str, port: int) -> None:
        """Serve ``/metrics`` (nothing without an endpoint).

        Raises:
            ConfigurationError: the address cannot be served.
        """
        if self.endpoint is not None:
            self.endpoint.serve(addr, port)

    # -- what the learner reports -------------------------------------------------------

    def train_step(self, duration_s: float) -> None:
        """One update of the algorithm took ``duration_s``."""
        if not self.active:
            return
        self.train_steps += 1
        self.train_seconds += duration_s
        self.train_buckets[bisect.bisect_left(TRAIN_STEP_BUCKETS_S, duration_s)] += 1

    def record(self, statistics: Mapping[str, float], step: int) -> None:
        """The algorithm's losses and statistics of one update, at the learner's iteration ``step``."""
        if not self.active:
            return
        self._means.add(statistics)
        self.step = step
        if self._clock() >= self._next_board:
            self._point()

    def ingested(self, samples: int, policy_lag: int) -> None:
        """A data message's ``samples`` were taken in, collected ``policy_lag`` iterations ago."""
        if not self.active:
            return
        self.samples += samples
        self.messages += 1
        self._lags.add({"policy_lag": policy_lag})
        if self._clock() >= self._next_board:
            self._point()

    def skipped(self, reason: str) -> None:
        """A data message was settled without learning from it (one of :data:`SKIP_REASONS`)."""
        self.skips[reason] = self.skips.get(reason, 0) + 1

    def policy_written(self, version: int) -> None:
        """The policy of iteration ``version`` was written for the collectors."""
        self.policies_written += 1
        self.policy_version = version

    def backlog_due(self) -> bool:
        """Whether to look at the learner's queue now (every :data:`BACKLOG_INTERVAL_S`, and only with a reader)."""
        if not self.active:
            return False
        now = self._clock()
        if now < self._next_backlog:
            return False
        self._next_backlog = now + BACKLOG_INTERVAL_S
        return True

    def backlog(self, messages: int) -> None:
        """``messages`` data messages wait in the learner's queue: samples waiting, at this run's mean per message."""
        per_message = self.samples / self.messages if self.messages else 0.0
        self.samples_waiting = messages * per_message

    def close(self) -> None:
        """The last TensorBoard point, then stop serving and writing (idempotent)."""
        if not self.active:
            return
        self.active = False
        if self.board is not None:
            self._point()
            self.board.close()
        if self.endpoint is not None:
            self.endpoint.close()

    # -- TensorBoard ----------------------------------------------------------------------

    def _point(self) -> None:
        """Close the interval: new means for Prometheus, and one TensorBoard point of each tag."""
        now = self._clock()
        self._next_board = now + BOARD_INTERVAL_S
        means = self._means.take()
        if means:
            self.statistics = means
        lag = self._lags.take().get("policy_lag")
        if lag is not None:
            self.policy_lag = lag
        then, steps_then, seconds_then, samples_then = self._last_point
        self._last_point = (now, self.train_steps, self.train_seconds, self.samples)
        if now > then:
            self.busy = min(1.0, (self.train_seconds - seconds_then) / (now - then))
        if self.device is not None:
            self.device_figures = self.device.sample()
        if self.board is None:
            return
        values = {f"learner/{name}": value for name, value in means.items()}
        if lag is not None:
            values["learner/policy_lag"] = lag
        if now > then:
            values["learner/train_steps_per_s"] = (self.train_steps - steps_then) / (now - then)
            values["learner/samples_per_s"] = (self.samples - samples_then) / (now - then)
        if self.train_steps > steps_then:
            values["learner/train_step_ms"] = (
                1000.0 * (self.train_seconds - seconds_then) / (self.train_steps - steps_then)
            )
        if self.samples:
            values["learner/replay_ratio"] = self.train_steps / self.samples
        values["learner/samples_waiting"] = self.samples_waiting
        values["learner/busy"] = self.busy
        values.update({f"learner/device_{name}": value for name, value in self.device_figures.items()})
        self.board.add(values, self.step)


class _LearnerCollector:
    """The learner's counters as Prometheus metrics, built at each scrape (no lock on the learner's side)."""

    def __init__(self, telemetry: LearnerTelemetry, label_values: tuple[str, str]) -> None:
        self.telemetry = telemetry
        self.values = list(label_values)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        from worker.telemetry.metrics import cumulative_buckets

        t, values = self.telemetry, self.values
        labels = ["role", "worker_id"]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        yield counter("warren_learner_train_steps", "Updates of the algorithm (train steps).", t.train_steps)
        duration = HistogramMetricFamily(
            "warren_learner_train_step_seconds", "Duration of one update of the algorithm.", labels=labels
        )
        duration.add_metric(values, cumulative_buckets(TRAIN_STEP_BUCKETS_S, list(t.train_buckets)), t.train_seconds)
        yield duration
        yield counter("warren_learner_samples_ingested", "Samples taken into the replay buffer.", t.samples)
        yield counter("warren_learner_messages_ingested", "Data messages whose step file was learned from.", t.messages)
        skipped = CounterMetricFamily(
            "warren_learner_messages_skipped",
            "Data messages settled without learning from them: a duplicate delivery, a missing or a corrupt file.",
            labels=[*labels, "reason"],
        )
        for reason, count in sorted(t.skips.items()):
            skipped.add_metric([*values, reason], count)
        yield skipped
        yield gauge(
            "warren_learner_samples_waiting",
            "Samples in the data messages waiting in the learner's queue (messages x mean samples per message).",
            t.samples_waiting,
        )
        yield gauge(
            "warren_learner_busy_ratio",
            "Share of the learner's wall time spent in updates over the last interval (about a second).",
            t.busy,
        )
        figures = t.device_figures
        if "utilization" in figures:
            yield gauge(
                "warren_learner_device_utilization_ratio",
                "Share of the last sample period the learner's GPU was running a kernel (NVML).",
                figures["utilization"],
            )
        memory = {k.removeprefix("memory_"): v for k, v in figures.items() if k.startswith("memory_")}
        if memory:
            family = GaugeMetricFamily(
                "warren_learner_device_memory_bytes",
                "The learner's GPU memory: allocated and reserved by torch, used and total on the device.",
                labels=[*labels, "kind"],
            )
            for kind, value in sorted(memory.items()):
                family.add_metric([*values, kind], value)
            yield family
        yield gauge("warren_policy_version", "Learner iteration of the newest policy written.", t.policy_version)
        yield counter("warren_learner_policies_written", "Policy files written for the collectors.", t.policies_written)
        yield gauge(
            "warren_learner_policy_lag_iterations",
            "Iterations between the policy that collected the data taken in and the learner's (mean, last second).",
            t.policy_lag,
        )
        statistic = GaugeMetricFamily(
            "warren_learner_statistic",
            "The algorithm's losses and statistics: each one's mean over the last second of updates.",
            labels=[*labels, "name"],
        )
        for name, value in sorted(t.statistics.items()):
            statistic.add_metric([*values, name], value)
        yield statistic
