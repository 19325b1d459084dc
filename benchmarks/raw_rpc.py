"""The raw pika RPC baseline: the plainest server and client that do what a task round trip does.

Server (a child process, ``python -m benchmarks.raw_rpc --queue Q``): one
BlockingConnection consuming a durable queue with prefetch 1 and manual acks; for each
request it unpacks the msgpack body, packs a reply of the same shape as warren's
``resource`` reply, publishes it to ``reply_to`` with the request's ``correlation_id``
(no publisher confirm) and acks. Client: one BlockingConnection per client, an
exclusive server-named reply queue consumed with ``auto_ack``, requests published
without confirms. This is the ``c1s1-exclusive`` / ``c4s1-exclusive`` setup of
``baseline-limits.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import uuid
from typing import Any

import msgpack
import pika
from pika.adapters.blocking_connection import BlockingChannel

CONTENT_TYPE = "application/msgpack"

#: What the raw server answers: the shape and size of a warren ``resource`` reply.
REPLY: dict[str, Any] = {
    "ok": True,
    "result": {
        "gpu": 0,
        "cpu": 2,
        "worker_id": "bench-raw-000000",
        "control_queue": "bench-00000000.collector.control.bench-raw-000000",
        "busy": False,
        "task_id": None,
    },
}


class RawRpcClient:
    """One caller with its own connection and exclusive reply queue."""

    def __init__(self, parameters: pika.ConnectionParameters, queue: str) -> None:
        self.queue = queue
        self.connection = pika.BlockingConnection(parameters)
        self.channel = self.connection.channel()
        frame = self.channel.queue_declare("", exclusive=True, auto_delete=True)
        self.reply_queue: str = frame.method.queue
        self.channel.basic_consume(self.reply_queue, self._on_reply, auto_ack=True)
        self._waiting: str | None = None
        self._reply: bytes | None = None

    def _on_reply(self, _ch: BlockingChannel, _method: Any, props: pika.BasicProperties, body: bytes) -> None:
        if props.correlation_id == self._waiting:
            self._reply = body

    def call(self, request: dict[str, Any]) -> Any:
        corr = uuid.uuid4().hex
        self._waiting, self._reply = corr, None
        props = pika.BasicProperties(content_type=CONTENT_TYPE, reply_to=self.reply_queue, correlation_id=corr)
        self.channel.basic_publish("", self.queue, msgpack.packb(request), properties=props)
        while self._reply is None:
            self.connection.process_data_events(time_limit=None)
        return msgpack.unpackb(self._reply)

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()


def serve(parameters: pika.ConnectionParameters, queue: str) -> None:
    """Serve ``queue`` until SIGTERM; print ``{"ready": true}`` once consuming."""
    connection = pika.BlockingConnection(parameters)
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.basic_qos(prefetch_count=1)
    stopping = False

    def on_request(ch: BlockingChannel, method: Any, props: pika.BasicProperties, body: bytes) -> None:
        msgpack.unpackb(body)
        reply = msgpack.packb(REPLY)
        reply_props = pika.BasicProperties(content_type=CONTENT_TYPE, correlation_id=props.correlation_id)
        ch.basic_publish("", props.reply_to, reply, properties=reply_props)
        ch.basic_ack(method.delivery_tag)

    def on_term(_signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    channel.basic_consume(queue, on_request)
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    while not stopping:
        connection.process_data_events(time_limit=0.5)
    connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    args = parser.parse_args(argv)
    serve(pika.URLParameters(args.url), args.queue)
    return 0


if __name__ == "__main__":
    sys.exit(main())
