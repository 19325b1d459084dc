"""A reader child process: drains queues on command, with warren's consumer or with raw pika.

The benchmark parent writes one JSON command per line to stdin and reads JSON lines
back, so one process (started once) serves every repeat of a case:

* ``{"mode": "warren" | "raw", "queue": q, "count": n | null, "prefetch": 64}`` answers
  ``{"ready": true}`` once it consumes ``q``, then ``{"done": true, "count": ..., "first":
  ..., "last": ...}`` (``time.monotonic()`` of the first and last message) once it has
  acked ``count`` messages, or, with ``count`` null, a message with ``collector_done``.

``warren`` reads with :class:`messaging.MetadataConsumer` (as the coordinator does);
``raw`` with a pika ``basic_consume`` and one manual ack per message.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import msgpack
import pika
from pika.adapters.blocking_connection import BlockingChannel

from messaging import BrokerLink, MetadataConsumer, Settings

#: Give up on a stream that has been silent this long.
SILENCE_S = 60.0


def _say(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def drain_warren(link: BrokerLink, queue: str, count: int | None, prefetch: int) -> dict[str, Any]:
    consumer = MetadataConsumer(link, queue, prefetch=prefetch)
    _say({"ready": True})
    got, first, last = 0, 0.0, 0.0
    try:
        while count is None or got < count:
            item = consumer.get(SILENCE_S)
            if item is None:
                return {"done": False, "error": f"silent for {SILENCE_S} s", "count": got}
            last = time.monotonic()
            first = first or last
            item.ack()
            got += 1
            if count is None and item.message.get("collector_done"):
                break
    finally:
        consumer.close()
    return {"done": True, "count": got, "first": first, "last": last}


def drain_raw(connection: pika.BlockingConnection, queue: str, count: int | None, prefetch: int) -> dict[str, Any]:
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    state: dict[str, Any] = {"got": 0, "first": 0.0, "last": 0.0, "finished": False}

    def on_message(ch: BlockingChannel, method: Any, _props: Any, body: bytes) -> None:
        message = msgpack.unpackb(body)
        state["last"] = time.monotonic()
        state["first"] = state["first"] or state["last"]
        ch.basic_ack(method.delivery_tag)
        state["got"] += 1
        if (count is not None and state["got"] >= count) or (count is None and message.get("collector_done")):
            state["finished"] = True

    tag = channel.basic_consume(queue, on_message)
    _say({"ready": True})
    silent_since = time.monotonic()
    while not state["finished"]:
        before = state["got"]
        connection.process_data_events(time_limit=1.0)
        if state["got"] != before:
            silent_since = time.monotonic()
        elif time.monotonic() - silent_since > SILENCE_S:
            break
    channel.basic_cancel(tag)
    channel.close()
    return {"done": state["finished"], "count": state["got"], "first": state["first"], "last": state["last"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True, help="warren prefix (its dead-letter topology is declared)")
    args = parser.parse_args(argv)
    settings = Settings.from_env({}, amqp_url=args.url, prefix=args.prefix, connect_timeout_s=10)
    link = BrokerLink(settings, "bench-drain").open()
    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            queue, count, prefetch = command["queue"], command.get("count"), int(command.get("prefetch", 64))
            if command["mode"] == "warren":
                _say(drain_warren(link, queue, count, prefetch))
            else:
                _say(drain_raw(connection, queue, count, prefetch))
    finally:
        link.close()
        if connection.is_open:
            connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
