"""One collect or eval task as the coordinator tracks it, from its start request to its close."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from worker.coordinator.bus import MetadataStream
from worker.errors import TaskError
from worker.protocol import InfoItem, StartTask, read_metadata

#: Grace after a start request's expiration before it is sent again.
START_GRACE_S = 5.0


@dataclass(frozen=True)
class Timeouts:
    start_s: float
    """A start request nobody took within this long expires and is sent again."""
    close_s: float
    """A close request unanswered for this long: the worker is taken as gone."""
    silence_s: float
    """A running task that sends nothing for this long is closed and its slot refilled."""
    start_grace_s: float = START_GRACE_S
    """Extra wait after a start request expired, for the reply of a worker that took it just in time."""


class State(StrEnum):
    STARTING = "starting"
    """Start request sent, no reply yet."""
    RUNNING = "running"
    """A worker runs it; its metadata stream is being read."""
    CLOSING = "closing"
    """Close request sent, no reply yet."""


class Kind(StrEnum):
    COLLECT = "collect"
    EVAL = "eval"


@dataclass
class Task:
    """What the coordinator knows of one task; :class:`~worker.coordinator.driver.TaskDriver` moves it on."""

    task_id: str
    kind: Kind
    start: StartTask | None
    """The start request (``None`` for a task adopted from an earlier coordinator's checkpoint)."""
    state: State = State.STARTING
    target: str | None = None
    """The worker the start request goes to (its control queue), or None for the shared task queue."""
    target_worker: str | None = None
    """The id of that worker."""
    correlation_id: str | None = None
    """The request in flight: the start request while starting, the close request while closing."""
    deadline: float = 0.0
    """When the request in flight is given up."""
    worker_id: str | None = None
    control_queue: str | None = None
    metadata_queue: str | None = None
    stream: MetadataStream | None = None
    last_heard: float = field(default_factory=time.monotonic)
    last_info: InfoItem | None = None
    samples: int = 0
    """Samples of the data items forwarded so far."""
    steps_counted: int = 0
    episodes_counted: int = 0
    done: bool = False
    """The worker said ``collector_done``: close it."""
    frees_worker: bool = False
    """Its worker said (start reply) that it takes its next task once this one is done, before the close."""
    misses: int = 0
    resend_at: float = 0.0
    """While closing: when the close is sent again if no reply came."""
    close_resend_s: float = 0.0
    """Liveness checks in a row that found the worker's control queue gone."""
    cancelled: bool = False
    """The run is ending: close the task as soon as it has started."""
    silenced: bool = False
    """Closed for its silence (hung in plug-in code?): counted as a task run again, not as one done."""

    @property
    def holds_worker(self) -> bool:
        """Whether a worker is (or will be) busy with it: not once it is done on a worker that frees itself then."""
        return not (self.done and self.frees_worker)

    def count(self, cur_step: int, cur_episode: int) -> tuple[int, int]:
        """New env steps and episodes since the last counters seen (they only grow; redeliveries add nothing)."""
        new_steps = max(0, cur_step - self.steps_counted)
        new_episodes = max(0, cur_episode - self.episodes_counted)
        self.steps_counted += new_steps
        self.episodes_counted += new_episodes
        return new_steps, new_episodes

    def to_checkpoint(self) -> dict[str, Any]:
        """What a restarted coordinator needs to keep reading this running task."""
        return {
            "kind": self.kind.value,
            "worker_id": self.worker_id,
            "control_queue": self.control_queue,
            "metadata_queue": self.metadata_queue,
            "counted": {"cur_step": self.steps_counted, "cur_episode": self.episodes_counted},
            "done": self.done,
            "last_info": self.last_info.to_wire() if self.last_info is not None else None,
        }

    @classmethod
    def from_checkpoint(cls, task_id: str, saved: dict[str, Any]) -> Task:
        counted = dict(saved.get("counted") or {})
        last_info = _info_or_none(saved.get("last_info"))
        # Checkpoints of earlier versions have no "done": it was the last info's collector_done.
        done = saved.get("done", last_info is not None and last_info.collector_done)
        return cls(
            task_id,
            Kind(saved["kind"]),
            None,
            state=State.RUNNING,
            worker_id=saved.get("worker_id"),
            control_queue=saved.get("control_queue"),
            metadata_queue=saved.get("metadata_queue"),
            steps_counted=int(counted.get("cur_step", 0)),
            episodes_counted=int(counted.get("cur_episode", 0)),
            last_info=last_info,
            done=bool(done),
        )


def _info_or_none(saved: Any) -> InfoItem | None:
    if not isinstance(saved, dict):
        return None
    try:
        info = read_metadata(saved)
    except TaskError:
        return None
    return info if isinstance(info, InfoItem) else None
