"""Names and declarations of every queue and exchange warren uses.

All names derive from one prefix (default ``warren``), so two deployments on one
broker never collide and a test run can own a private prefix. Declarations are
idempotent: every process declares what it needs with the same arguments, before it
publishes or consumes, and again after each reconnect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from messaging.settings import Settings

#: Queue arguments a quorum queue refuses (406 on declare, RabbitMQ 3.10): dropped from
#: quorum declarations. Not exclusive, not auto-delete, never transient either.
QUORUM_REFUSED_ARGS: Final = frozenset({"x-max-priority", "x-queue-mode"})
#: Where a new quorum queue's leader goes (RabbitMQ 3.10+, ``x-queue-leader-locator``): on
#: the node that leads the fewest quorum queues, not on the declaring client's node (the
#: default, ``client-local``), so the loss of one node is the loss of some leaders, not all.
QUORUM_LEADER_LOCATOR: Final = "balanced"


@dataclass(frozen=True)
class QueueDecl:
    """Everything needed to (re)declare one queue."""

    name: str
    durable: bool = True
    exclusive: bool = False
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    fanouts: tuple[str, ...] = ()
    """Fanout exchanges (declared durable) the queue is bound to, e.g. the collectors' roster."""


@dataclass(frozen=True)
class Names:
    """Queue and exchange names of one deployment, all under ``prefix``, and their declarations.

    ``queue_type`` (``Settings.queue_type``) decides how the long-lived durable queues are
    declared: the task queue, the learner queues and the dead-letter queue. ``quorum`` adds
    ``x-queue-type: quorum`` and ``x-queue-leader-locator: balanced`` and drops what a
    quorum queue refuses. The control and reply queues stay classic either way (a control
    queue dies with its worker's connection, a reply queue is transient: neither needs
    replicas), and so do the per-task metadata queues: one Raft group created and deleted
    per task costs 4x a classic queue on a healthy cluster and 5 s per deletion while a
    member is down, and what a classic one loses with its node is collected again by
    re-running the task (figures in docs/reliability.md).
    """

    prefix: str = "warren"
    queue_type: str = "classic"

    @classmethod
    def of(cls, settings: Settings) -> Names:
        """The names and declarations of a deployment's :class:`~messaging.settings.Settings`."""
        return cls(settings.prefix, settings.queue_type)

    @property
    def dead_letter_exchange(self) -> str:
        """Fanout exchange that receives rejected, expired and unprocessable messages."""
        return f"{self.prefix}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        """Where dead letters are kept for inspection (management UI: Get messages)."""
        return f"{self.prefix}.dead-letter"

    @property
    def collector_tasks(self) -> str:
        """Shared durable queue of collector tasks; every idle collector competes for it."""
        return f"{self.prefix}.collector.tasks"

    @property
    def collector_roster(self) -> str:
        """Fanout exchange every collector's control queue is bound to: a ``resource`` sent there reaches all."""
        return f"{self.prefix}.collector.roster"

    def collector_control(self, worker_id: str) -> str:
        """A collector's own queue, for tasks about the collector it is running."""
        return f"{self.prefix}.collector.control.{worker_id}"

    def metadata(self, task_id: str) -> str:
        """Stream of metadata (data and collector info) of one collector task."""
        return f"{self.prefix}.metadata.{task_id}"

    def learner_data(self, buffer_id: str) -> str:
        """Data metadata handed by the coordinator to the learner owning ``buffer_id``."""
        return f"{self.prefix}.learner.{buffer_id}"

    def reply(self, client_id: str) -> str:
        """An RPC client's reply queue."""
        return f"{self.prefix}.reply.{client_id}"

    # -- declarations -------------------------------------------------------------

    def dead_letter_args(self) -> dict[str, Any]:
        return {"x-dead-letter-exchange": self.dead_letter_exchange}

    def durable_decl(self, name: str, arguments: dict[str, Any] | None = None) -> QueueDecl:
        """A durable queue of the deployment's queue type (the declaration every client must repeat)."""
        args = dict(arguments or {})
        if self.queue_type == "quorum":
            args = {k: v for k, v in args.items() if k not in QUORUM_REFUSED_ARGS}
            args["x-queue-type"] = "quorum"
            args["x-queue-leader-locator"] = QUORUM_LEADER_LOCATOR
        return QueueDecl(name, durable=True, exclusive=False, auto_delete=False, arguments=args)

    def classic_decl(self, name: str, arguments: dict[str, Any] | None = None) -> QueueDecl:
        """A durable classic queue whatever the deployment's queue type (a task's metadata queue)."""
        return QueueDecl(name, durable=True, exclusive=False, auto_delete=False, arguments=dict(arguments or {}))

    def dead_letter_queue_decl(self) -> QueueDecl:
        return self.durable_decl(self.dead_letter_queue)

    def collector_tasks_decl(self) -> QueueDecl:
        return self.durable_decl(self.collector_tasks, self.dead_letter_args())

    def collector_control_decl(self, worker_id: str) -> QueueDecl:
        # Auto-delete: the queue dies with its one consumer, the worker's connection, so a task
        # sent to a dead worker fails at once (mandatory publish) instead of waiting for a
        # timeout. Not exclusive: the coordinator checks that it exists by a passive declare,
        # which the broker would refuse (and log as an error) for another connection's
        # exclusive queue, every few seconds per running task.
        return QueueDecl(
            self.collector_control(worker_id),
            durable=False,
            exclusive=False,
            auto_delete=True,
            arguments=self.dead_letter_args(),
            fanouts=(self.collector_roster,),
        )

    def metadata_decl(self, task_id: str, *, max_length: int, expires_s: float) -> QueueDecl:
        # reject-publish makes a full queue nack the publish: that is the back-pressure
        # that holds the collector when nobody reads, like DI-engine's Queue(8). Classic on
        # every deployment (see the class docstring): it lives on the node of the collector
        # that declares it (RabbitMQ's client-local placement), and dies with that node.
        return self.classic_decl(
            self.metadata(task_id),
            {
                **self.dead_letter_args(),
                "x-max-length": max_length,
                "x-overflow": "reject-publish",
                "x-expires": int(expires_s * 1000),
            },
        )

    def learner_data_decl(self, buffer_id: str) -> QueueDecl:
        return self.durable_decl(self.learner_data(buffer_id), self.dead_letter_args())

    def reply_decl(self, client_id: str, *, expires_s: float) -> QueueDecl:
        # Not exclusive: a reply queue outlives a brief reconnect of its client (x-expires
        # removes it once nobody uses it), so replies sent meanwhile are not lost.
        return QueueDecl(
            self.reply(client_id),
            durable=False,
            arguments={"x-expires": int(expires_s * 1000)},
        )
