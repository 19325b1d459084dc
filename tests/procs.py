"""Run warren roles as real processes in tests, and make sure none outlives its test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from messaging import BrokerLink, Settings
from tests.broker_admin import wait_until


class Proc:
    """A ``warren`` subcommand in a child process, logging to a file."""

    def __init__(self, args: Sequence[str], *, env: dict[str, str], log: Path) -> None:
        self.args = list(args)
        self.log_path = log
        self._log = log.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", *self.args],
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout_s: float) -> int:
        return self.popen.wait(timeout_s)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)
        self._log.close()


def role_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment that points a child process at the test's broker vhost and prefix."""
    return {
        "WARREN_AMQP_URL": settings.amqp_url,
        "WARREN_PREFIX": settings.prefix,
        "WARREN_QUEUE_TYPE": settings.queue_type,
        "WARREN_CONNECT_TIMEOUT_S": "10",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def wait_for_queue(link: BrokerLink, queue: str, timeout_s: float = 30.0) -> None:
    """Wait until a worker has declared ``queue`` (its sign of being ready)."""
    wait_until(lambda: link.queue_exists(queue), timeout_s, f"queue {queue}")
