"""Raw pika publishers with publisher confirms: the baselines of the metadata stream.

* :func:`publish_sync`: BlockingConnection, ``confirm_delivery()``, every ``basic_publish``
  waits for its own confirm (what warren's :class:`~messaging.BrokerLink` does).
* :func:`publish_windowed`: SelectConnection keeping up to ``window`` unconfirmed
  messages in flight, topped up on every (possibly multiple) ``Basic.Ack``.

Both publish persistent messages to the default exchange.
"""

from __future__ import annotations

import time
from typing import Any

import pika
import pika.spec
from pika.channel import Channel

CONTENT_TYPE = "application/msgpack"
PERSISTENT = pika.BasicProperties(content_type=CONTENT_TYPE, delivery_mode=pika.DeliveryMode.Persistent)


def publish_sync(connection: pika.BlockingConnection, queue: str, bodies: list[bytes]) -> float:
    """Publish ``bodies`` one confirm at a time; returns the seconds it took."""
    channel = connection.channel()
    channel.confirm_delivery()
    started = time.monotonic()
    for body in bodies:
        channel.basic_publish("", queue, body, properties=PERSISTENT)
    elapsed = time.monotonic() - started
    channel.close()
    return elapsed


class _Windowed:
    def __init__(self, queue: str, bodies: list[bytes], window: int) -> None:
        self.queue, self.bodies, self.window = queue, bodies, window
        self.sent = 0
        self.outstanding: set[int] = set()
        self.started = 0.0
        self.finished = 0.0
        self.error: str | None = None
        self.connection: pika.SelectConnection | None = None
        self.channel: Channel | None = None

    def on_open(self, connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=self.on_channel)

    def on_channel(self, channel: Channel) -> None:
        self.channel = channel
        channel.confirm_delivery(ack_nack_callback=self.on_confirm, callback=self.on_confirm_mode)

    def on_confirm_mode(self, _frame: Any) -> None:
        self.started = time.monotonic()
        self.top_up()

    def top_up(self) -> None:
        assert self.channel is not None
        while self.sent < len(self.bodies) and len(self.outstanding) < self.window:
            self.channel.basic_publish("", self.queue, self.bodies[self.sent], properties=PERSISTENT)
            self.sent += 1
            self.outstanding.add(self.sent)  # delivery tags count from 1

    def on_confirm(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            self.error = f"nack for delivery tag {method.delivery_tag}"
        tag = method.delivery_tag
        if method.multiple:
            self.outstanding = {t for t in self.outstanding if t > tag}
        else:
            self.outstanding.discard(tag)
        if self.sent == len(self.bodies) and not self.outstanding:
            self.finished = time.monotonic()
            assert self.connection is not None
            self.connection.close()
        else:
            self.top_up()


def publish_windowed(parameters: pika.ConnectionParameters, queue: str, bodies: list[bytes], window: int) -> float:
    """Publish ``bodies`` with up to ``window`` confirms outstanding; returns the seconds it took."""
    state = _Windowed(queue, bodies, window)

    def on_failed(_connection: Any, error: Any) -> None:
        state.error = f"connection failed: {error!r}"
        _connection.ioloop.stop()

    connection = pika.SelectConnection(
        parameters,
        on_open_callback=state.on_open,
        on_open_error_callback=on_failed,
        on_close_callback=lambda conn, _reason: conn.ioloop.stop(),
    )
    state.connection = connection
    connection.ioloop.start()
    if state.error is not None or not state.finished:
        raise RuntimeError(f"windowed publish failed: {state.error or 'connection closed early'}")
    return state.finished - state.started
