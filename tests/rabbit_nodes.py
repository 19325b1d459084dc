"""Private RabbitMQ nodes (1 or a cluster of 3) that tests may stop, restart and kill.

The broker on ``WARREN_AMQP_URL`` is shared with other processes and other people's test
runs: no test may stop, restart or reconfigure it. Tests that need a broker to go away
start their own nodes here, and this module is the only place under ``tests/`` that runs
a RabbitMQ command-line tool (``tests/unit/test_broker_guard.py`` checks that).

What keeps a private node away from the shared one:

- it runs the package's own scripts (``/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin``),
  not the wrappers on the PATH, which switch user, rewrite the shared node's startup log
  and read ``/etc/rabbitmq/rabbitmq-env.conf`` (that file names the shared node);
- in a clean environment: every path the server reads (env file, config, advanced
  config, conf.d, enabled plugins, data, logs, pid file) is inside the cluster's own
  directory, and ``RABBITMQ_CONF_ENV_FILE`` names an empty file of ours (left empty, the
  scripts fall back to the system file);
- with a private Erlang cookie (a private ``HOME``), so even a CLI call naming the shared
  node by mistake could not authenticate to it; and every CLI call passes ``-n`` with a
  node of ours, built in one place (:meth:`PrivateNode.cli`);
- on ports picked at start, never the shared broker's (AMQP, management, distribution,
  epmd) nor the range the CLI tools use by default, all bound to 127.0.0.1.

Nothing is left running: the pytest fixtures stop their clusters, an ``atexit`` hook and
SIGTERM/SIGHUP handlers stop whatever this process still runs, and every start first
reaps clusters whose owning process died without cleaning up (a SIGKILLed pytest).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import IO, Any
from urllib.parse import quote

# How a node is laid out and started from the package's own files is shared with
# scripts/offline-kit (a standalone node on an offline machine): scripts/rabbit_node.py.
from scripts.rabbit_node import (
    NODE_HOST,
    PORT_RANGE,
    RESERVED_PORTS,
    NodeError,
    NodeLayout,
    Ports,
    api_call,
    erlang_bin,
    port_is_free,
    proc_alive,
    proc_environ,
    write_cookie,
)
from scripts.rabbit_node import answers as node_answers
from scripts.rabbit_node import deadline_wait as _deadline_wait
from scripts.rabbit_node import log_tail as node_log_tail
from scripts.rabbit_node import vm_pid as node_vm_pid

__all__ = ["NODE_HOST", "PORT_RANGE", "RESERVED_PORTS", "NodeError", "Ports"]  # re-exported

#: Every private node's name starts with this (``warren-test-<hex>-<i>@localhost``; the
#: shared node is ``rabbit@localhost`` on the same epmd).
NODE_PREFIX = "warren-test-"
#: Default bound on a start (one node, or a whole cluster booting in parallel).
START_TIMEOUT_S = 90.0
#: Bound on one CLI call; each costs 2-7 s here (an Erlang VM and the Elixir CLI boot).
CLI_TIMEOUT_S = 120.0
#: Bound on a graceful stop before the node is killed.
STOP_TIMEOUT_S = 20.0
#: Environment variable set on every private node's VM, naming its directory: a process
#: is killed only if its /proc/PID/environ carries it (and its node name).
MARKER = "WARREN_PRIVATE_RABBIT_DIR"
#: Where cluster directories go unless a workdir is given (and where orphans are reaped).
DEFAULT_ROOT = Path(tempfile.gettempdir()) / "warren-rabbit"

# RESERVED_PORTS (the shared broker's, epmd's, the CLI tools' default distribution range)
# and PORT_RANGE (below Linux's ephemeral range) come from scripts/rabbit_node.py.
CLI_TOOLS = frozenset({"rabbitmqctl", "rabbitmq-queues", "rabbitmq-diagnostics"})


def find_sbin() -> Path | None:
    """The server package's own scripts folder, or None when RabbitMQ is not installed."""
    override = os.environ.get("WARREN_RABBITMQ_SBIN")
    candidates = [Path(override)] if override else sorted(Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*/sbin"))
    for path in reversed(candidates):
        if (path / "rabbitmq-server").is_file() and shutil.which("erl"):
            return path
    return None


_handed_out: set[int] = set()


def _free_port(rng: random.Random) -> int:
    """A port nobody listens on now, outside the reserved ones and not given out before."""
    for _ in range(500):
        port = rng.randrange(*PORT_RANGE)
        if port in RESERVED_PORTS or port in _handed_out:
            continue
        if not port_is_free(port):
            continue
        _handed_out.add(port)
        return port
    raise NodeError(f"no free port in {PORT_RANGE}")


def _proc_start_ticks(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


class PrivateNode:
    """One RabbitMQ node of a :class:`PrivateCluster`: its own name, ports, data and cookie."""

    def __init__(self, cluster: PrivateCluster, index: int, ports: Ports) -> None:
        self.cluster = cluster
        self.index = index
        self.name = f"{cluster.id}-{index}@{NODE_HOST}"
        self.ports = ports
        # Its files and environments (scripts/rabbit_node.py): all under its own directory.
        self.layout = NodeLayout(
            dir=cluster.dir / f"node{index}",
            name=self.name,
            ports=ports,
            home=cluster.home,  # the private .erlang.cookie
            marker=MARKER,
            erl_bin=erlang_bin(),
        )
        self.dir = self.layout.dir
        self.pid_file = self.layout.pid_file
        self.log_dir = self.layout.log_dir
        self._popen: subprocess.Popen[bytes] | None = None
        self._stdout: IO[bytes] | None = None

    def __repr__(self) -> str:
        return f"PrivateNode({self.name}, amqp={self.ports.amqp}, management={self.ports.management})"

    # -- addresses -------------------------------------------------------------

    @property
    def amqp_url(self) -> str:
        """AMQP URL of the default vhost as guest (127.0.0.1: the listener is IPv4 only)."""
        return self.layout.amqp_url

    @property
    def management_url(self) -> str:
        return self.layout.management_url

    @property
    def prometheus_url(self) -> str:
        return self.layout.prometheus_url

    # -- files and environments -------------------------------------------------

    def write_files(self, seed: PrivateNode | None) -> None:
        """Config, plugins and the empty env file; ``seed``: the node a blank node joins at boot."""
        rabbit: list[str] = []
        if seed is not None:
            # Classic-config peer discovery: a blank node joins ``seed`` while booting, which
            # saves the stop_app/reset/join_cluster/start_app round (4 CLI calls) per node.
            # The retries cover the seed booting at the same time (no lock in this backend).
            rabbit.append(f"{{cluster_nodes, {{['{seed.name}'], disc}}}}")
            rabbit.append("{cluster_formation, [{discovery_retry_limit, 240}, {discovery_retry_interval, 500}]}")
        self.layout.write_files(rabbit)

    def server_env(self) -> dict[str, str]:
        """The complete environment of the node's server (nothing inherited)."""
        return self.layout.server_env()

    def cli_env(self) -> dict[str, str]:
        """The complete environment of a CLI call on this node (nothing inherited)."""
        return self.layout.cli_env()

    def cli_argv(self, tool: str, *args: str) -> list[str]:
        """The argv of a CLI call: always the package's own script, always ``-n`` this node."""
        if tool not in CLI_TOOLS:
            raise ValueError(f"not a RabbitMQ CLI tool this module runs: {tool}")
        if not self.name.startswith(NODE_PREFIX):
            raise NodeError(f"refusing to run {tool} against {self.name}: not a private node")
        return [str(self.cluster.sbin / tool), "-q", "-n", self.name, *args]

    def cli(self, *args: str, tool: str = "rabbitmqctl", timeout_s: float = CLI_TIMEOUT_S) -> str:
        """Run a RabbitMQ CLI command against this node; its stdout, or NodeError."""
        try:
            done = subprocess.run(
                self.cli_argv(tool, *args),
                env=self.cli_env(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise NodeError(f"{tool} {' '.join(args)} on {self.name}: no answer within {timeout_s} s") from exc
        if done.returncode != 0:
            raise NodeError(f"{tool} {' '.join(args)} on {self.name} failed ({done.returncode}): {done.stderr[-2000:]}")
        return done.stdout

    # -- management API --------------------------------------------------------

    def api(self, method: str, path: str, body: Any = None, timeout_s: float = 10.0) -> Any:
        """Call this node's management HTTP API as guest."""
        return api_call(self.management_url, method, path, body, timeout_s)

    def queue(self, name: str, vhost: str = "/") -> dict[str, Any]:
        """The management API's view of a queue (``leader``, ``members``, ``messages``...)."""
        result: dict[str, Any] = self.api("GET", f"/api/queues/{quote(vhost, safe='')}/{quote(name, safe='')}")
        return result

    def running_nodes(self) -> list[str]:
        """Names of the cluster's nodes this node sees running (management API)."""
        return sorted(n["name"] for n in self.api("GET", "/api/nodes?columns=name,running") if n.get("running"))

    def cluster_status(self) -> dict[str, Any]:
        """``rabbitmqctl cluster_status`` as JSON (``running_nodes``, ``disk_nodes``...)."""
        result: dict[str, Any] = json.loads(self.cli("cluster_status", "--formatter", "json"))
        return result

    # -- state -----------------------------------------------------------------

    def running(self) -> bool:
        """True while the node's server process (the start script and its VM) lives."""
        return self._popen is not None and self._popen.poll() is None

    def answers(self) -> bool:
        """True when the node says (management API) it listens for AMQP on its port, and it accepts.

        The node's own list of listeners, not only a connect: a node whose AMQP listener
        failed (port taken) keeps its VM and management API up, and the taker accepts.
        """
        return node_answers(self.layout)

    def vm_pid(self) -> int:
        """PID of the node's Erlang VM, verified from /proc/PID/environ (else NodeError).

        3.10 starts distribution at run time, so the VM's command line does not carry the
        node name: the pid file gives the PID and the environment proves whose VM it is.
        """
        return node_vm_pid(self.layout)

    # -- lifecycle -------------------------------------------------------------

    def spawn(self) -> None:
        """Start the server process and return at once (see :meth:`await_ready`)."""
        if self.running():
            raise NodeError(f"{self.name} is already running")
        if self._stdout is None:
            self._stdout = (self.dir / "stdout.log").open("ab")
        self._popen = subprocess.Popen(
            [str(self.cluster.sbin / "rabbitmq-server")],
            env=self.server_env(),
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            # Its own process group: a final cleanup can kill the script and VM together
            # by this PID (ours) without touching anything else.
            start_new_session=True,
        )

    def await_ready(self, deadline: float) -> None:
        """Wait until the node answers (AMQP and management), or NodeError with its log."""
        while not self.answers():
            if not self.running():
                code = self._popen.returncode if self._popen else None
                raise NodeError(f"{self.name} exited (code {code}) while starting:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise NodeError(f"{self.name} did not come up in time:\n{self.log_tail()}")
            time.sleep(0.25)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Start the node (again: a node with data rejoins its cluster); seconds it took."""
        started = time.monotonic()
        self.spawn()
        try:
            self.await_ready(started + timeout_s)
        except NodeError:
            self.stop(timeout_s=0)
            raise
        return time.monotonic() - started

    def stop_app(self, timeout_s: float = CLI_TIMEOUT_S) -> None:
        """``rabbitmqctl stop_app``: the broker application stops, the VM stays up."""
        self.cli("stop_app", timeout_s=timeout_s)

    def start_app(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """``rabbitmqctl start_app``, then wait until the node answers again."""
        started = time.monotonic()
        self.cli("start_app", timeout_s=timeout_s)
        self.await_ready(started + timeout_s)

    def ensure_running(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Bring the node back if a test left it down: start_app if the VM lives, else start."""
        if self.answers():
            return
        if self.running():
            try:
                self.start_app(timeout_s)
                return
            except NodeError:
                self.stop()
        self.start(timeout_s)

    def join(self, seed: PrivateNode, timeout_s: float = START_TIMEOUT_S) -> None:
        """Make this running node a member of ``seed``'s cluster (its data is reset)."""
        started = time.monotonic()
        self.cli("stop_app")
        self.cli("reset")
        self.cli("join_cluster", seed.name)
        self.cli("start_app")
        self.await_ready(started + timeout_s)

    def kill(self, timeout_s: float = 30.0) -> int:
        """``kill -9`` the node's Erlang VM (after verifying it is ours); its PID."""
        pid = self.vm_pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        _deadline_wait(lambda: not proc_alive(pid), deadline, f"{self.name}'s VM {pid} to die")
        if self._popen is not None:
            # The start script was waiting on the VM; it exits now.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(max(0.0, deadline - time.monotonic()))
        return pid

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the node: SIGTERM (a clean shutdown), SIGKILL after ``timeout_s``."""
        self.signal_stop()
        self.finish_stop(time.monotonic() + timeout_s)

    def restart(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Stop the node if it runs and start it again; seconds the start took."""
        if self.running():
            self.stop()
        return self.start(timeout_s)

    def signal_stop(self) -> None:
        """First half of a stop: ask the VM to shut down (the cluster stops nodes in parallel)."""
        if not self.running():
            return
        try:
            os.kill(self.vm_pid(), signal.SIGTERM)  # RabbitMQ shuts down cleanly on SIGTERM
        except NodeError:
            # No verified VM yet (still booting): the start script forwards SIGTERM to it.
            with contextlib.suppress(ProcessLookupError):
                assert self._popen is not None
                self._popen.send_signal(signal.SIGTERM)

    def finish_stop(self, deadline: float) -> None:
        """Second half: wait until ``deadline``, then kill the node's process group."""
        popen = self._popen
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(max(0.0, deadline - time.monotonic()))
            self._kill_leftovers()
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(10)
        if self._stdout is not None:
            self._stdout.close()
            self._stdout = None

    def _kill_leftovers(self) -> None:
        """SIGKILL our own process group and a verified VM that may have left it."""
        if self._popen is not None and self._popen.poll() is None:
            # Not yet reaped, so the PID (and group id) cannot belong to anyone else.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._popen.pid, signal.SIGKILL)
        with contextlib.suppress(NodeError, ProcessLookupError):
            os.kill(self.vm_pid(), signal.SIGKILL)

    def log_tail(self, chars: int = 3000) -> str:
        return node_log_tail(self.layout, chars)


class PrivateCluster:
    """1 or more private RabbitMQ nodes in one directory, clustered when more than one.

    ``PrivateCluster.start(3)`` boots node 0 (the seed), then the others in parallel; the
    others join it while booting. ``stop()`` stops every node and removes the directory.
    """

    def __init__(self, size: int, workdir: Path | None = None, sbin: Path | None = None) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one node")
        found = sbin or find_sbin()
        if found is None:
            raise NodeError("RabbitMQ's server scripts were not found (install the Debian package rabbitmq-server)")
        self.sbin = found
        self.root = workdir or DEFAULT_ROOT
        self.id = f"{NODE_PREFIX}{secrets.token_hex(4)}"
        self.dir = self.root / self.id
        self.home = self.dir / "home"
        self.timings: dict[str, float] = {}
        rng = random.Random(secrets.randbits(64))
        self.nodes = [PrivateNode(self, i, Ports(*(_free_port(rng) for _ in range(4)))) for i in range(size)]
        self._stopped = False

    def __repr__(self) -> str:
        return f"PrivateCluster({self.id}, nodes={self.nodes})"

    @classmethod
    def start(
        cls,
        size: int = 1,
        workdir: Path | None = None,
        *,
        timeout_s: float | None = None,
        sbin: Path | None = None,
    ) -> PrivateCluster:
        """Start ``size`` nodes (clustered) and wait until all run; NodeError after ``timeout_s``.

        ``workdir`` is the folder the cluster's own directory goes in (default: a folder
        under the system temp dir); on failure everything started is stopped and removed.
        """
        root = workdir or DEFAULT_ROOT
        root.mkdir(parents=True, exist_ok=True)
        reap_orphans(root)
        _install_signal_handlers()
        bound = timeout_s if timeout_s is not None else START_TIMEOUT_S + 30.0 * (size - 1)
        for attempt in (1, 2):
            cluster = cls(size, root, sbin)
            _live.append(cluster)
            try:
                cluster._boot(bound)
                return cluster
            except NodeError as exc:
                cluster.stop()
                # A port picked free was taken before the node bound it: once more, new ports.
                if attempt == 1 and "eaddrinuse" in str(exc):
                    continue
                raise
            except BaseException:
                cluster.stop()
                raise
        raise AssertionError("unreachable")

    def _boot(self, timeout_s: float) -> None:
        started = time.monotonic()
        deadline = started + timeout_s
        self.dir.mkdir()
        # Who owns the cluster (PID and start time): another run reaps it once that process is gone.
        (self.dir / "owner").write_text(f"{os.getpid()} {_proc_start_ticks(os.getpid())}\n")
        self.home.mkdir()
        write_cookie(self.home)  # owner-only: Erlang refuses a cookie file others can read
        seed = self.nodes[0]
        for node in self.nodes:
            node.write_files(None if node is seed else seed)
        # The seed first, then the joiners together: a node that joins while the seed is still
        # creating its tables copies them half-made and stops (schema_integrity_check_failed).
        seed.spawn()
        seed.await_ready(deadline)
        for node in self.nodes[1:]:
            node.spawn()
        for node in self.nodes[1:]:
            node.await_ready(deadline)
        self.timings["nodes_up_s"] = time.monotonic() - started
        if len(self.nodes) > 1:
            self.await_running(len(self.nodes), deadline - time.monotonic())
        self.timings["start_s"] = time.monotonic() - started

    def running_nodes(self, via: PrivateNode | None = None) -> list[str]:
        """Running cluster members as seen by ``via`` (default: the first node that answers)."""
        for node in [via] if via else self.nodes:
            if node.running():
                with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                    return node.running_nodes()
        return []

    def await_running(self, count: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until every running node sees ``count`` running members, or NodeError."""
        deadline = time.monotonic() + timeout_s

        def agreed() -> bool:
            views = [self.running_nodes(via=n) for n in self.nodes if n.running()]
            return bool(views) and all(len(v) == count for v in views)

        try:
            _deadline_wait(agreed, deadline, f"{count} running nodes in {self.id}")
        except NodeError as exc:
            views = {n.name: self.running_nodes(via=n) for n in self.nodes if n.running()}
            raise NodeError(f"{exc}; running nodes seen by each node: {views}") from None

    def node_named(self, name: str) -> PrivateNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every node (in parallel, bounded) and remove the cluster's directory."""
        if self._stopped:
            return
        self._stopped = True
        try:
            for node in self.nodes:
                node.signal_stop()
            deadline = time.monotonic() + timeout_s
            for node in self.nodes:
                node.finish_stop(deadline)
        finally:
            for port in (p for n in self.nodes for p in n.ports.all()):
                _handed_out.discard(port)
            shutil.rmtree(self.dir, ignore_errors=True)
            with contextlib.suppress(ValueError):
                _live.remove(self)

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """Last-resort cleanup (atexit, signals): SIGKILL everything, remove the directory."""
        self._stopped = True
        pids = []
        for node in self.nodes:
            with contextlib.suppress(NodeError):
                pids.append(node.vm_pid())
            node._kill_leftovers()
        # A dying VM may still write into its directory: remove it once they are gone.
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(NodeError):
            _deadline_wait(lambda: not any(proc_alive(pid) for pid in pids), deadline, "killed VMs", 0.05)
        shutil.rmtree(self.dir, ignore_errors=True)


# -- second line of defence: nothing outlives the process, or its death -----------

_live: list[PrivateCluster] = []
_handlers_installed = False


def _cleanup_all() -> None:
    for cluster in list(_live):
        cluster.kill_all()
    _live.clear()


atexit.register(_cleanup_all)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _cleanup_all()
    # Then die of the signal as we would have without this handler.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_signal_handlers() -> None:
    """Clean up on SIGTERM/SIGHUP too (atexit does not run then); only where nobody else handles them."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: atexit and fixtures remain
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _on_signal)


def reap_orphans(root: Path) -> list[str]:
    """Kill and remove clusters under ``root`` whose owning process is gone (a SIGKILLed run).

    A VM is killed only when its /proc/PID/environ names the orphaned node's directory.
    """
    reaped: list[str] = []
    for cluster_dir in _children(root, NODE_PREFIX):
        try:
            pid_text, ticks = (cluster_dir / "owner").read_text().split()
            owner = int(pid_text)
        except (OSError, ValueError):
            continue  # being created, or not ours
        if proc_alive(owner) and _proc_start_ticks(owner) == ticks:
            continue
        for node_dir in _children(cluster_dir, "node"):
            with contextlib.suppress(OSError, ValueError):
                pid = int((node_dir / "rabbit.pid").read_text().strip())
                if proc_environ(pid).get(MARKER) == str(node_dir):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(cluster_dir, ignore_errors=True)
        reaped.append(cluster_dir.name)
    return reaped


def _children(path: Path, prefix: str) -> Iterable[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and p.name.startswith(prefix)]
    except OSError:
        return []
