"""Which collectors are listening and whether each can run the job, learned from their ``resource`` replies.

Every few seconds the coordinator sends one ``resource`` request to the collectors'
roster exchange (every control queue is bound to it), and every collector answers with
what it measured and which plug-ins it has. As long as every worker that answered can
run the job, start requests go to the shared task queue, as always. Once one cannot (it
lacks a plug-in, or has another version), starts go straight to the control queues of
idle workers that can, so the one that cannot is never handed the job's tasks, and
says so once in the log instead of refusing again and again. A worker that refuses a
start with ``missing plugin`` before the roster heard of it is marked the same way.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from worker.coordinator.bus import CoordinatorBus
from worker.errors import TaskError
from worker.protocol import ResourceReply, TaskName, simple_task

logger = logging.getLogger(__name__)

#: Seconds between two roster requests (and how long the replies to one are collected).
ROSTER_S = 5.0


@dataclass(frozen=True)
class Requirement:
    """One plug-in the job's tasks name: its kind (``env``, ``model``, ``algorithm``), name and version."""

    kind: str
    name: str
    version: str | None

    def describe(self) -> str:
        return f"{self.kind} plug-in {self.name!r} {self.version or ''}".strip()


@dataclass
class Roster:
    """The workers the coordinator heard of, and what each lacks (see the module docstring)."""

    bus: CoordinatorBus
    requirements: tuple[Requirement, ...]
    refresh_s: float = ROSTER_S
    workers: dict[str, ResourceReply] = field(default_factory=dict)
    lacking: dict[str, str] = field(default_factory=dict)
    """Worker id -> why it cannot run the job."""
    _request: str | None = None
    _next: float = 0.0
    _heard: dict[str, float] = field(default_factory=dict)

    def refresh(self, now: float | None = None) -> None:
        """Collect the replies to the last request; send a new one when it is time. Never blocks."""
        now = time.monotonic() if now is None else now
        if self._request is not None:
            for result in self.bus.gathered(self._request):
                self._learn(result, now)
        if now < self._next:
            return
        if self._request is not None:
            self.bus.gathered(self._request, done=True)
        self._forget_silent(now)
        self._request = self.bus.broadcast(simple_task(TaskName.RESOURCE), timeout_s=self.refresh_s)
        self._next = now + self.refresh_s

    def soon(self) -> None:
        """Ask again at the next :meth:`refresh` (after a surprise: a refusal)."""
        self._next = 0.0

    def _learn(self, result: dict[str, object], now: float) -> None:
        try:
            reply = ResourceReply.from_wire(result)
        except TaskError as exc:
            logger.debug("ignoring a resource reply: %s", exc.message)
            return
        self.workers[reply.worker_id] = reply
        self._heard[reply.worker_id] = now
        why = self._lacks(reply)
        if why is None:
            self.lacking.pop(reply.worker_id, None)
        elif reply.worker_id not in self.lacking:
            self.mark(reply.worker_id, why)

    def _lacks(self, reply: ResourceReply) -> str | None:
        for need in self.requirements:
            why = reply.lacks(need.kind, need.name, need.version)
            if why is not None:
                return why
        return None

    def _forget_silent(self, now: float) -> None:
        # A worker that missed two rounds is gone (or stuck): it no longer counts either way.
        for worker_id, heard in list(self._heard.items()):
            if now - heard > 2.5 * self.refresh_s:
                del self._heard[worker_id]
                self.workers.pop(worker_id, None)
                self.lacking.pop(worker_id, None)

    def mark(self, worker_id: str, why: str) -> None:
        """Record that ``worker_id`` cannot run the job (logged once per worker)."""
        if self.lacking.get(worker_id) != why:
            logger.error("%s: this job's tasks go to the other workers", why)
        self.lacking[worker_id] = why

    @property
    def mixed(self) -> bool:
        """Some worker cannot run the job: starts go to chosen workers, not the shared queue."""
        return bool(self.lacking)

    def capable(self) -> list[ResourceReply]:
        """The workers that can run the job, as last heard of."""
        return [w for wid, w in self.workers.items() if wid not in self.lacking]

    def pick(self, taken: set[str]) -> ResourceReply | None:
        """An idle worker that can run the job and is not in ``taken`` (workers with a task of ours)."""
        for worker in self.capable():
            if not worker.busy and worker.worker_id not in taken:
                return worker
        return None

    def nobody_can(self) -> str | None:
        """Why no worker heard of can run the job, when that is the case (and some were heard of)."""
        if self.lacking and not self.capable():
            return "; ".join(sorted(self.lacking.values()))
        return None


def job_requirements(job: Any) -> tuple[Requirement, ...]:
    """The plug-ins every task of ``job`` names (a worker lacking one cannot run it)."""
    needs = [
        Requirement("algorithm", job.algorithm.name, job.algorithm.version),
        Requirement("model", job.model.name, job.model.version),
    ]
    if job.env.plugin is not None:
        needs.append(Requirement("env", job.env.plugin, job.env.plugin_version))
    return tuple(needs)
