"""Logging set-up shared by every role: one line per event, naming the process's role and id."""

from __future__ import annotations

import logging
import sys


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
