#!/usr/bin/env python3
"""Run docker-compose.yml for real, in containers, on a machine without Docker.

    scripts/compose-smoke          # what scripts/test runs after pytest

It does what the README tells a user to do, and checks what the user should see:

1. podman (Debian's package) serves the Docker API on a private socket, and Debian's
   docker-compose 1.29 drives it: the real Dockerfile and the real docker-compose.yml.
2. Base images come from Debian packages (scripts/local-images, cached between runs);
   warren's image is built from the Dockerfile with PYTHON_IMAGE pointing at them.
3. ``up --exit-code-from coordinator``: the broker becomes healthy, the .env account
   is the one in use, the collectors connect under their names, training reaches the
   stop value, and every container stops cleanly when the coordinator ends.
4. ``up -d`` then ``up -d --scale collector=4``: the new collectors are listed by their
   connection names with their consumers, and the coordinator gives each a task.
   Prometheus scrapes RabbitMQ and every warren role (its targets are up: the two
   collectors, then all four, found by the compose network's DNS), and warren's
   counters rise while the job trains.
5. SIGKILL of one busy collector: the coordinator sees it gone and runs its task again
   (steps 4-6 run with a small override giving the coordinator longer collect tasks, so
   that a collector can be caught in the middle of one).
6. ``stop`` + ``down`` (what ``down`` does, in two steps to read the exit codes): every
   container ends within its stop_grace_period with a clean exit code.
7. The run log on the named volume kept both runs across ``down`` and ``up``.
8. With docker-compose.cluster.yml: three brokers form one cluster, the task queue is a
   quorum queue on all three, and the job trains to its stop value on it.

Only the stdlib: it runs before (or without) the project's virtualenv. Every wait has a
deadline, and everything it starts (containers, network, volumes, the podman service)
is removed at the end, on failure too; the base images, warren's image (its layer
cache) and the wheels stay under /var/cache/warren-compose and in podman's store.
The published ports are free ones picked at start, the project name is unique: a
RabbitMQ already listening on this machine's default ports is left alone.

It is one file, over 400 lines, and its steps are one class (:class:`Smoke`): each step
acts on what the steps before it started and recorded (the podman service, the project
and its ports, the volumes, the containers killed), and :meth:`Smoke.cleanup` must know
all of it to leave nothing behind, on failure too.
"""

from __future__ import annotations

import base64
import calendar
import fcntl
import http.client
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import FrameType
from typing import IO, Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("WARREN_IMAGE_CACHE", "/var/cache/warren-compose"))
WARREN_IMAGE = "localhost/warren-smoke:latest"
PREFIX = "warren"
#: Debian packages: the engine, the client, and what podman needs for compose networks.
PACKAGES = ("podman", "runc", "docker-compose", "netavark", "aardvark-dns", "iptables", "mmdebstrap")
#: podman's settings for this run. runc and cgroupfs because there is no systemd here;
#: podman's default ulimits (1M open files) are above what a sandboxed root may set.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "netavark"
"""
#: A stop value CartPole-v1 (at most 500 per episode) never reaches: the job keeps running.
UNREACHABLE_STOP_VALUE = "100000"
#: An env-step budget no run uses up (400,000 take about 25 s with the vector envs).
UNREACHABLE_ENV_STEPS = "100000000000"
#: The override that turns the single broker into a 3-node cluster with quorum queues.
CLUSTER_FILE = "docker-compose.cluster.yml"
#: Tries at freezing every collector at once and finding one in the middle of a task.
KILL_TRIES = 60
#: Samples per collect task in the scale/kill run (~1 s of a collector's time on 2 busy cores).
LONG_TASK_SAMPLES = 65536
#: Collectors killed at most, when a kill lands after its task's data was complete.
KILLS = 2
COMPLETED_FROM_DATA = "completed from its data"
#: Run log kinds of a finished task: collect tasks log "task", evaluations "eval".
FINISHED = ("task", "eval")
#: Prometheus' scrape jobs (deploy/prometheus.yml) and the warren counter each must see rise.
SCRAPE_JOBS = ("rabbitmq", "warren-coordinator", "warren-learner", "warren-collector")
RISING = (
    'sum(warren_env_steps_total{role="collector"})',
    'sum(warren_learner_train_steps_total{role="learner"})',
    'sum(warren_run_env_steps_total{role="coordinator"})',
)
T = TypeVar("T")


# A collector's main connection logging in, as the broker logs it: "(... - warren-collector-<id>@<host>:<pid>):
# user '<user>' authenticated". Its -task/-handler connections have a suffix after the id and do not match.
COLLECTOR_LOGIN = re.compile(
    r"- warren-collector-(?P<id>[A-Za-z0-9_.-]+-\d+-[0-9a-f]{4})@[^@:\s]+:\d+\): user '(?P<user>[^']+)' authenticated"
)


class SmokeFailure(Exception):
    """A check failed; the message says which and what was seen."""


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} compose-smoke: {message}", flush=True)


def wait_until(predicate: Callable[[], T | None], timeout_s: float, what: str, every_s: float = 2.0) -> T:
    """Poll ``predicate`` until it returns something other than None/False; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise SmokeFailure(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now (the kernel's choice), for the broker's published ports."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def duration_s(text: str) -> float:
    """A compose duration (``40s``, ``1m30s``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text))


def parse_time(text: str) -> float:
    """An RFC 3339 timestamp from ``podman inspect`` (nanoseconds, zone) as epoch seconds."""
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", text)
    if not match:
        raise ValueError(f"not a timestamp: {text!r}")
    base, fraction, zone = match.groups()
    stamp = float(calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")))
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        stamp -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return stamp + float(fraction or 0)


#: A collector's log line about one of its tasks (worker.collector.run).
TASK_LINE = re.compile(
    r"\[collector (?P<worker>\S+)\] worker\.collector\.run: task (?P<task>\S+) (?P<what>started|ended)"
)
#: A stop request in a container's log: warren's signal handler, or RabbitMQ's shutdown.
STOP_LINE = re.compile(
    r"^(?P<name>\S+)\s+\| (?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[.,](?P<fraction>\d+)"
    r".*(SIGTERM received|RabbitMQ is asked to stop)"
)


def stop_requests(logs: str, since: float) -> dict[str, float]:
    """``{service_N: epoch time}`` of each container's first stop request logged after ``since``.

    The containers log in UTC, with their own millisecond timestamps.
    """
    found: dict[str, float] = {}
    for line in logs.splitlines():
        match = STOP_LINE.match(line)
        if match:
            base = calendar.timegm(time.strptime(match.group("stamp"), "%Y-%m-%d %H:%M:%S"))
            stamp = base + float("0." + match.group("fraction"))
            if stamp >= since and match.group("name") not in found:
                found[match.group("name")] = stamp
    return found


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over the engine's unix socket (to ping the Docker API)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class Smoke:
    """One run: the engine, the project, its checks and its cleanup."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.project = f"warrensmoke{os.getpid()}"
        self.socket_path = workdir / "podman.sock"
        self.env_file = workdir / "smoke.env"
        # docker-compose.yml, and for the cluster step the override after it.
        self.compose_files = ["docker-compose.yml"]
        self.user = f"smoke-{secrets.token_hex(3)}"
        self.password = secrets.token_urlsafe(18).replace("-", "x").replace("_", "y")
        self.amqp_port, self.management_port, self.prometheus_port, self.prometheus_ui_port = free_ports(4)
        self.service: subprocess.Popen[bytes] | None = None
        self.up_process: subprocess.Popen[bytes] | None = None
        self.health_stop = threading.Event()
        self.health_thread: threading.Thread | None = None
        self.timings: list[tuple[str, float]] = []
        self.passed: list[str] = []
        self.grace_s: dict[str, float] = {}

    # -- bookkeeping -------------------------------------------------------------------

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        log(f"[{name}] ...")
        started = time.monotonic()
        yield
        took = time.monotonic() - started
        self.timings.append((name, took))
        log(f"[{name}] done in {took:.1f} s")

    def passed_check(self, what: str) -> None:
        self.passed.append(what)
        log(f"ok: {what}")

    # -- commands ----------------------------------------------------------------------

    def environment(self, **overrides: str) -> dict[str, str]:
        """A clean environment for docker-compose: the shell's WARREN_*/RABBITMQ_* would beat the env file."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "DOCKER_HOST": f"unix://{self.socket_path}",
            # A 2-core machine building torch layers answers slowly; the default is 60 s.
            "COMPOSE_HTTP_TIMEOUT": "600",
            "CONTAINERS_CONF": os.environ["CONTAINERS_CONF"],
        }
        env.update(overrides)
        return env

    def compose_argv(self, *args: str) -> list[str]:
        return [
            "docker-compose",
            "--project-name",
            self.project,
            "--project-directory",
            str(ROOT),
            "--env-file",
            str(self.env_file),
            *(arg for name in self.compose_files for arg in ("--file", str(ROOT / name))),
            *args,
        ]

    def compose(self, *args: str, timeout_s: float, env: dict[str, str] | None = None) -> str:
        """Run docker-compose to the end; its output is returned (and logged on failure)."""
        done = subprocess.run(
            self.compose_argv(*args),
            cwd=ROOT,
            env=env or self.environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
        )
        output = done.stdout.decode(errors="replace")
        if done.returncode != 0:
            raise SmokeFailure(f"docker-compose {' '.join(args)} exited {done.returncode}:\n{output[-4000:]}")
        return output

    def podman(self, *args: str, timeout_s: float = 60, check: bool = True) -> str:
        done = subprocess.run(
            ["podman", *args], capture_output=True, timeout=timeout_s, check=False, env=self.environment()
        )
        if check and done.returncode != 0:
            raise SmokeFailure(f"podman {' '.join(args)} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
        return done.stdout.decode()

    def containers(self, service: str | None = None) -> list[dict[str, Any]]:
        """``podman inspect`` of the project's containers (of one service), oldest first."""
        label = f"label=com.docker.compose.project={self.project}"
        filters = ["--filter", label]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        ids = self.podman("ps", "--all", "--quiet", "--no-trunc", *filters).split()
        if not ids:
            return []
        found: list[dict[str, Any]] = json.loads(self.podman("inspect", *ids))
        return sorted(found, key=lambda c: str(c["Created"]))

    # -- the engine --------------------------------------------------------------------

    def install_packages(self) -> None:
        missing = []
        for package in PACKAGES:
            status = subprocess.run(
                ["dpkg-query", "--show", "--showformat=${Status}", package], capture_output=True, check=False
            )
            if b"install ok installed" not in status.stdout:
                missing.append(package)
        if not missing:
            return
        log(f"installing {' '.join(missing)} (Debian packages)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
            env=env,
            check=True,
            timeout=900,
            stdout=subprocess.DEVNULL,
        )

    def start_engine(self) -> None:
        CACHE.mkdir(parents=True, exist_ok=True)
        conf = CACHE / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        os.environ["CONTAINERS_CONF"] = str(conf)
        with (self.workdir / "podman-service.log").open("wb") as service_log:
            self.service = subprocess.Popen(
                ["podman", "system", "service", "--time=0", f"unix://{self.socket_path}"],
                env=self.environment(),
                stdout=service_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the smoke must not kill it before the cleanup
            )

        def answers() -> bool:
            assert self.service is not None
            if self.service.poll() is not None:
                raise SmokeFailure(f"podman system service exited {self.service.returncode}")
            try:
                connection = UnixHTTPConnection(str(self.socket_path), timeout=5)
                connection.request("GET", "/_ping")
                return connection.getresponse().status == 200
            except OSError:
                return False

        wait_until(answers, 60, "the podman service to answer on its socket", every_s=0.5)
        # podman runs healthchecks from systemd timers; without systemd nobody runs them and
        # the broker would stay "starting" for ever (compose waits for "healthy"). Run them
        # here, as the timer would. With systemd, podman does it itself.
        if not Path("/run/systemd/system").exists():
            self.health_thread = threading.Thread(target=self.run_healthchecks, daemon=True)
            self.health_thread.start()

    def run_healthchecks(self) -> None:
        """Run each healthcheck of the project's containers at its own interval, as podman's timer would."""
        last_run: dict[str, float] = {}
        while not self.health_stop.wait(1.0):
            try:
                for container in self.containers():
                    check = container["Config"].get("Healthcheck") or {}
                    interval_s = float(check.get("Interval") or 30e9) / 1e9  # nanoseconds
                    cid = container["Id"]
                    if not check.get("Test") or not container["State"]["Running"]:
                        continue
                    if time.monotonic() - last_run.get(cid, -1e9) >= interval_s:
                        last_run[cid] = time.monotonic()
                        self.podman("healthcheck", "run", cid, timeout_s=60, check=False)
            except (SmokeFailure, subprocess.SubprocessError, json.JSONDecodeError) as exc:
                log(f"healthcheck runner: {exc}")

    # -- the management API and the run log ----------------------------------------------

    def api(self, path: str, user: str | None = None, password: str | None = None) -> Any:
        request = urllib.request.Request(f"http://127.0.0.1:{self.management_port}{path}")
        token = base64.b64encode(f"{user or self.user}:{password or self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def collector_connections(self) -> dict[str, dict[str, Any]]:
        """``{worker id: connection}`` of every collector's main connection the management API lists."""
        pattern = re.compile(r"^warren-collector-(?P<id>[A-Za-z0-9_.-]+-\d+-[0-9a-f]{4})@(?P<host>[^@:]+):\d+$")
        found: dict[str, dict[str, Any]] = {}
        try:
            connections = self.api("/api/connections")
        except (urllib.error.URLError, OSError):
            return found
        for conn in connections:
            name = conn.get("client_properties", {}).get("connection_name", "")
            match = pattern.match(name)
            if match:
                found[match.group("id")] = conn
        return found

    def consumers_by_worker(self) -> dict[str, set[str]]:
        """``{worker id: queues it consumes}``, via each consumer's channel to its named connection."""
        owners = {conn["name"]: wid for wid, conn in self.collector_connections().items()}
        queues: dict[str, set[str]] = {}
        for consumer in self.api("/api/consumers/%2F"):
            details = consumer.get("channel_details")
            if isinstance(details, dict) and details.get("connection_name") in owners:
                queues.setdefault(owners[details["connection_name"]], set()).add(consumer["queue"]["name"])
        return queues

    def volume_path(self) -> Path:
        volume = f"{self.project}_warren-data"
        return Path(self.podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume).strip())

    def run_log(self) -> list[dict[str, Any]]:
        """The coordinator's run log, read from the named volume on the host (fast enough to poll)."""
        path = self.volume_path() / "runs" / "run.jsonl"
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the line being written
        return records

    def current_run(self) -> list[dict[str, Any]]:
        """The run log's records since the last summary (the run now going on)."""
        records = self.run_log()
        ends = [i for i, r in enumerate(records) if r.get("kind") == "summary"]
        return records[ends[-1] + 1 :] if ends else records

    def workers_given_tasks(self) -> set[str]:
        """Workers the current run gave a task to: finished ones, and running ones in the last checkpoint."""
        records = self.current_run()
        workers = {str(r["worker_id"]) for r in records if r.get("kind") in FINISHED and r.get("worker_id")}
        checkpoints = [r for r in records if r.get("kind") == "checkpoint"]
        if checkpoints:
            running = checkpoints[-1].get("running", {}).values()
            workers |= {str(t["worker_id"]) for t in running if t.get("worker_id")}
        return workers

    # -- the steps ---------------------------------------------------------------------

    def write_env_file(self, images: dict[str, str]) -> None:
        """.env as a user makes it from .env.example: an own account, other ports, the local images."""
        values = {
            "RABBITMQ_DEFAULT_USER": self.user,
            "RABBITMQ_DEFAULT_PASS": self.password,
            "RABBITMQ_BIND": "127.0.0.1",
            "RABBITMQ_AMQP_PORT": str(self.amqp_port),
            "RABBITMQ_MANAGEMENT_PORT": str(self.management_port),
            "RABBITMQ_PROMETHEUS_PORT": str(self.prometheus_port),
            "PROMETHEUS_BIND": "127.0.0.1",
            "PROMETHEUS_PORT": str(self.prometheus_ui_port),
            "WARREN_IMAGE": WARREN_IMAGE,
            "RABBITMQ_CLUSTER_COOKIE": secrets.token_hex(20),
            # A bound on the training run: a budget spent is exit code 3, not a hang.
            "WARREN_MAX_TIME_S": "300",
            **images,
        }
        lines = []
        for line in (ROOT / ".env.example").read_text().splitlines():
            key = line.split("=", 1)[0]
            if "=" in line and not line.startswith("#") and key in values:
                lines.append(f"{key}={values.pop(key)}")
            else:
                lines.append(line)
        lines += [f"{key}={value}" for key, value in values.items()]
        self.env_file.write_text("\n".join(lines) + "\n")
        self.env_file.chmod(0o600)

    def build_images(self) -> None:
        with self.step("base images"):
            done = subprocess.run(
                [str(ROOT / "scripts" / "local-images")],
                env={**os.environ, "CONTAINERS_CONF": os.environ["CONTAINERS_CONF"]},
                stdout=subprocess.PIPE,
                timeout=2400,
                check=False,
            )
            if done.returncode != 0:
                raise SmokeFailure(f"scripts/local-images exited {done.returncode}")
            images = {}
            for line in done.stdout.decode().split():
                key, _, value = line.partition("=")
                images[key] = value
            self.write_env_file(images)
        with self.step("build"):
            old = self.podman("image", "inspect", "--format", "{{.Id}}", WARREN_IMAGE, check=False).strip()
            output = self.compose("build", timeout_s=2400)
            (self.workdir / "build.log").write_text(output)
            new = self.podman("image", "inspect", "--format", "{{.Id}}", WARREN_IMAGE).strip()
            if old and old != new:
                self.podman("image", "rm", old, check=False)  # the previous build: its layers are replaced
            # The grace periods as docker-compose reads them, for the stop checks.
            service = ""
            for line in self.compose("config", timeout_s=60).splitlines():
                if re.match(r"^  [a-z]", line):
                    service = line.strip().rstrip(":")
                elif line.strip().startswith("stop_grace_period:"):
                    self.grace_s[service] = duration_s(line.split(":", 1)[1].strip())
        self.passed_check(f"the Dockerfile builds {WARREN_IMAGE} (base {self.env_value('PYTHON_IMAGE')})")

    def env_value(self, key: str) -> str:
        for line in self.env_file.read_text().splitlines():
            if line.startswith(key + "="):
                return line.split("=", 1)[1]
        return ""

    def wait_healthy(self, timeout_s: float) -> None:
        def healthy() -> bool:
            if self.up_process is not None and self.up_process.poll() is not None:
                raise SmokeFailure(f"docker-compose up exited {self.up_process.returncode} early")
            brokers = self.containers("rabbitmq")
            return bool(brokers) and brokers[0]["State"].get("Health", {}).get("Status") == "healthy"

        wait_until(healthy, timeout_s, "the rabbitmq service to become healthy")

    def check_accounts(self) -> None:
        """Only the .env account exists on the broker, and guest/guest is refused."""
        whoami = self.api("/api/whoami")
        users = sorted(u["name"] for u in self.api("/api/users"))
        if whoami.get("name") != self.user or users != [self.user]:
            raise SmokeFailure(f"broker users {users}, whoami {whoami}: wanted only {self.user!r} from .env")
        try:
            self.api("/api/whoami", "guest", "guest")
            raise SmokeFailure("guest/guest was let in")
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                raise

    @staticmethod
    def logged_collector_logins(broker_log: str) -> dict[str, str]:
        """``{worker id: user}`` of every collector main connection the broker's log says logged in.

        The broker's log, not the management API: a fast job can start and end between two polls
        of the API (it did in CI: 9 s of training), while the log keeps every login.
        """
        found: dict[str, str] = {}
        for match in COLLECTOR_LOGIN.finditer(broker_log):
            found[match.group("id")] = match.group("user")
        return found

    def start_job(self, out: IO[bytes]) -> subprocess.Popen[bytes]:
        """The README's command, ``up --exit-code-from coordinator``, its output to ``out``."""
        return subprocess.Popen(
            self.compose_argv("up", "--exit-code-from", "coordinator"),
            cwd=ROOT,
            env=self.environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_job_end(self, process: subprocess.Popen[bytes]) -> int:
        """The exit code of ``up``, which ends with the coordinator; bounded by the run's time budget."""
        try:
            return process.wait(timeout=int(self.env_value("WARREN_MAX_TIME_S")) + 240)
        except subprocess.TimeoutExpired as exc:
            raise SmokeFailure("docker-compose up did not end after the run's time budget") from exc

    def train(self) -> None:
        """The README's command: up --build --exit-code-from coordinator, to the stop value."""
        up_log = self.workdir / "up.log"
        with self.step("up"), up_log.open("wb") as out:
            self.up_process = self.start_job(out)
            self.wait_healthy(300)
            self.check_accounts()  # now, while the broker surely runs: the job may be over in seconds
            logins = wait_until(
                lambda: found if len(found := self.logged_collector_logins(up_log.read_text())) >= 2 else None,
                240,
                "2 collector logins in the broker's log",
                every_s=0.5,
            )
        self.passed_check(f"up: broker healthy, collectors connected as {sorted(logins)}")
        if set(logins.values()) != {self.user}:
            raise SmokeFailure(f"collector connections not as {self.user}: {logins}")
        self.passed_check(f"the broker has only the .env account {self.user!r}; the workers log in with it")
        with self.step("training"):
            code = self.wait_job_end(self.up_process)
        summaries = [r for r in self.run_log() if r.get("kind") == "summary"]
        if not summaries:
            raise SmokeFailure(f"no run summary in the run log; up exited {code}:\n{up_log.read_text()[-3000:]}")
        summary = summaries[-1]
        took = f"{summary['wall_time_s']} s, {summary['env_steps']} env steps, policy iter {summary['policy_iter']}"
        if code == 0 and summary["success"]:
            self.passed_check(f"training reached the stop value: {summary['reason']} ({took})")
        elif code == 3 and summary["policy_iter"] > 0 and summary["evals"] > 0:
            self.passed_check(f"training ran to its budget: best eval {summary['best_eval']} ({took})")
        else:
            raise SmokeFailure(f"up exited {code}, summary {summary}:\n{up_log.read_text()[-3000:]}")
        # --exit-code-from stops everything else when the coordinator ends.
        states = {c["Name"]: (c["State"]["Running"], c["State"]["ExitCode"]) for c in self.containers()}
        if any(running or code != 0 for running, code in states.values()):
            raise SmokeFailure(f"after the job ended: {states}")
        self.passed_check(f"the job's end stopped every container with exit code 0 ({len(states)} containers)")
        with self.step("down"):
            self.compose("down", timeout_s=300)

    def scale(self) -> None:
        # A job that does not end while collectors are scaled and killed: neither its stop value
        # nor its env-step budget can be reached (400k env steps take ~25 s now), only 15 min.
        env = self.environment(
            WARREN_STOP_VALUE=UNREACHABLE_STOP_VALUE,
            WARREN_MAX_ENV_STEPS=UNREACHABLE_ENV_STEPS,
            WARREN_MAX_TIME_S="900",
        )
        # Tasks of 2,048 samples last ~15 ms, mostly spent waiting for the last confirms: too
        # short to kill a collector in the middle of one (kill_busy_collector). This run's
        # coordinator gets a job of longer tasks through a small override of its command.
        self.compose_files = ["docker-compose.yml", str(self.long_tasks_override())]
        with self.step("up -d"):
            self.compose("up", "--detach", timeout_s=600, env=env)
            two = wait_until(lambda: self.gave_tasks(2), 240, "2 collectors with tasks")
        with self.step("prometheus"):
            up = wait_until(lambda: self.scraped(collectors=2), 120, "Prometheus targets up: broker, 3 roles")
            rising = self.counters_rise()
        self.passed_check(f"Prometheus scrapes every target: {up}")
        self.passed_check("warren's counters rise in Prometheus during training: " + "; ".join(rising))
        with self.step("scale"):
            self.compose("up", "--detach", "--scale", "collector=4", timeout_s=600, env=env)
            workers = wait_until(lambda: self.gave_tasks(4), 240, "4 collectors with tasks")
            consumers = wait_until(
                lambda: self.consume_control_queues(workers), 120, "a consumer per new collector's control queue"
            )
            scaled = wait_until(lambda: self.scraped(collectors=4), 120, "Prometheus targets of 4 collectors up")
        new = sorted(set(workers) - set(two))
        self.passed_check(f"--scale collector=4: {len(new)} new collectors, each with tasks: {new}")
        for wid in sorted(workers):
            name = workers[wid]["client_properties"]["connection_name"]
            log(f"  {name}: consumes {sorted(consumers[wid])}")
        self.passed_check("the management API lists every collector's connection name and its consumers")
        self.passed_check(f"Prometheus found the new collectors by DNS, with no config change: {scaled}")

    def prometheus(self, path: str) -> Any:
        """The ``data`` of a Prometheus HTTP API answer (the service's published port)."""
        url = f"http://127.0.0.1:{self.prometheus_ui_port}{path}"
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
        if answer.get("status") != "success":
            raise SmokeFailure(f"Prometheus {path}: {answer}")
        return answer["data"]

    def scraped(self, collectors: int) -> dict[str, int] | None:
        """``{job: targets up}`` once every target is up: the broker, the coordinator, the learner, ``collectors``."""
        try:
            targets = self.prometheus("/api/v1/targets?state=active")["activeTargets"]
        except (urllib.error.URLError, OSError, json.JSONDecodeError):
            return None
        up: dict[str, int] = {}
        for target in targets:
            if target.get("health") != "up":
                return None
            job = str(target["labels"]["job"])
            up[job] = up.get(job, 0) + 1
        wanted = {job: 1 for job in SCRAPE_JOBS} | {"warren-collector": collectors}
        return up if up == wanted else None

    def query(self, expression: str) -> float | None:
        """The value of a PromQL expression with one result (``None`` while it has none)."""
        try:
            result = self.prometheus("/api/v1/query?" + urllib.parse.urlencode({"query": expression}))["result"]
        except (urllib.error.URLError, OSError, json.JSONDecodeError):
            return None
        return float(result[0]["value"][1]) if result else None

    def counters_rise(self) -> list[str]:
        """Each counter of :data:`RISING` is scraped, then scraped again higher (the job trains)."""
        seen = []
        for expression in RISING:
            first = wait_until(partial(self.query, expression), 60, f"{expression} in Prometheus", every_s=1)
            later = wait_until(partial(self.above, expression, first), 60, f"{expression} above {first:g}", every_s=1)
            seen.append(f"{expression} {first:g} -> {later:g}")
        return seen

    def above(self, expression: str, floor: float) -> float | None:
        value = self.query(expression)
        return value if value is not None and value > floor else None

    def long_tasks_override(self) -> Path:
        """A compose file giving the coordinator the shipped job with 64k-sample collect tasks (~1 s)."""
        job = self.workdir / "long-tasks.toml"
        job.write_text(
            f"[collector]\nn_sample = {LONG_TASK_SAMPLES}\n\n"
            # room for a task per collector: the run-ahead limit must hold 4 of them
            f"[coordinator]\nmax_run_ahead_samples = {4 * LONG_TASK_SAMPLES}\n"
        )
        job.chmod(0o644)
        command = [
            "coordinator", "--config", "/etc/warren-smoke/job.toml", "--collect-tasks", "0",
            "--stop-value", "${WARREN_STOP_VALUE:-195}", "--max-env-steps", "${WARREN_MAX_ENV_STEPS:-2000000}",
            "--max-time-s", "${WARREN_MAX_TIME_S:-1800}", "--seed", "0",
            "--run-log", "/data/runs/run.jsonl", "--progress", "log",
        ]  # fmt: skip
        override = self.workdir / "long-tasks.yml"
        override.write_text(
            "services:\n"
            "  coordinator:\n"
            f"    command: {json.dumps(command)}\n"
            "    volumes:\n"
            f"      - {job}:/etc/warren-smoke/job.toml:ro\n"
        )
        return override

    def gave_tasks(self, count: int) -> dict[str, dict[str, Any]] | None:
        """Collector connections, when ``count`` of them are listed and each was given a task."""
        conns = self.collector_connections()
        if len(conns) < count:
            return None
        return conns if set(conns) <= self.workers_given_tasks() else None

    def consume_control_queues(self, workers: dict[str, dict[str, Any]]) -> dict[str, set[str]] | None:
        consumers = self.consumers_by_worker()
        if all(f"{PREFIX}.collector.control.{wid}" in consumers.get(wid, set()) for wid in workers):
            return consumers
        return None

    def kill_busy_collector(self) -> None:
        """SIGKILL a collector in the middle of a task; the coordinator must run that task again.

        A collect task lasts a few tens of milliseconds here (2,048 samples of 64 vector envs)
        and a worker is often idle while the coordinator holds collectors back for the learner;
        a kill that lands after the task's data is in (while it is being closed, or between
        two tasks) loses nothing, so nothing is re-run. So each try freezes every collector at
        once (``podman pause``) and reads their logs: one whose last task line says it started
        is in that task; the others are thawed. With 4 collectors in a task ~7% of the time
        each, a try catches one about 1 time in 4. The log line can still lag the task: a
        collector frozen after it published its last item but before it logged the end is
        killed with nothing left to re-run (the coordinator completes the task from its data,
        which is right). Then another collector is killed, up to :data:`KILLS` in all.
        """
        with self.step("kill"):
            kills = 0
            while kills < KILLS:
                kills += 1
                container, worker_id, task_id = self.freeze_one_in_a_task()
                rerun_before = max(int(r["tasks_rerun"]) for r in self.current_run() if r.get("kind") == "checkpoint")
                # docker-compose 1.29 can only kill every container of a service; one is the engine's job.
                self.podman("kill", "--signal", "KILL", container["Id"])
                log(f"SIGKILL to {container['Name']} (worker {worker_id}) in the middle of {task_id}")
                outcome = wait_until(
                    partial(self.after_kill, worker_id, task_id, rerun_before),
                    180,
                    f"the coordinator to re-run the task of {worker_id}",
                    every_s=3,
                )
                if outcome != COMPLETED_FROM_DATA:
                    break
                log(f"{task_id} was complete before the kill (finished from its data); killing another collector")
            if outcome == COMPLETED_FROM_DATA:
                raise SmokeFailure(f"each of {KILLS} kills landed after its task's data was complete")
        (dead,) = [c for c in self.containers("collector") if c["Id"] == container["Id"]]
        self.passed_check(
            f"SIGKILL of {dead['Name']} (exit {dead['State']['ExitCode']}) during {task_id}: the coordinator "
            f"logged 'worker {worker_id} is gone', counted a re-run, and {outcome} finished the next task"
            + (f" (kill {kills} of {KILLS})" if kills > 1 else "")
        )

    def freeze_one_in_a_task(self) -> tuple[dict[str, Any], str, str]:
        """A frozen collector container whose last task line says it started, its worker and task ids."""
        for _attempt in range(KILL_TRIES):
            live = [c["Id"] for c in self.containers("collector") if c["State"]["Running"]]
            if len(live) < 2:
                raise SmokeFailure("fewer than 2 collectors left to kill one")
            self.podman("pause", *live)
            victim = None
            try:
                found = {cid: self.task_in_progress(cid) for cid in live}
                victim = next((cid for cid, task in found.items() if task is not None), None)
            finally:  # thaw all but the one caught, whatever happened
                others = [cid for cid in live if cid != victim]
                if others:
                    self.podman("unpause", *others)
            if victim is not None:
                (container,) = [c for c in self.containers("collector") if c["Id"] == victim]
                caught = found[victim]
                assert caught is not None
                return container, caught[0], caught[1]
            time.sleep(0.2)
        raise SmokeFailure(f"no collector was caught in the middle of a task in {KILL_TRIES} tries")

    def task_in_progress(self, container_id: str) -> tuple[str, str] | None:
        """``(worker id, task id)`` when a (frozen) collector's last log line about a task says it started."""
        done = subprocess.run(
            ["podman", "logs", "--tail", "40", container_id],
            capture_output=True,
            timeout=60,
            check=False,
            env=self.environment(),
        )
        last = None
        for line in (done.stdout + done.stderr).decode(errors="replace").splitlines():
            match = TASK_LINE.search(line)
            if match:
                last = match
        if last is None or last.group("what") != "started":
            return None
        return last.group("worker"), last.group("task")

    def after_kill(self, worker_id: str, task_id: str, rerun_before: int) -> str | None:
        """What the coordinator made of the kill, once it is known (None: not yet).

        The worker that finished a task after the coordinator counted the re-run, or
        :data:`COMPLETED_FROM_DATA` when it finished the killed task from what it had published.
        """
        logs = self.compose("logs", "--no-color", "coordinator", timeout_s=120)
        # A collector may run more than one task at once: any of them may be the one named.
        # A kill that lands while the coordinator is closing a task whose data is all in is
        # seen by the close ("left before task ... was closed"), not by the liveness check.
        noticed = (f"worker {worker_id} is gone (task ", f"worker {worker_id} left before task {task_id} was closed")
        if not any(line in logs for line in noticed):
            return None
        records = self.current_run()
        if any(
            r.get("kind") == "task" and r.get("task_id") == task_id and r.get("worker_id") == worker_id for r in records
        ):
            return COMPLETED_FROM_DATA
        counted = [r for r in records if r.get("kind") == "checkpoint" and r["tasks_rerun"] > rerun_before]
        if not counted:
            return None
        after = [
            r
            for r in records
            if r.get("kind") in FINISHED and r.get("worker_id") != worker_id and r["time"] > counted[0]["time"]
        ]
        return str(after[0]["worker_id"]) if after else None

    def stop_and_down(self) -> None:
        """``down``, in two steps (``stop``, then ``down``) to read every exit code before removal."""
        running = [c for c in self.containers() if c["State"]["Running"]]
        with self.step("down"):
            asked = time.time()
            self.compose("stop", timeout_s=300)
            stopped = {c["Id"]: c for c in self.containers()}
            logs = self.compose("logs", "--no-color", timeout_s=120)
            self.compose("down", timeout_s=300)
        signalled = stop_requests(logs, asked - 1.0)
        report = []
        for container in running:
            after = stopped[container["Id"]]
            service = after["Config"]["Labels"]["com.docker.compose.service"]
            code = int(after["State"]["ExitCode"])
            ended = parse_time(after["State"]["FinishedAt"])
            # compose stops the services one after another (dependents first), so each
            # container's grace counts from when it logged the stop request, if it did.
            short = after["Name"].removeprefix(self.project + "_")
            since = signalled.get(short, asked)
            # The coordinator's codes: 0 the stop value was reached, 128 + SIGTERM (143) the signal stopped it.
            clean = code in (0, 128 + signal.SIGTERM) if service == "coordinator" else code == 0
            grace = self.grace_s.get(service, 10.0)
            how = "after its SIGTERM" if short in signalled else "after `stop` began"
            report.append(f"{short}: exit {code}, {ended - since:.1f} s {how} (grace {grace:.0f} s)")
            if not clean or ended - since > grace:
                raise SmokeFailure(f"stop: {report[-1]}")
        if self.containers():
            raise SmokeFailure(f"down left containers: {[c['Name'] for c in self.containers()]}")
        for line in report:
            log(f"  {line}")
        self.passed_check(f"down: {len(running)} containers stopped within their grace periods, clean exit codes")

    def check_run_log_kept(self) -> None:
        with self.step("run log"):
            # docs/compose.md's command for copying the run log out of the volume.
            output = self.compose(
                "run", "--rm", "-T", "--no-deps", "--entrypoint", "cat", "coordinator", "/data/runs/run.jsonl",
                timeout_s=300,
            )  # fmt: skip
        records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
        summaries = [r for r in records if r.get("kind") == "summary"]
        if len(summaries) != 2 or summaries[-1].get("reason") != "stopped by signal":
            raise SmokeFailure(f"run log summaries {summaries}: wanted the job's, then the stopped run's")
        tasks = sum(1 for r in records if r.get("kind") == "task")
        self.passed_check(f"the named volume kept the run log across down/up: 2 runs, {tasks} task records")

    # -- cleanup -----------------------------------------------------------------------

    def diagnose(self) -> None:
        """What a failure leaves to look at: the containers' states, and their logs (kept in the cache dir)."""
        try:
            for container in self.containers():
                state = container["State"]
                health = state.get("Health", {}).get("Status") or "-"
                log(f"  {container['Name']}: {state['Status']}, exit {state['ExitCode']}, health {health}")
            logs = self.compose("logs", "--no-color", "--timestamps", timeout_s=120)
            kept = CACHE / "last-failure.log"
            kept.write_text(logs)
            print("\n".join(logs.splitlines()[-60:]), flush=True)
            log(f"all the containers' logs: {kept}")
        except (SmokeFailure, subprocess.SubprocessError, OSError, json.JSONDecodeError) as exc:
            log(f"(no diagnostics: {exc})")

    def cleanup(self) -> None:
        """Remove everything of the project and stop the engine; every step bounded, none may stop the rest."""
        log("cleanup")
        if self.up_process is not None and self.up_process.poll() is None:
            self.up_process.terminate()
            try:
                self.up_process.wait(30)
            except subprocess.TimeoutExpired:
                self.up_process.kill()
        label = f"label=com.docker.compose.project={self.project}"
        try:
            subprocess.run(
                self.compose_argv("down", "--volumes", "--remove-orphans", "--timeout", "10"),
                cwd=ROOT,
                env=self.environment(),
                capture_output=True,
                timeout=300,
                check=False,
            )
        except (subprocess.SubprocessError, OSError) as exc:
            log(f"cleanup: {exc}")
        # Whatever compose could not remove (e.g. the engine went away): straight from podman.
        try:
            ids = self.podman("ps", "--all", "--quiet", "--filter", label, check=False).split()
            if ids:
                self.podman("rm", "--force", "--time", "5", *ids, timeout_s=120, check=False)
            volumes = self.podman("volume", "ls", "--quiet", "--filter", label, check=False).split()
            if volumes:
                self.podman("volume", "rm", "--force", *volumes, check=False)
            if self.project + "_default" in self.podman("network", "ls", "--format", "{{.Name}}", check=False).split():
                self.podman("network", "rm", "--force", self.project + "_default", check=False)
        except (subprocess.SubprocessError, OSError, KeyError) as exc:
            log(f"cleanup: {exc}")
        self.health_stop.set()
        if self.health_thread is not None:
            self.health_thread.join(90)
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
            try:
                self.service.wait(30)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait(10)

    def cluster(self) -> None:
        """docker-compose.cluster.yml: three brokers form one cluster, the roles use quorum queues on it.

        The override replaces the single broker with node 1 (same published ports) and adds
        nodes 2 and 3; every role gets all three URLs and ``WARREN_QUEUE_TYPE=quorum``. The
        job runs to its stop value as in step 3. Losing a node mid-run is tested in pytest's
        ``cluster`` suite against private nodes, where a node's VM can be killed.
        """
        # A fresh volume: the learner would otherwise resume from the policy the earlier runs trained.
        self.compose("down", "--volumes", timeout_s=300)
        self.compose_files = ["docker-compose.yml", CLUSTER_FILE]
        up_log = self.workdir / "cluster-up.log"
        with self.step("cluster up"), up_log.open("wb") as out:
            self.up_process = self.start_job(out)
            nodes = wait_until(self.running_cluster_nodes, 420, "3 running nodes in /api/nodes", every_s=3)
            queue = wait_until(self.quorum_task_queue, 240, "the task queue as a quorum queue on 3 nodes", every_s=1)
        self.passed_check(f"cluster: {len(nodes)} nodes running as one cluster: {sorted(nodes)}")
        self.passed_check(
            f"cluster: {queue['name']} is a {queue['type']} queue, leader {queue['leader']}, members {queue['members']}"
        )
        with self.step("cluster training"):
            code = self.wait_job_end(self.up_process)
        summaries = [r for r in self.run_log() if r.get("kind") == "summary"]
        if not summaries:  # the volume was new: any summary is this run's
            raise SmokeFailure(f"no run summary; up exited {code}:\n{up_log.read_text()[-3000:]}")
        summary = summaries[-1]
        if code != 0 or not summary["success"]:
            raise SmokeFailure(f"cluster run: up exited {code}, summary {summary}:\n{up_log.read_text()[-3000:]}")
        self.passed_check(
            f"cluster: training reached the stop value: {summary['reason']} ({summary['wall_time_s']} s, "
            f"{summary['env_steps']} env steps)"
        )
        with self.step("cluster down"):
            self.compose("down", "--volumes", "--timeout", "30", timeout_s=300)

    def running_cluster_nodes(self) -> list[str] | None:
        try:
            nodes = self.api("/api/nodes")
        except (urllib.error.URLError, OSError, json.JSONDecodeError):
            return None
        running = [str(n["name"]) for n in nodes if n.get("running")]
        return running if len(running) == 3 else None

    def quorum_task_queue(self) -> dict[str, Any] | None:
        try:
            queue: dict[str, Any] = self.api("/api/queues/%2F/warren.collector.tasks")
        except (urllib.error.URLError, OSError, json.JSONDecodeError):
            return None
        if queue.get("type") != "quorum" or len(queue.get("members") or []) != 3 or not queue.get("leader"):
            return None
        return queue

    def run(self) -> None:
        with self.step("engine"):
            self.install_packages()
            self.start_engine()
        log(f"project {self.project}, broker ports {self.amqp_port}/{self.management_port}/{self.prometheus_port}")
        self.build_images()
        self.train()
        self.scale()
        self.kill_busy_collector()
        self.stop_and_down()
        self.check_run_log_kept()
        self.cluster()


def try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def on_signal(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str]) -> int:
    if argv:
        print(__doc__)
        return 0 if argv[0] in ("-h", "--help") else 2
    if os.geteuid() != 0:
        print("compose-smoke: run it as root (podman's rootful mode, apt-get)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, on_signal)
    started = time.monotonic()
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "compose-smoke.lock").open("w") as lock, tempfile.TemporaryDirectory(prefix="warren-smoke-") as tmp:
        # One run at a time per machine: they would share the image tags and the 2 cores.
        wait_until(lambda: try_lock(lock.fileno()), 1800, "another compose-smoke run to finish", every_s=5)
        smoke = Smoke(Path(tmp))
        failed: str | None = None
        try:
            smoke.run()
        except (SmokeFailure, subprocess.SubprocessError, OSError, KeyboardInterrupt) as exc:
            failed = f"{type(exc).__name__}: {exc}"
            log(f"FAILED: {failed}")
            smoke.diagnose()
        finally:
            smoke.cleanup()
    log("times: " + ", ".join(f"{name} {took:.0f} s" for name, took in smoke.timings))
    log(f"total {time.monotonic() - started:.0f} s")
    # One plain closing line, as test runners print.
    print(f"compose-smoke: {len(smoke.passed)} passed, {1 if failed else 0} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
