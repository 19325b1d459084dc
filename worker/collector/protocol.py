"""The collector task protocol: task names, request parsing and metadata validation.

Kept the same as DI-engine's ``CollectorSlave`` (see ``docs/protocol.md``); every check
here turns untrusted input into a :class:`TaskError` with a clear message instead of a
``KeyError`` or an ``assert``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from worker.errors import TaskError, UnsafePath, short_repr
from worker.rl.config import CollectorSpec
from worker.storage import PolicyStore

RESOURCE: Final = "resource"
START: Final = "collector_start_task"
DATA: Final = "collector_data_task"
CLOSE: Final = "collector_close_task"
TASK_NAMES: Final = (RESOURCE, START, DATA, CLOSE)

#: ids end up in queue and file names: keep them to a safe alphabet.
_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
DATA_KEYS: Final = frozenset({"data_id", "policy_iter"})
INFO_KEYS: Final = frozenset({"collector_done", "cur_episode", "cur_sample", "cur_step"})


def task_name(body: Any) -> str:
    """The ``name`` of a task message.

    Raises:
        TaskError: the body is not a map with a string ``name``.
    """
    if not isinstance(body, dict):
        raise TaskError(f"a task must be a map, got {type(body).__name__}", {"message": "bad task"})
    name = body.get("name")
    if not isinstance(name, str):
        raise TaskError("a task needs a string 'name'", {"message": "task name error"})
    return name


def unknown_task(name: str) -> TaskError:
    """DI-engine's answer to a task it does not know."""
    return TaskError(f"illegal collector task <{name[:100]}>", {"message": "task name error"})


def _checked_id(info: Mapping[str, Any], key: str) -> str:
    value = info.get(key)
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise TaskError(
            f"task_info.{key} must be a string matching {_ID_RE.pattern}, got {short_repr(value)}",
            {"message": f"bad {key}"},
        )
    return value


@dataclass(frozen=True)
class StartTask:
    """A validated ``collector_start_task``."""

    task_id: str
    buffer_id: str
    spec: CollectorSpec
    task_info: dict[str, Any]

    @classmethod
    def from_wire(cls, body: Mapping[str, Any], *, path_policy: Path) -> StartTask:
        """Validate a start task's ``task_info``, including where its policy path points.

        Raises:
            TaskError: a key is missing or wrong, or ``policy_update_path`` leaves ``path_policy``.
        """
        info = body.get("task_info")
        if not isinstance(info, dict):
            raise TaskError("collector_start_task needs a 'task_info' map", {"message": "missing task_info"})
        task_id = _checked_id(info, "task_id")
        buffer_id = _checked_id(info, "buffer_id")
        if "collector_cfg" not in info:
            raise TaskError("task_info.collector_cfg is missing", {"message": "missing collector_cfg"})
        try:
            spec = CollectorSpec.from_wire(info["collector_cfg"])
        except TaskError as exc:
            raise TaskError(exc.message, exc.result or {"message": "bad collector_cfg"}) from None
        if spec.policy_update_path is not None:
            try:
                PolicyStore.check_name(path_policy, spec.policy_update_path)
            except UnsafePath as exc:
                raise TaskError(f"refused policy_update_path: {exc.message}", {"message": "unsafe path"}) from None
        return cls(task_id, buffer_id, spec, info)


#: Counters and ids in metadata are integers in this range (msgpack carries up to 2**64-1).
_MAX_COUNTER: Final = 2**53


def checked_count(metadata: Mapping[str, Any], key: str) -> int:
    """An integer counter of a metadata item (``cur_step``, ``unroll_len``...), 0 when absent.

    Raises:
        TaskError: the value is not an integer in ``0..2**53``.
    """
    value = metadata.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNTER:
        raise TaskError(f"metadata {key} must be an integer in 0..2**53, got {short_repr(value)}")
    return value


def check_metadata(metadata: Mapping[str, Any]) -> None:
    """DI-engine's ``send_metadata`` rule: data metadata or a collector info, nothing else.

    Raises:
        TaskError: neither ``data_id`` + ``policy_iter`` nor the four collector-info keys are present.
    """
    keys = set(metadata)
    if not (keys >= DATA_KEYS or keys >= INFO_KEYS):
        raise TaskError(
            f"metadata must hold {sorted(DATA_KEYS)} or {sorted(INFO_KEYS)}; got keys {sorted(keys)}",
            {"message": "bad metadata"},
        )
