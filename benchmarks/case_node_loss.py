"""Node loss: what a per-task metadata queue costs on a 3-node cluster, healthy and with a node down.

warren creates one metadata queue per task and deletes it once the task is read (hundreds
a minute with short tasks). This case measures that life cycle, declare then delete
through a :class:`messaging.BrokerLink`, for the queue as warren declares it (classic, the
"warren" column) and as a quorum queue (the per-task quorum design it replaced, the
"baseline" column), first on a healthy private 3-node cluster, then with one node killed
(``kill -9``). It starts its own cluster (``tests.rabbit_nodes``: own ports, data and
cookie, removed at the end), never touching the broker of ``--amqp-url``.

The whole job's env steps/s before, during and after a node loss are measured by the
node-loss fault test (``scripts/reliability --full tests/faults/test_private_cluster.py``),
which writes them to docs/reliability.md.
"""

from __future__ import annotations

import functools
import statistics
import time

from benchmarks.common import CaseContext, CaseResult, Trials, alternate
from benchmarks.stats import Row
from messaging import BrokerLink, Names, QueueDecl, Settings
from tests.rabbit_nodes import PrivateCluster

NAME = "node-loss"
TITLE = "per-task metadata queue on a 3-node cluster, healthy and one node down"
VARIANTS = ("classic", "quorum")


def _decls(names: Names, queue_type: str, tag: str, count: int) -> list[QueueDecl]:
    classic = [names.metadata_decl(f"{tag}-{i}", max_length=8, expires_s=3600) for i in range(count)]
    if queue_type == "classic":
        return classic
    quorum = Names(names.prefix, "quorum")
    return [quorum.durable_decl(d.name, {k: v for k, v in d.arguments.items() if k != "x-expires"}) for d in classic]


def _cycle(link: BrokerLink, names: Names, queue_type: str, tag: str, count: int) -> dict[str, float]:
    """Declare ``count`` queues then delete them; median milliseconds of each step."""
    declares, deletes = [], []
    decls = _decls(names, queue_type, tag, count)
    for decl in decls:
        started = time.monotonic()
        link.declare(decl, remember=False)
        declares.append((time.monotonic() - started) * 1000)
    for decl in decls:
        started = time.monotonic()
        link.delete_queue(decl.name)
        deletes.append((time.monotonic() - started) * 1000)
    return {
        "declare_ms": statistics.median(declares),
        "delete_ms": statistics.median(deletes),
        "cycle_ms": statistics.median(a + b for a, b in zip(declares, deletes, strict=True)),
    }


def run(ctx: CaseContext) -> CaseResult:
    healthy_n, degraded_n = (10, 1) if ctx.quick else (30, 2)
    cluster = PrivateCluster.start(3, ctx.workdir / "cluster")
    try:
        first, _, doomed = cluster.nodes
        settings = Settings.from_env(
            {}, amqp_url=first.amqp_url, prefix=ctx.broker.sub_prefix("node-loss"), connect_timeout_s=30
        )
        names = Names.of(settings)
        seq = iter(range(1_000_000))
        with BrokerLink(settings, "bench-node-loss") as link:
            ctx.log("3 nodes up: healthy cluster")
            healthy = alternate(
                ctx.repeats,
                {
                    variant: functools.partial(
                        lambda v, n: _cycle(link, names, v, f"h{next(seq)}", n), variant, healthy_n
                    )
                    for variant in VARIANTS
                },
                log=ctx.log,
            )
            ctx.log(f"killing {doomed.name}")
            doomed.kill()
            degraded = alternate(
                ctx.repeats,
                {
                    variant: functools.partial(
                        lambda v, n: _cycle(link, names, v, f"d{next(seq)}", n),
                        variant,
                        healthy_n if variant == "classic" else degraded_n,
                    )
                    for variant in VARIANTS
                },
                log=ctx.log,
            )
    finally:
        cluster.stop()
    rows = _rows(healthy, "3 nodes") + _rows(degraded, "1 of 3 down")
    return CaseResult.of(rows, healthy, degraded=degraded.to_dict(), queues={"healthy": healthy_n})


def _rows(trials: Trials, state: str) -> list[Row]:
    def row(metric: str, key: str) -> Row:
        return Row(
            case=TITLE,
            metric=f"{metric}, {state}",
            unit="ms",
            better="lower",
            warren=trials.series("classic", key),
            baseline=trials.series("quorum", key),
            baseline_name="quorum",
            reference="warren's classic metadata queue vs a per-task quorum queue",
            notes={"versus": "queue type"},
        )

    return [row("declare", "declare_ms"), row("delete", "delete_ms"), row("declare + delete", "cycle_ms")]
