"""What a person watching a run sees: a live status line, a run log, a final summary."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import IO, Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.segment import Segment
from rich.text import Text

from worker import json_text
from worker.coordinator.stats import RunStats


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


def status_text(stats: RunStats, workers: str, *, final: bool = False) -> str:
    """The status line: counters, rates and ``workers`` (already worded: now, or seen).

    ``final``: the run is over, so nothing is held back any more.
    """
    eval_text = f"{stats.last_eval:.1f}" if stats.last_eval is not None else "-"
    ratio = stats.replay_ratio()
    ratio_text = f"{ratio:.3f}" if ratio is not None else "-"
    return (
        f"{_clock(stats.elapsed())} | env steps {stats.env_steps:,} | {stats.steps_per_s():,.0f} steps/s"
        f" | samples {stats.samples:,} | episodes {stats.episodes:,} | eval {eval_text}"
        f" | {workers} | policy iter {stats.policy_iter:,} | ratio {ratio_text}"
        + (" | held: learner behind" if stats.held_back and not final else "")
        + (" | no collector listening" if stats.no_workers and not final else "")
    )


def summary_text(summary: dict[str, Any]) -> str:
    """The one-line outcome of a run, from :meth:`Coordinator.summary`."""
    outcome = "reached" if summary["success"] else "did NOT reach"
    best = summary["best_eval"]
    best_text = f"best eval return {best:.1f}" if best is not None else "no eval finished"
    return (
        f"run {outcome} the stop value {summary['stop_value']} ({summary['reason']}): "
        f"{best_text}, {summary['env_steps']:,} env steps, "
        f"{summary['wall_time_s']:.0f} s, {summary['tasks_done']} tasks ({summary['tasks_rerun']} re-run), "
        f"{len(summary['workers_seen'])} workers, {_policy_text(summary)}, " + _ratio_text(summary)
    )


def _policy_text(summary: dict[str, Any]) -> str:
    """Which policy the run evaluated at the stop value, and which one its policy file holds."""
    evaluated, left, best = summary.get("policy_evaluated"), summary.get("policy_left"), summary.get("best_eval_policy")
    left_text = "policy file not visible here" if left is None else f"policy left {left:,}"
    if evaluated is not None:
        kept = " (kept)" if left == evaluated else ""
        return f"policy evaluated {evaluated:,}, {left_text}{kept}"
    best_text = f" (the best eval's: {best:,})" if best is not None else ""
    return f"{left_text}{best_text}"


def _ratio_text(summary: dict[str, Any]) -> str:
    configured = summary["replay_ratio_configured"]
    if configured is None and summary["replay_ratio"] is not None:
        # An algorithm that does not pace itself by a replay ratio (on-policy): its updates.
        return f"{summary['learner_train_steps']:,} updates for {summary['learner_samples']:,} samples"
    if summary["replay_ratio"] is None:
        return f"replay ratio unknown (no learner counters seen; configured {configured})"
    return (
        f"replay ratio {summary['replay_ratio']:.3f} (configured {configured}; the learner's "
        f"{summary['learner_train_steps']:,} train steps for {summary['learner_samples']:,} samples)"
    )


class _AsItIs:
    """One line of text for rich to print as it is: no wrapping, no markup, no highlighting."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Segment(self.text)
        yield Segment.line()


class _AboveTheStatusLine:
    """A text stream for log handlers that prints each line above the live status line.

    rich's console knows where its live display is: what it prints goes above it and the
    display is redrawn below, so a log line never lands on the status line's row.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self._partial = ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            # As it is, not wrapped by rich (the terminal wraps it), so a long log line copies
            # out as one line. Not print(soft_wrap=True): the status line redrawn by the same
            # print would be cropped to one row too.
            self.console.print(_AsItIs(line), crop=False)
        return len(text)

    def flush(self) -> None:
        pass


class Progress:
    """A status line redrawn in place on a terminal, or a log line every few seconds elsewhere.

    On a terminal the status line is a rich live display, and while it is up, the log
    handlers writing to the same stream print through it (above the line), so log lines
    and the status line never share a row.

    Args:
        mode: ``"line"`` (redraw in place), ``"log"`` (one line every ``every_s``),
            ``"off"``, or ``"auto"`` (line on a terminal, log otherwise).
        stream: where to write (stderr by default).
    """

    def __init__(self, mode: str = "auto", *, stream: IO[str] | None = None, every_s: float = 5.0) -> None:
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "line" if self.stream.isatty() else "log"
        self.mode = mode
        self.every_s = every_s if mode == "log" else 0.5
        self._last = 0.0
        self._stats: RunStats | None = None
        self._live: Live | None = None
        self._rerouted: list[tuple[logging.StreamHandler[Any], Any]] = []

    def update(self, stats: RunStats, workers_alive: int, *, force: bool = False) -> None:
        """Show ``stats`` (at most every ``every_s``, unless ``force``); ``workers_alive``: of running tasks."""
        self._stats = stats
        now = time.monotonic()
        if self.mode == "off" or (not force and now - self._last < self.every_s):
            return
        self._last = now
        self._show(status_text(stats, f"workers {workers_alive}"))

    def finish(self, summary: dict[str, Any]) -> None:
        """The last status line (with the workers seen over the run: none runs a task any more), the summary."""
        if self.mode == "off":
            return
        if self._stats is not None:
            self._show(status_text(self._stats, f"workers seen {len(summary['workers_seen'])}", final=True))
        self.close()
        self.stream.write(summary_text(summary) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Take the live display down and give the log handlers their stream back (idempotent)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        for handler, stream in self._rerouted:
            handler.setStream(stream)
        self._rerouted = []

    def _show(self, text: str) -> None:
        if self.mode == "log":
            self.stream.write(text + "\n")
            self.stream.flush()
            return
        if self._live is None:
            self._live = self._start_live()
        self._live.update(Text(text), refresh=True)

    def _start_live(self) -> Live:
        # force_terminal: "line" may be asked for on a stream that is not a terminal.
        console = Console(file=self.stream, force_terminal=True, highlight=False)
        live = Live(
            console=console,
            auto_refresh=False,  # redrawn by update(), twice a second at most
            redirect_stdout=False,  # stdout may be a file (the summary JSON): never move it to stderr
            # Stray writes to stderr (warnings) go above the line too, when stderr is the stream.
            redirect_stderr=self.stream is sys.stderr,
        )
        live.start()
        writer = _AboveTheStatusLine(console)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is self.stream:
                self._rerouted.append((handler, handler.setStream(writer)))
        return live


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
        self._file.write(json_text.dumps({"kind": kind, "time": time.time(), **record}, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
