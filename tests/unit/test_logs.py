"""Logging set-up: a refused connection is one warren line at INFO; pika's detail only at DEBUG."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from messaging import ConnectionFailed, Settings
from messaging.connection import connect
from worker.logs import last_reason, setup_logging

#: A log line of one of pika's own loggers, as setup_logging formats it.
PIKA_LINE = re.compile(r"^\S+ \S+ \w+ \[[^]]*\] pika\.", re.MULTILINE)


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def closed_port_url() -> str:
    """An AMQP URL on a local port where nothing listens: every connect is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"amqp://guest:secret@127.0.0.1:{port}/%2F"


def refused_connect(level: str, capsys: pytest.CaptureFixture[str]) -> str:
    setup_logging("test", level)
    settings = Settings.from_env({}, amqp_url=closed_port_url(), connect_timeout_s=1.0)
    with pytest.raises(ConnectionFailed, match="Connection refused"):
        connect(settings, "test-role")
    return capsys.readouterr().err


def test_a_refused_connect_logs_one_warning_without_traceback_or_pika_lines(capsys: pytest.CaptureFixture[str]) -> None:
    # Given the default level; When every connect attempt of a whole retry budget is refused
    err = refused_connect("INFO", capsys)
    # Then the outage is one warning that names the broker (password hidden) and the cause
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "WARNING" in lines[0] and "test-role: cannot reach the broker at amqp://guest:***@127.0.0.1" in lines[0]
    assert "ConnectionRefusedError" in lines[0] and "secret" not in err
    # And pika's own error lines and tracebacks stay out
    assert "Traceback" not in err and not PIKA_LINE.search(err)


def test_verbose_shows_pikas_records_and_tracebacks_as_debug(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused_connect("DEBUG", capsys)
    assert "Traceback" in err
    pika_lines = [line for line in err.splitlines() if PIKA_LINE.match(line)]
    assert pika_lines and all(" DEBUG " in line for line in pika_lines)
    assert len(re.findall(r"WARNING .* cannot reach the broker", err)) == 1  # later attempts: DEBUG


def _line(level: str, message: str) -> str:
    return f"2026-01-01 10:00:00,000 {level} [learner] worker.cli.learner: {message}"


def test_why_a_process_stopped_is_read_from_its_logs_last_critical_line_or_the_crash_that_ended_it(
    tmp_path: Path,
) -> None:
    log = tmp_path / "learner.log"
    # Given a log whose process said why it stops, after a traceback it logged on the way
    log.write_text(
        "\n".join(
            [
                _line("ERROR", "task failed"),
                "Traceback (most recent call last):",
                '  File "x.py", line 1, in <module>',
                "KeyError: 'logged on the way'",
                _line("CRITICAL", "learner stops: algorithm plug-in 'dqn' 0.1.0 (from warren): update: NaN"),
                _line("INFO", "bye"),
            ]
        )
    )
    assert last_reason(log) == "learner stops: algorithm plug-in 'dqn' 0.1.0 (from warren): update: NaN"
    # Given one that crashed: the exception that ended it (the first line of a chained one's last)
    log.write_text(
        "\n".join(
            [
                _line("ERROR", "an earlier error"),
                "Traceback (most recent call last):",
                '  File "x.py", line 1, in <module>',
                "KeyError: 'x'",
                "",
                "During handling of the above exception, another exception occurred:",
                "",
                "Traceback (most recent call last):",
                '  File "x.py", line 2, in <module>',
                "ValueError: the random algorithm has no learner",
                "and a second line",
            ]
        )
    )
    assert last_reason(log) == "ValueError: the random algorithm has no learner"
    # and one that only logged errors, or nothing, or is not there
    log.write_text(_line("ERROR", "skipping d1: corrupt") + "\n" + _line("INFO", "bye") + "\n")
    assert last_reason(log) == "skipping d1: corrupt"
    log.write_text(_line("INFO", "bye"))
    assert last_reason(log) is None
    assert last_reason(tmp_path / "missing.log") is None
