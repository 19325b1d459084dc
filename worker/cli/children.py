"""The child processes of ``warren run``: started with the run's environment, watched, stopped together.

Every child gets SIGTERM from the kernel if ``warren run`` dies (Linux parent-death
signal), so no process outlives the run; each runs in a session of its own, so a Ctrl-C
reaches only ``warren run``, which then stops each child with exactly one SIGTERM. A child
that exits early is reported with the reason its log ends with, and ends the run when
the run cannot go on without it (:class:`ChildDeaths`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from worker.cli.exit_codes import ExitCode
from worker.logs import last_reason
from worker.plugins.faults import parse

logger = logging.getLogger(__name__)

#: How long children get to stop after SIGTERM before they are killed.
CHILD_GRACE_S = 30.0


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG = 1: the kernel sends SIGTERM to the child when this process dies.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class Children:
    """The run's child processes, started with the run's environment and stopped together."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._files: list[IO[bytes]] = []
        self._stopping = False

    def start(self, name: str, args: list[str]) -> None:
        # Appended, never truncated: a resumed run's logs go on after the earlier run's.
        log = (self.logs / f"{name}.log").open("ab")
        self._files.append(log)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only calls prctl, no locks taken
            # Own session: a Ctrl-C reaches only this process, which then stops each child
            # with exactly one SIGTERM (a second signal would make a child exit at once).
            start_new_session=True,
        )

    def watch(self, on_exit: Callable[[str, int], None]) -> None:
        """Call ``on_exit(name, code)`` from a watcher thread when a child exits before :meth:`stop`."""
        for name, proc in self.procs.items():
            threading.Thread(target=self._wait, args=(name, proc, on_exit), name=f"watch-{name}", daemon=True).start()

    def _wait(self, name: str, proc: subprocess.Popen[bytes], on_exit: Callable[[str, int], None]) -> None:
        code = proc.wait()  # blocks in the kernel; returns when the child is gone
        if not self._stopping:
            on_exit(name, code)

    def stop(self) -> dict[str, int | None]:
        """SIGTERM everyone, wait for the grace period, SIGKILL whoever is left."""
        self._stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + CHILD_GRACE_S
        codes: dict[str, int | None] = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in %.0f s: killing it", name, CHILD_GRACE_S)
                proc.kill()
                codes[name] = proc.wait(10)
        for log in self._files:
            log.close()
        return codes


class ChildDeaths:
    """Ends the run when a child's exit leaves it unable to go on: the learner, or every collector.

    Each child that exits non-zero is reported with its own one-line reason, read from the
    end of its log (:func:`worker.logs.last_reason`), not only its exit code. A learner that
    gave up on the job's plug-ins (exit code 4: NaN updates, every chunk rejected, a model
    that breaks the contract) ends the run as a plug-in failure, so ``warren run`` exits 4 too.
    """

    def __init__(self, coordinator: Any, collectors: int, logs: Path) -> None:
        self.coordinator = coordinator
        self.collectors_left = collectors
        self.logs = logs
        self._lock = threading.Lock()
        self._reported: set[str] = set()

    def why(self, name: str, code: int) -> str:
        """``<name> exited with code <code>: <its reason>``."""
        reason = last_reason(self.logs / f"{name}.log") or f"its log says no reason (logs/{name}.log)"
        return f"{name} exited with code {code}: {reason}"

    def on_exit(self, name: str, code: int) -> None:
        why = self.why(name, code)
        logger.error("%s (its log: logs/%s.log)", why, name)
        with self._lock:
            self._reported.add(name)
            if name == "learner" and code == ExitCode.PLUGIN_FAILING:
                self.coordinator.give_up(f"the {why}", {**parse(why), "role": "learner"})
            elif name == "learner":
                self.coordinator.abort(f"the {why}")
            elif name.startswith("collector"):
                self.collectors_left -= 1
                if self.collectors_left == 0:
                    self.coordinator.abort(f"every collector exited, the last: {why}")

    def report_stopped(self, codes: Mapping[str, int | None]) -> None:
        """Say why each child that exited non-zero when the run stopped it did (those not reported yet)."""
        for name, code in codes.items():
            if code and name not in self._reported:
                logger.warning("%s (its log: logs/%s.log)", self.why(name, code), name)
