"""``warren run``: the whole job on one machine, a coordinator, N collectors and a learner.

The coordinator runs in this process; collectors and the learner are child processes
(:mod:`worker.cli.children`) that log to ``<workdir>/logs/``. Ctrl-C stops the
coordinator, which then sends each child one SIGTERM and waits for it. Every child also
gets SIGTERM from the kernel if this process dies (Linux parent-death signal), so no
process outlives the run. What the run is made of is decided first, before anything
starts (:mod:`worker.cli.run_plan`); this module checks the broker and carries it out.

A run named with ``--name`` (:mod:`worker.cli.named_run`) can be joined by collectors on
other machines: it keeps one collect task per collector listening on its task queue
(not a fixed ``--collectors``), logs the command that joins it, and leaves its shared
task queue in place at exit for the collectors that are still listening.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path
from typing import Any

from messaging import BrokerLink, Settings, WarrenError
from worker import json_text
from worker.cli.children import ChildDeaths, Children
from worker.cli.cleanup import remove_run_topology, remove_step_files, sweep_interrupted_runs
from worker.cli.exit_codes import ExitCode, of_ended_run
from worker.cli.exit_codes import describe as describe_exit_codes
from worker.cli.flags import (
    add_job_flags,
    add_telemetry_flags,
    add_transport_flags,
    log_level,
    positive_int,
)
from worker.cli.named_run import RUNS_DIR, join_command, loopback_hosts, run_name
from worker.cli.run_dir import RunLock, new_record
from worker.cli.run_plan import (
    DEFAULT_COLLECTORS,
    collector_env_threads,
    collector_id,
    crowded_collectors,
    metrics_ports,
    plan_run,
    workdir_refusal,
)
from worker.config import cpu_budget
from worker.lifecycle import stop_signal
from worker.logs import setup_logging

logger = logging.getLogger(__name__)

#: Connect budget of the checks before and after the run: a broker is there or it is not.
PREFLIGHT_CONNECT_S = 5.0


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "run",
        help="train on this machine: coordinator + N collectors + learner",
        description=(
            "Start a learner and --collectors collector processes against WARREN_AMQP_URL, with the "
            "run's own directory (runs/<id>, or runs/NAME with --name, which collectors elsewhere can "
            "join), and run the coordinator here until the stop value (CartPole-v1 "
            "to 195 by default). Ctrl-C stops everything (a second Ctrl-C at once). "
            + describe_exit_codes()
            + " An env the job cannot use is a bad config."
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
        "policy, counters, budgets and logs; a name or workdir no run used is refused, and so is, without "
        "--resume, one a run used",
    )
    parser.add_argument(
        "--progress",
        choices=["auto", "line", "log", "off"],
        help="live status line (auto: on a terminal), periodic log lines, or nothing (WARREN_PROGRESS; auto)",
    )
    add_telemetry_flags(parser, tensorboard=False)  # TensorBoard events always go to the run's directory
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from worker.coordinator.loop import Coordinator

    plan = plan_run(args)
    config, identity, job = plan.config, plan.identity, plan.job
    run_id, workdir, transport = identity.run_id, identity.workdir, config.transport
    ports = metrics_ports(config.metrics_port, plan.collectors)
    setup_logging("run", log_level(args))
    for name, why in plan.ignored.items():
        logger.warning("%s is ignored: warren run sets it itself (%s)", name, why)
    crowded = crowded_collectors(plan.collectors, cpu_budget())
    if crowded is not None:
        logger.warning("%s", crowded)
    refusal = workdir_refusal(plan)
    if refusal is not None:
        return fatal(refusal, ExitCode.USAGE)
    problem = preflight(config)
    if problem is not None:
        return fatal(problem, ExitCode.FAILED)
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
    deaths = ChildDeaths(coordinator, plan.collectors, children.logs)
    children.watch(deaths.on_exit)
    failure: str | None = None
    try:
        summary = coordinator.run()
    except WarrenError as exc:
        failure = f"run failed: {exc.message}"  # said once the run's processes are stopped
    finally:
        coordinator.progress.close()  # the terminal back to normal, however the run ended
        coordinator.telemetry.close()
        codes = children.stop()
        deaths.report_stopped(codes)
        removed = 0
        if remove_run_topology(transport, job.coordinator.buffer_id, keep_shared=identity.named):
            removed = remove_step_files(workdir / "data")
            lock.release()  # clean: the workdir shows an ended run (else an interrupted one)
        else:
            lock.unlock()
        if removed:
            logger.info("removed %d step files nobody will read", removed)
    if failure is not None:
        return fatal(failure, ExitCode.FAILED)
    summary["children_exit_codes"] = codes
    # Read again now that the learner stopped: a run that missed its stop value leaves what it wrote last,
    # and the learner's counters count its last updates.
    summary["policy_left"] = coordinator.policy_left()
    summary.update(coordinator.learner_left())
    summary["children_pids"] = {name: proc.pid for name, proc in children.procs.items()}
    summary["workdir"] = str(workdir)
    (workdir / "summary.json").write_text(json_text.dumps(summary, indent=2))
    print(json_text.dumps(summary))
    if summary["error"]:
        print(f"warren run: {summary['error']}", file=sys.stderr)
        return ExitCode.PLUGIN_FAILING if summary.get("failure") else ExitCode.FAILED
    return of_ended_run(summary["success"], stop_signal())


def fatal(message: str, code: int) -> int:
    """Say once why the run cannot go on (stderr, as ``warren run: ...``, like a refused config) and return ``code``.

    Not also as a log line: every fatal path of ``warren run`` says it this one way.
    """
    print(f"warren run: {message}", file=sys.stderr)
    return code


def preflight(config: Any) -> str | None:
    """What makes this run impossible, found before any child starts (``None``: go ahead).

    The broker is tried with a short budget (:data:`PREFLIGHT_CONNECT_S`, or the connect
    timeout if shorter), and the message says it was this check's: a refused password or
    a closed port is known in seconds, not after every child's reconnect budget
    (``WARREN_CONNECT_TIMEOUT_S``, which applies once the run is going). (A job whose env
    no collector could run is refused earlier still, when the job config is built.)
    """
    budget = min(config.transport.connect_timeout_s, PREFLIGHT_CONNECT_S)
    probe = config.transport.replace(connect_timeout_s=budget)
    try:
        BrokerLink(probe, "run-preflight", reconnect=False).open().close()
    except WarrenError as exc:
        return (
            f"no usable broker: {exc.message} (warren run's check before it starts anything gives the broker "
            f"{budget:g} s; WARREN_CONNECT_TIMEOUT_S, {config.transport.connect_timeout_s:g} s, is each process's "
            "reconnect budget once the run is going)"
        )
    return None


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
