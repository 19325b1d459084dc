"""Picking a run up again after the coordinator restarts, from its own run log.

The coordinator appends a ``checkpoint`` record to the run log whenever a task starts
or ends (and every few seconds): the run's counters and, for every running task, the
queues needed to keep reading it. A restarted coordinator given the same run log loads
the last checkpoint, keeps counting from there, and re-attaches to the tasks that were
running: their metadata waited in durable queues meanwhile.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def last_checkpoint(run_log: Path | None) -> dict[str, Any] | None:
    """The newest checkpoint of an unfinished run, or ``None`` (no log, or the run had ended)."""
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
            elif record.get("kind") == "summary":
                checkpoint = None  # that run ended; a new one starts from zero
    return checkpoint
