"""Role settings: the transport settings plus what each role needs, built once at start-up.

Like :class:`messaging.Settings`, every field reads ``WARREN_<FIELD>`` from the
environment and can be overridden by a CLI flag of the same name.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from messaging import ConfigurationError, Settings

_T = TypeVar("_T")
_WORKER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def default_worker_id() -> str:
    """``<host>-<pid>-<random>``: unique per process, readable in the management UI."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


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
    close_wait_s: float = 600.0
    """A finished task that nobody closes is closed by the worker itself after this long."""
    stall_timeout_s: float = 300.0
    """A task whose metadata nobody reads for this long (queue full) is abandoned, freeing the worker."""
    stop_grace_s: float = 20.0
    """On SIGTERM, how long running work may take to finish before the worker exits anyway."""
    fsync: bool = False
    """fsync step files before publishing their metadata (survives host crashes, costs ~0.3 ms/file)."""
    handler_threads: int = 4
    """Tasks served at the same time (data and close tasks run while a collector runs)."""

    def __post_init__(self) -> None:
        if not _WORKER_ID_RE.match(self.worker_id):
            raise ConfigurationError(f"worker_id must match {_WORKER_ID_RE.pattern}, got {self.worker_id!r}")
        for name in ("data_wait_s", "policy_wait_s", "close_wait_s", "stall_timeout_s", "stop_grace_s"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.handler_threads < 2:
            raise ConfigurationError("handler_threads must be >= 2 (data and close tasks run side by side)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> CollectorConfig:
        """Build from ``WARREN_*`` variables and non-``None`` overrides (CLI flags)."""
        return from_env(cls, env, overrides)


def from_env(cls: type[_T], env: Mapping[str, str] | None, overrides: Mapping[str, Any]) -> _T:
    """Build a role config dataclass: its ``transport`` from :class:`Settings`, the rest by field name."""
    env = os.environ if env is None else env
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    transport_names = {f.name for f in fields(Settings)}
    transport = Settings.from_env(env, **{k: v for k, v in overrides.items() if k in transport_names})
    values: dict[str, Any] = {"transport": transport}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name == "transport":
            continue
        raw = env.get("WARREN_" + f.name.upper())
        if raw:
            values[f.name] = _parse(f.name, str(f.type), raw)
    for key, value in overrides.items():
        if value is None or key in transport_names:
            continue
        if key not in names:
            raise ConfigurationError(f"unknown setting {key!r}")
        values[key] = value
    return cls(**values)


def _parse(name: str, type_name: str, raw: str) -> Any:
    try:
        if type_name == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if type_name == "int":
            return int(raw)
        if type_name == "float":
            return float(raw)
        if type_name == "Path":
            return Path(raw)
        return raw
    except ValueError:
        raise ConfigurationError(f"WARREN_{name.upper()} must be a {type_name}, got {raw!r}") from None


def replace(config: _T, **changes: Any) -> _T:
    """A copy of a frozen config with some fields changed (validated again)."""
    return dataclasses.replace(config, **changes)  # type: ignore[type-var]
