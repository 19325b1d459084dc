"""The window of a :class:`~messaging.publisher.ConfirmedPublisher`: its unconfirmed messages.

The only state shared between the threads that publish and the publisher's I/O thread.
Publishing threads add messages and wait for room or for confirms; the I/O thread takes
the new messages, reports confirms and records a failure. One condition guards it all,
so every wait here is a condition wait with a deadline, never a sleep.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import pika

from messaging.errors import ConnectionClosed, MessagingError, PublishTimeout, StreamStopped

#: How often a waiter looks at a caller's stop event: a ``threading.Event`` cannot wake our condition.
_STOP_CHECK_S: Final = 0.05


@dataclass(slots=True)
class Outgoing:
    """One message on its way: sent, waiting to be sent, or waiting to be sent again."""

    seq: int
    """Publish order; messages are (re)sent in this order."""
    queue: str
    body: bytes
    properties: pika.BasicProperties
    put_at: float = 0.0
    """When it was published (monotonic): its confirm latency counts from here."""


class UnconfirmedWindow:
    """At most ``size`` published but unconfirmed messages, and the publisher's failure.

    Args:
        size: how many messages may be unconfirmed before :meth:`put` blocks.
        name: shown in errors (the publisher's role).
        id_prefix: start of every message's ``message_id`` (the publish order follows it).
    """

    def __init__(self, size: int, name: str, id_prefix: str) -> None:
        self.size = size
        self.name = name
        self.id_prefix = id_prefix
        self._cond = threading.Condition()
        self._new: collections.deque[Outgoing] = collections.deque()
        self._unconfirmed = 0
        self._next_seq = 0
        self._wake_pending = False
        self._failure: MessagingError | None = None
        self._closed = False

    @property
    def unconfirmed(self) -> int:
        """Messages put but not confirmed yet (including those not sent yet)."""
        return self._unconfirmed

    @property
    def failure(self) -> MessagingError | None:
        return self._failure

    # -- publishing threads ---------------------------------------------------------

    def put(self, queue: str, body: bytes, properties: pika.BasicProperties, *, stop: threading.Event | None) -> bool:
        """Add a message once there is room; returns whether the I/O thread must be woken.

        Only the first message after the I/O thread last took new ones asks for a
        wake-up: a burst of publishes costs one cross-thread wake-up, not one each.

        Raises:
            StreamStopped: ``stop`` was set while the window was full.
            MessagingError: the publisher failed (the error that failed it) or is closed.
        """
        with self._cond:
            self._wait(lambda: self._unconfirmed < self.size, stop=stop, deadline=None)
            seq = self._next_seq
            self._next_seq = seq + 1
            properties.message_id = f"{self.id_prefix}{seq}"
            self._new.append(Outgoing(seq, queue, body, properties, time.monotonic()))
            self._unconfirmed += 1
            wake = not self._wake_pending
            self._wake_pending = True
        return wake

    def wait_confirmed(self, timeout_s: float, *, stop: threading.Event | None) -> None:
        """Wait until every message put so far is confirmed.

        Raises:
            PublishTimeout: some were still unconfirmed after ``timeout_s``.
            StreamStopped: ``stop`` was set first.
            MessagingError: the publisher failed.
        """
        with self._cond:
            self._wait(lambda: self._unconfirmed == 0, stop=stop, deadline=time.monotonic() + timeout_s)

    def close(self) -> int:
        """Refuse further messages; returns how many are dropped unconfirmed."""
        with self._cond:
            self._closed = True
            dropped, self._unconfirmed = self._unconfirmed, 0
            self._new.clear()
            self._cond.notify_all()
        return dropped

    def _wait(self, ready: Callable[[], bool], *, stop: threading.Event | None, deadline: float | None) -> None:
        while True:
            self._raise_if_unusable()
            if ready():
                return
            if stop is not None and stop.is_set():
                raise StreamStopped(f"{self.name} publisher stopped with {self._unconfirmed} messages unconfirmed")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise PublishTimeout(f"{self.name} publisher: {self._unconfirmed} messages still unconfirmed")
            if stop is not None:
                remaining = _STOP_CHECK_S if remaining is None else min(remaining, _STOP_CHECK_S)
            self._cond.wait(remaining)

    def _raise_if_unusable(self) -> None:
        if self._failure is not None:
            # A fresh instance per raise: one shared exception object would collect the
            # tracebacks of every thread that raised it.
            raise type(self._failure)(self._failure.message)
        if self._closed:
            raise ConnectionClosed(f"{self.name} publisher is closed")

    # -- the I/O thread ---------------------------------------------------------------

    def take_new(self) -> list[Outgoing]:
        """The messages put since the last call, in publish order."""
        with self._cond:
            taken = list(self._new)
            self._new.clear()
            self._wake_pending = False
        return taken

    def confirmed(self, count: int) -> None:
        """``count`` messages were acked by the broker: make room and wake the waiters."""
        with self._cond:
            self._unconfirmed = max(0, self._unconfirmed - count)
            self._cond.notify_all()

    def fail(self, error: MessagingError) -> bool:
        """Record the publisher's failure (the first one wins); returns whether it was the first."""
        with self._cond:
            if self._failure is not None:
                return False
            self._failure = error
            self._cond.notify_all()
        return True


class Outbox:
    """The I/O thread's side: messages to send, sent ones by delivery tag, refused ones.

    Everything here is kept in publish order (``seq``), so that whatever has to be sent
    again (after a nack, a new channel or a new connection) goes out in that order.
    Used only by the I/O thread; it makes no broker calls itself.
    """

    def __init__(self) -> None:
        self._to_send: collections.deque[Outgoing] = collections.deque()
        self._sent: collections.OrderedDict[int, Outgoing] = collections.OrderedDict()
        self._next_tag = 1
        self.refused: list[Outgoing] = []
        """Nacked messages waiting to be sent again; newer messages wait while there are any."""

    def __len__(self) -> int:
        return len(self._to_send) + len(self._sent) + len(self.refused)

    @property
    def waiting(self) -> int:
        """Messages waiting to be sent (not refused ones)."""
        return len(self._to_send)

    @property
    def awaiting_confirm(self) -> int:
        """Messages sent on the current channel and not confirmed yet."""
        return len(self._sent)

    def add(self, messages: list[Outgoing]) -> None:
        """New messages, newer than any already here."""
        self._to_send.extend(messages)

    def new_channel(self) -> None:
        """The broker numbers a channel's publishes from 1."""
        self._next_tag = 1

    @property
    def next_tag(self) -> int:
        """The delivery tag the next message sent on this channel gets."""
        return self._next_tag

    def send(self, publish: Callable[[Outgoing], None], *, in_flight: int | None = None) -> None:
        """``publish`` waiting messages in order, unless refused ones wait.

        ``in_flight``: send only while fewer than this many sent messages await their
        confirm (``None``: no limit); the rest wait for the next call.
        If ``publish`` raises, the message stays first in line and the error propagates.
        """
        if self.refused:
            return
        to_send, sent = self._to_send, self._sent
        limit = len(to_send) + len(sent) if in_flight is None else in_flight
        tag = self._next_tag
        try:
            while to_send and len(sent) < limit:
                publish(to_send[0])
                sent[tag] = to_send.popleft()
                tag += 1
        finally:
            self._next_tag = tag

    def confirmed(self, tag: int, multiple: bool) -> list[Outgoing]:
        """The sent messages a confirm (ack or nack) of ``tag`` covers, removed from here."""
        sent = self._sent
        if not multiple:
            one = sent.pop(tag, None)
            return [] if one is None else [one]
        covered = []
        while sent and next(iter(sent)) <= tag:
            covered.append(sent.popitem(last=False)[1])
        return covered

    def retry_refused(self) -> None:
        """Put the refused messages back in line, before the newer ones."""
        self._to_send = collections.deque(sorted([*self.refused, *self._to_send], key=_by_seq))
        self.refused.clear()

    def resend_all(self) -> None:
        """Put every unconfirmed message back in line (its channel is gone), in publish order."""
        pending = [*self._sent.values(), *self.refused, *self._to_send]
        self._sent.clear()
        self.refused.clear()
        self._to_send = collections.deque(sorted(pending, key=_by_seq))


def _by_seq(message: Outgoing) -> int:
    return message.seq


#: Nacks in a row, without an ack in between, after which a publisher reopens its channel.
NACKS_BEFORE_REOPEN: Final = 3


class NackStreak:
    """Nacks in a row on one publishing channel, and when to give that channel up.

    Why: on RabbitMQ 3.10, a channel whose first publish to a quorum queue happens while
    the queue still names its dead leader (just after a node loss) gets every publish
    nacked, indefinitely, however often it is sent again; a new channel is accepted at
    once. So after ``limit`` nacks without an ack in between, a publisher reopens its
    channel and then sends the refused messages again. A full ``reject-publish`` queue
    nacks in a row too; there a reopen costs one channel round trip and changes nothing.
    Used by one thread (the publisher's I/O thread, or a link's thread).
    """

    def __init__(self, limit: int = NACKS_BEFORE_REOPEN) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        self.limit = limit
        self.count = 0
        """Nacks since the last ack or reopen."""
        self.reopens = 0
        """Channels given up so far."""

    @property
    def due(self) -> bool:
        """Whether the channel should be reopened before anything is sent again."""
        return self.count >= self.limit

    def acked(self) -> None:
        """The broker accepted a message: the channel works."""
        self.count = 0

    def nacked(self, messages: int = 1) -> bool:
        """The broker refused ``messages`` (one nack may cover several); returns :attr:`due`."""
        self.count += messages
        return self.due

    def reopened(self) -> None:
        """The channel was replaced: a new one starts a new streak."""
        self.count = 0
        self.reopens += 1


#: What a nack leaves of the messages a publisher may have in flight (TCP halves; a full
#: metadata queue refuses in short bursts, and 0.75 lost less of the stream's pace: 7.3k
#: against 6.5k items/s with 0.5, in one run of benchmarks/case_stream's setting).
SENDING_DECREASE: Final = 0.75


class SendingWindow:
    """How many sent messages may await their confirm: about what the queue has room for.

    Why: a ``reject-publish`` queue (a task's metadata queue holds 8 ready messages)
    refuses whatever arrives beyond its room, and a refused message, and every newer one,
    waits for a backoff before it is sent again. A publisher that sends its whole window
    (128) into such a queue has most of it refused whenever the reader is the slower side,
    and the stream idles on backoff timers: 1,500-2,000 nacks per 3,000 messages, 0.21x of
    raw pika with the same window. So the publisher sends as TCP does: the first nack of a
    round (a message sent after the last cut) cuts the messages in flight by
    :data:`SENDING_DECREASE`, and acks let the limit grow back by one per limit's worth of
    acks, up to ``size``. A queue that never refuses keeps the full window. Used only by
    the publisher's I/O thread.
    """

    def __init__(self, size: int, decrease: float = SENDING_DECREASE) -> None:
        if size < 1 or not 0 < decrease < 1:
            raise ValueError(f"need size >= 1 and 0 < decrease < 1, got {size!r}, {decrease!r}")
        self.size = size
        self.decrease = decrease
        self._limit = float(size)
        self._round_end = 0

    @property
    def limit(self) -> int:
        """Sent messages that may await their confirm now (at least 1)."""
        return max(1, int(self._limit))

    def acked(self, count: int) -> None:
        """``count`` messages were accepted: grow by ``count / limit`` (one per round of acks)."""
        self._limit = min(float(self.size), self._limit + count / self._limit)

    def nacked(self, tag: int, next_tag: int) -> None:
        """The broker refused the message(s) up to delivery ``tag``; ``next_tag`` is the next one to go out.

        Only a refusal of a message sent after the last cut cuts again: one burst that
        overran the queue is one cut, not one per refused message.
        """
        if tag >= self._round_end:
            self._round_end = next_tag
            self._limit = max(1.0, self._limit * self.decrease)

    def new_channel(self) -> None:
        """Delivery tags start again from 1 on a new channel."""
        self._round_end = 0
