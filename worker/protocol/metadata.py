"""The metadata stream: data items (one per step file) and collector infos.

DI-engine's ``send_metadata`` rule: a metadata message is either data metadata (it has
``data_id`` and ``policy_iter``) or a collector info (it has ``collector_done`` and the
three counters). Both carry the task's ``task_id`` and ``buffer_id``, so a reader of the
stream needs nothing else. ``docs/protocol.md`` section 5 documents the same.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from worker.errors import TaskError, short_repr
from worker.protocol.tasks import Refusal

DATA_KEYS: Final = frozenset({"data_id", "policy_iter"})
INFO_KEYS: Final = frozenset({"collector_done", "cur_episode", "cur_sample", "cur_step"})
#: Counters and ids in metadata are integers in this range (msgpack carries up to 2**64-1).
MAX_COUNTER: Final = 2**53


def checked_count(metadata: Mapping[str, Any], key: str) -> int:
    """An integer counter of a metadata item (``cur_step``, ``unroll_len``...), 0 when absent.

    Raises:
        TaskError: the value is not an integer in ``0..2**53``.
    """
    value = metadata.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNTER:
        raise TaskError(f"metadata {key} must be an integer in 0..2**53, got {short_repr(value)}")
    return value


def _number(metadata: Mapping[str, Any], key: str, default: float) -> float:
    value = metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TaskError(f"metadata {key} must be a number, got {short_repr(value)}")
    return float(value)


def _flag(metadata: Mapping[str, Any], key: str, default: bool) -> bool:
    """A true/false key; anything else (a number, an array) is refused, not judged by its truth."""
    value = metadata.get(key, default)
    if not isinstance(value, bool):
        raise TaskError(f"metadata {key} must be true or false, got {short_repr(value)}")
    return value


def _optional_str(metadata: Mapping[str, Any], key: str) -> str | None:
    value = metadata.get(key)
    if value is not None and not isinstance(value, str):
        raise TaskError(f"metadata {key} must be a string, got {short_repr(value)}")
    return value


@dataclass(frozen=True)
class DataItem:
    """Data metadata: ``data_id`` names a complete step file (one columnar chunk) on the shared volume."""

    data_id: str
    policy_iter: int
    """Learner iteration of the policy that produced every sample of the chunk."""
    unroll_len: int
    """Steps per env in the chunk (``T``: the leading dimension of its arrays)."""
    env_num: int
    """Envs per step (``N``: the second dimension)."""
    sample_count: int
    """Real transitions in the chunk (``valid`` rows; at most ``T x N``)."""
    cur_episode: int
    cur_sample: int
    cur_step: int
    task_id: str | None = None
    buffer_id: str | None = None
    eval_flag: bool = False
    compressor: str = "none"
    get_data_time: float = field(default_factory=time.time)
    priority: float = 1.0

    def to_wire(self) -> dict[str, Any]:
        return _without_none(asdict(self))


@dataclass(frozen=True)
class InfoItem:
    """A collector info: the task's counters, sent after steps in which an episode ended and at the end."""

    collector_done: bool
    cur_episode: int
    cur_sample: int
    cur_step: int
    task_id: str | None = None
    buffer_id: str | None = None
    eval_flag: bool = False
    get_info_time: float = field(default_factory=time.time)
    error: str | None = None
    """The task failed (then ``collector_done`` is true: nothing more will come)."""
    aborted: bool = False
    """The worker is shutting down mid-task (``collector_done`` false): run the task elsewhere."""

    def to_wire(self) -> dict[str, Any]:
        wire = _without_none(asdict(self))
        if not self.aborted:
            del wire["aborted"]
        return wire


def _without_none(wire: dict[str, Any]) -> dict[str, Any]:
    """Optional keys that have no value are left out of the wire map, not sent as nil."""
    return {key: value for key, value in wire.items() if value is not None}


def check_metadata(metadata: Mapping[str, Any]) -> None:
    """DI-engine's rule: data metadata or a collector info, nothing else.

    Raises:
        TaskError: neither ``data_id`` + ``policy_iter`` nor the four collector-info keys are present.
    """
    keys = set(metadata)
    if not (keys >= DATA_KEYS or keys >= INFO_KEYS):
        raise Refusal.BAD_METADATA.error(
            f"metadata must hold {sorted(DATA_KEYS)} or {sorted(INFO_KEYS)}; got keys {sorted(keys)}"
        )


def read_metadata(message: Mapping[str, Any]) -> DataItem | InfoItem:
    """Validate one message of a metadata stream; unknown extra keys are ignored.

    Raises:
        TaskError: it breaks the rule of :func:`check_metadata`, or a counter, id or flag
            has the wrong type.
    """
    check_metadata(message)
    cur_episode, cur_sample, cur_step = (checked_count(message, k) for k in ("cur_episode", "cur_sample", "cur_step"))
    task_id, buffer_id = _optional_str(message, "task_id"), _optional_str(message, "buffer_id")
    eval_flag = _flag(message, "eval_flag", False)
    if "data_id" in message:
        data_id = message["data_id"]
        if not isinstance(data_id, str):
            raise TaskError(f"data_id must be a string, got {short_repr(data_id)}")
        return DataItem(
            data_id=data_id,
            policy_iter=checked_count(message, "policy_iter"),
            unroll_len=checked_count(message, "unroll_len"),
            env_num=checked_count(message, "env_num"),
            sample_count=checked_count(message, "sample_count"),
            cur_episode=cur_episode,
            cur_sample=cur_sample,
            cur_step=cur_step,
            task_id=task_id,
            buffer_id=buffer_id,
            eval_flag=eval_flag,
            compressor=_optional_str(message, "compressor") or "none",
            get_data_time=_number(message, "get_data_time", time.time()),
            priority=_number(message, "priority", 1.0),
        )
    error = message.get("error")
    return InfoItem(
        collector_done=_flag(message, "collector_done", False),
        cur_episode=cur_episode,
        cur_sample=cur_sample,
        cur_step=cur_step,
        task_id=task_id,
        buffer_id=buffer_id,
        eval_flag=eval_flag,
        get_info_time=_number(message, "get_info_time", time.time()),
        error=None if error is None else str(error),
        aborted=_flag(message, "aborted", False),
    )
