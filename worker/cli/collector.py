"""``warren collector``: start a collector worker process."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

from worker.cli.flags import add_telemetry_flags, add_transport_flags, flag_values, log_level
from worker.config import CollectorConfig, role_config
from worker.logs import setup_logging


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "collector",
        help="run a collector worker",
        description=(
            "Serve collector tasks from <prefix>.collector.tasks: run gymnasium envs with the task's "
            "policy, write step data to --path-data and stream metadata through RabbitMQ. Start more "
            "processes to scale out. SIGTERM/Ctrl-C stops cleanly; a second one exits at once."
        ),
    )
    add_transport_flags(parser)
    group = parser.add_argument_group("collector (flags override WARREN_* environment variables)")
    group.add_argument("--worker-id", help="id naming the control queue (WARREN_WORKER_ID; default host-pid-random)")
    group.add_argument("--path-data", type=Path, help="step data directory on the shared volume (WARREN_PATH_DATA)")
    group.add_argument("--path-policy", type=Path, help="policy directory on the shared volume (WARREN_PATH_POLICY)")
    group.add_argument(
        "--data-wait-s", type=float, help="max wait of a collector_data_task for metadata (WARREN_DATA_WAIT_S; 10)"
    )
    group.add_argument(
        "--policy-wait-s", type=float, help="max wait for the first policy file (WARREN_POLICY_WAIT_S; 60)"
    )
    group.add_argument(
        "--close-wait-s", type=float, help="close a finished, unclosed task after this (WARREN_CLOSE_WAIT_S; 60)"
    )
    group.add_argument(
        "--stall-timeout-s",
        type=float,
        help="abandon a task whose metadata nobody reads for this long (WARREN_STALL_TIMEOUT_S; 300)",
    )
    group.add_argument(
        "--stop-grace-s", type=float, help="time given to running work on SIGTERM (WARREN_STOP_GRACE_S; 20)"
    )
    group.add_argument(
        "--env-threads",
        type=int,
        help="threads of a native vector env such as ale-py's (WARREN_ENV_THREADS; 0: this process's CPUs)",
    )
    group.add_argument(
        "--fsync", action="store_true", default=None, help="fsync step files before publishing (WARREN_FSYNC)"
    )
    add_telemetry_flags(parser, tensorboard=False)
    parser.set_defaults(run=run)


def configure(args: argparse.Namespace) -> CollectorConfig:
    """The collector's settings: ``WARREN_*`` variables, then the flags.

    Raises:
        ConfigurationError: a value does not parse or is out of range.
    """
    return role_config(CollectorConfig, **flag_values(args, CollectorConfig))


def run(args: argparse.Namespace) -> int:
    config = configure(args)
    setup_logging(f"collector {config.worker_id}", log_level(args))
    stop: threading.Event = args.stop
    from worker.collector.service import run_collector  # torch and gymnasium load only when serving

    return run_collector(config, stop)
