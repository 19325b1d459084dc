"""A role's Prometheus endpoint: its own registry, its labels and its ``/metrics`` server.

Every metric warren exports is named ``warren_...`` in base units (seconds, bytes;
counters end in ``_total``) and carries two labels: ``role`` (``collector``,
``learner``, ``coordinator``) and ``worker_id`` (a collector's worker id; for the
learner and the coordinator, of which a run has one each, the role's name). The
registry also holds the client library's process metrics (``process_cpu_seconds_total``,
``process_resident_memory_bytes``...) and the transport's counters
(:class:`TransportCollector`, read from :mod:`messaging.stats` at each scrape).

The server is prometheus_client's own, on a daemon thread: a scrape costs the role's
threads nothing but the GIL while the text is built.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterator, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from messaging import ConfigurationError, stats
from messaging.stats import CONFIRM_BUCKETS_S

logger = logging.getLogger(__name__)

#: The labels every warren metric carries, in this order.
LABELS = ("role", "worker_id")


def _version() -> str:
    try:
        return importlib.metadata.version("warren")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class MetricsEndpoint:
    """One role's metrics: create its metrics here, then :meth:`serve` them.

    Creating an endpoint turns on the transport's counters (:func:`messaging.stats.enable`)
    for the links the process opens from then on: create it before the role connects.

    Args:
        role: ``collector``, ``learner`` or ``coordinator``.
        worker_id: a collector's worker id; the role's name when ``None``.
    """

    def __init__(self, role: str, worker_id: str | None = None) -> None:
        self.role = role
        self.worker_id = worker_id or role
        # No ``<counter>_created`` series: Prometheus tells resets from the values themselves.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        stats.enable()
        self.registry.register(TransportCollector(self.label_values))
        build = Info("warren_build", "The warren version this process runs.", LABELS, registry=self.registry)
        build.labels(*self.label_values).info({"version": _version()})
        self._server: WSGIServer | None = None

    @property
    def label_values(self) -> tuple[str, str]:
        return self.role, self.worker_id

    # -- metrics ----------------------------------------------------------------------

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        """A counter with the role's labels plus ``labels``; ``name`` ends in ``_total``."""
        return Counter(name, documentation, (*LABELS, *labels), registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, documentation, (*LABELS, *labels), registry=self.registry)

    def histogram(
        self, name: str, documentation: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        return Histogram(name, documentation, (*LABELS, *labels), buckets=buckets, registry=self.registry)

    def register(self, collector: Collector) -> None:
        """Add a collector that builds its metrics at scrape time (from counters kept elsewhere)."""
        self.registry.register(collector)

    def exposition(self) -> bytes:
        """What a scrape of ``/metrics`` returns now (Prometheus' text format)."""
        return generate_latest(self.registry)

    # -- the server -------------------------------------------------------------------

    def serve(self, addr: str, port: int) -> int:
        """Serve ``/metrics`` on ``addr:port`` (0: any free port); returns the port.

        Raises:
            ConfigurationError: the address cannot be served (the port is taken, the
                address is not this machine's).
        """
        try:
            server, _thread = start_http_server(port, addr, registry=self.registry)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {addr}:{port} (WARREN_METRICS_ADDR, WARREN_METRICS_PORT): {exc}"
            ) from None
        self._server = server
        bound = int(server.server_port)
        logger.info("serving metrics on http://%s:%d/metrics", addr, bound)
        return bound

    def close(self) -> None:
        """Stop the server (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class TransportCollector(Collector):
    """The transport's counters (:mod:`messaging.stats`) as metrics, one series per link role.

    Args:
        label_values: the endpoint's ``role`` and ``worker_id``.
    """

    def __init__(self, label_values: tuple[str, str]) -> None:
        self.label_values = label_values

    def describe(self) -> list[Metric]:
        # Nothing to check against other collectors' names up front: they are all distinct.
        return []

    def collect(self) -> Iterator[Metric]:
        labels = [*LABELS, "link"]
        published = CounterMetricFamily(
            "warren_publisher_messages_published",
            "Messages handed to a confirmed publisher (metadata, data relayed to the learner).",
            labels=labels,
        )
        confirmed = CounterMetricFamily(
            "warren_publisher_messages_confirmed", "Published messages the broker confirmed.", labels=labels
        )
        nacked = CounterMetricFamily(
            "warren_publisher_messages_nacked",
            "Nacks from the broker (a full queue's back-pressure); a resend nacked again counts again.",
            labels=labels,
        )
        latency = HistogramMetricFamily(
            "warren_publisher_confirm_latency_seconds",
            "From publish() to the broker's confirm, resends after nacks included.",
            labels=labels,
        )
        reconnects = CounterMetricFamily(
            "warren_link_reconnects", "Broker connections lost and opened again.", labels=labels
        )
        for link, counts in sorted(stats.snapshot().items()):
            values = [*self.label_values, link]
            reconnects.add_metric(values, counts.reconnects)
            if not counts.published:
                continue  # a link that only consumes and answers: no publisher series
            published.add_metric(values, counts.published)
            confirmed.add_metric(values, counts.confirmed)
            nacked.add_metric(values, counts.nacked)
            latency.add_metric(
                values, cumulative_buckets(CONFIRM_BUCKETS_S, counts.confirm_buckets), counts.confirm_seconds
            )
        yield from (published, confirmed, nacked, latency, reconnects)


def cumulative_buckets(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """Counts per bucket (``counts[i]`` at most ``bounds[i]``, one more above them all) as
    Prometheus' cumulative ``le`` buckets, ``+Inf`` last."""
    labels = [repr(float(bound)) for bound in bounds] + ["+Inf"]
    total = 0
    cumulative = []
    for label, count in zip(labels, counts, strict=True):
        total += count
        cumulative.append((label, float(total)))
    return cumulative
