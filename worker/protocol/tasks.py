"""Task messages and their replies: names, refusal codes, start, resource and close.

DI-engine's ``CollectorSlave`` protocol (``docs/protocol.md`` sections 3 and 4): a task
is ``{"name": ..., "task_info": {...}}``; a refusal is an ``ok: false`` reply whose
``result.message`` is one of the :class:`Refusal` codes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from worker.errors import TaskError, short_repr
from worker.plugins.spaces import UnsupportedSpace
from worker.protocol.checks import mapping
from worker.protocol.collector_cfg import CollectorSpec


class TaskName(StrEnum):
    """The four tasks a collector worker serves."""

    RESOURCE = "resource"
    START = "collector_start_task"
    DATA = "collector_data_task"
    CLOSE = "collector_close_task"


class Refusal(StrEnum):
    """``result.message`` of an ``ok: false`` reply: why a task was refused, as a short code."""

    BAD_REQUEST = "bad request"
    """Undecodable, wrong content type, no correlation id (answered by the RPC layer)."""
    INTERNAL_ERROR = "internal error"
    """A handler crashed (a bug on the worker)."""
    BAD_TASK = "bad task"
    TASK_NAME_ERROR = "task name error"
    MISSING_TASK_INFO = "missing task_info"
    BAD_TASK_ID = "bad task_id"
    BAD_BUFFER_ID = "bad buffer_id"
    MISSING_COLLECTOR_CFG = "missing collector_cfg"
    BAD_COLLECTOR_CFG = "bad collector_cfg"
    UNKNOWN_ENV = "unknown env"
    """The env id is not in the gymnasium registry, or the env cannot be created."""
    UNSUPPORTED_ENV = "unsupported env"
    """The env's spaces, or the task's ``spaces``, are not ones warren carries; the env's differ from
    the task's; or the algorithm or model cannot use them. (Malformed ``spaces`` are ``bad collector_cfg``.)"""
    MISSING_PLUGIN = "missing plugin"
    """The worker lacks a plug-in the task names, or has it at another version. Permanent for
    this worker (``result`` names the plug-in and the worker); another worker may have it."""
    UNSAFE_PATH = "unsafe path"
    WORKER_BUSY = "worker busy"
    WRONG_QUEUE = "wrong queue"
    NO_RUNNING_COLLECTOR = "no running collector"
    NO_DATA_YET = "no data yet"
    COLLECTOR_FAILED = "collector failed"
    BAD_METADATA = "bad metadata"

    @property
    def permanent(self) -> bool:
        """Sending the same task again (to any worker) cannot succeed."""
        return self in _PERMANENT

    @property
    def worker_specific(self) -> bool:
        """This worker can never run the task, but another may: send it elsewhere, not here again."""
        return self is Refusal.MISSING_PLUGIN

    def error(self, message: str, **detail: Any) -> TaskError:
        """The :class:`TaskError` a handler raises to refuse a task with this code."""
        return TaskError(message, {"message": self.value, **detail})

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> Refusal | None:
        """The code in a refusal's ``result``, or ``None`` if it carries none we know."""
        code = result.get("message")
        try:
            return cls(code) if isinstance(code, str) else None
        except ValueError:
            return None


_PERMANENT: Final = frozenset(
    {
        Refusal.BAD_TASK,
        Refusal.TASK_NAME_ERROR,
        Refusal.MISSING_TASK_INFO,
        Refusal.BAD_TASK_ID,
        Refusal.BAD_BUFFER_ID,
        Refusal.MISSING_COLLECTOR_CFG,
        Refusal.BAD_COLLECTOR_CFG,
        Refusal.UNKNOWN_ENV,
        Refusal.UNSUPPORTED_ENV,
        Refusal.UNSAFE_PATH,
    }
)

#: ids end up in queue and file names: keep them to a safe alphabet.
ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def task_name(body: Any) -> TaskName:
    """The name of a task message.

    Raises:
        TaskError: the body is not a map with the name of a known task.
    """
    if not isinstance(body, dict):
        raise Refusal.BAD_TASK.error(f"a task must be a map, got {type(body).__name__}")
    name = body.get("name")
    if not isinstance(name, str):
        raise Refusal.TASK_NAME_ERROR.error("a task needs a string 'name'")
    try:
        return TaskName(name)
    except ValueError:
        raise Refusal.TASK_NAME_ERROR.error(f"illegal collector task <{name[:100]}>") from None


def checked_id(info: Mapping[str, Any], key: str, refusal: Refusal) -> str:
    value = info.get(key)
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise refusal.error(f"task_info.{key} must be a string matching {ID_PATTERN.pattern}, got {short_repr(value)}")
    return value


@dataclass(frozen=True)
class StartTask:
    """``collector_start_task``: run ``cfg`` as task ``task_id`` for replay buffer ``buffer_id``."""

    task_id: str
    buffer_id: str
    cfg: CollectorSpec
    free_when_done: bool = False
    """The worker may take its next start task once this one is done (its final info published),
    before the close comes: the caller reads the stream and closes each task by its id, so the
    close need not stand between two tasks. Without it (DI-engine, a client polling with
    ``collector_data_task``), the worker is busy until the close."""

    def to_wire(self) -> dict[str, Any]:
        info: dict[str, Any] = {"task_id": self.task_id, "buffer_id": self.buffer_id}
        info["collector_cfg"] = self.cfg.to_wire()
        if self.free_when_done:
            info["free_when_done"] = True
        return {"name": TaskName.START.value, "task_info": info}

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> StartTask:
        """Validate a start task (paths in it are checked by whoever opens them).

        Raises:
            TaskError: a key is missing or wrong; ``result.message`` says which kind.
        """
        info = body.get("task_info")
        if not isinstance(info, dict):
            raise Refusal.MISSING_TASK_INFO.error("collector_start_task needs a 'task_info' map")
        task_id = checked_id(info, "task_id", Refusal.BAD_TASK_ID)
        buffer_id = checked_id(info, "buffer_id", Refusal.BAD_BUFFER_ID)
        if "collector_cfg" not in info:
            raise Refusal.MISSING_COLLECTOR_CFG.error("task_info.collector_cfg is missing")
        try:
            cfg = CollectorSpec.from_wire(info["collector_cfg"])
        except UnsupportedSpace as exc:  # well-formed spaces of a kind warren does not carry
            raise Refusal.UNSUPPORTED_ENV.error(exc.message) from None
        except TaskError as exc:
            raise Refusal.BAD_COLLECTOR_CFG.error(exc.message) from None
        free_when_done = info.get("free_when_done", False)
        if not isinstance(free_when_done, bool):
            raise Refusal.BAD_REQUEST.error(
                f"task_info.free_when_done must be true or false, got {short_repr(free_when_done)}"
            )
        return cls(task_id, buffer_id, cfg, free_when_done)


#: ``message`` of a successful start reply (DI-engine's wording).
STARTED: Final = "collector task has started"


@dataclass(frozen=True)
class StartReply:
    """Where the started task lives: the worker's control queue and the task's metadata queue."""

    worker_id: str
    task_id: str
    control_queue: str
    metadata_queue: str
    spaces: Mapping[str, Any] | None = None
    """The spaces of the worker's env in their canonical wire form (``Spaces.to_wire()``; equal to the
    task's ``spaces`` where it named them): how a client that has not got the env learns them. Kept
    as they came (``Spaces.from_wire`` decodes them): warren's coordinator has no use for them, and a
    start must not fail over them. ``None``: a worker that does not say (DI-engine's)."""
    free_when_done: bool = False
    """The worker honours the start's ``free_when_done`` (older workers do not say, and stay
    busy until the close)."""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "message": STARTED,
            "worker_id": self.worker_id,
            "task_id": self.task_id,
            "control_queue": self.control_queue,
            "metadata_queue": self.metadata_queue,
        }
        if self.spaces is not None:
            wire["spaces"] = dict(self.spaces)
        if self.free_when_done:
            wire["free_when_done"] = True
        return wire

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> StartReply:
        """Read a start reply's ``result``.

        Raises:
            TaskError: a queue name or id is missing or not a string.
        """
        values = {}
        for key in ("worker_id", "task_id", "control_queue", "metadata_queue"):
            value = result.get(key)
            if not isinstance(value, str) or not value:
                raise TaskError(f"start reply without a string {key}: {short_repr(dict(result))}")
            values[key] = value
        spaces = result.get("spaces")
        free = result.get("free_when_done") is True
        return cls(**values, free_when_done=free, spaces=spaces if isinstance(spaces, Mapping) else None)


@dataclass(frozen=True)
class ResourceReply:
    """Answer to ``resource``: what the worker can use, measured, which plug-ins it has, and whether it is busy."""

    gpu: int
    cpu: int
    worker_id: str
    control_queue: str
    busy: bool
    task_id: str | None
    plugins: Mapping[str, Mapping[str, str]] | None = None
    """``{"envs": {name: version}, "models": {...}, "algorithms": {...}}``: what the worker can run
    (``None``: a worker that does not say, such as a DI-engine one)."""

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "gpu": self.gpu,
            "cpu": self.cpu,
            "worker_id": self.worker_id,
            "control_queue": self.control_queue,
            "busy": self.busy,
            "task_id": self.task_id,
        }
        if self.plugins is not None:
            wire["plugins"] = {kind: dict(have) for kind, have in self.plugins.items()}
        return wire

    def lacks(self, kind: str, name: str, version: str | None) -> str | None:
        """What the worker lacks of that plug-in (``kind``: ``env``, ``model``, ``algorithm``), or None.

        A worker that does not list its plug-ins is taken to have them (it refuses if not).
        """
        if self.plugins is None:
            return None
        have = self.plugins.get(f"{kind}s", {}).get(name)
        if have is None:
            return f"worker {self.worker_id} has no {kind} plug-in {name!r}"
        if version is not None and have != version:
            return f"worker {self.worker_id} has {kind} plug-in {name!r} {have}, the job needs {version}"
        return None

    @classmethod
    def from_wire(cls, result: Any) -> ResourceReply:
        """Raises: TaskError: a key is missing or has the wrong type."""
        result = mapping(result, "resource reply")
        try:
            task_id = result["task_id"]
            reply = cls(
                gpu=int(result["gpu"]),
                cpu=int(result["cpu"]),
                worker_id=str(result["worker_id"]),
                control_queue=str(result["control_queue"]),
                busy=bool(result["busy"]),
                task_id=None if task_id is None else str(task_id),
                plugins=_plugins(result["plugins"]) if "plugins" in result else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TaskError(f"malformed resource reply ({exc!r}): {short_repr(dict(result))}") from None
        return reply


def _plugins(value: Any) -> dict[str, dict[str, str]]:
    if not isinstance(value, Mapping):
        raise TypeError("plugins must be a map")
    return {
        str(kind): {str(name): str(version) for name, version in mapping(have, f"plugins.{kind}").items()}
        for kind, have in value.items()
    }


def simple_task(name: TaskName) -> dict[str, Any]:
    """The body of a task that carries no ``task_info`` (resource, data, DI-engine's close)."""
    return {"name": name.value}


def close_task(task_id: str) -> dict[str, Any]:
    """A close of ``task_id`` only: a worker that runs another task by now refuses it.

    DI-engine's close names no task and ends whatever runs; a close that arrives late
    (after the worker closed the task itself at its close wait and took the next one)
    would then end a task somebody else follows.
    """
    return {"name": TaskName.CLOSE.value, "task_id": task_id}


def close_target(body: Mapping[str, Any]) -> str | None:
    """The task a close names (:func:`close_task`), or None for a close of whatever runs.

    Raises:
        TaskError: ``task_id`` is there but not a task id.
    """
    if "task_id" not in body:
        return None
    return checked_id(body, "task_id", Refusal.BAD_REQUEST)
