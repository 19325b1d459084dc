"""``warren run``: the whole job on one machine, a coordinator, N collectors and a learner.

The coordinator runs in this process; collectors and the learner are child processes
that log to ``<workdir>/logs/``. Ctrl-C stops the coordinator, which then sends each
child one SIGTERM and waits for it. Every child also gets SIGTERM from the kernel if
this process dies (Linux parent-death signal), so no process outlives the run.

A run named with ``--name`` (:mod:`worker.cli.named_run`) can be joined by collectors on
other machines: it keeps one collect task per collector listening on its task queue
(not a fixed ``--collectors``), logs the command that joins it, and leaves its shared
task queue in place at exit for the collectors that are still listening.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from messaging import BrokerLink, ConfigurationError, Settings, WarrenError
from messaging.settings import to_env
from worker import json_text
from worker.cli.cleanup import remove_run_topology, remove_step_files, sweep_interrupted_runs
from worker.cli.flags import (
    ENV_FLAGS,
    add_job_flags,
    add_telemetry_flags,
    add_transport_flags,
    env_variable,
    flag_values,
    job_config,
    log_level,
    positive_int,
)
from worker.cli.named_run import RUNS_DIR, RunIdentity, join_command, loopback_hosts, run_identity, run_name
from worker.cli.run_dir import RunLock, RunState, new_record, read_record, state_of
from worker.config import CoordinatorConfig, cpu_budget, role_config
from worker.job import JobConfig
from worker.logs import setup_logging

logger = logging.getLogger(__name__)

#: How long children get to stop after SIGTERM before they are killed.
CHILD_GRACE_S = 30.0
#: Connect budget of the checks before and after the run: a broker is there or it is not.
PREFLIGHT_CONNECT_S = 5.0
#: Collector processes unless ``--collectors`` or ``WARREN_COLLECTORS`` say otherwise.
DEFAULT_COLLECTORS = 2
#: Variables ``warren run`` sets itself for its processes, and why (a value given is ignored, with a warning).
RUN_SETS = {
    "WARREN_PATH_DATA": "the run's own <workdir>/data",
    "WARREN_PATH_POLICY": "the run's own <workdir>/policy",
    "WARREN_RUN_LOG": "the run's own <workdir>/run.jsonl",
    "WARREN_WORKER_ID": "its collectors are c0, c1...",
    "WARREN_COLLECT_TASKS": "one collect task per collector (per listening collector with --name)",
}
#: The run directory's sub-directory of TensorBoard event files (one per role inside).
TENSORBOARD_DIR = "tensorboard"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "run",
        help="train on this machine: coordinator + N collectors + learner",
        description=(
            "Start a learner and --collectors collector processes against WARREN_AMQP_URL, with the "
            "run's own directory (runs/<id>, or runs/NAME with --name, which collectors elsewhere can "
            "join), and run the coordinator here until the stop value (CartPole-v1 "
            "to 195 by default). Ctrl-C stops everything. Exit code 0 when the stop value was reached, "
            "3 when a budget ran out, 1 when the run could not go on (no broker, the learner or every "
            "collector gone), 2 for a bad command line or config (an env the job cannot use included)."
        ),
    )
    add_transport_flags(parser)
    add_job_flags(parser)
    parser.add_argument(
        "--collectors", type=positive_int, help=f"collector processes (WARREN_COLLECTORS; default {DEFAULT_COLLECTORS})"
    )
    parser.add_argument(
        "--name",
        type=run_name,
        help="a fixed run name, so collectors on other machines can join (queue prefix <prefix>-NAME, "
        "workdir runs/NAME, one collect task per listening collector); the command to join is logged at start",
    )
    parser.add_argument(
        "--workdir", type=Path, help="where data, policies, logs and run.jsonl go (default runs/<name or id>)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run of this --name (or --workdir): its job (job.json, with the flags given applied), "
        "policy, counters, budgets and logs; without it, a name or workdir a run used is refused",
    )
    parser.add_argument(
        "--progress",
        choices=["auto", "line", "log", "off"],
        help="live status line (auto: on a terminal), periodic log lines, or nothing (WARREN_PROGRESS; auto)",
    )
    add_telemetry_flags(parser, tensorboard=False)  # TensorBoard events always go to the run's directory
    parser.set_defaults(run=run)


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG = 1: the kernel sends SIGTERM to the child when this process dies.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class Children:
    """The run's child processes, started with the run's environment and stopped together."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._files: list[IO[bytes]] = []
        self._stopping = False

    def start(self, name: str, args: list[str]) -> None:
        # Appended, never truncated: a resumed run's logs go on after the earlier run's.
        log = (self.logs / f"{name}.log").open("ab")
        self._files.append(log)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only calls prctl, no locks taken
            # Own session: a Ctrl-C reaches only this process, which then stops each child
            # with exactly one SIGTERM (a second signal would make a child exit at once).
            start_new_session=True,
        )

    def watch(self, on_exit: Callable[[str, int], None]) -> None:
        """Call ``on_exit(name, code)`` from a watcher thread when a child exits before :meth:`stop`."""
        for name, proc in self.procs.items():
            threading.Thread(target=self._wait, args=(name, proc, on_exit), name=f"watch-{name}", daemon=True).start()

    def _wait(self, name: str, proc: subprocess.Popen[bytes], on_exit: Callable[[str, int], None]) -> None:
        code = proc.wait()  # blocks in the kernel; returns when the child is gone
        if not self._stopping:
            on_exit(name, code)

    def stop(self) -> dict[str, int | None]:
        """SIGTERM everyone, wait for the grace period, SIGKILL whoever is left."""
        self._stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + CHILD_GRACE_S
        codes: dict[str, int | None] = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in %.0f s: killing it", name, CHILD_GRACE_S)
                proc.kill()
                codes[name] = proc.wait(10)
        for log in self._files:
            log.close()
        return codes


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Everything a run is made of, decided before anything starts."""

    config: CoordinatorConfig
    """The coordinator's settings: the run's own prefix and run log, the job."""
    identity: RunIdentity
    collectors: int
    children_env: dict[str, str]
    """The environment of the learner and the collectors (see :func:`child_env`)."""
    ignored: dict[str, str]
    """Variables of :data:`RUN_SETS` that were set, and why the run sets them itself."""
    resume: bool = False
    """Continue the run of the workdir (``--resume``): its counters, policy and logs."""

    @property
    def job(self) -> JobConfig:
        return self.config.job

    @property
    def base_prefix(self) -> str:
        """The prefix the run's own is made from (``WARREN_PREFIX``, ``--prefix``)."""
        return self.config.transport.prefix.removesuffix("-" + self.identity.run_id)


def plan_run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> RunPlan:
    """The run ``args`` ask for, with ``WARREN_*`` variables read as every role reads them.

    Raises:
        ConfigurationError: a flag, a variable or the job cannot be used.
    """
    env = os.environ if env is None else env
    collectors = args.collectors if args.collectors is not None else DEFAULT_COLLECTORS
    # A named run keeps one collect task per collector listening on its task queue, so
    # collectors that join from other machines get collect work too; an unnamed run has
    # only its own collectors, a fixed number.
    collect_tasks = 0 if args.name else collectors
    base = Settings.from_env(env, **flag_values(args, Settings))
    # The run's own prefix: its queues cannot meet those of any other deployment or run.
    identity = run_identity(base.prefix, args.name, args.workdir)
    resumed_job = identity.workdir / "job.json"
    # A resumed run trains the job it trained (a --config given instead is the user's call).
    config_file = resumed_job if args.resume and args.config is None and resumed_job.is_file() else args.config
    job = job_config(args, config_file=config_file, extra={"coordinator.collect_tasks": collect_tasks})
    config = role_config(CoordinatorConfig, env, job=job, **flag_values(args, CoordinatorConfig))
    transport = config.transport.replace(prefix=identity.prefix)
    workdir = identity.workdir
    config = dataclasses.replace(
        config,
        transport=transport,
        run_log=workdir / "run.jsonl",
        path_policy=workdir / "policy",
        tensorboard_dir=workdir / TENSORBOARD_DIR,
    )
    ignored = {name: why for name, why in RUN_SETS.items() if env.get(name)}
    children_env = child_env(transport, identity.workdir, env)
    return RunPlan(config, identity, collectors, children_env, ignored, resume=bool(args.resume))


def run(args: argparse.Namespace) -> int:
    from worker.coordinator.loop import Coordinator

    plan = plan_run(args)
    config, identity, job = plan.config, plan.identity, plan.job
    run_id, workdir, transport = identity.run_id, identity.workdir, config.transport
    ports = metrics_ports(config.metrics_port, plan.collectors)
    setup_logging("run", log_level(args))
    for name, why in plan.ignored.items():
        logger.warning("%s is ignored: warren run sets it itself (%s)", name, why)
    refusal = workdir_refusal(plan)
    if refusal is not None:
        logger.critical("%s", refusal)
        print(f"warren run: {refusal}", file=sys.stderr)
        return 2
    problem = preflight(config)
    if problem is not None:
        logger.critical("%s", problem)
        print(f"warren run: {problem}", file=sys.stderr)
        return 1
    # What interrupted unnamed runs left (a second Ctrl-C exits at once): nobody else will remove it.
    sweep_interrupted_runs(RUNS_DIR, transport.replace(prefix=plan.base_prefix), skip=workdir)
    record = new_record(
        run_id,
        transport.prefix,
        named=identity.named,
        buffer_id=job.coordinator.buffer_id,
        broker=transport.redacted_url,
    )
    lock = RunLock.acquire(workdir, record)  # held until this process exits, however it exits
    for sub in ("data", "policy", "logs"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    for warning in job.warnings():
        logger.warning("%s", warning)
    job_file = workdir / "job.json"
    job_file.write_text(job.to_json())
    stop: threading.Event = args.stop
    children = Children(plan.children_env, workdir / "logs")
    logger.info(
        "run %s: %d collectors%s, workdir %s, queue prefix %s",
        run_id,
        plan.collectors,
        " here (more may join: one collect task per listening collector)" if identity.named else "",
        workdir,
        transport.prefix,
    )
    if identity.named:
        _log_how_to_join(transport, workdir)
    _log_where_to_look(config, ports)
    level = ["--log-level", log_level(args)]  # --verbose reaches the children's log files too

    def metrics(name: str) -> list[str]:
        return ["--metrics-port", str(ports[name])] if ports else []

    learner = ["learner", "--config", str(job_file), "--tensorboard-dir", str(config.tensorboard_dir)]
    children.start("learner", [*learner, *metrics("learner"), *level])
    threads = collector_env_threads(plan.collectors, plan.children_env)
    for i in range(plan.collectors):
        name = f"collector-{i}"
        children.start(name, ["collector", "--worker-id", collector_id(i), *threads, *metrics(name), *level])
    coordinator = Coordinator(config, stop, continue_ended=plan.resume)
    children.watch(_ChildDeaths(coordinator, plan.collectors).on_exit)
    try:
        summary = coordinator.run()
    except WarrenError as exc:
        logger.critical("run failed: %s", exc.message)
        return 1
    finally:
        coordinator.progress.close()  # the terminal back to normal, however the run ended
        coordinator.telemetry.close()
        codes = children.stop()
        removed = 0
        if remove_run_topology(transport, job.coordinator.buffer_id, keep_shared=identity.named):
            removed = remove_step_files(workdir / "data")
            lock.release()  # clean: the workdir shows an ended run (else an interrupted one)
        else:
            lock.unlock()
        if removed:
            logger.info("removed %d step files nobody will read", removed)
    summary["children_exit_codes"] = codes
    summary["children_pids"] = {name: proc.pid for name, proc in children.procs.items()}
    summary["workdir"] = str(workdir)
    (workdir / "summary.json").write_text(json_text.dumps(summary, indent=2))
    print(json_text.dumps(summary))
    if summary["error"]:
        print(f"warren run: {summary['error']}", file=sys.stderr)
        return 1
    return 0 if summary["success"] else 3


def workdir_refusal(plan: RunPlan) -> str | None:
    """Why the run's workdir cannot be used (``None``: go ahead).

    A workdir another run used is refused unless ``--resume`` continues that run: a second
    run of one name would otherwise resume the policy but not the counters, and overwrite
    the first run's logs. A live run's workdir is refused either way.
    """
    identity = plan.identity
    state = state_of(identity.workdir)
    what = f"run {identity.run_id}" if identity.named else f"workdir {identity.workdir}"
    if state is RunState.RUNNING:
        record = read_record(identity.workdir)
        pid = f" (pid {record.pid})" if record is not None else ""
        return f"{what} is running{pid}; wait for it to end, or give another --name or --workdir"
    if state is RunState.NEW or plan.resume:
        if plan.resume and state is RunState.NEW:
            logger.info("nothing to resume in %s: starting %s", identity.workdir, what)
        return None
    how = "was interrupted (its process died)" if state is RunState.INTERRUPTED else "ended"
    return (
        f"{what} already has a run in {identity.workdir}, which {how}: --resume continues it (its policy, "
        "counters, budgets and logs), or give another --name or --workdir (or remove the directory)"
    )


class _ChildDeaths:
    """Ends the run when a child's exit leaves it unable to go on: the learner, or every collector."""

    def __init__(self, coordinator: Any, collectors: int) -> None:
        self.coordinator = coordinator
        self.collectors_left = collectors
        self._lock = threading.Lock()

    def on_exit(self, name: str, code: int) -> None:
        logger.error("%s exited with code %d (its log: logs/%s.log)", name, code, name)
        with self._lock:
            if name == "learner":
                self.coordinator.abort(f"the learner exited with code {code}")
            elif name.startswith("collector"):
                self.collectors_left -= 1
                if self.collectors_left == 0:
                    self.coordinator.abort(f"every collector exited (the last with code {code})")


def preflight(config: Any) -> str | None:
    """What makes this run impossible, found before any child starts (``None``: go ahead).

    The broker is tried once with a short budget: a refused password or a closed port is
    known in seconds, not after every child's reconnect budget. (A job whose env no
    collector could run is refused earlier still, when the job config is built.)
    """
    probe = config.transport.replace(connect_timeout_s=min(config.transport.connect_timeout_s, PREFLIGHT_CONNECT_S))
    try:
        BrokerLink(probe, "run-preflight", reconnect=False).open().close()
    except WarrenError as exc:
        return f"no usable broker: {exc.message}"
    return None


def collector_env_threads(collectors: int, env: Mapping[str, str]) -> list[str]:
    """``--env-threads``: this machine's CPUs shared out among the run's collectors (unless ``WARREN_ENV_THREADS``).

    Without it each collector would take every CPU for its vector env (ale-py's thread pool),
    and N collectors would run N times as many env threads as there are cores.
    """
    if env.get("WARREN_ENV_THREADS"):
        return []
    return ["--env-threads", str(max(1, cpu_budget() // collectors))]


def metrics_ports(first: int, collectors: int) -> dict[str, int]:
    """The ``/metrics`` port of each process of the run, from ``first`` on: none when ``first`` is 0.

    The coordinator (this process) takes ``first``, the learner the next, then collector 0, 1...

    Raises:
        ConfigurationError: the last of them would be above 65535.
    """
    if not first:
        return {}
    names = ["coordinator", "learner", *(f"collector-{i}" for i in range(collectors))]
    if first + len(names) - 1 > 65535:
        raise ConfigurationError(
            f"--metrics-port {first}: the run's {len(names)} processes need ports {first} to "
            f"{first + len(names) - 1}, above 65535"
        )
    return {name: first + i for i, name in enumerate(names)}


def _log_where_to_look(config: Any, ports: dict[str, int]) -> None:
    logger.info("TensorBoard: tensorboard --logdir %s", config.tensorboard_dir)
    if ports:
        ordered = list(ports.values())
        logger.info(
            "Prometheus metrics at http://%s:<port>/metrics: coordinator %d, learner %d, collectors %s",
            config.metrics_addr,
            ordered[0],
            ordered[1],
            f"{ordered[2]}-{ordered[-1]}" if len(ordered) > 3 else str(ordered[2]),
        )


def _log_how_to_join(transport: Settings, workdir: Path) -> None:
    logger.info(
        "to add a collector on another machine (same broker, this run's directories on a shared volume): %s",
        join_command(transport, workdir / "data", workdir / "policy"),
    )
    loopback = loopback_hosts(transport.amqp_url)
    if loopback:
        logger.info("(there, replace %s in the URL with an address of this machine's broker)", " and ".join(loopback))


def collector_id(index: int) -> str:
    """The worker id of the run's ``index``-th collector: ``c0``, ``c1``...

    Short, because the collector puts its role in front of it (connection
    ``warren-collector-c0@host:pid``, log lines ``[collector c0]``); its log file is
    ``logs/collector-<index>.log``.
    """
    return f"c{index}"


def child_env(transport: Settings, workdir: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The children's environment: ``env`` (this process's), with every transport setting of the run.

    Every field of ``transport`` is passed (not a hand-picked subset), so a setting given
    to ``warren run`` as a flag reaches the collectors and the learner as it reaches the
    coordinator; the roles' own variables (``WARREN_STALL_TIMEOUT_S``,
    ``WARREN_TORCH_THREADS``...) pass as they are. The job's variables do not: the job
    reaches the learner whole, in ``job.json``, with the flags that overrode them applied.
    ``OMP_WAIT_POLICY`` is ``PASSIVE`` unless set: the children share the machine, and a
    learner's idle torch (OpenMP) threads would otherwise spin on the cores the
    collectors need.
    """
    env = os.environ if env is None else env
    job_variables = {env_variable(flag) for flag in ENV_FLAGS}
    return {
        **{name: value for name, value in env.items() if name not in job_variables},
        **to_env(transport),
        "WARREN_PATH_DATA": str(workdir / "data"),
        "WARREN_PATH_POLICY": str(workdir / "policy"),
        "PYTHONUNBUFFERED": "1",
        "OMP_WAIT_POLICY": env.get("OMP_WAIT_POLICY", "PASSIVE"),
    }
