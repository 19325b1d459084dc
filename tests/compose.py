"""Read docker-compose.yml and .env.example the way Docker Compose does, for tests without Docker.

Only what this repository's compose file uses: ``KEY=VALUE`` env files, and the
``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?message}``, ``${VAR?message}``,
``$VAR`` and ``$$`` interpolation forms, applied to every string value (not to keys).
tests/infra/test_compose_file.py checks the result against ``docker-compose config``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
#: The override that replaces the one broker with a three-node cluster (``-f`` after COMPOSE_FILE).
CLUSTER_FILE = ROOT / "docker-compose.cluster.yml"
ENV_EXAMPLE = ROOT / ".env.example"

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class InterpolationError(ValueError):
    """A ``${VAR:?message}`` whose variable is missing, or a ``$`` compose would refuse."""


def read_env_file(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """``KEY=VALUE`` lines; blank lines and ``#`` comments skipped, values taken as written."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{path}:{number}: not KEY=VALUE: {line!r}")
        values[key] = value
    return values


def interpolate(text: str, variables: Mapping[str, str]) -> str:
    """Substitute compose variables in one string."""

    def substitute(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("bare") or match.group("braced")
        op, arg = match.group("op"), match.group("arg") or ""
        value = variables.get(name)
        unset_or_empty = value is None or (value == "" and op is not None and op.startswith(":"))
        if op in ("-", ":-"):
            return arg if unset_or_empty else str(value)
        if op in ("?", ":?"):
            if unset_or_empty:
                raise InterpolationError(f"{name}: {arg}")
            return str(value)
        return "" if value is None else value

    return _VARIABLE.sub(substitute, text)


def _interpolate_tree(node: Any, variables: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, variables)
    if isinstance(node, list):
        return [_interpolate_tree(item, variables) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate_tree(value, variables) for key, value in node.items()}
    return node


def load_compose(variables: Mapping[str, str], path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file with YAML anchors merged and ``variables`` substituted."""
    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path} is not a mapping")
    result: dict[str, Any] = _interpolate_tree(document, variables)
    return result


def service_environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's ``environment`` (mapping or ``KEY=VALUE`` list) as strings."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) if "=" in item else (item, "") for item in raw)
    return {str(key): "" if value is None else str(value) for key, value in raw.items()}


def service_command(service: Mapping[str, Any]) -> list[str]:
    """A service's ``command`` as an argument list."""
    command = service.get("command")
    if isinstance(command, str):
        return command.split()
    if not isinstance(command, list):
        raise ValueError(f"service has no command: {service!r}")
    return [str(arg) for arg in command]


def named_mounts(service: Mapping[str, Any], named_volumes: Mapping[str, Any]) -> dict[str, str]:
    """``{target path: volume name}`` for the service's named-volume mounts."""
    mounts: dict[str, str] = {}
    for entry in service.get("volumes") or []:
        source, _, rest = str(entry).partition(":")
        target = rest.split(":", 1)[0]
        if source in named_volumes:
            mounts[target] = source
    return mounts


def duration_s(text: str) -> float:
    """A compose duration (``40s``, ``1m30s``, ``500ms``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a compose duration: {text!r}")
    return sum(float(number) * units[unit] for number, unit in parts)
