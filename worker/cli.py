"""The ``warren`` command line: one subcommand per role."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from messaging import ConfigurationError
from worker import collector_cli, coordinator_cli, launcher, learner_cli, plot


def add_transport_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every role; each overrides the ``WARREN_*`` variable of the same name."""
    group = parser.add_argument_group("broker (flags override WARREN_* environment variables)")
    group.add_argument(
        "--amqp-url", help="broker URL (WARREN_AMQP_URL; default amqp://guest:guest@localhost:5672/%%2F)"
    )
    group.add_argument("--amqp-ca-file", help="CA bundle for amqps:// (WARREN_AMQP_CA_FILE)")
    group.add_argument("--prefix", help="queue-name prefix (WARREN_PREFIX; default warren)")
    group.add_argument("--heartbeat-s", type=int, help="AMQP heartbeat in seconds (WARREN_HEARTBEAT_S; default 30)")
    group.add_argument(
        "--connect-timeout-s", type=float, help="total connect retry time (WARREN_CONNECT_TIMEOUT_S; default 30)"
    )
    group.add_argument("--rpc-timeout-s", type=float, help="reply wait for tasks (WARREN_RPC_TIMEOUT_S; default 30)")
    group.add_argument(
        "--metadata-queue-length",
        type=int,
        help="ready metadata per task before the collector is held (WARREN_METADATA_QUEUE_LENGTH; default 8)",
    )
    group.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING... (default INFO)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="warren",
        description="RabbitMQ-driven workers for distributed RL data collection.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    collector_cli.add_parser(commands, add_transport_flags)
    coordinator_cli.add_parser(commands, add_transport_flags)
    learner_cli.add_parser(commands, add_transport_flags)
    launcher.add_parser(commands, add_transport_flags)
    plot.add_parser(commands, add_transport_flags)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        code: int = args.run(args)
    except ConfigurationError as exc:
        print(f"warren {args.command}: {exc.message}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
