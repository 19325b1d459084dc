#!/usr/bin/env python3
"""A RabbitMQ node run from the server package's own files, as a plain process.

    python3 scripts/rabbit_node.py start --root PREFIX --data DIR   # prints WARREN_AMQP_URL=...
    python3 scripts/rabbit_node.py stop --data DIR

Two users: ``tests/rabbit_nodes.py`` (private nodes tests may stop and kill, laid out with
:class:`NodeLayout`) and ``scripts/offline-kit start-broker`` (one node from Debian packages
unpacked under a prefix, on a machine where nothing may be installed as a system service).
What keeps such a node to itself, whichever starts it:

- it runs the package's own scripts (``usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin``
  under the root), not the wrappers on the PATH, which switch user and read
  ``/etc/rabbitmq/rabbitmq-env.conf``;
- in a complete environment (nothing inherited): every path the server reads (env file,
  config, advanced config, conf.d, enabled plugins, data, logs, pid file) is inside the
  node's own directory, and ``RABBITMQ_CONF_ENV_FILE`` names an empty file of ours (left
  empty, the scripts fall back to the system file);
- with its own Erlang cookie (its own ``HOME``), on ports given to it, bound to 127.0.0.1;
- an environment variable (the *marker*) names its directory on the VM, so a PID read
  from its pid file is signalled only when /proc/PID/environ proves it is this node's.

Only the standard library: it runs on the offline machine before warren is installed.

It is one file, over 400 lines, on purpose: the offline kit copies it into every kit and
runs it as a script there, beside nothing else of warren's, and the tests import their
private nodes' layout and process checks from this same file, so the two cannot drift.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: Host part of node names; ``localhost`` resolves to 127.0.0.1, where distribution listens.
NODE_HOST = "localhost"
GUEST = "guest"  # allowed from loopback only, which is where every client of such a node is
#: The plugins every such node runs: the management API (its UI, and the readiness check
#: below) and Prometheus metrics.
PLUGINS = ("rabbitmq_management", "rabbitmq_prometheus")
#: Ports a node started here never takes: the usual broker's (AMQP, AMQPS, management,
#: Prometheus, distribution), epmd's, and the distribution range the CLI tools use.
RESERVED_PORTS = frozenset({4369, 5671, 5672, 15671, 15672, 15692, 25672, *range(35672, 35683)})
#: Below Linux's ephemeral range (32768-60999): the kernel never hands these out to a
#: client socket, so a node's port stays free while the node is down for a restart.
PORT_RANGE = (20000, 32000)


class NodeError(RuntimeError):
    """A node failed to start, stop or answer within its bound."""


@dataclass(frozen=True)
class Ports:
    amqp: int
    dist: int
    management: int
    prometheus: int

    def all(self) -> tuple[int, ...]:
        return (self.amqp, self.dist, self.management, self.prometheus)


def server_scripts(root: Path = Path("/")) -> Path | None:
    """The server package's own scripts folder under ``root`` (newest version), or None."""
    found = sorted((root / "usr/lib/rabbitmq/lib").glob("rabbitmq_server-*/sbin"))
    return next((path for path in reversed(found) if (path / "rabbitmq-server").is_file()), None)


def erlang_bin(root: Path = Path("/")) -> Path | None:
    """The folder holding ``erl``: under ``root`` when Erlang was unpacked there, else the PATH's."""
    if root != Path("/"):
        unpacked = root / "usr/lib/erlang/bin"
        return unpacked if (unpacked / "erl").is_file() else None
    erl = shutil.which("erl")
    return Path(erl).parent if erl else None


def port_is_free(port: int) -> bool:
    """True when nothing listens on ``port`` (a listener on 0.0.0.0 counts too, on Linux)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class NodeLayout:
    """Where one node keeps everything it reads and writes (all under ``dir``), and its environments.

    ``marker`` names the environment variable set to ``dir`` on the node's VM; ``erl_bin``
    is the folder of the ``erl`` to run (None: none on the PATH); ``epmd_port``, when
    given, is a port-mapper of the node's own instead of the machine's one on 4369.
    """

    dir: Path
    name: str
    ports: Ports
    home: Path
    marker: str
    erl_bin: Path | None = None
    epmd_port: int | None = None

    @property
    def pid_file(self) -> Path:
        return self.dir / "rabbit.pid"

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    @property
    def amqp_url(self) -> str:
        """AMQP URL of the default vhost as guest (127.0.0.1: the listener is IPv4 only)."""
        return f"amqp://guest:guest@127.0.0.1:{self.ports.amqp}/%2F"  # GUEST

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.management}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.prometheus}"

    def write_files(self, rabbit_terms: Sequence[str] = ()) -> None:
        """Config, plugins and the empty env file; ``rabbit_terms``: extra ``rabbit`` app settings."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "mnesia").mkdir(exist_ok=True)
        (self.dir / "conf.d").mkdir(exist_ok=True)
        (self.dir / "rabbitmq-env.conf").write_text("")
        (self.dir / "enabled_plugins").write_text(f"[{', '.join(PLUGINS)}].\n")
        # Classic Erlang-term config: nothing to translate through the cuttlefish schemas.
        (self.dir / "rabbitmq.config").write_text(
            "[{rabbit, [" + ", ".join(rabbit_terms) + "]},\n"
            f' {{rabbitmq_management, [{{tcp_config, [{{ip, "127.0.0.1"}}, {{port, {self.ports.management}}}]}}]}},\n'
            f' {{rabbitmq_prometheus, [{{tcp_config, [{{ip, "127.0.0.1"}}, {{port, {self.ports.prometheus}}}]}}]}}].\n'
        )

    def base_env(self) -> dict[str, str]:
        """What the server and the CLI tools share (nothing inherited from the caller)."""
        path = [str(self.erl_bin)] if self.erl_bin else []
        env = {
            "PATH": ":".join([*path, "/usr/bin", "/bin"]),
            "HOME": str(self.home),  # the node's own .erlang.cookie
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            # An empty file of ours: unset or empty, the scripts read /etc/rabbitmq/rabbitmq-env.conf.
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_NODENAME": self.name,
            # If no epmd runs yet, the one the VM starts listens on loopback only.
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            self.marker: str(self.dir),
        }
        if self.epmd_port is not None:
            env["ERL_EPMD_PORT"] = str(self.epmd_port)
        return env

    def server_env(self) -> dict[str, str]:
        """The complete environment of the node's server."""
        return {
            **self.base_env(),
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.ports.amqp),
            "RABBITMQ_DIST_PORT": str(self.ports.dist),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.log_dir),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.config"),
            # These default to /etc/rabbitmq too; ours stay absent or empty.
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_CONFIG_FILES": str(self.dir / "conf.d"),
            "RABBITMQ_MOTD_FILE": str(self.dir / "motd"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def cli_env(self) -> dict[str, str]:
        """The complete environment of a CLI call on this node."""
        # Port 0: an ephemeral distribution port per CLI call, instead of the 11 ports
        # (35672-35682) every rabbitmqctl on the machine competes for.
        return {**self.base_env(), "RABBITMQ_CTL_DIST_PORT_MIN": "0", "RABBITMQ_CTL_DIST_PORT_MAX": "0"}


def write_cookie(home: Path) -> None:
    """A fresh Erlang cookie in ``home``, owner-only (Erlang refuses one others can read)."""
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / ".erlang.cookie", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "w") as cookie:
        cookie.write(secrets.token_hex(16).upper())


def api_call(base_url: str, method: str, path: str, body: Any = None, timeout_s: float = 10.0) -> Any:
    """Call a node's management HTTP API as guest; the decoded JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base_url + path, data=data, method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{GUEST}:{GUEST}".encode()).decode())
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def answers(layout: NodeLayout) -> bool:
    """True when the node says (management API) it listens for AMQP on its port, and it accepts.

    The node's own list of listeners, not only a connect: a node whose AMQP listener
    failed (port taken) keeps its VM and management API up, and the taker accepts.
    """
    try:
        overview = api_call(layout.management_url, "GET", "/api/overview?columns=node,listeners", timeout_s=2.0)
        listening = {(item.get("protocol"), item.get("port")) for item in overview.get("listeners", [])}
        if overview.get("node") != layout.name or ("amqp", layout.ports.amqp) not in listening:
            return False
        with socket.create_connection(("127.0.0.1", layout.ports.amqp), timeout=1.0):
            return True
    except (OSError, urllib.error.URLError, ValueError, AttributeError):
        return False


def proc_environ(pid: int) -> dict[str, str]:
    """A process's environment (empty when it is gone or not readable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def proc_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def vm_pid(layout: NodeLayout) -> int:
    """PID of the node's Erlang VM, verified from /proc/PID/environ (else NodeError).

    3.10 starts distribution at run time, so the VM's command line does not carry the
    node name: the pid file gives the PID and the environment proves whose VM it is.
    """
    try:
        pid = int(layout.pid_file.read_text().strip())
    except (OSError, ValueError) as exc:
        raise NodeError(f"{layout.name}: no pid file at {layout.pid_file}") from exc
    env = proc_environ(pid)
    if env.get("RABBITMQ_NODENAME") != layout.name or env.get(layout.marker) != str(layout.dir):
        raise NodeError(f"{layout.name}: PID {pid} from the pid file is not this node's VM (or is gone)")
    return pid


def marked_pids(marker: str, node_dir: Path, program: str) -> list[int]:
    """PIDs of ``program`` processes whose environment names ``node_dir`` under ``marker``.

    How the node's own port-mapper is found: the VM starts ``epmd`` with its environment,
    and epmd detaches, so no pid file names it.
    """
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if Path(entry, "comm").read_text().strip() != program:
                continue
            if proc_environ(int(entry.name)).get(marker) == str(node_dir):
                pids.append(int(entry.name))
    return pids


def deadline_wait(predicate: Callable[[], bool], deadline: float, what: str, interval_s: float = 0.25) -> None:
    """Poll ``predicate`` until it holds, or NodeError once ``deadline`` (monotonic) passes."""
    while not predicate():
        if time.monotonic() > deadline:
            raise NodeError(f"timed out waiting for {what}")
        time.sleep(interval_s)


def log_tail(layout: NodeLayout, chars: int = 3000) -> str:
    """The end of the node's console output and of its own log."""
    parts = []
    for path in (layout.dir / "stdout.log", layout.log_dir / f"{layout.name}.log"):
        with contextlib.suppress(OSError):
            parts.append(f"--- {path}\n" + path.read_text(errors="replace")[-chars:])
    return "\n".join(parts)


# -- a standalone node: start it detached, find it again, stop it -------------------

#: The marker of standalone nodes (tests' private nodes carry their own).
STANDALONE_MARKER = "WARREN_STANDALONE_RABBIT_DIR"
#: Where a standalone node's directory records what ``stop`` and a second ``start`` need.
STATE_FILE = "node.json"
#: The variables a shell sources from ``broker.env`` (``set -a; . DIR/broker.env; set +a``).
ENV_FILE = "broker.env"
DEFAULT_NAME = "warren"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


def _pick_ports(previous: dict[str, int], amqp_port: int | None) -> tuple[Ports, int]:
    """The node's ports and its epmd port: the ones it had last time where still free."""
    rng = random.Random(secrets.randbits(64))
    taken: set[int] = set()

    def pick(key: str, wanted: int | None = None) -> int:
        if wanted is not None:
            if not port_is_free(wanted):
                raise NodeError(f"port {wanted} is taken: choose another with --amqp-port")
            taken.add(wanted)
            return wanted
        old = previous.get(key)
        if old and old not in taken and old not in RESERVED_PORTS and port_is_free(old):
            taken.add(old)
            return old
        for _ in range(500):
            port = rng.randrange(*PORT_RANGE)
            if port not in RESERVED_PORTS and port not in taken and port_is_free(port):
                taken.add(port)
                return port
        raise NodeError(f"no free port in {PORT_RANGE}")

    ports = Ports(pick("amqp", amqp_port), pick("dist"), pick("management"), pick("prometheus"))
    return ports, pick("epmd")


def standalone_layout(root: Path, data: Path, name: str, ports: Ports, epmd_port: int) -> NodeLayout:
    """The layout of a standalone node whose files live in ``data`` (its Erlang under ``root``)."""
    return NodeLayout(
        dir=data.resolve(),
        name=f"{name}@{NODE_HOST}",
        ports=ports,
        home=data.resolve() / "home",
        marker=STANDALONE_MARKER,
        erl_bin=erlang_bin(root),
        epmd_port=epmd_port,
    )


def _read_state(data: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((data / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state


def _layout_from_state(state: dict[str, Any], data: Path) -> NodeLayout:
    return standalone_layout(Path(state["root"]), data, state["name"], Ports(**state["ports"]), state["epmd_port"])


def running_layout(data: Path) -> NodeLayout | None:
    """The layout of the standalone node of ``data`` when its VM runs, else None."""
    state = _read_state(data)
    if not state:
        return None
    layout = _layout_from_state(state, data)
    try:
        vm_pid(layout)
    except NodeError:
        return None
    return layout


def env_lines(layout: NodeLayout) -> list[str]:
    """What a warren process needs to use the node, as ``NAME=value`` lines."""
    return [
        f"WARREN_AMQP_URL={layout.amqp_url}",
        f"WARREN_MANAGEMENT_URL={layout.management_url}",
        f"WARREN_PROMETHEUS_URL={layout.prometheus_url}",
    ]


def start_standalone(
    root: Path,
    data: Path,
    *,
    name: str = DEFAULT_NAME,
    amqp_port: int | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> NodeLayout:
    """Start a node from the files under ``root``, detached, and wait until it answers.

    The node outlives the caller (its own session); ``data`` keeps its queues across a stop
    and the next start, which reuses its ports where they are still free. NodeError (with
    the node's log) when it does not come up within ``timeout_s``; it is stopped then.
    """
    running = running_layout(data)
    if running is not None:
        if amqp_port is not None and amqp_port != running.ports.amqp:
            raise NodeError(f"a node already runs from {data} on AMQP port {running.ports.amqp}")
        return running
    sbin = server_scripts(root)
    if sbin is None:
        raise NodeError(f"no RabbitMQ server files under {root} (usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin)")
    if erlang_bin(root) is None:
        raise NodeError(f"no Erlang under {root} (usr/lib/erlang/bin/erl)" if root != Path("/") else "no erl on PATH")
    data.mkdir(parents=True, exist_ok=True)
    previous = _read_state(data)
    ports, epmd_port = _pick_ports({**previous.get("ports", {}), "epmd": previous.get("epmd_port", 0)}, amqp_port)
    layout = standalone_layout(root, data, name, ports, epmd_port)
    if not (layout.home / ".erlang.cookie").exists():
        write_cookie(layout.home)
    layout.write_files()
    state = {"root": str(root.resolve()), "name": name, "ports": asdict(ports), "epmd_port": epmd_port}
    (data / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
    with (layout.dir / "stdout.log").open("ab") as console:
        server = subprocess.Popen(
            [str(sbin / "rabbitmq-server")],
            env=layout.server_env(),
            cwd=layout.dir,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this process, and the terminal it ran in
        )
    deadline = time.monotonic() + timeout_s
    while not answers(layout):
        if server.poll() is not None or time.monotonic() > deadline:
            why = (
                f"exited (code {server.returncode})"
                if server.poll() is not None
                else f"did not answer in {timeout_s:.0f} s"
            )
            stop_standalone(data, timeout_s=10)
            raise NodeError(f"RabbitMQ node {layout.name} {why}:\n{log_tail(layout)}")
        time.sleep(0.25)
    (data / ENV_FILE).write_text("\n".join(env_lines(layout)) + "\n")
    return layout


def stop_standalone(data: Path, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Stop the standalone node of ``data`` (SIGTERM, SIGKILL after ``timeout_s``) and its epmd.

    True when something was running. Only processes whose environment names ``data`` are
    signalled.
    """
    state = _read_state(data)
    if not state:
        return False
    layout = _layout_from_state(state, data)
    stopped = False
    with contextlib.suppress(NodeError):
        pid = vm_pid(layout)
        os.kill(pid, signal.SIGTERM)  # RabbitMQ shuts down cleanly on SIGTERM
        stopped = True
        try:
            deadline_wait(lambda: not proc_alive(pid), time.monotonic() + timeout_s, f"{layout.name} to stop")
        except NodeError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # The start script of a node that never wrote its pid file, and the node's own epmd.
    # SIGKILL is delivered, not done, and a VM that was shutting down may still have been
    # starting its port-mapper: scan and kill until nothing of the node is left (bounded),
    # so a caller that looks right after the stop finds nothing running.
    deadline = time.monotonic() + timeout_s
    while True:
        left = [pid for program in ("beam.smp", "epmd") for pid in marked_pids(layout.marker, layout.dir, program)]
        if not left or time.monotonic() > deadline:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                stopped = True
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        (data / ENV_FILE).unlink()
    return stopped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rabbit_node.py", description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    start = verbs.add_parser("start", help="start a node (or say the one that runs) and print its URLs")
    start.add_argument("--root", type=Path, default=Path("/"), help="where the packages are unpacked (default: /)")
    start.add_argument("--data", type=Path, required=True, help="the node's own directory")
    start.add_argument("--name", default=DEFAULT_NAME, help=f"node name before @{NODE_HOST} (default: %(default)s)")
    start.add_argument("--amqp-port", type=int, help="AMQP port (default: a free one, the last one when free)")
    start.add_argument("--timeout", type=float, default=START_TIMEOUT_S, help="seconds to wait (default: %(default)s)")
    stop = verbs.add_parser("stop", help="stop the node of --data")
    stop.add_argument("--data", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.verb == "start":
            layout = start_standalone(
                args.root, args.data, name=args.name, amqp_port=args.amqp_port, timeout_s=args.timeout
            )
            print(f"RabbitMQ node {layout.name} answers; its data, logs and cookie are in {layout.dir}")
            for line in env_lines(layout):
                print(f"export {line}")
            print(f"# or: set -a; . {layout.dir / ENV_FILE}; set +a")
            return 0
        if stop_standalone(args.data):
            print(f"stopped the RabbitMQ node of {args.data}")
        else:
            print(f"no RabbitMQ node runs from {args.data}")
        return 0
    except NodeError as exc:
        print(f"rabbit_node: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
