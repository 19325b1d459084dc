"""Metadata stream: ~300-byte metadata dicts from a publisher to a reader in another process.

warren: :class:`messaging.MetadataPublisher` over a :class:`messaging.ConfirmedPublisher`
(persistent, 128 confirms in flight, a task's metadata queue with its ``x-max-length``
back-pressure) to a
:class:`messaging.MetadataConsumer` in the :mod:`benchmarks.drain` child (prefetch 64,
as the coordinator). Baselines: raw pika persistent publishes to a plain durable queue,
(a) BlockingChannel with one confirm per message, (b) SelectConnection with 128
confirms in flight; a raw ``basic_consume`` in the same child reads them. The rate is
items / (last item read - first publish).

A fourth variant, ``warren-unbounded``, is warren's publisher and reader on a queue
without the length limit, like the raw baselines': the gap between it and ``warren`` is
what the back-pressure costs when the reader is the slower side (the queue then refuses
publishes, which wait for a backoff), the gap between it and raw pika is warren's own
code on both sides.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgpack
import pika

from benchmarks import procs, raw_stream
from benchmarks.common import CaseContext, CaseResult, Trials, alternate
from benchmarks.stats import Row
from messaging import BrokerLink, ConfirmedPublisher, MetadataPublisher, Names, QueueDecl, Settings, codec

NAME = "stream"
TITLE = "metadata stream"
WINDOW = 128
PREFETCH = 64
TARGET_BYTES = 300


def metadata_message(seq: int) -> dict[str, Any]:
    """A data metadata item as a collector publishes it, padded to about 300 bytes encoded."""
    message: dict[str, Any] = {
        "data_id": f"env_{seq % 8}_{uuid.uuid1().hex}",
        "policy_iter": 1234,
        "env_id": seq % 8,
        "unroll_len": 32,
        "eval_flag": False,
        "compressor": "none",
        "get_data_time": time.time(),
        "priority": 1.0,
        "cur_episode": 120 + seq,
        "cur_sample": 4096 + 32 * seq,
        "cur_step": 4100 + 32 * seq,
        "task_id": "collect-000012-54321",
        "buffer_id": "main",
        "pad": "",
    }
    message["pad"] = "x" * max(0, TARGET_BYTES - len(codec.encode(message)))
    return message


class _Stream:
    """The three variants, sharing one reader child and one raw publishing connection."""

    def __init__(self, ctx: CaseContext, settings: Settings, reader: procs.Child, n: int) -> None:
        self.ctx, self.settings, self.reader, self.n = ctx, settings, reader, n
        self.names = Names(settings.prefix)
        self.link = BrokerLink(settings, "bench-stream").open()
        self.raw = pika.BlockingConnection(ctx.broker.parameters())
        self.messages = [metadata_message(i) for i in range(n)]
        self.seq = 0
        self.full_waits: list[int] = []

    def close(self) -> None:
        self.link.close()
        if self.raw.is_open:
            self.raw.close()

    def _queue(self) -> str:
        self.seq += 1
        return f"{self.settings.prefix}.q{self.seq}"

    def _read(self, mode: str, queue: str) -> None:
        self.reader.send({"mode": mode, "queue": queue, "count": self.n, "prefetch": PREFETCH})
        procs.wait_ready(self.reader)

    def _finish(self, started: float, published: float, queue: str) -> dict[str, float]:
        answer = self.reader.receive(120)
        if not answer.get("done"):
            raise RuntimeError(f"reader did not finish {queue}: {answer}")
        self.link.delete_queue(queue)
        return {"items_s": self.n / (answer["last"] - started), "publish_items_s": self.n / (published - started)}

    def warren(self) -> dict[str, float]:
        self.seq += 1
        decl = self.names.metadata_decl(
            f"stream{self.seq}",
            max_length=self.settings.metadata_queue_length,
            expires_s=self.settings.metadata_queue_expires_s,
        )
        return self._warren(decl, self.full_waits)

    def warren_unbounded(self) -> dict[str, float]:
        self.seq += 1
        return self._warren(self.names.durable_decl(self.names.metadata(f"stream{self.seq}")), [])

    def _warren(self, decl: QueueDecl, full_waits: list[int]) -> dict[str, float]:
        with ConfirmedPublisher(self.settings, "bench-stream-publisher") as confirmed:
            publisher = MetadataPublisher(confirmed, decl)
            self._read("warren", decl.name)
            started = time.monotonic()
            for message in self.messages:
                publisher.publish(message, headers={"kind": "data"})
            publisher.flush(120)
            published = time.monotonic()
            full_waits.append(confirmed.nacks)  # messages the full queue refused
        return self._finish(started, published, decl.name)

    def raw_sync(self) -> dict[str, float]:
        return self._raw(lambda queue, bodies: raw_stream.publish_sync(self.raw, queue, bodies))

    def raw_window(self) -> dict[str, float]:
        params = self.ctx.broker.parameters()
        return self._raw(lambda queue, bodies: raw_stream.publish_windowed(params, queue, bodies, WINDOW))

    def _raw(self, publish: Any) -> dict[str, float]:
        queue = self._queue()
        channel = self.raw.channel()
        channel.queue_declare(queue, durable=True)
        channel.close()
        self._read("raw", queue)
        started = time.monotonic()
        # Encoding is part of the publisher's work in both variants.
        seconds = publish(queue, [msgpack.packb(m) for m in self.messages])
        return self._finish(started, started + seconds, queue)


def run(ctx: CaseContext) -> CaseResult:
    n = 1000 if ctx.quick else 3000
    settings = ctx.broker.settings(ctx.broker.sub_prefix("stream"))
    with ctx.scratch("stream") as workdir:
        reader = procs.Child(
            procs.python_module("benchmarks.drain", "--url", ctx.broker.amqp_url, "--prefix", settings.prefix),
            env={},
            log=workdir / "drain.log",
            talk=True,
        )
        stream: _Stream | None = None
        try:
            stream = _Stream(ctx, settings, reader, n)
            trials = alternate(
                ctx.repeats,
                {
                    "warren": stream.warren,
                    "raw-sync": stream.raw_sync,
                    "raw-window": stream.raw_window,
                    "warren-unbounded": stream.warren_unbounded,
                },
                log=ctx.log,
            )
            full_waits = stream.full_waits
        finally:
            if stream is not None:
                stream.close()
            procs.stop_all([reader])
    size = len(codec.encode(metadata_message(0)))
    return CaseResult.of(_rows(trials), trials, items=n, message_bytes=size, full_waits=full_waits)


def _rows(trials: Trials) -> list[Row]:
    warren = trials.series("warren", "items_s")
    return [
        Row(
            TITLE,
            "items/s vs confirm-per-msg",
            "items/s",
            "higher",
            warren,
            trials.series("raw-sync", "items_s"),
            "raw BlockingChannel, 1 confirm/msg",
            "raw persistent sync 1,815/s",
        ),
        Row(
            TITLE,
            f"items/s vs {WINDOW} in flight",
            "items/s",
            "higher",
            warren,
            trials.series("raw-window", "items_s"),
            f"raw SelectConnection, window {WINDOW}",
            "target >= 10,000/s and >= 0.5x; raw window100 persistent 15,600/s",
        ),
        Row(
            TITLE,
            f"no length limit vs {WINDOW} in flight",
            "items/s",
            "higher",
            trials.series("warren-unbounded", "items_s"),
            trials.series("raw-window", "items_s"),
            f"raw SelectConnection, window {WINDOW}",
            "warren on a queue without x-max-length, like the baselines': what warren's code costs",
        ),
    ]
