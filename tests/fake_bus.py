"""An in-memory stand-in for the coordinator's broker operations (``CoordinatorBus``).

It records what the coordinator sends and lets a test play the workers: answer a start
request, put items on a task's metadata stream, make a worker's control queue vanish.
Items carry real :class:`~messaging.Delivery` objects whose settlement is recorded.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from typing import Any

from messaging import (
    Delivery,
    Envelope,
    MessagingError,
    MetadataItem,
    PublishRejected,
    QueueDecl,
    QueueNotFound,
    RemoteError,
    encode,
)
from worker.protocol import ResourceReply, StartReply, StartTask, TaskName


@dataclass
class Sent:
    queue: str
    body: dict[str, Any]
    correlation_id: str
    timeout_s: float


class FakeStream:
    def __init__(self, bus: FakeBus, queue: str) -> None:
        self.bus = bus
        self.queue = queue
        self.closed = False

    def get(self, timeout_s: float) -> MetadataItem | None:
        if self.queue in self.bus.lost:
            raise QueueNotFound(f"consuming from {self.queue}: NOT_FOUND - home node of durable queue is down")
        pending = self.bus.queues.get(self.queue)
        if self.closed or not pending:
            return None
        body = pending.popleft()
        message = self.bus.decoded[body]
        return MetadataItem(message, Delivery(Envelope(body, self.queue), self.bus.settler(self.queue, message)))

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeBus:
    """The coordinator's side of the broker, in memory."""

    idle_workers: int = 0
    sent: list[Sent] = field(default_factory=list)
    replies: dict[str, dict[str, Any] | RemoteError] = field(default_factory=dict)
    abandoned: list[str] = field(default_factory=list)
    stray: list[dict[str, Any]] = field(default_factory=list)
    """Results of replies no request waits for, as the next :meth:`stray_replies` returns them."""
    queues: dict[str, collections.deque[bytes]] = field(default_factory=dict)
    decoded: dict[bytes, dict[str, Any]] = field(default_factory=dict)
    alive: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    """Metadata queues whose node died: reading them raises :class:`QueueNotFound`."""
    forwarded: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Confirmed copies sent to the learner's queue."""
    unconfirmed: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    confirm_failure: MessagingError | None = None
    learner_backlog: int = 0
    """Data items waiting in the learner's queue."""
    settled: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """(queue, "ack" | "requeue" | "dead-letter", message) in settlement order."""
    deleted: list[str] = field(default_factory=list)
    declared: list[str] = field(default_factory=list)
    closed: bool = False
    nacks: int = 0
    """How many of the next sends the broker nacks (:class:`PublishRejected`)."""
    broadcasts: list[Sent] = field(default_factory=list)
    """Requests sent to every collector (the roster's ``resource``), apart from :attr:`sent`."""
    roster: list[dict[str, Any]] = field(default_factory=list)
    """``resource`` results every broadcast gets back (what the workers listening would answer)."""
    finished_broadcasts: list[str] = field(default_factory=list)
    _gathering: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    # -- CoordinatorBus -------------------------------------------------------------

    def open(self, *decls: QueueDecl) -> None:
        self.declared += [d.name for d in decls]

    def send(self, queue: str, body: dict[str, Any], *, timeout_s: float, durable: bool = False) -> str:
        if queue.count(".control.") and queue not in self.alive:
            raise QueueNotFound(f"no queue {queue}")
        if self.nacks > 0:
            self.nacks -= 1
            raise PublishRejected(f"publishing to {queue}: the broker rejected the message")
        correlation_id = f"c{next(self._ids)}"
        self.sent.append(Sent(queue, body, correlation_id, timeout_s))
        return correlation_id

    def broadcast(self, body: dict[str, Any], *, timeout_s: float) -> str:
        correlation_id = f"b{next(self._ids)}"
        self.broadcasts.append(Sent("p.collector.roster", body, correlation_id, timeout_s))
        self._gathering[correlation_id] = [dict(result) for result in self.roster]
        return correlation_id

    def gathered(self, correlation_id: str, *, done: bool = False) -> list[dict[str, Any]]:
        found = self._gathering.get(correlation_id, [])
        self._gathering[correlation_id] = []
        if done:
            self._gathering.pop(correlation_id, None)
            self.finished_broadcasts.append(correlation_id)
        return found

    def poll(self, correlation_id: str) -> dict[str, Any] | None:
        reply = self.replies.pop(correlation_id, None)
        if isinstance(reply, RemoteError):
            raise reply
        return reply

    def abandon(self, correlation_id: str) -> None:
        self.abandoned.append(correlation_id)

    def stray_replies(self) -> list[dict[str, Any]]:
        found, self.stray = self.stray, []
        return found

    def stream(self, queue: str) -> FakeStream:
        if queue not in self.queues:
            raise QueueNotFound(f"no queue {queue}")
        return FakeStream(self, queue)

    def forward(self, queue: str, body: bytes) -> None:
        self.unconfirmed.append((queue, self.decoded[body]))

    def confirm_forwarded(self, timeout_s: float) -> None:
        if self.confirm_failure is not None:
            raise self.confirm_failure
        self.forwarded += self.unconfirmed
        self.unconfirmed.clear()

    def consumers(self, queue: str) -> int:
        return self.idle_workers

    def exists(self, queue: str) -> bool:
        return queue in self.alive or queue in self.queues

    def depth(self, queue: str) -> int:
        if queue.endswith(".learner.main"):
            return self.learner_backlog
        return len(self.queues.get(queue, ()))

    def delete(self, queue: str) -> None:
        self.queues.pop(queue, None)
        self.deleted.append(queue)

    def wait(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    # -- playing the workers --------------------------------------------------------

    def settler(self, queue: str, message: dict[str, Any]) -> Any:
        def settle(ack: bool, requeue: bool) -> None:
            outcome = "ack" if ack else "requeue" if requeue else "dead-letter"
            self.settled.append((queue, outcome, message))

        return settle

    def starts(self) -> list[Sent]:
        """Start requests sent so far, oldest first."""
        return [s for s in self.sent if s.body.get("name") == TaskName.START.value]

    def accept(self, sent: Sent, worker_id: str, *, frees: bool = False) -> StartReply:
        """A worker takes the start request: its control queue and the task's metadata queue exist.

        ``frees``: the worker says it honours the start's ``free_when_done`` (warren's workers
        do; DI-engine's and older ones do not say).
        """
        task = StartTask.from_wire(sent.body)
        reply = StartReply(
            worker_id,
            task.task_id,
            f"p.collector.control.{worker_id}",
            f"p.metadata.{task.task_id}",
            free_when_done=frees and task.free_when_done,
        )
        self.alive.add(reply.control_queue)
        self.queues.setdefault(reply.metadata_queue, collections.deque())
        self.replies[sent.correlation_id] = reply.to_wire()
        return reply

    def refuse(self, sent: Sent, code: str, **detail: Any) -> None:
        self.replies[sent.correlation_id] = RemoteError(f"refused: {code}", {"message": code, **detail})

    def listening(
        self, worker_id: str, *, plugins: dict[str, dict[str, str]] | None = None, busy: bool = False
    ) -> ResourceReply:
        """A worker that answers the roster's ``resource`` broadcasts (its control queue exists)."""
        reply = ResourceReply(
            0, 2, worker_id, f"p.collector.control.{worker_id}", busy=busy, task_id=None, plugins=plugins
        )
        self.roster = [r for r in self.roster if r["worker_id"] != worker_id] + [reply.to_wire()]
        self.alive.add(reply.control_queue)
        return reply

    def push(self, queue: str, message: dict[str, Any]) -> None:
        """A worker publishes one metadata item."""
        body = encode({"n": next(self._ids)})  # distinct bytes per item; the message is kept beside
        self.decoded[body] = message
        self.queues[queue].append(body)
