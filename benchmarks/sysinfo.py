"""What the numbers were measured on: versions, CPUs, load, and who else used the CPU.

The machine this suite was written on is shared: other jobs take a core or more at
times. :class:`CpuProbe` measures, for one repeat, how busy the machine was and how much
of that was *foreign* (neither this process tree nor the broker), so a noisy repeat can
be recognised in the JSON afterwards.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.broker import management_get

_CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Process names counted as the broker (beam.smp is RabbitMQ's Erlang VM).
_BROKER_COMMS = frozenset({"beam.smp", "erl_child_setup", "epmd", "inet_gethost"})


def versions() -> dict[str, str]:
    """Python and the libraries whose speed the numbers depend on."""
    found = {"python": platform.python_version()}
    for dist in ("pika", "msgpack", "torch", "numpy", "gymnasium", "warren"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = "missing"
    return found


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def broker_version(amqp_url: str) -> dict[str, str]:
    """RabbitMQ and Erlang versions from the management API, else from ``rabbitmqctl``."""
    try:
        overview = management_get(amqp_url, "/api/overview")
        return {
            "rabbitmq": str(overview.get("rabbitmq_version")),
            "erlang": str(overview.get("erlang_version")),
            "source": "management API /api/overview",
        }
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        management_error = repr(exc)
    if shutil.which("rabbitmqctl"):
        done = subprocess.run(["rabbitmqctl", "version"], capture_output=True, text=True, timeout=30, check=False)
        if done.returncode == 0:
            return {"rabbitmq": done.stdout.strip(), "source": "rabbitmqctl version"}
    return {"rabbitmq": "unknown", "source": f"management API failed: {management_error}"}


def broker_uptime_s(amqp_url: str) -> float | None:
    """Seconds since the broker node started (a drop between two calls means it restarted)."""
    try:
        nodes = management_get(amqp_url, "/api/nodes?columns=name,uptime")
        return round(float(nodes[0]["uptime"]) / 1000.0, 1)
    except (OSError, ValueError, LookupError, TypeError):
        return None


def machine() -> dict[str, Any]:
    cpu_model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "hostname": platform.node(),
    }


def management_reachable(amqp_url: str) -> bool:
    try:
        management_get(amqp_url, "/api/overview")
    except (OSError, ValueError):
        return False
    return True


# -- CPU accounting ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    at: float
    machine_busy: int
    machine_total: int
    per_pid: dict[int, tuple[str, int, int, int]]  # pid -> (comm, ppid, utime+stime ticks, start time)


def _machine_ticks() -> tuple[int, int]:
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return total - idle, total


def _processes() -> dict[int, tuple[str, int, int, int]]:
    found: dict[int, tuple[str, int, int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                raw = handle.read()
        except OSError:
            continue
        # comm may hold spaces and parentheses: split around the last ')'.
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        rest = raw[raw.rindex(")") + 2 :].split()
        # Fields after comm: state ppid ... utime(11) stime(12) ... starttime(19).
        found[int(entry.name)] = (comm, int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[19]))
    return found


def _snapshot() -> _Snapshot:
    busy, total = _machine_ticks()
    return _Snapshot(time.monotonic(), busy, total, _processes())


def _descendants(root: int, table: dict[int, tuple[str, int, int, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    ours, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in ours:
                ours.add(child)
                todo.append(child)
    return ours


class CpuProbe:
    """CPU use during a ``with`` block, in CPUs (1.0 = one core busy the whole time).

    ``ours`` is this process and its children, ``broker`` the RabbitMQ VM, ``foreign``
    everything else; ``machine_busy`` is the fraction of all CPUs that were busy.
    """

    def __init__(self) -> None:
        self.result: dict[str, float] = {}
        self._start: _Snapshot | None = None

    def __enter__(self) -> CpuProbe:
        self._start = _snapshot()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._start is not None
        end = _snapshot()
        self.result = _account(self._start, end)


def _account(start: _Snapshot, end: _Snapshot) -> dict[str, float]:
    seconds = max(end.at - start.at, 1e-9)
    ours = _descendants(os.getpid(), end.per_pid) | _descendants(os.getpid(), start.per_pid)
    split = {"ours": 0, "broker": 0, "foreign": 0}
    for pid, (comm, _, ticks, started) in end.per_pid.items():
        before = start.per_pid.get(pid)
        # Same pid and start time: the same process (kernel threads rename themselves).
        delta = ticks - (before[2] if before is not None and before[3] == started else 0)
        if delta <= 0:
            continue
        kind = "ours" if pid in ours else "broker" if comm in _BROKER_COMMS else "foreign"
        split[kind] += delta
    cpus = os.cpu_count() or 1
    total = max(end.machine_total - start.machine_total, 1)
    result = {kind: round(ticks / _CLK_TCK / seconds, 3) for kind, ticks in split.items()}
    busy = (end.machine_busy - start.machine_busy) / total
    # Tick sampling is coarse over short windows: never report more than the machine did.
    result["foreign"] = round(min(result["foreign"], max(0.0, busy * cpus - result["ours"] - result["broker"])), 3)
    result["machine_busy"] = round(busy, 3)
    result["seconds"] = round(seconds, 3)
    result["cpus"] = float(cpus)
    return result


def quiet_wait(max_wait_s: float, *, threshold_cpus: float = 0.2) -> float:
    """Wait up to ``max_wait_s`` for foreign CPU use to drop under ``threshold_cpus``.

    Returns the foreign CPU use of the last one-second window.
    """
    deadline = time.monotonic() + max_wait_s
    while True:
        with CpuProbe() as probe:
            time.sleep(1.0)
        foreign = probe.result["foreign"]
        if foreign < threshold_cpus or time.monotonic() >= deadline:
            return foreign
