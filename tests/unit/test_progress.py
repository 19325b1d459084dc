"""The coordinator's progress display: a status line that log lines never land on, and the summary."""

from __future__ import annotations

import io
import logging
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from messaging import Settings
from tests.fake_bus import FakeBus
from worker.config import CoordinatorConfig
from worker.coordinator.loop import Coordinator
from worker.coordinator.progress import Progress, summary_text
from worker.coordinator.stats import RunStats
from worker.job import JobConfig
from worker.logs import setup_logging

#: A log line as setup_logging writes it, from its first character.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) \[coordinator\] ")
CSI = re.compile(r"\x1b\[(\??)(\d*)([A-Za-z])")


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal (as stderr is when a person watches a run)."""

    def isatty(self) -> bool:
        return True


def screen(output: str) -> list[str]:
    """The rows a terminal shows after ``output``: carriage return, newline, cursor up, erase line.

    Text overwrites what is under the cursor, as on a terminal; lines are not wrapped at a
    width (a long line stays one row), which is enough to see what shares a row with what.
    """
    rows = [""]
    row = col = 0
    pos = 0
    while pos < len(output):
        match = CSI.match(output, pos)
        if match:
            private, count, command = match.groups()
            if not private and command == "A":
                row = max(0, row - int(count or 1))
            elif not private and command == "K":
                rows[row] = ""
                col = 0 if count == "2" else col
            pos = match.end()
            continue
        char = output[pos]
        pos += 1
        if char == "\r":
            col = 0
        elif char == "\n":
            row, col = row + 1, 0
            if row == len(rows):
                rows.append("")
        else:
            line = rows[row].ljust(col)
            rows[row] = line[:col] + char + line[col + 1 :]
            col += 1
    return [r.rstrip() for r in rows if r.strip()]


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def on_terminal(monkeypatch: pytest.MonkeyPatch) -> FakeTerminal:
    """stderr as a terminal 100 columns wide, with the roles' logging set up on it.

    Called in the test body: pytest puts its own stderr back between a fixture and the test.
    """
    term = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.setenv("COLUMNS", "100")  # a status line longer than the terminal is wide
    setup_logging("coordinator")
    return term


def summary(**changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "success": True,
        "reason": "eval return 200.0 >= 195.0",
        "stop_value": 195.0,
        "best_eval": 200.0,
        "env_steps": 30_000,
        "wall_time_s": 15.2,
        "tasks_done": 8,
        "tasks_rerun": 0,
        "workers_seen": ["c0", "c1"],
        "policy_iter": 470,
        "policy_evaluated": 452,
        "best_eval_policy": 452,
        "policy_left": 452,
        "replay_ratio": 0.0156,
        "replay_ratio_configured": 0.015625,
        "learner_train_steps": 468,
        "learner_samples": 30_000,
    }
    return {**values, **changes}


def test_log_lines_never_share_a_row_with_the_status_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the status line on a terminal, and log lines written meanwhile (one from another thread)
    terminal = on_terminal(monkeypatch)
    progress = Progress("auto")
    assert progress.mode == "line"
    stats = RunStats()
    log = logging.getLogger("worker.coordinator.loop")
    for i in range(3):
        stats.env_steps += 4096
        progress.update(stats, 2, force=True)
        log.info("eval %d: return %.1f at %d env steps", i, 20.0 * i, stats.env_steps)
        thread = threading.Thread(target=log.warning, args=("worker c%d is gone", i))
        thread.start()
        thread.join()
    progress.finish(summary())
    rows = screen(terminal.getvalue())
    # Then every log line starts its own row, and no row mixes a log line with the status line
    logged = [row for row in rows if " [coordinator] " in row]
    assert len(logged) == 6
    for row in logged:
        assert LOG_LINE.match(row), f"log line glued to something: {row!r}"
        assert "env steps 4" not in row and "policy iter" not in row
    # And the status line (wrapped to the width) stays below the log lines, then the summary
    status = [i for i, row in enumerate(rows) if "policy iter" in row or "env steps 12,288" in row]
    assert status and min(status) > rows.index(logged[-1])
    assert "workers seen 2" in "\n".join(rows)
    assert rows[-1].startswith("run reached the stop value 195.0")


def test_log_lines_reach_their_handler_again_once_the_run_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = on_terminal(monkeypatch)
    progress = Progress("line")
    progress.update(RunStats(), 1, force=True)
    progress.finish(summary())
    logging.getLogger("worker.test").info("after the run")
    assert terminal.getvalue().endswith("INFO [coordinator] worker.test: after the run\n")
    assert screen(terminal.getvalue())[-1].endswith("after the run")


def test_off_a_terminal_the_status_is_a_plain_line_every_few_seconds() -> None:
    stream = io.StringIO()
    progress = Progress("auto", stream=stream)
    assert progress.mode == "log"
    stats = RunStats(held_back=True)
    progress.update(stats, 2, force=True)
    progress.update(stats, 2)  # within every_s: nothing
    progress.finish(summary())
    lines = stream.getvalue().splitlines()
    assert "\x1b" not in stream.getvalue() and "\r" not in stream.getvalue()
    assert len(lines) == 3
    assert "| workers 2 |" in lines[0] and lines[0].endswith("| held: learner behind")
    assert "| workers seen 2 |" in lines[1] and "held" not in lines[1]  # the run is over
    assert lines[2].startswith("run reached")


def test_progress_off_writes_nothing() -> None:
    stream = FakeTerminal()
    progress = Progress("off", stream=stream)
    progress.update(RunStats(), 2, force=True)
    progress.finish(summary())
    assert stream.getvalue() == ""


def test_the_summary_says_when_no_eval_finished() -> None:
    text = summary_text(summary(success=False, best_eval=None, reason="stopped by signal"))
    assert "None" not in text
    assert "run did NOT reach the stop value 195.0 (stopped by signal): no eval finished, 30,000 env steps" in text
    assert "best eval return 200.0, 30,000 env steps, 15 s, 8 tasks (0 re-run), 2 workers" in summary_text(summary())


def test_the_summary_names_the_policy_evaluated_and_the_policy_left() -> None:
    assert "2 workers, policy evaluated 452, policy left 452 (kept), replay ratio" in summary_text(summary())
    missed = summary(success=False, policy_evaluated=None, best_eval_policy=300, policy_left=12_303)
    assert "policy left 12,303 (the best eval's: 300)" in summary_text(missed)
    assert "policy file not visible here" in summary_text(summary(policy_left=None))


def test_a_run_says_how_it_schedules_and_ends_with_the_workers_it_saw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a coordinator (progress as log lines) whose tasks ran on two workers, now gone
    caplog.set_level(logging.INFO)
    stop = threading.Event()
    config = CoordinatorConfig(
        transport=Settings(prefix="p"),
        job=JobConfig(),
        run_log=tmp_path / "run.jsonl",
        progress="log",
        path_policy=tmp_path / "policy",
    )
    coordinator = Coordinator(config, stop, bus=FakeBus(idle_workers=0))
    coordinator.stats.workers.update({"c0", "c1"})
    coordinator.turn()
    # When the run ends
    stop.set()
    coordinator.run()
    # Then it said in plain words how many collect tasks it keeps running
    assert "coordinating CartPole-v1: one collect task per worker, stop value 195.0" in caplog.messages
    # And its last status line counts the workers seen, not the (zero) workers of running tasks
    lines = capsys.readouterr().err.splitlines()
    assert "| workers 0 |" in lines[0]
    assert "| workers seen 2 |" in lines[-2] and "| workers 0 |" not in lines[-2]
    assert lines[-1].startswith("run did NOT reach the stop value 195.0 (stopped by signal): no eval finished")
