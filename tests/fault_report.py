"""Figures from the fault and fuzz suites, gathered for docs/reliability.md.

Each test adds one row with :func:`record`. Rows are appended to the JSON-lines file
named by ``WARREN_RELIABILITY_REPORT`` (nothing is written when it is unset);
``python -m tests.reliability_table FILE`` renders them as the report's table.
``WARREN_FAULT_SCALE`` = ``ci`` (default: a reduced, bounded run) or ``full``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def scale() -> str:
    return os.environ.get("WARREN_FAULT_SCALE", "ci")


def scaled(ci: int, full: int) -> int:
    """A repetition count for the current scale."""
    return full if scale() == "full" else ci


def record(fault: str, **figures: Any) -> None:
    """Append one row of figures for ``fault`` to the report, if a report is being written."""
    path = os.environ.get("WARREN_RELIABILITY_REPORT")
    if not path:
        return
    row = {"fault": fault, "scale": scale(), "time": time.strftime("%Y-%m-%d %H:%M:%S"), **figures}
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(row, default=str) + "\n")
