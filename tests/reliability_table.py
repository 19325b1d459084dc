"""Render the fault/fuzz figures (JSON lines from tests.fault_report) as docs/reliability.md's table.

python -m tests.reliability_table REPORT.jsonl [--update docs/reliability.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

START = "<!-- figures:start -->"
END = "<!-- figures:end -->"


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| fault or input | scale | figures |", "|---|---|---|"]
    for row in rows:
        figures = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in row.items() if k not in ("fault", "scale", "time"))
        lines.append(f"| {row['fault']} | {row['scale']} | {figures} |")
    stamp = rows[-1]["time"] if rows else "never"
    return "\n".join([f"Last run: {stamp}.", "", *lines])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("report", type=Path)
    parser.add_argument("--update", type=Path, help="markdown file whose figures block to replace")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.report.read_text().splitlines() if line.strip()]
    table = render(rows)
    if args.update is None:
        print(table)
        return 0
    text = args.update.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    args.update.write_text(f"{head}{START}\n{table}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
