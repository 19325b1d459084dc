"""Task round trip: a ``resource`` task through a real ``warren collector`` process.

warren: :class:`messaging.RpcClient` calls ``<prefix>.collector.tasks`` served by a
``warren collector`` child process. Baseline: :mod:`benchmarks.raw_rpc` (raw pika, one
server process, exclusive reply queue). Both run sequentially from one client and with
4 concurrent clients (threads, each with its own client and connection).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import procs
from benchmarks.common import CaseContext, CaseResult, Trials, alternate
from benchmarks.raw_rpc import RawRpcClient
from benchmarks.stats import Row, percentile
from messaging import Names, RpcClient

NAME = "rpc"
TITLE = "task round trip"
CLIENTS = 4
REQUEST = {"name": "resource"}

Call = Callable[[], Any]


def _sequential(call: Call, n: int) -> dict[str, float]:
    latencies = []
    started = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t0)
    wall = time.perf_counter() - started
    return _summary(latencies, wall)


def _concurrent(calls: Sequence[Call], n_each: int) -> dict[str, float]:
    barrier = threading.Barrier(len(calls) + 1)
    latencies: list[list[float]] = [[] for _ in calls]
    ends = [0.0] * len(calls)
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            barrier.wait()
            for _ in range(n_each):
                t0 = time.perf_counter()
                calls[i]()
                latencies[i].append(time.perf_counter() - t0)
            ends[i] = time.perf_counter()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join(300)
    if errors:
        raise errors[0]
    pooled = [x for per_client in latencies for x in per_client]
    return _summary(pooled, max(ends) - started)


#: A call this slow is a stall (a lost wake-up or a timeout), not queueing.
SLOW_S = 0.1


def _summary(latencies: list[float], wall: float) -> dict[str, float]:
    return {
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "max_ms": max(latencies) * 1e3,
        "slow_calls": float(sum(1 for x in latencies if x >= SLOW_S)),
        "calls_s": len(latencies) / wall,
    }


def _measure(calls: Sequence[Call], n_seq: int, n_conc: int) -> dict[str, float]:
    for call in calls:  # a few untimed calls: caches and connections warm
        for _ in range(10):
            call()
    seq = _sequential(calls[0], n_seq)
    conc = _concurrent(calls, n_conc)
    return {**{f"seq_{k}": v for k, v in seq.items()}, **{f"c4_{k}": v for k, v in conc.items()}}


def run(ctx: CaseContext) -> CaseResult:
    n_seq, n_conc = (300, 100) if ctx.quick else (1000, 300)
    prefix = ctx.broker.sub_prefix("rpc")
    settings = ctx.broker.settings(prefix, rpc_timeout_s=30)
    names = Names(prefix)
    raw_queue = f"{prefix}.raw-rpc"
    children: list[procs.Child] = []
    warren_clients: list[RpcClient] = []
    raw_clients: list[RawRpcClient] = []
    with ctx.scratch("rpc") as workdir:
        try:
            ctx.log("starting a warren collector and the raw pika server")
            children.append(procs.start_collector(settings, workdir, "bench-rpc"))
            raw = procs.Child(
                procs.python_module("benchmarks.raw_rpc", "--url", ctx.broker.amqp_url, "--queue", raw_queue),
                env={},
                log=workdir / "raw-rpc.log",
                talk=True,
            )
            children.append(raw)
            procs.wait_ready(raw)
            warren_clients = [RpcClient(settings, f"bench-rpc-{i}") for i in range(CLIENTS)]
            raw_clients = [RawRpcClient(ctx.broker.parameters(), raw_queue) for _ in range(CLIENTS)]
            warren_calls = [_warren_call(c, names.collector_tasks) for c in warren_clients]
            raw_calls = [_raw_call(c) for c in raw_clients]
            for call in (*warren_calls, *raw_calls):  # connections, reply queues, JIT-free warm-up
                for _ in range(50):
                    call()
            trials = alternate(
                ctx.repeats,
                {
                    "warren": lambda: _measure(warren_calls, n_seq, n_conc),
                    "raw": lambda: _measure(raw_calls, n_seq, n_conc),
                },
                log=ctx.log,
            )
        finally:
            for client in warren_clients:
                client.close()
            for raw_client in raw_clients:
                raw_client.close()
            procs.stop_all(children)
    return CaseResult.of(_rows(trials), trials, calls={"sequential": n_seq, "per_client": n_conc})


def _warren_call(client: RpcClient, queue: str) -> Call:
    return lambda: client.call(queue, REQUEST, timeout_s=30)


def _raw_call(client: RawRpcClient) -> Call:
    return lambda: client.call(REQUEST)


def _rows(trials: Trials) -> list[Row]:
    def stalls(prefix: str) -> str:
        counts = [int(run[f"{prefix}_slow_calls"]) for run in trials.runs["warren"]]
        return f"; warren calls >= {SLOW_S * 1e3:.0f} ms per repeat: {counts}" if any(counts) else ""

    def row(metric: str, key: str, unit: str, better: str, reference: str = "") -> Row:
        return Row(
            case=TITLE,
            metric=metric,
            unit=unit,
            better="higher" if better == "higher" else "lower",
            warren=trials.series("warren", key),
            baseline=trials.series("raw", key),
            baseline_name="raw pika",
            reference=reference,
        )

    return [
        row("1 client p50", "seq_p50_ms", "ms", "lower", "raw 0.43 ms; Flask 2.2-3.5 ms"),
        row("1 client p99", "seq_p99_ms", "ms", "lower", "raw 0.68 ms"),
        row("1 client rate", "seq_calls_s", "calls/s", "higher", "raw 2,270/s; Flask 270-390/s" + stalls("seq")),
        row("4 clients p50", "c4_p50_ms", "ms", "lower", "raw c4s1 1.38 ms"),
        row("4 clients p99", "c4_p99_ms", "ms", "lower", "raw c4s1 2.94 ms"),
        row("4 clients rate", "c4_calls_s", "calls/s", "higher", "raw c4s1 2,700/s" + stalls("c4")),
    ]
