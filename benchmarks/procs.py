"""Child processes of a benchmark: ``warren`` workers and the raw-pika helpers.

Every child is started with a parent-death signal, so none outlives the suite even if
it is killed, and :func:`stop_all` ends them (SIGTERM, then SIGKILL) by their own pids.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from messaging import BrokerLink, Settings

#: The repository root, put on children's PYTHONPATH so ``-m benchmarks.*`` works from anywhere.
REPO_ROOT = Path(__file__).resolve().parent.parent


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG = 1: SIGTERM the child when the suite dies.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class Child:
    """One child process; its stderr goes to ``log``; stdout is a pipe when ``talk`` is set."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str], log: Path, talk: bool = False) -> None:
        self.argv = list(argv)
        self.log_path = log
        self._log = log.open("wb")
        self.popen = subprocess.Popen(
            self.argv,
            env={**os.environ, "PYTHONPATH": _python_path(), **env},
            stdin=subprocess.PIPE if talk else subprocess.DEVNULL,
            stdout=subprocess.PIPE if talk else self._log,
            stderr=self._log,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only calls prctl
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, message: dict[str, Any]) -> None:
        """Write one JSON line to the child's stdin."""
        stdin = self._pipe(self.popen.stdin)
        stdin.write((json.dumps(message) + "\n").encode())
        stdin.flush()

    def receive(self, timeout_s: float) -> dict[str, Any]:
        """Read one JSON line from the child's stdout."""
        stdout = self._pipe(self.popen.stdout)
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        if not ready:
            raise TimeoutError(f"{self.argv[2:4]} said nothing within {timeout_s} s; log: {self.log_path}")
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"{self.argv[2:4]} exited ({self.popen.poll()}); log: {self.log_path}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self, grace_s: float = 15.0) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                stream.close()
        self._log.close()
        return self.popen.returncode

    @staticmethod
    def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
        if stream is None:
            raise RuntimeError("this child was started without talk=True")
        return stream


def _python_path() -> str:
    existing = os.environ.get("PYTHONPATH")
    return f"{REPO_ROOT}{os.pathsep}{existing}" if existing else str(REPO_ROOT)


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def warren_env(settings: Settings, workdir: Path) -> dict[str, str]:
    """Environment of a ``warren`` child: the run's broker and prefix, files under ``workdir``."""
    return {
        "WARREN_AMQP_URL": settings.amqp_url,
        "WARREN_PREFIX": settings.prefix,
        "WARREN_QUEUE_TYPE": settings.queue_type,
        "WARREN_CONNECT_TIMEOUT_S": "10",
        "WARREN_PATH_DATA": str(workdir / "data"),
        "WARREN_PATH_POLICY": str(workdir / "policy"),
        "PYTHONUNBUFFERED": "1",
    }


def start_collector(settings: Settings, workdir: Path, worker_id: str) -> Child:
    """Start ``warren collector`` and wait until its control queue exists (it is serving)."""
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    child = Child(
        python_module("worker.cli", "collector", "--worker-id", worker_id, "--log-level", "WARNING"),
        env=warren_env(settings, workdir),
        log=logs / f"{worker_id}.log",
    )
    queue = f"{settings.prefix}.collector.control.{worker_id}"
    deadline = time.monotonic() + 60.0
    with BrokerLink(settings, "bench-probe") as link:
        while not link.queue_exists(queue):
            if not child.alive() or time.monotonic() > deadline:
                child.stop()
                raise RuntimeError(f"collector {worker_id} did not start; log: {child.log_path}")
            time.sleep(0.1)
    return child


def stop_all(children: Sequence[Child]) -> None:
    """SIGTERM every child first, then wait for each (they stop in parallel)."""
    for child in children:
        if child.alive():
            child.popen.send_signal(signal.SIGTERM)
    for child in children:
        child.stop()


def wait_ready(child: Child, timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait for the ``{"ready": ...}`` line a helper prints once it consumes."""
    answer = child.receive(timeout_s)
    if "ready" not in answer:
        raise RuntimeError(f"unexpected first line from {child.argv}: {answer}")
    return answer
