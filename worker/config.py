"""Every role's settings, built one way: ``WARREN_*`` environment variables, then CLI flags.

Each role gets one frozen dataclass holding the transport :class:`messaging.Settings` and
what that role needs besides. :func:`role_config` builds any of them through
:func:`messaging.settings.load`, the one parser warren has: a field ``stall_timeout_s``
reads ``WARREN_STALL_TIMEOUT_S`` and is overridden by ``--stall-timeout-s``. The job
(what to train, :class:`~worker.job.JobConfig`) is not an environment setting: it comes
from its file and flags.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from messaging import ConfigurationError, Settings
from messaging.settings import load
from worker.job import JobConfig
from worker.plugins.registry import DEFAULT_ENV_PACKAGES, import_env_packages

_C = TypeVar("_C")
_WORKER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def default_worker_id() -> str:
    """``<host>-<pid>-<random>``: unique per process, readable in the management UI."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def role_config(cls: type[_C], env: Mapping[str, str] | None = None, **overrides: Any) -> _C:
    """Build a role's config from ``WARREN_*`` variables and non-``None`` ``overrides`` (flags).

    Raises:
        ConfigurationError: a value does not parse or is out of range, or an override names no setting.
    """
    return load(cls, env, overrides)


@dataclass(frozen=True)
class EnvPackagesConfig:
    """The setting every process that checks a job or makes envs reads first (see :func:`import_env_packages_of`)."""

    env_packages: str = DEFAULT_ENV_PACKAGES
    """Modules imported at start so their gymnasium ids register (comma-separated; missing ones are skipped)."""


def import_env_packages_of(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Import the env packages ``WARREN_ENV_PACKAGES`` names (default ``ale_py``); returns the ones imported.

    The same import a collector's plug-in registry makes at start, for every other process
    that checks a job or makes its envs (``warren run``, the coordinator, the learner,
    ``warren check``). Call it before the job is loaded: the job's env id is checked
    against gymnasium's registry, which an env package's import fills.

    Raises:
        ConfigurationError: the variable does not parse, or a named module is installed but fails to import.
    """
    return import_env_packages(role_config(EnvPackagesConfig, env).env_packages, strict=True)


def _check_metrics(port: int, addr: str) -> None:
    if not 0 <= port <= 65535:
        raise ConfigurationError(f"metrics_port must be 0 (no metrics) or a port up to 65535, got {port!r}")
    if not addr:
        raise ConfigurationError("metrics_addr names no address")


def _positive(config: object, *names: str) -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise ConfigurationError(f"{name} must be > 0, got {getattr(config, name)!r}")


@dataclass(frozen=True)
class CollectorConfig:
    """Everything a collector worker process needs to know."""

    transport: Settings = field(default_factory=Settings)
    """Broker URL, prefix, timeouts (see :class:`messaging.Settings`)."""
    worker_id: str = field(default_factory=default_worker_id)
    """Names the worker's control queue and appears in replies and logs."""
    path_data: Path = Path("./data")
    """Shared volume directory for step data files."""
    path_policy: Path = Path("./policy")
    """Shared volume directory the learner writes policy files to."""
    data_wait_s: float = 10.0
    """How long a ``collector_data_task`` waits for the next metadata item before an error reply."""
    policy_wait_s: float = 60.0
    """How long a task waits for its first policy file before failing."""
    close_wait_s: float = 60.0
    """A finished task that nobody closes is closed by the worker itself after this long."""
    stall_timeout_s: float = 300.0
    """A task whose metadata nobody reads for this long (queue full) is abandoned, freeing the worker."""
    stop_grace_s: float = 20.0
    """On SIGTERM, or a close, how long a running task may take to finish its step; a task
    hung in a plug-in call is not waited for (see :data:`worker.collector.run.HUNG_CALL_S`)."""
    fsync: bool = False
    """fsync step files before publishing their metadata (survives host crashes, costs ~0.3 ms/file)."""
    step_compression: str = "auto"
    """``lz4``: compress step files; ``auto``: only those of frame stacks (pixel jobs: Pong's
    60x smaller at ~1 us an env step, and faster to collect even on a local disk), when the
    lz4 package (the ``atari`` extra) is installed; ``none``. Learners read every kind."""
    handler_threads: int = 4
    """Tasks served at the same time (data and close tasks run while a collector runs)."""
    env_threads: int = 0
    """Threads a native vector env (ale-py's) may step its envs on; 0: the CPUs this process may
    run on (its affinity, a container's cpuset), shared out by `warren run` among its collectors."""
    plugins: str = "*"
    """Distributions whose ``warren.*`` entry points this worker loads (comma-separated; ``*``:
    every installed one). warren's built-ins are always there. Tasks can only name what is loaded."""
    env_packages: str = DEFAULT_ENV_PACKAGES
    """Modules imported at start so their gymnasium ids register (comma-separated; missing ones are skipped)."""
    metrics_port: int = 0
    """Serve Prometheus metrics at ``http://<metrics_addr>:<port>/metrics``; 0: none."""
    metrics_addr: str = "127.0.0.1"
    """The address ``/metrics`` listens on (``0.0.0.0``: every interface, for a Prometheus elsewhere)."""

    def __post_init__(self) -> None:
        if not _WORKER_ID_RE.match(self.worker_id):
            raise ConfigurationError(f"worker_id must match {_WORKER_ID_RE.pattern}, got {self.worker_id!r}")
        _positive(self, "data_wait_s", "policy_wait_s", "close_wait_s", "stall_timeout_s", "stop_grace_s")
        if self.handler_threads < 2:
            raise ConfigurationError("handler_threads must be >= 2 (data and close tasks run side by side)")
        if self.step_compression not in ("auto", "none", "lz4"):
            raise ConfigurationError(f"step_compression must be auto, none or lz4, got {self.step_compression!r}")
        if not 0 <= self.env_threads <= 256:
            raise ConfigurationError(f"env_threads must be 0 (auto) to 256, got {self.env_threads!r}")
        _check_metrics(self.metrics_port, self.metrics_addr)

    @property
    def vector_env_threads(self) -> int:
        """:attr:`env_threads`, with 0 resolved from this process's CPU budget."""
        return self.env_threads or cpu_budget()


def cpu_budget() -> int:
    """CPUs this process may run on (``sched_getaffinity``: what ``taskset`` or a container's cpuset leaves)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class LearnerConfig:
    """What the learner process needs: the broker, the job, and the shared volume."""

    transport: Settings = field(default_factory=Settings)
    job: JobConfig = field(default_factory=JobConfig)
    path_data: Path = Path("./data")
    """Shared volume directory the collectors write step data files to."""
    path_policy: Path = Path("./policy")
    """Shared volume directory for the policy files the learner writes."""
    torch_threads: int = 0
    """torch intra-op threads of the learner; 0: the job's ``learner.torch_threads``, else 1.
    The numpy train steps' BLAS pool is sized by ``OPENBLAS_NUM_THREADS`` (1 unless set,
    see :mod:`worker.lifecycle`)."""
    device: str = ""
    """Where the learner trains (``auto``, ``cpu``, ``cuda``, ``cuda:N``); empty: the job's
    ``learner.device``. This machine's setting, so it wins over the job's."""
    metrics_port: int = 0
    """Serve Prometheus metrics at ``http://<metrics_addr>:<port>/metrics``; 0: none."""
    metrics_addr: str = "127.0.0.1"
    """The address ``/metrics`` listens on (``0.0.0.0``: every interface, for a Prometheus elsewhere)."""
    tensorboard_dir: Path | None = None
    """Write TensorBoard event files under ``<dir>/learner``; ``None``: none."""
    env_packages: str = DEFAULT_ENV_PACKAGES
    """Modules imported at start, before the job is loaded (:func:`import_env_packages_of`), so that
    its env id may be one they register (comma-separated; missing ones are skipped)."""

    def __post_init__(self) -> None:
        from worker.devices import check_device_setting

        if self.torch_threads < 0:
            raise ConfigurationError(f"torch_threads must be >= 0, got {self.torch_threads!r}")
        if self.device:
            check_device_setting(self.device, "WARREN_DEVICE/--device")
        _check_metrics(self.metrics_port, self.metrics_addr)

    @property
    def learner_threads(self) -> int:
        """The torch threads the learner runs: this process's setting, else the job's, else 1."""
        return self.torch_threads or self.job.learner.torch_threads or 1

    @property
    def device_setting(self) -> tuple[str, str]:
        """The device the learner trains on, unresolved, and what set it: this process's setting, else the job's."""
        if self.device:
            return self.device, "WARREN_DEVICE/--device"
        return self.job.learner.device, "learner.device"


@dataclass(frozen=True)
class CoordinatorConfig:
    """What the coordinator needs: the broker, the job, and where to log."""

    transport: Settings = field(default_factory=Settings)
    job: JobConfig = field(default_factory=JobConfig)
    run_log: Path | None = None
    """JSON-lines log of tasks, evals and checkpoints (also what a restarted coordinator resumes from)."""
    progress: str = "auto"
    """``line`` (live status line), ``log`` (a line every few seconds), ``off``, or ``auto`` (line on a terminal)."""
    path_policy: Path = Path("./policy")
    """The learner's policy directory, where it writes its counters (:mod:`worker.storage.counters`):
    the replay ratio shown and summed up is the learner's own from there, unknown where the
    coordinator cannot see that directory."""
    metrics_port: int = 0
    """Serve Prometheus metrics at ``http://<metrics_addr>:<port>/metrics``; 0: none."""
    metrics_addr: str = "127.0.0.1"
    """The address ``/metrics`` listens on (``0.0.0.0``: every interface, for a Prometheus elsewhere)."""
    tensorboard_dir: Path | None = None
    """Write TensorBoard event files under ``<dir>/coordinator``; ``None``: none."""
    env_packages: str = DEFAULT_ENV_PACKAGES
    """Modules imported at start, before the job is loaded (:func:`import_env_packages_of`), so that
    its env id may be one they register (comma-separated; missing ones are skipped)."""

    def __post_init__(self) -> None:
        if self.progress not in ("auto", "line", "log", "off"):
            raise ConfigurationError(f"progress must be auto, line, log or off, got {self.progress!r}")
        _check_metrics(self.metrics_port, self.metrics_addr)
