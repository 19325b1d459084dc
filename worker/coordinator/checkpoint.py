"""Picking a run up again after the coordinator restarts, from its own run log.

The coordinator appends a ``checkpoint`` record to the run log whenever a task starts
running and every few seconds: the run's counters and, for every running task, the
queues needed to keep reading it. A restarted coordinator given the same run log loads
the last checkpoint, keeps counting from there, and re-attaches to the tasks that were
running: their metadata waited in durable queues meanwhile.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from worker.coordinator.stats import RunStats
from worker.coordinator.task import State, Task

logger = logging.getLogger(__name__)

#: Task numbers a resumed coordinator skips, so it never reuses a task id of the earlier run.
SEQ_GAP = 1000


def checkpoint_record(stats: RunStats, tasks: Iterable[Task], seq: int) -> dict[str, Any]:
    """The run's state as one run-log record (tasks still starting are not worth keeping)."""
    running = {t.task_id: t.to_checkpoint() for t in tasks if t.state is not State.STARTING}
    return {**stats.to_record(), "seq": seq, "running": running}


def restore(record: dict[str, Any], stats: RunStats) -> tuple[int, list[Task]]:
    """Counters into ``stats``; returns the next task number and the tasks to re-attach to."""
    stats.restore(record)
    tasks = [Task.from_checkpoint(task_id, saved) for task_id, saved in dict(record.get("running", {})).items()]
    return int(record.get("seq", 0)) + SEQ_GAP, tasks


def last_checkpoint(run_log: Path | None, *, after_end: bool = False) -> dict[str, Any] | None:
    """The newest checkpoint of an unfinished run, or ``None`` (no log, or the run had ended).

    ``after_end``: the newest checkpoint even when the run ended after it (``warren run
    --resume`` continues an ended run; the coordinator writes a last checkpoint, with no
    task running, just before its summary).
    """
    if run_log is None or not run_log.exists():
        return None
    checkpoint: dict[str, Any] | None = None
    with run_log.open(encoding="utf-8") as lines:
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("ignoring a torn line in %s", run_log)  # a crash mid-write
                continue
            if record.get("kind") == "checkpoint":
                checkpoint = record
            elif record.get("kind") == "summary" and not after_end:
                checkpoint = None  # that run ended; a new one starts from zero
    return checkpoint
