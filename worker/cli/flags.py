"""Command-line flags shared by the roles: the broker's and the job's.

Each flag overrides the ``WARREN_*`` environment variable of the same name (the broker's
through :func:`messaging.settings.load`, the job's through :func:`read_environment`), and
the job's flags and variables override the TOML job config. Counts and budgets are checked here, so a bad
value stops at argument parsing with argparse's usage message, before anything starts.
"""

from __future__ import annotations

import argparse
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from messaging import ConfigurationError
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
    "queue_type",
)


def add_transport_flags(parser: argparse.ArgumentParser, *, address_only: bool = False) -> None:
    """Flags shared by every role; each overrides the ``WARREN_*`` variable of the same name.

    ``address_only``: only which broker and how to trust it (``--amqp-url``,
    ``--amqp-ca-file``), for a command that reads the rest from elsewhere (``warren clean``
    takes each run's prefix from its ``run.json`` and connects with a budget of its own).
    """
    group = parser.add_argument_group("broker (flags override WARREN_* environment variables)")
    group.add_argument(
        "--amqp-url",
        help="broker URL, or comma-separated URLs of a cluster's nodes, tried in turn "
        "(WARREN_AMQP_URL; default amqp://guest:guest@localhost:5672/%%2F)",
    )
    group.add_argument("--amqp-ca-file", help="CA bundle for amqps:// (WARREN_AMQP_CA_FILE)")
    if address_only:
        add_output_flags(parser, broker=True)
        return
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
    group.add_argument(
        "--queue-type",
        choices=["classic", "quorum"],
        help="how the durable queues are declared; quorum: replicated, survives a node loss "
        "(WARREN_QUEUE_TYPE; default classic; the same in every process of a deployment)",
    )
    add_output_flags(parser, broker=True)


def add_output_flags(parser: argparse.ArgumentParser, *, broker: bool = False) -> None:
    """``--log-level`` and ``--verbose``, which every command takes (``broker``: one that talks to the broker,
    whose ``--verbose`` shows pika's messages too)."""
    output = parser.add_argument_group("output")
    output.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="(default INFO)",
    )
    output.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log at DEBUG, with pika's own messages and tracebacks" if broker else "log at DEBUG",
    )


def log_level(args: argparse.Namespace) -> str:
    """The level the role logs at: DEBUG with ``--verbose``, else ``--log-level``."""
    return "DEBUG" if args.verbose else str(args.log_level)


def _checked(convert: Callable[[str], Any], ok: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    """An argparse type: ``convert``, then refuse values that are not ``ok`` (argparse names the flag)."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    return parse


positive_int = _checked(int, lambda v: v >= 1, "at least 1")
port = _checked(int, lambda v: 0 <= v <= 65535, "a port, 0 to 65535")
non_negative_int = _checked(int, lambda v: v >= 0, "0 or more")
positive_float = _checked(float, lambda v: v > 0, "more than 0")
#: No return compares >= nan, so a nan stop value could never end a run; inf says so on purpose.
stop_value = _checked(float, lambda v: not math.isnan(v), "a number (inf: run until a budget ends it)")


#: Flags a ``WARREN_<FLAG>`` variable sets when the command line leaves them out, with the
#: flag's own check: the job's flags and ``warren run``'s ``--collectors`` (the broker's and
#: the roles' settings are read by :func:`messaging.settings.load`). A command reads those of
#: its flags only, so ``WARREN_MAX_TIME_S`` reaches the coordinator and ``warren run``.
ENV_FLAGS: dict[str, Callable[[str], Any]] = {
    "env_id": str,
    "algorithm": str,
    "seed": int,
    "stop_value": stop_value,
    "max_env_steps": positive_int,
    "max_time_s": positive_float,
    "collect_tasks": non_negative_int,
    "collectors": positive_int,
}


def env_variable(flag: str) -> str:
    """The variable of the flag ``flag`` (its argparse dest): ``max_time_s`` -> ``WARREN_MAX_TIME_S``."""
    return "WARREN_" + flag.upper()


def read_environment(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> None:
    """Fill the :data:`ENV_FLAGS` flags left out on the command line from their variables.

    Raises:
        ConfigurationError: a variable's value is one the flag would refuse.
    """
    env = os.environ if env is None else env
    for flag, convert in ENV_FLAGS.items():
        raw = env.get(env_variable(flag))
        if not hasattr(args, flag) or getattr(args, flag) is not None or not raw:
            continue
        try:
            setattr(args, flag, convert(raw))
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ConfigurationError(f"{env_variable(flag)}={raw!r}: {exc}") from None


def add_telemetry_flags(parser: argparse.ArgumentParser, *, tensorboard: bool) -> None:
    """``--metrics-port`` and ``--metrics-addr`` (every role), ``--tensorboard-dir`` (``tensorboard``)."""
    group = parser.add_argument_group("metrics and TensorBoard (flags override WARREN_* environment variables)")
    group.add_argument(
        "--metrics-port",
        type=port,
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (WARREN_METRICS_PORT; default 0: none)",
    )
    group.add_argument(
        "--metrics-addr",
        help="address /metrics listens on (WARREN_METRICS_ADDR; default 127.0.0.1; 0.0.0.0: every interface)",
    )
    if tensorboard:
        group.add_argument(
            "--tensorboard-dir",
            type=Path,
            help="write TensorBoard event files under DIR/<role> (WARREN_TENSORBOARD_DIR; default: none)",
        )


def flag_values(args: argparse.Namespace, config_type: type) -> dict[str, Any]:
    """The flags of ``args`` that name a field of ``config_type`` or of its transport settings.

    Flags left out on the command line are ``None``, so the environment or the default
    applies (see :func:`worker.config.role_config`).
    """
    names = {f.name for f in fields(config_type)} | set(TRANSPORT_FLAGS)
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


def add_job_flags(parser: argparse.ArgumentParser, *, run_end: bool = True) -> None:
    """The job flags: what to train, and (``run_end``) when the run ends.

    Only the coordinator decides when a run ends, so only it and ``warren run`` take the
    stop value and the budgets; the learner reads the same job for its env and seed.
    """
    group = parser.add_argument_group(
        "job (defaults: the shipped CartPole-v1 DQN job; flags override WARREN_* variables)"
    )
    group.add_argument(
        "--config", type=Path, help="job config: TOML ([env], [algorithm], [model], [collector]...) or a run's job.json"
    )
    group.add_argument("--env-id", help="gymnasium env id, or an env plug-in's (env.id; WARREN_ENV_ID)")
    group.add_argument(
        "--algorithm",
        help="algorithm plug-in: dqn, ppo, sac, random, or an installed one (algorithm.name; WARREN_ALGORITHM)",
    )
    group.add_argument("--seed", type=int, help="seed of envs and networks (env.seed; WARREN_SEED)")
    group.add_argument(
        "--set",
        dest="job_settings",
        action="append",
        type=job_setting,
        metavar="SECTION.KEY=VALUE",
        help="any setting of the job file (algorithm.lr=3e-4, model.hidden_sizes=[64,64], env.id=Pendulum-v1), "
        "checked like the file's; VALUE is a TOML value, else a string; repeatable (the last of a key wins); "
        "applied over --config, and refused where a job flag here (--seed...) or its variable gives the same key "
        "another value",
    )
    if run_end:
        group.add_argument(
            "--stop-value",
            type=stop_value,
            help="eval return that ends the run (env.stop_value; WARREN_STOP_VALUE; default: 195 for CartPole-v1, "
            "else the env's reward_threshold; inf: run until a budget ends it)",
        )
        group.add_argument(
            "--max-env-steps",
            type=positive_int,
            help="env step budget (coordinator.max_env_steps; WARREN_MAX_ENV_STEPS; 2000000)",
        )
        group.add_argument(
            "--max-time-s",
            type=positive_float,
            help="wall time budget in seconds (coordinator.max_time_s; WARREN_MAX_TIME_S; 1800)",
        )


def toml_value(text: str) -> Any:
    """``text`` read as a TOML value (``3e-4``, ``true``, ``[64, 64]``, ``"a b"``, ``inf``), else the text itself.

    So ``--set`` gives a job the values a job file would hold, typed the same way; a bare
    word (``Pendulum-v1``, ``ppo``) is a string without shell-proof quotes.
    """
    if "\n" in text:
        return text  # one value, never more keys smuggled in after it
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def job_setting(text: str) -> tuple[str, Any]:
    """argparse type of ``--set``: ``SECTION.KEY=VALUE`` as ``("section.key", value)``."""
    key, equals, value = text.partition("=")
    section, dot, name = key.strip().partition(".")
    if not equals or not dot or not section or not name or "." in name:
        raise argparse.ArgumentTypeError(
            f"must be SECTION.KEY=VALUE, one key of one section of the job file (algorithm.lr=3e-4), got {text!r}"
        )
    return f"{section}.{name}", toml_value(value.strip())


#: The job keys the named flags set, and the flag (its argparse dest) of each.
JOB_FLAGS = {
    "env.id": "env_id",
    "env.seed": "seed",
    "algorithm.name": "algorithm",
    "env.stop_value": "stop_value",
    "coordinator.max_env_steps": "max_env_steps",
    "coordinator.max_time_s": "max_time_s",
}


def job_config(
    args: argparse.Namespace, *, config_file: Path | None = None, extra: Mapping[str, object] | None = None
) -> JobConfig:
    """The job config from ``--config`` (or ``config_file``), ``--set``, and the override flags the role has.

    ``--set`` values go over the file's; a named flag (or its ``WARREN_*`` variable) or a
    value of the command's own (``extra``) that gives one of their keys another value is a
    conflict, refused: which should win is the user's call, not a precedence rule to know.

    Raises:
        ConfigurationError: a conflict, or a job the file and the overrides make that cannot run.
    """
    overrides: dict[str, object] = {key: getattr(args, name, None) for key, name in JOB_FLAGS.items()}
    overrides.update({key: value for key, value in (extra or {}).items() if value is not None})
    settings: dict[str, Any] = dict(getattr(args, "job_settings", None) or ())
    for key, value in settings.items():
        given = overrides.get(key)
        if given is not None and given != value:
            flag = JOB_FLAGS.get(key)
            source = (
                f"--{flag.replace('_', '-')} (or {env_variable(flag)})" if flag is not None else "the command itself"
            )
            raise ConfigurationError(
                f"--set {key}={value!r} conflicts with {key} = {given!r} from {source}: give {key} once"
            )
    merged = {**settings, **{key: value for key, value in overrides.items() if value is not None}}
    return JobConfig.load(config_file if config_file is not None else args.config, **merged)
