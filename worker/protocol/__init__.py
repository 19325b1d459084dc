"""The wire contract every role speaks: tasks, replies, ``collector_cfg``, metadata, ``finish_info``.

Role-neutral, and free of broker calls (it uses only warren's error types): the
coordinator, the collectors, the learner, the tests and the fuzzer meet here (and in
``docs/protocol.md``, which documents the same contract for clients in other
languages); roles never import each other. Every type converts both
ways: ``to_wire()`` gives the msgpack-ready map, ``from_wire()`` validates an untrusted
one and raises a :class:`~worker.errors.TaskError` carrying a :class:`Refusal` code.
"""

from __future__ import annotations

from worker.protocol.collector_cfg import MAX_ENV_NUM, CollectorSpec, EnvSpec, PolicySpec
from worker.protocol.finish import FinishInfo
from worker.protocol.metadata import DataItem, InfoItem, check_metadata, checked_count, read_metadata
from worker.protocol.tasks import (
    ID_PATTERN,
    STARTED,
    Refusal,
    ResourceReply,
    StartReply,
    StartTask,
    TaskName,
    close_target,
    close_task,
    simple_task,
    task_name,
)

__all__ = [
    "ID_PATTERN",
    "MAX_ENV_NUM",
    "STARTED",
    "CollectorSpec",
    "DataItem",
    "EnvSpec",
    "FinishInfo",
    "InfoItem",
    "PolicySpec",
    "Refusal",
    "ResourceReply",
    "StartReply",
    "StartTask",
    "TaskName",
    "check_metadata",
    "checked_count",
    "close_target",
    "close_task",
    "read_metadata",
    "simple_task",
    "task_name",
]
