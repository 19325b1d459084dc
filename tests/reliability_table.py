"""Render the fault/fuzz figures (JSON lines from tests.fault_report) as docs/reliability.md's table.

python -m tests.reliability_table REPORT.jsonl [--update docs/reliability.md] [--merge]

``--update`` replaces the whole table with the report's rows; with ``--merge`` the
report's rows replace only the rows of the same fault (and scale) and other rows stay,
so one test run again (``scripts/reliability --full tests/faults/test_private_cluster.py``)
refreshes its own rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

START = "<!-- figures:start -->"
END = "<!-- figures:end -->"
HEADER = ["| fault or input | scale | figures |", "|---|---|---|"]


def row_line(row: dict[str, Any]) -> str:
    figures = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in row.items() if k not in ("fault", "scale", "time"))
    return f"| {row['fault']} | {row['scale']} | {figures} |"


def render(rows: list[dict[str, Any]]) -> str:
    stamp = rows[-1]["time"] if rows else "never"
    return "\n".join([f"Last run: {stamp}.", "", *HEADER, *(row_line(row) for row in rows)])


def merge(block: str, rows: list[dict[str, Any]]) -> str:
    """The table of ``block`` with ``rows`` in place of the lines of the same fault and scale."""
    lines = [line for line in block.splitlines() if line.startswith("| ") and line not in HEADER]
    new = {(row["fault"], row["scale"]): row_line(row) for row in rows}
    kept = []
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        key = (cells[0], cells[1]) if len(cells) >= 2 else None
        kept.append(new.pop(key) if key in new else line)
    kept.extend(new.values())
    stamps = [row["time"] for row in rows]
    previous = next((line for line in block.splitlines() if line.startswith("Last run:")), "Last run: never.")
    base = previous.split("; rows updated")[0].removesuffix(".")
    stamp = f"{base}; rows updated {max(stamps)}." if stamps else previous
    return "\n".join([stamp, "", *HEADER, *kept])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("report", type=Path)
    parser.add_argument("--update", type=Path, help="markdown file whose figures block to replace")
    parser.add_argument("--merge", action="store_true", help="replace only the rows of the faults in the report")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.report.read_text().splitlines() if line.strip()]
    if args.update is None:
        print(render(rows))
        return 0
    text = args.update.read_text()
    head, _, rest = text.partition(START)
    block, _, tail = rest.partition(END)
    table = merge(block, rows) if args.merge else render(rows)
    args.update.write_text(f"{head}{START}\n{table}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
