"""``warren learner``: train the job's DQN from the collected step data."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

from messaging import WarrenError
from worker.flags import add_job_flags, add_transport_flags, job_config, transport_settings
from worker.logs import setup_logging


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "learner",
        help="train a DQN from the step data and write policy files",
        description=(
            "Consume data metadata from <prefix>.learner.<buffer_id>, read the step files from "
            "--path-data into a replay buffer, train, and write {model, iter} to --path-policy."
        ),
    )
    add_transport_flags(parser)
    add_job_flags(parser)
    parser.add_argument("--path-data", type=Path, help="step data directory (WARREN_PATH_DATA; ./data)")
    parser.add_argument("--path-policy", type=Path, help="policy directory (WARREN_PATH_POLICY; ./policy)")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import os

    from worker.learner.service import Learner, LearnerConfig

    config = LearnerConfig(
        transport=transport_settings(args),
        run=job_config(args),
        path_data=args.path_data or Path(os.environ.get("WARREN_PATH_DATA", "./data")),
        path_policy=args.path_policy or Path(os.environ.get("WARREN_PATH_POLICY", "./policy")),
        torch_threads=args.torch_threads,
    )
    setup_logging("learner", args.log_level)
    stop: threading.Event = args.stop
    try:
        Learner(config, stop).run()
    except WarrenError as exc:
        print(f"warren learner: {exc.message}")
        return 1
    return 0
