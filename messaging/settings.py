"""Transport settings: one frozen object, built once at start-up from env vars and flags."""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

from messaging.errors import ConfigurationError

#: Prefix of every environment variable warren reads.
ENV_PREFIX: Final = "WARREN_"
_C = TypeVar("_C")
#: A queue-name prefix (and a run name, which becomes part of one).
PREFIX_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: Values of :attr:`Settings.queue_type`.
QUEUE_TYPES: Final = ("classic", "quorum")
#: Values of :attr:`Settings.amqp_node_order`.
NODE_ORDERS: Final = ("random", "given")


@dataclass(frozen=True)
class Settings:
    """How to reach RabbitMQ and how to behave on it.

    Every field can be set by an environment variable named ``WARREN_<FIELD>`` in upper
    case (``WARREN_AMQP_URL``, ``WARREN_PREFIX``, ``WARREN_RPC_TIMEOUT_S``...) or by the
    matching CLI flag; flags win over the environment, which wins over the defaults.
    """

    amqp_url: str = "amqp://guest:guest@localhost:5672/%2F"
    """Broker URL; ``amqps://`` enables TLS (see ``amqp_ca_file``).

    A comma-separated list names several nodes of one cluster (same credentials and vhost,
    normally): connections try them in turn, and after losing one node fail over to the
    next (see :attr:`amqp_urls`)."""
    amqp_node_order: str = "random"
    """Which node of :attr:`amqp_url` a process tries first: ``random`` (each process draws one
    node of the list once, at random, and every connection it opens starts there, so the
    processes of a deployment spread over the nodes), or ``given`` (the list's first node
    first, as written). Either way a connection that loses its node tries the next one first."""
    amqp_ca_file: str = ""
    """CA bundle to verify the broker's certificate with ``amqps://``; empty: system CAs."""
    prefix: str = "warren"
    """First component of every queue and exchange name; one prefix = one isolated deployment."""
    heartbeat_s: int = 30
    """AMQP heartbeat timeout asked of the broker; a dead peer is noticed after about twice this."""
    blocked_connection_timeout_s: float = 60.0
    """How long a publish may wait on a broker resource alarm before the connection is dropped."""
    connect_timeout_s: float = 30.0
    """Total time spent retrying (jittered exponential backoff) before a connection attempt fails."""
    prefetch: int = 1
    """Unacked task messages a worker holds; 1 keeps long tasks from piling up on one worker."""
    rpc_timeout_s: float = 30.0
    """Default time a caller waits for a reply; also sent as the request's ``expiration``.

    The coordinator waits this long for a collector's close reply, so keep it above the
    collectors' ``stop_grace_s`` (a close may take that long)."""
    max_message_bytes: int = 8 * 1024 * 1024
    """Largest body accepted or produced; bigger task messages are dead-lettered."""
    metadata_queue_length: int = 8
    """Ready metadata messages a task may queue before the collector is held back (DI-engine's Queue(8))."""
    metadata_queue_expires_s: float = 3600.0
    """An unused per-task metadata queue is deleted by the broker after this long."""
    reply_queue_expires_s: float = 300.0
    """An RPC client's reply queue outlives a dropped connection for this long, so replies wait for it."""
    queue_type: str = "classic"
    """How the long-lived durable queues (tasks, learner, dead letters) are declared: ``classic``,
    or ``quorum`` (replicated on a cluster: they survive the loss of a node, and a publish is
    confirmed once a majority holds it; leaders placed across the nodes). A task's metadata
    queue stays classic either way (see docs/reliability.md, *Per-task metadata queues*).
    Every process of a deployment must use the same: the broker refuses to redeclare an
    existing queue with another type."""

    def __post_init__(self) -> None:
        if not self.amqp_urls:
            raise ConfigurationError("amqp_url names no broker")
        for url in self.amqp_urls:
            if urlsplit(url).scheme not in ("amqp", "amqps"):
                raise ConfigurationError(f"amqp_url must start with amqp:// or amqps://, got {redact_url(url)!r}")
        if self.amqp_node_order not in NODE_ORDERS:
            raise ConfigurationError(
                f"amqp_node_order must be one of {', '.join(NODE_ORDERS)}, got {self.amqp_node_order!r}"
            )
        if self.queue_type not in QUEUE_TYPES:
            raise ConfigurationError(f"queue_type must be one of {', '.join(QUEUE_TYPES)}, got {self.queue_type!r}")
        if not PREFIX_RE.match(self.prefix):
            raise ConfigurationError(f"prefix must match {PREFIX_RE.pattern}, got {self.prefix!r}")
        for name in ("heartbeat_s", "prefetch", "max_message_bytes", "metadata_queue_length"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in (
            "blocked_connection_timeout_s",
            "connect_timeout_s",
            "rpc_timeout_s",
            "metadata_queue_expires_s",
            "reply_queue_expires_s",
        ):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be > 0, got {getattr(self, name)!r}")

    def __repr__(self) -> str:
        # Settings end up in logs and tracebacks: never show the password.
        shown = ", ".join(
            f"{f.name}={self.redacted_url if f.name == 'amqp_url' else getattr(self, f.name)!r}" for f in fields(self)
        )
        return f"Settings({shown})"

    @property
    def amqp_urls(self) -> tuple[str, ...]:
        """Every broker address of :attr:`amqp_url`, in the order connections try them."""
        return tuple(part.strip() for part in self.amqp_url.split(",") if part.strip())

    @property
    def redacted_url(self) -> str:
        """The broker URL(s) with every password replaced by ``***``, safe for logs and errors."""
        return redact_url(self.amqp_url)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from ``WARREN_*`` variables, then apply non-``None`` ``overrides``.

        Raises:
            ConfigurationError: a variable does not parse as its field's type, a value is
                out of range, or an override names no setting.
        """
        return load(cls, env, overrides)

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def redact_url(url: str, placeholder: str = "***") -> str:
    """Hide the password of an AMQP URL, or of every URL of a comma-separated list."""
    if "," in url:
        return ",".join(redact_url(part.strip(), placeholder) for part in url.split(",") if part.strip())
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:{placeholder}@{netloc}"))


def load(cls: type[_C], env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> _C:
    """Build any settings dataclass the one way warren builds them all.

    Each field is read from ``WARREN_<FIELD>`` (empty means unset), then overridden by a
    non-``None`` entry of ``overrides`` (CLI flags). A role's ``transport: Settings``
    field is built the same way from the same environment and overrides; fields of other
    types (a job config) come only from ``overrides``.

    Raises:
        ConfigurationError: an unparsable variable, an out-of-range value, or an override
            that names no setting.
    """
    env = os.environ if env is None else env
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    used: set[str] = set()
    for f in fields(cls):  # type: ignore[arg-type]
        kind = hints[f.name]
        if kind is Settings:
            nested = {k for k in given if k in {g.name for g in fields(Settings)}}
            values[f.name] = load(Settings, env, {k: given[k] for k in nested})
            used |= nested
            continue
        raw = env.get(ENV_PREFIX + f.name.upper())
        if raw and _parser(kind) is not None:
            values[f.name] = _parse(f.name, kind, raw)
        if f.name in given:
            values[f.name] = given[f.name]
            used.add(f.name)
    unknown = set(given) - used
    if unknown:
        raise ConfigurationError(f"unknown settings: {sorted(unknown)}")
    return cls(**values)


def to_env(settings: Any) -> dict[str, str]:
    """Every field of a settings dataclass as the ``WARREN_*`` variables :func:`load` reads back.

    How a parent process hands its exact settings to the children it starts.
    """
    env: dict[str, str] = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, Settings):
            env.update(to_env(value))
        elif isinstance(value, bool):
            env[ENV_PREFIX + f.name.upper()] = "1" if value else "0"
        elif isinstance(value, str | int | float | Path):
            env[ENV_PREFIX + f.name.upper()] = str(value)
    return env


def _parser(kind: Any) -> Callable[[str], Any] | None:
    """How to turn an environment string into a value of ``kind`` (``X | None`` as ``X``)."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if len(args) == 1:
        kind = args[0]
    parsers: dict[Any, Callable[[str], Any]] = {bool: _parse_bool, int: int, float: float, str: str, Path: Path}
    return parsers.get(kind)


def _parse_bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _parse(name: str, kind: Any, raw: str) -> Any:
    parser = _parser(kind)
    assert parser is not None
    try:
        return parser(raw)
    except ValueError:
        kind_name = getattr(parser, "__name__", str(kind)).lstrip("_").removeprefix("parse_")
        raise ConfigurationError(f"{ENV_PREFIX}{name.upper()} must be a {kind_name}, got {raw!r}") from None
