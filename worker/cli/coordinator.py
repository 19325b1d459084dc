"""``warren coordinator``: drive the collector workers until the job's stop value."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path
from typing import Any

from messaging import WarrenError
from worker import json_text
from worker.cli.exit_codes import ExitCode, of_ended_run
from worker.cli.exit_codes import describe as describe_exit_codes
from worker.cli.flags import (
    add_job_flags,
    add_telemetry_flags,
    add_transport_flags,
    flag_values,
    job_config,
    log_level,
    non_negative_int,
)
from worker.config import CoordinatorConfig, import_env_packages_of, role_config
from worker.lifecycle import stop_signal
from worker.logs import setup_logging

logger = logging.getLogger(__name__)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "coordinator",
        help="schedule collect/eval tasks and feed the learner",
        description=(
            "Keep collect tasks running on every collector worker that listens on the task queue, "
            "evaluate every eval_interval_s, forward data metadata to the learner, and stop at the "
            "stop value, a budget or a signal. " + describe_exit_codes()
        ),
    )
    add_transport_flags(parser)
    add_job_flags(parser)
    parser.add_argument(
        "--collect-tasks",
        type=non_negative_int,
        help="collect tasks at once (coordinator.collect_tasks; WARREN_COLLECT_TASKS); 0, the default: one per "
        "collector worker",
    )
    parser.add_argument(
        "--run-log", type=Path, help="JSON-lines log of tasks and evals, for warren plot (WARREN_RUN_LOG)"
    )
    parser.add_argument(
        "--progress",
        choices=["auto", "line", "log", "off"],
        help="live status line (auto: on a terminal), periodic log lines, or nothing (WARREN_PROGRESS; auto)",
    )
    add_telemetry_flags(parser, tensorboard=True)
    parser.set_defaults(run=run)


def configure(args: argparse.Namespace) -> CoordinatorConfig:
    """The coordinator's settings: ``WARREN_*`` variables, the job, then the flags.

    Raises:
        ConfigurationError: a value does not parse or is out of range.
    """
    import_env_packages_of()  # before the job: its env id may be one they register
    job = job_config(args, extra={"coordinator.collect_tasks": args.collect_tasks})
    return role_config(CoordinatorConfig, job=job, **flag_values(args, CoordinatorConfig))


def run(args: argparse.Namespace) -> int:
    from worker.coordinator.loop import Coordinator

    config = configure(args)
    job = config.job
    setup_logging("coordinator", log_level(args))
    for warning in job.warnings():
        logger.warning("%s", warning)
    stop: threading.Event = args.stop
    coordinator = Coordinator(config, stop)
    try:
        summary = coordinator.run()
    except WarrenError as exc:
        print(f"warren coordinator: {exc.message}", file=sys.stderr)
        return ExitCode.FAILED
    finally:
        coordinator.progress.close()  # the terminal back to normal, however the run ended
        coordinator.telemetry.close()
    print(json_text.dumps(summary))
    if summary["error"]:
        print(f"warren coordinator: {summary['error']}", file=sys.stderr)
        return ExitCode.PLUGIN_FAILING if summary.get("failure") else ExitCode.FAILED
    return of_ended_run(summary["success"], stop_signal())
