"""``warren clean``: remove what stopped runs left on the broker and in their workdirs."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from worker.cli.cleanup import clean_ended, clean_interrupted
from worker.cli.flags import add_transport_flags, flag_values, log_level
from worker.cli.named_run import RUNS_DIR
from worker.cli.run_dir import RunState, state_of
from worker.logs import setup_logging

logger = logging.getLogger(__name__)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "clean",
        help="remove the queues and step files that stopped runs left",
        description=(
            "For every run directory given (default: each one under runs/): a run that was interrupted "
            "(its process died without cleaning up: a second Ctrl-C, a kill) has its queues and exchanges "
            "deleted from the broker, its step files removed and a summary written; a run that ended has the "
            "dead letters it kept for inspection deleted, and a named one the task queue and roster exchange it "
            "kept for joined collectors, once no collector listens on the queue (and any run the roster "
            "exchange an older warren left). Only what was removed is reported. A "
            "run that is alive is left alone, and so are queues that still have consumers. Use the broker "
            "the runs used (WARREN_AMQP_URL; each run's queue prefix is read from its run.json). Logs, run logs "
            "and policies stay. Exit code 0 when everything is clean, 1 when something was left."
        ),
    )
    parser.add_argument("workdirs", nargs="*", type=Path, help="run directories (default: runs/*)")
    add_transport_flags(parser, address_only=True)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from messaging import Settings

    setup_logging("clean", log_level(args))
    transport = Settings.from_env(None, **flag_values(args, Settings))
    workdirs: list[Path] = args.workdirs
    if not workdirs and RUNS_DIR.is_dir():
        workdirs = sorted(path for path in RUNS_DIR.iterdir() if path.is_dir())
    left = 0
    for workdir in workdirs:
        state = state_of(workdir)
        if state is RunState.RUNNING:
            logger.info("%s: the run is alive; left alone", workdir)
        elif state is RunState.INTERRUPTED:
            left += not clean_interrupted(workdir, transport, named_too=True, dead_letters_too=True)
        elif state is RunState.ENDED:
            left += not clean_ended(workdir, transport)
        else:
            logger.info("%s: no run used it", workdir)
    return 1 if left else 0
