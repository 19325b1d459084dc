"""``warren learner``: train the job's algorithm on the collected step data."""

from __future__ import annotations

import argparse
import logging
import threading
from pathlib import Path
from typing import Any

from messaging import WarrenError
from worker.cli.exit_codes import ExitCode
from worker.cli.flags import (
    add_job_flags,
    add_telemetry_flags,
    add_transport_flags,
    flag_values,
    job_config,
    log_level,
)
from worker.config import LearnerConfig, import_env_packages_of, role_config
from worker.errors import PluginFailed
from worker.logs import setup_logging

logger = logging.getLogger(__name__)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "learner",
        help="train the job's algorithm on the step data and write policy files",
        description=(
            "Consume data metadata from <prefix>.learner.<buffer_id>, read the step files from "
            "--path-data, train the job's algorithm, and write its weights (safetensors) to --path-policy."
        ),
    )
    add_transport_flags(parser)
    add_job_flags(parser, run_end=False)  # the coordinator decides when the run ends
    parser.add_argument("--path-data", type=Path, help="step data directory (WARREN_PATH_DATA; ./data)")
    parser.add_argument("--path-policy", type=Path, help="policy directory (WARREN_PATH_POLICY; ./policy)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        help="torch intra-op threads (WARREN_TORCH_THREADS; default: the job's learner.torch_threads, else 1)",
    )
    parser.add_argument(
        "--device",
        help="where to train: auto, cpu, cuda, cuda:N (WARREN_DEVICE; default: the job's learner.device, auto)",
    )
    add_telemetry_flags(parser, tensorboard=True)
    parser.set_defaults(run=run)


def configure(args: argparse.Namespace) -> LearnerConfig:
    """The learner's settings: ``WARREN_*`` variables, the job, then the flags.

    Raises:
        ConfigurationError: a value does not parse or is out of range.
    """
    import_env_packages_of()  # before the job: its env id may be one they register
    return role_config(LearnerConfig, job=job_config(args), **flag_values(args, LearnerConfig))


def run(args: argparse.Namespace) -> int:
    from worker.learner.service import Learner

    config = configure(args)
    setup_logging("learner", log_level(args))
    stop: threading.Event = args.stop
    learner = None
    try:
        learner = Learner(config, stop)
        learner.run()
    except PluginFailed as exc:
        # One line naming the plug-in: ``warren run`` shows it and gives up on the run (exit code 4).
        logger.critical("learner stops: %s", exc.message)
        return ExitCode.PLUGIN_FAILING
    except WarrenError as exc:
        logger.critical("learner stops: %s", exc.message)
        return ExitCode.FAILED
    finally:
        if learner is not None:
            learner.telemetry.close()  # also when the run failed: the last TensorBoard point, the port freed
    return 0
