"""The ``warren`` command line: one subcommand per role."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import threading
from collections.abc import Sequence

from worker.lifecycle import install_stop_handlers, single_threaded_math


def _version() -> str:
    try:
        return importlib.metadata.version("warren")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    from worker.cli import check, clean, collector, coordinator, learner, plot, run
    from worker.cli import eval as eval_command
    from worker.cli import export as export_command

    parser = argparse.ArgumentParser(
        prog="warren",
        description="RabbitMQ-driven workers for distributed RL data collection.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for role in (collector, coordinator, learner, run, check, plot, clean, eval_command, export_command):
        role.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Signal handlers come first, before the heavy imports (torch, gymnasium): a SIGTERM
    # that arrives while a process is still starting must stop it cleanly too.
    stop = threading.Event()
    install_stop_handlers(stop)
    single_threaded_math()
    from messaging import ConfigurationError
    from worker.cli.flags import read_environment

    parser = build_parser()
    args = parser.parse_args(argv)
    args.stop = stop
    if args.command is None:
        parser.print_help()
        return 2
    try:
        read_environment(args)
        code: int = args.run(args)
    except ConfigurationError as exc:
        print(f"warren {args.command}: {exc.message}", file=sys.stderr)
        return 2
    return code
