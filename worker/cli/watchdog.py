"""Run a piece of work in a child process that must keep making progress, and that a signal ends at once.

``warren check`` drives a job's env plug-in, which may hang: in C code that holds the
GIL, in a sleep, in a socket read. A thread cannot be stopped from outside, and a process
whose main thread is stuck may never run a Python signal handler. So the work runs in a
forked child, in its own process group, and this process only watches it: the child
reports each step it begins on a pipe (:class:`Progress`), and a step that does not end
within ``step_timeout_s`` gets the child's whole group killed. The first SIGTERM or
SIGINT does the same and ends the watch (the usual first-signal-stops-cleanly rule of
:mod:`worker.lifecycle` does not fit here: there is nothing to finish cleanly, and a
child that hangs would never notice the request).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

#: How often the watch looks at the clock, the child and the signals when the child is quiet.
_POLL_S = 0.2
#: PR_SET_PDEATHSIG: the kernel signals the child when the process that forked it dies.
_PR_SET_PDEATHSIG = 1


class Progress:
    """The child's side of the pipe: it names each step as it begins it."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def begin(self, step: str) -> None:
        """``step`` starts now: the watch gives it a whole ``step_timeout_s`` from here."""
        line = step.replace("\n", " ") + "\n"
        with contextlib.suppress(OSError):  # the watch is gone: the kernel ends this process anyway
            os.write(self._fd, line.encode())


@dataclass(frozen=True)
class Watched:
    """How the watched work ended: one of ``code``, ``stalled`` and ``signum`` is set."""

    code: int | None = None
    """The child's exit status, when it ended by itself."""
    stalled: str | None = None
    """The step that did not end within the timeout (the child was killed)."""
    signum: int | None = None
    """The signal that ended the watch (the child was killed)."""


def run_watched(work: Callable[[Progress], int], *, step_timeout_s: float) -> Watched:
    """Run ``work(progress)`` in a forked child; its return value is the child's exit status.

    Call it from a process with one thread (a fork copies only the calling thread).
    The child's stdout and stderr are this process's.
    """
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; it leaves through os._exit
            os.close(read_fd)
            _child(work, write_fd)
        os.close(write_fd)
        try:
            return _watch(pid, read_fd, step_timeout_s, received)
        finally:
            os.close(read_fd)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _child(work: Callable[[Progress], int], fd: int) -> None:  # pragma: no cover - runs in the child
    code = 1
    try:
        os.setsid()  # its own group: killed with every process it starts, out of the terminal's Ctrl-C
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        with contextlib.suppress(OSError, AttributeError):  # not Linux: the watch still kills it
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        code = work(Progress(fd))
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _watch(pid: int, fd: int, step_timeout_s: float, received: list[int]) -> Watched:
    step = "starting"
    deadline = time.monotonic() + step_timeout_s
    pending = b""
    listening = True
    while True:
        if received:
            _kill(pid)
            return Watched(signum=received[0])
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            # Ended (not reaped yet, so its group id stays its own): anything it left in its group goes too.
            return Watched(code=_kill(pid))
        now = time.monotonic()
        if now >= deadline:
            _kill(pid)
            return Watched(stalled=step)
        wait_s = min(_POLL_S, deadline - now)
        if not listening:  # the child closed its end and is exiting
            time.sleep(wait_s)
            continue
        ready, _, _ = select.select([fd], [], [], wait_s)
        if not ready:
            continue
        data = os.read(fd, 4096)
        listening = bool(data)
        *lines, pending = (pending + data).split(b"\n")
        if lines:
            step = lines[-1].decode(errors="replace")
            deadline = time.monotonic() + step_timeout_s


def _kill(pid: int) -> int:
    """SIGKILL the child's process group (the child alone before it made its group); reap it, return its status."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
