"""Command-line flags shared by the roles: the broker's and the job's.

Each broker flag overrides the ``WARREN_*`` environment variable of the same name; the
job flags override the TOML job config.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

from worker.job import JobConfig

#: Settings fields that have a broker flag (see :func:`add_transport_flags`).
TRANSPORT_FLAGS = (
    "amqp_url",
    "amqp_ca_file",
    "prefix",
    "heartbeat_s",
    "connect_timeout_s",
    "rpc_timeout_s",
    "metadata_queue_length",
)


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


def flag_values(args: argparse.Namespace, config_type: type) -> dict[str, Any]:
    """The flags of ``args`` that name a field of ``config_type`` or of its transport settings.

    Flags left out on the command line are ``None``, so the environment or the default
    applies (see :func:`worker.config.role_config`).
    """
    names = {f.name for f in fields(config_type)} | set(TRANSPORT_FLAGS)
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("job (defaults: the shipped CartPole-v1 DQN job)")
    group.add_argument("--config", type=Path, help="TOML job config ([env], [collector], [coordinator], [learner]...)")
    group.add_argument("--env-id", help="gymnasium env id (env.id)")
    group.add_argument("--stop-value", type=float, help="eval return that ends the run (env.stop_value; 195)")
    group.add_argument("--max-env-steps", type=int, help="env step budget (coordinator.max_env_steps)")
    group.add_argument("--max-time-s", type=float, help="wall time budget (coordinator.max_time_s)")
    group.add_argument("--seed", type=int, help="seed of envs and networks (env.seed)")


def job_config(args: argparse.Namespace, **extra: object) -> JobConfig:
    """The job config from ``--config`` and the override flags."""
    overrides: dict[str, object] = {
        "env.id": args.env_id,
        "env.stop_value": args.stop_value,
        "env.seed": args.seed,
        "coordinator.max_env_steps": args.max_env_steps,
        "coordinator.max_time_s": args.max_time_s,
        **extra,
    }
    return JobConfig.load(args.config, **overrides)
