"""Queue type: the same warren paths on quorum queues beside classic ones, in the same run.

What ``WARREN_QUEUE_TYPE=quorum`` costs, measured side by side on the same broker:

* **metadata stream**: :class:`messaging.MetadataPublisher` over a
  :class:`messaging.ConfirmedPublisher` (persistent, 128 confirms in flight) to a task's
  metadata queue declared classic or quorum, read by the :mod:`benchmarks.drain` child
  (prefix 64), as in :mod:`benchmarks.case_stream`;
* **task round trip**: ``resource`` calls from :class:`messaging.RpcClient` to a
  ``warren collector`` child serving a task queue of each type (two collectors, one per
  type, each under its own prefix), 1 client and 4 concurrent clients, as in
  :mod:`benchmarks.case_rpc`.

The "warren" column is quorum, the "baseline" column classic: the ratio is what quorum
costs (or gains). On a single broker a quorum queue still writes every message to its
Raft log and fsyncs it before confirming, so this is its floor; on a cluster, a publish is
confirmed only once a majority of nodes holds it (see docs/deploy.md, "When to use quorum
queues").
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

from benchmarks import procs
from benchmarks.case_rpc import CLIENTS, REQUEST, _concurrent, _sequential
from benchmarks.case_stream import PREFETCH, WINDOW, metadata_message
from benchmarks.common import CaseContext, CaseResult, Trials, alternate
from benchmarks.stats import Better, Row
from messaging import BrokerLink, ConfirmedPublisher, MetadataPublisher, Names, RpcClient, Settings

NAME = "queue-type"
TITLE = "quorum vs classic"
QUEUE_TYPES = ("classic", "quorum")
#: Marks rows that compare two warren configurations, not warren against a baseline.
VERSUS = {"versus": "queue type"}


class _Variant:
    """One queue type: its settings, a collector serving its task queue, clients, a stream counter."""

    def __init__(self, ctx: CaseContext, queue_type: str, workdir: Path, children: list[procs.Child]) -> None:
        prefix = ctx.broker.sub_prefix(f"qt-{queue_type}")
        self.settings: Settings = ctx.broker.settings(prefix, rpc_timeout_s=30, queue_type=queue_type)
        self.names = Names.of(self.settings)
        # In ``children`` at once: the caller stops it even if the warm-up below fails.
        children.append(procs.start_collector(self.settings, workdir / queue_type, f"bench-{queue_type}"))
        self.clients: list[RpcClient] = []
        self.seq = 0
        try:
            for i in range(CLIENTS):
                self.clients.append(RpcClient(self.settings, f"bench-qt-{i}"))
                for _ in range(30):  # connection and reply queue warm
                    self.clients[-1].call(self.names.collector_tasks, REQUEST, timeout_s=30)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for client in self.clients:
            client.close()


class _QueueTypes:
    """Both variants, sharing one reader child."""

    def __init__(self, ctx: CaseContext, reader: procs.Child, variants: dict[str, _Variant], items: int) -> None:
        self.ctx, self.reader, self.variants = ctx, reader, variants
        self.messages = [metadata_message(i) for i in range(items)]

    def measure(self, queue_type: str, n_seq: int, n_conc: int) -> dict[str, float]:
        variant = self.variants[queue_type]
        queue = variant.names.collector_tasks
        calls = [functools.partial(client.call, queue, REQUEST, timeout_s=30) for client in variant.clients]
        seq = _sequential(calls[0], n_seq)
        conc = _concurrent(calls, n_conc)
        return {
            "stream_items_s": self._stream(variant),
            "rpc_seq_p50_ms": seq["p50_ms"],
            "rpc_seq_calls_s": seq["calls_s"],
            "rpc_c4_calls_s": conc["calls_s"],
        }

    def _stream(self, variant: _Variant) -> float:
        variant.seq += 1
        settings = variant.settings
        decl = variant.names.metadata_decl(
            f"stream{variant.seq}",
            max_length=settings.metadata_queue_length,
            expires_s=settings.metadata_queue_expires_s,
        )
        with ConfirmedPublisher(settings, "bench-qt-publisher", window=WINDOW) as confirmed:
            publisher = MetadataPublisher(confirmed, decl)
            self.reader.send({"mode": "warren", "queue": decl.name, "count": len(self.messages), "prefetch": PREFETCH})
            procs.wait_ready(self.reader)
            started = time.monotonic()
            for message in self.messages:
                publisher.publish(message, headers={"kind": "data"})
            publisher.flush(120)
        answer = self.reader.receive(120)
        if not answer.get("done"):
            raise RuntimeError(f"reader did not finish {decl.name}: {answer}")
        with BrokerLink(settings, "bench-qt-cleanup") as link:
            link.delete_queue(decl.name)
        return len(self.messages) / (float(answer["last"]) - started)


def run(ctx: CaseContext) -> CaseResult:
    items = 1000 if ctx.quick else 3000
    n_seq, n_conc = (300, 100) if ctx.quick else (1000, 300)
    variants: dict[str, _Variant] = {}
    children: list[procs.Child] = []
    with ctx.scratch("queue-type") as workdir:
        try:
            ctx.log("starting a warren collector per queue type and the reader")
            for queue_type in QUEUE_TYPES:
                variants[queue_type] = _Variant(ctx, queue_type, workdir, children)
            # The reader declares its prefix's dead-letter topology: the classic one's.
            reader_prefix = variants["classic"].settings.prefix
            reader = procs.Child(
                procs.python_module("benchmarks.drain", "--url", ctx.broker.amqp_url, "--prefix", reader_prefix),
                env={},
                log=workdir / "drain.log",
                talk=True,
            )
            children.append(reader)
            both = _QueueTypes(ctx, reader, variants, items)
            trials = alternate(
                ctx.repeats,
                {queue_type: functools.partial(both.measure, queue_type, n_seq, n_conc) for queue_type in QUEUE_TYPES},
                log=ctx.log,
            )
        finally:
            for variant in variants.values():
                variant.close()
            procs.stop_all(children)
    return CaseResult.of(_rows(trials), trials, items=items, calls={"sequential": n_seq, "per_client": n_conc})


def _rows(trials: Trials) -> list[Row]:
    def row(metric: str, key: str, unit: str, better: Better) -> Row:
        return Row(
            case=TITLE,
            metric=metric,
            unit=unit,
            better=better,
            warren=trials.series("quorum", key),
            baseline=trials.series("classic", key),
            baseline_name="classic",
            reference="warren on quorum queues vs warren on classic queues",
            notes=dict(VERSUS),
        )

    return [
        row("metadata stream", "stream_items_s", "items/s", "higher"),
        row("task round trip, 1 client p50", "rpc_seq_p50_ms", "ms", "lower"),
        row("task round trip, 1 client rate", "rpc_seq_calls_s", "calls/s", "higher"),
        row(f"task round trip, {CLIENTS} clients rate", "rpc_c4_calls_s", "calls/s", "higher"),
    ]
