"""What identifies a ``warren run``: its id, queue prefix and workdir, and how others join it.

An unnamed run makes a fresh id (``20261130-201512-ab12``), so its queues cannot meet
those of any other run and nobody else can find them. ``warren run --name NAME`` fixes
the id instead: the prefix ``<prefix>-NAME`` and the workdir ``runs/NAME`` are known in
advance, so collectors started on other machines (``warren collector --prefix
<prefix>-NAME``) join the run by consuming the same task queue, and a second run with
the same name picks up where the last one stopped.
"""

from __future__ import annotations

import argparse
import shlex
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from messaging import ConfigurationError, Settings
from messaging.settings import PREFIX_RE, redact_url, to_env

#: A run name: one plain path component (it names the workdir) that is also a queue prefix.
RUN_NAME_RE: Final = PREFIX_RE
#: Longest queue prefix :class:`messaging.Settings` accepts.
MAX_PREFIX_CHARS: Final = 64
#: Where a run's workdir goes unless ``--workdir`` says otherwise.
RUNS_DIR: Final = Path("runs")
#: Stands for the password in the join command: it is never logged.
URL_PLACEHOLDER_TEXT: Final = "<password>"
#: Settings the join command passes as flags or placeholders, not as copied variables.
_NOT_COPIED: Final = frozenset({"WARREN_AMQP_URL", "WARREN_PREFIX", "WARREN_AMQP_CA_FILE"})
_LOOPBACK: Final = frozenset({"localhost", "127.0.0.1", "::1"})


def run_name(text: str) -> str:
    """argparse type of ``--name``: refuse names that could not be a directory and a prefix part."""
    if RUN_NAME_RE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"must match {RUN_NAME_RE.pattern}, got {text!r}")
    return text


@dataclass(frozen=True)
class RunIdentity:
    """The names of one run, fixed before anything starts."""

    run_id: str
    """The run's name, or a fresh ``<date>-<time>-<random>`` id."""
    prefix: str
    """Queue prefix of every process of the run: ``<base prefix>-<run_id>``."""
    workdir: Path
    """Data, policies, logs and the run log: ``runs/<run_id>`` unless given."""
    named: bool
    """Joinable (``--name``): collectors elsewhere may use the prefix, so its shared queues stay."""


def run_identity(base_prefix: str, name: str | None = None, workdir: Path | None = None) -> RunIdentity:
    """The identity of a run named ``name`` (``None``: a fresh id nobody else knows).

    Raises:
        ConfigurationError: the name is not a valid run name, or makes the prefix too long.
    """
    if name is not None and RUN_NAME_RE.fullmatch(name) is None:
        raise ConfigurationError(f"a run name must match {RUN_NAME_RE.pattern}, got {name!r}")
    run_id = name if name is not None else time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    prefix = f"{base_prefix}-{run_id}"
    if len(prefix) > MAX_PREFIX_CHARS:
        raise ConfigurationError(
            f"the run's queue prefix {prefix!r} is longer than {MAX_PREFIX_CHARS} characters: "
            "use a shorter --name or --prefix"
        )
    return RunIdentity(run_id, prefix, workdir if workdir is not None else RUNS_DIR / run_id, name is not None)


def url_placeholder(amqp_url: str) -> str:
    """``amqp_url`` (one URL or a comma-separated list) with every password replaced by a placeholder."""
    return redact_url(amqp_url, URL_PLACEHOLDER_TEXT)


def loopback_hosts(amqp_url: str) -> list[str]:
    """The hosts of ``amqp_url`` that only mean "this machine" (another machine must use another name)."""
    return [host for host in _hosts(amqp_url) if host in _LOOPBACK]


def _hosts(amqp_url: str) -> Iterator[str]:
    for url in amqp_url.split(","):
        host = urlsplit(url.strip()).hostname
        if host:
            yield host


def join_command(transport: Settings, path_data: Path, path_policy: Path) -> str:
    """The shell command that starts a collector on another machine in this run.

    Every transport setting that differs from warren's default is copied as a
    ``WARREN_*`` variable: settings such as the queue type or the metadata queue length
    are part of how queues are declared, and a collector declaring them differently
    would be refused by the broker. The password is a placeholder; the paths are this
    machine's, and the shared volume must be mounted at the same paths over there (or
    the paths changed to where it is mounted).
    """
    defaults = to_env(Settings())
    copied = {
        key: value
        for key, value in sorted(to_env(transport).items())
        if key not in _NOT_COPIED and defaults.get(key) != value
    }
    words = [f"{key}={shlex.quote(value)}" for key, value in copied.items()]
    words.append(f"WARREN_AMQP_URL={shlex.quote(url_placeholder(transport.amqp_url))}")
    words += ["warren", "collector", "--prefix", shlex.quote(transport.prefix)]
    words += ["--path-data", shlex.quote(str(path_data.absolute()))]
    words += ["--path-policy", shlex.quote(str(path_policy.absolute()))]
    if transport.amqp_ca_file:
        words += ["--amqp-ca-file", shlex.quote(transport.amqp_ca_file)]
    return " ".join(words)
