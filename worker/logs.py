"""Logging set-up shared by every role: one line per event, naming the process's role and id."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

#: How much of the end of a log :func:`last_reason` reads.
REASON_TAIL_BYTES = 64 * 1024
#: The format's head: ``time level [identity] logger: `` (see :func:`setup_logging`).
_HEAD = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) \[[^\]]*\] \S+: (?P<message>.*)$")


class _Identity(logging.Filter):
    def __init__(self, identity: str) -> None:
        super().__init__()
        self.identity = identity

    def filter(self, record: logging.LogRecord) -> bool:
        record.identity = self.identity
        return True


def setup_logging(identity: str, level: str = "INFO") -> None:
    """Log to stderr as ``time level [identity] logger: message``; pika only from WARNING up.

    pika's ERROR records (and their tracebacks) show only at DEBUG: warren reports every
    connection event itself, once (see ``messaging.connection``).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Identity(identity))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(identity)s] %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("pika").setLevel(logging.WARNING)


def last_reason(log: Path) -> str | None:
    """Why the process that wrote ``log`` stopped, in one line, read from the log's end.

    After a crash, the exception that ends the log's last traceback; else its last CRITICAL
    message (every role says why it stops at that level); else its last ERROR message.
    ``None`` when the log says none of them (or cannot be read).
    """
    try:
        with log.open("rb") as file:
            file.seek(max(0, file.seek(0, 2) - REASON_TAIL_BYTES))
            lines = file.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    critical = error = crash = None
    in_traceback = False
    for line in lines:
        head = _HEAD.match(line)
        if head is not None:
            in_traceback, crash = False, None  # a traceback logged on the way, not the one it died of
            if head["level"] == "CRITICAL":
                critical = head["message"]
            elif head["level"] == "ERROR":
                error = head["message"]
        elif line.startswith("Traceback (most recent call last)"):
            in_traceback, crash = True, None
        elif in_traceback and crash is None and line.strip() and not line.startswith((" ", "\t")):
            crash = line.strip()  # the exception: the traceback's first unindented line after its head
    return crash or critical or error
