"""Logging set-up: a refused connection is one warren line at INFO; pika's detail only at DEBUG."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator

import pytest

from messaging import ConnectionFailed, Settings
from messaging.connection import connect
from worker.logs import setup_logging

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
