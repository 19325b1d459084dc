"""A run's directory: whether a run used it, whether that run is alive, and its lock.

``warren run`` writes ``<workdir>/run.json`` (the run's id, queue prefix and broker: what
it may leave on the broker) and holds an exclusive lock (``flock``) on
``<workdir>/run.lock`` for as long as its process lives. A clean end removes the lock
file. So the directory says what became of its run:

* **new**: no run wrote there;
* **running**: the lock is held: the run's process is alive (on this machine, or on
  another one sharing the directory over a filesystem with working locks);
* **interrupted**: the file is there but nobody holds its lock: the process died without
  cleaning up (a second Ctrl-C, a kill, a crash); its queues and step files may be left;
* **ended**: the run's files are there (``job.json``, ``run.jsonl``, logs) without a lock
  file: it finished and cleaned up after itself.

The kernel drops the lock with the process, however it dies, so no stale lock can ever
claim that a dead run is alive.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from messaging import ConfigurationError
from worker.storage import atomic_write

#: The lock file's name in a workdir.
LOCK_NAME: Final = "run.lock"
#: The run's record (:class:`RunRecord`) in its workdir.
RECORD_NAME: Final = "run.json"
#: Files and directories a run writes into its workdir: any of them means a run used it.
RUN_FILES: Final = ("job.json", "run.jsonl", "summary.json", "logs", RECORD_NAME, LOCK_NAME)


class RunState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    ENDED = "ended"


@dataclass(frozen=True)
class RunRecord:
    """Who the run in a workdir is: enough to find what it left on the broker."""

    run_id: str
    prefix: str
    """The run's queue prefix (``<base prefix>-<run id>``)."""
    named: bool
    buffer_id: str
    """Names the learner's queue."""
    broker: str
    """The broker URL(s), without the password: a run cleans up only on the broker it used."""
    pid: int
    started: float

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunRecord | None:
        try:
            data = json.loads(text)
            return cls(
                run_id=str(data["run_id"]),
                prefix=str(data["prefix"]),
                named=bool(data["named"]),
                buffer_id=str(data["buffer_id"]),
                broker=str(data["broker"]),
                pid=int(data["pid"]),
                started=float(data["started"]),
            )
        except (ValueError, TypeError, KeyError):
            return None


def _lock_free(path: Path) -> bool:
    """Whether nobody holds the lock of ``path`` (the file must exist)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the probe's own lock
    return True


def state_of(workdir: Path) -> RunState:
    """What became of the run that used ``workdir`` (see the module docstring)."""
    lock = workdir / LOCK_NAME
    if lock.exists():
        return RunState.INTERRUPTED if _lock_free(lock) else RunState.RUNNING
    if any((workdir / name).exists() for name in RUN_FILES):
        return RunState.ENDED
    return RunState.NEW


def runs_under(directory: Path) -> dict[str, RunState]:
    """The directories under ``directory`` that a run used, by name, with what became of each run."""
    if not directory.is_dir():
        return {}
    states = {path.name: state_of(path) for path in sorted(directory.iterdir()) if path.is_dir()}
    return {name: state for name, state in states.items() if state is not RunState.NEW}


def describe_runs(directory: Path) -> str:
    """The runs under ``directory`` in words, for a message: ``runs/: exp1 (ended), exp2 (interrupted)``."""
    runs = runs_under(directory)
    if not runs:
        return f"no run has used {directory}/ yet"
    return f"runs in {directory}/: " + ", ".join(f"{name} ({state.value})" for name, state in runs.items())


def read_record(workdir: Path) -> RunRecord | None:
    """The record of ``workdir``'s run, if there is a readable one."""
    try:
        return RunRecord.from_json((workdir / RECORD_NAME).read_text())
    except OSError:
        return None


class RunLock:
    """The lock a live run holds on its workdir (see the module docstring)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def take(cls, workdir: Path) -> RunLock | None:
        """Lock ``workdir`` for this process; ``None`` when a live process holds it."""
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / LOCK_NAME
        # Not inherited by the run's children (O_CLOEXEC): only this process holds the lock.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return cls(path, fd)

    @classmethod
    def acquire(cls, workdir: Path, record: RunRecord) -> RunLock:
        """Lock ``workdir`` for the run of ``record`` and write the record.

        Raises:
            ConfigurationError: another live process holds the lock (the run is running).
        """
        lock = cls.take(workdir)
        if lock is None:
            other = read_record(workdir)
            pid = f" (pid {other.pid})" if other is not None else ""
            raise ConfigurationError(f"run {record.run_id} is running{pid}: its workdir {workdir} is locked")
        atomic_write(workdir / RECORD_NAME, record.to_json().encode(), fsync=False)
        return lock

    def release(self) -> None:
        """The run ended and cleaned up: remove the lock file, then drop the lock (idempotent)."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.unlock()

    def unlock(self) -> None:
        """Drop the lock but keep the file: the run stays interrupted (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def new_record(run_id: str, prefix: str, *, named: bool, buffer_id: str, broker: str) -> RunRecord:
    return RunRecord(run_id, prefix, named, buffer_id, broker, os.getpid(), time.time())
