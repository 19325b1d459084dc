"""What a person watching a run sees: a live status line, a run log, a final summary."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import IO, Any

from worker.coordinator.stats import RunStats


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


class Progress:
    """A status line redrawn in place on a terminal, or a log line every few seconds elsewhere.

    Args:
        mode: ``"line"`` (redraw in place), ``"log"`` (one line every ``every_s``),
            ``"off"``, or ``"auto"`` (line on a terminal, log otherwise).
    """

    def __init__(self, mode: str = "auto", *, stream: IO[str] | None = None, every_s: float = 5.0) -> None:
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "line" if self.stream.isatty() else "log"
        self.mode = mode
        self.every_s = every_s if mode == "log" else 0.5
        self._last = 0.0

    def update(self, stats: RunStats, workers_alive: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.mode == "off" or (not force and now - self._last < self.every_s):
            return
        self._last = now
        eval_text = f"{stats.last_eval:.1f}" if stats.last_eval is not None else "-"
        text = (
            f"{_clock(stats.elapsed())} | env steps {stats.env_steps:,} | {stats.steps_per_s():,.0f} steps/s"
            f" | samples {stats.samples:,} | episodes {stats.episodes:,} | eval {eval_text}"
            f" | workers {workers_alive} | policy iter {stats.policy_iter:,} | ratio {stats.replay_ratio():.3f}"
            + (" | held: learner behind" if stats.held_back else "")
        )
        if self.mode == "line":
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self, summary: dict[str, Any]) -> None:
        if self.mode == "off":
            return
        if self.mode == "line":
            self.stream.write("\n")
        outcome = "reached" if summary["success"] else "did NOT reach"
        self.stream.write(
            f"run {outcome} the stop value {summary['stop_value']} ({summary['reason']}): "
            f"best eval return {summary['best_eval']}, {summary['env_steps']:,} env steps, "
            f"{summary['wall_time_s']:.0f} s, {summary['tasks_done']} tasks ({summary['tasks_rerun']} re-run), "
            f"policy iter {summary['policy_iter']:,}, replay ratio {summary['replay_ratio']:.3f} "
            f"(configured {summary['replay_ratio_configured']})\n"
        )
        self.stream.flush()


class RunLog:
    """One JSON object per line: every finished task and every eval, for ``warren plot``."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")

    def write(self, kind: str, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps({"kind": kind, "time": time.time(), **record}, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
