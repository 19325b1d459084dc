"""The offline kit's common ground: its layout, its defaults, names and versions of the target, running tools."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

#: The folder the kit's tools stand in: scripts/ in the repository, the kit itself in a kit.
TOOLS = Path(__file__).resolve().parent.parent
#: The files of the kit's own tooling: copied into every kit.
TOOL_FILES = ("offline-kit", "offline_kit", "rabbit_node.py")
#: Tool files of kits built before (the script was one file then): a kit still, when built again.
FORMER_TOOL_FILES = ("offline_kit.py",)
#: What ``offline-kit --help`` says it is.
DESCRIPTION = "Everything a warren run needs on a machine cut off from package indexes, in one directory."
MANIFEST = "manifest.json"
WHEELS = "wheels"
DEBS = "debs"
#: Where ``install`` unpacks the Debian packages unless told (inside the kit).
DEFAULT_PREFIX = "root"
#: What ``install`` records in the kit: the prefix, so ``start-broker DIR`` finds it.
INSTALLED = "installed.json"
#: The broker's own directory under the prefix (data, logs, cookie, node.json, broker.env).
BROKER_DATA = "broker"

SERVER_PACKAGE = "rabbitmq-server"
#: What a GPU machine with PyTorch already has, and warren needs: left out of the kit.
#: Their own dependencies (nvidia-*, triton, sympy, markdown-it-py, grpcio...) are never
#: fetched either: the resolver sees them as placeholders without dependencies.
DEFAULT_WITHOUT = ("torch", "numpy", "safetensors", "msgpack", "rich", "tensorboard", "prometheus-client")
#: A Pong/Atari run's extra (ale-py with its ROMs, lz4); ``--extras atari,mujoco`` for MuJoCo too.
DEFAULT_EXTRAS = ("atari",)
#: Newest glibc the wheels may need (manylinux_2_N); 2.28: Debian 10, Ubuntu 18.10, RHEL 8.
DEFAULT_GLIBC = "2.28"
#: Version label of the placeholder wheels that stand for what the target already has.
STUB_LABEL = "kitstub"
MIB = 1024 * 1024


class KitError(Exception):
    """A step of the kit failed; the message is one line that names what failed."""


# -- names, versions, targets -------------------------------------------------------


def canonical(name: str) -> str:
    """A distribution name as indexes compare them (PEP 503): ``Prometheus_Client`` → ``prometheus-client``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def python_version(text: str) -> str:
    """``3.12`` from ``3.12``, ``3.12.3`` or ``312``; KitError for anything else."""
    match = re.fullmatch(r"3\.?(\d{1,2})(?:\.\d+)?", text.strip())
    if not match:
        raise KitError(f"--python wants a CPython 3 version such as 3.12, not {text!r}")
    return f"3.{match.group(1)}"


def parse_without(items: Iterable[str]) -> dict[str, str | None]:
    """``["torch==2.11.0", "numpy"]`` → ``{"torch": "2.11.0", "numpy": None}`` (canonical names)."""
    result: dict[str, str | None] = {}
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        name, pinned, version = item.partition("==")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip()) or (pinned and not version.strip()):
            raise KitError(f"--without wants NAME or NAME==VERSION, not {item!r}")
        result[canonical(name)] = version.strip() or None
    return result


def platform_tags(glibc: str) -> list[str]:
    """The manylinux x86_64 tags of a target with this glibc, newest first (pip matches each exactly)."""
    match = re.fullmatch(r"2\.(\d+)", glibc.strip())
    if not match or int(match.group(1)) < 5:
        raise KitError(f"--glibc wants a version such as 2.28, not {glibc!r}")
    minor = int(match.group(1))
    tags = [f"manylinux_2_{n}_x86_64" for n in range(minor, 4, -1)]
    # The legacy aliases: manylinux2014 = 2.17, manylinux2010 = 2.12, manylinux1 = 2.5.
    tags += [
        legacy for legacy, needs in (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)) if minor >= needs
    ]
    return [tag if tag.endswith("_x86_64") else f"{tag}_x86_64" for tag in tags]


def target_environment(version: str) -> dict[str, str]:
    """PEP 508 marker values of CPython ``version`` on Linux x86_64 (what a Requires-Dist is judged by)."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{version}.0",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{version}.0",
        "python_version": version,
        "sys_platform": "linux",
    }


def mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"


# -- running tools ------------------------------------------------------------------


def run_tool(argv: Sequence[str], what: str, cwd: Path | None = None, timeout_s: float = 900) -> str:
    """Run a command; its output, or KitError naming ``what`` with the output's telling line."""
    try:
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise KitError(f"{what}: {argv[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise KitError(f"{what}: no result within {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        raise KitError(f"{what}: {telling_line(done.stderr + done.stdout)}")
    return done.stdout


def telling_line(output: str) -> str:
    """The line of a tool's output that says what went wrong (pip's and apt's errors)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for pattern in (r"^ERROR: No matching distribution", r"^E: ", r"^ERROR: ", r"Error", r"error"):
        for line in lines:
            if re.search(pattern, line):
                return line
    return lines[-1] if lines else "(no output)"
