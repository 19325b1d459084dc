"""Flags shared by the job's roles (coordinator, learner, run): the job config and its overrides."""

from __future__ import annotations

import argparse
from pathlib import Path

from worker.run_config import RunConfig


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("job (defaults: the shipped CartPole-v1 DQN job)")
    group.add_argument("--config", type=Path, help="TOML job config ([env], [collector], [coordinator], [learner]...)")
    group.add_argument("--env-id", help="gymnasium env id (env.id)")
    group.add_argument("--stop-value", type=float, help="eval return that ends the run (env.stop_value; 195)")
    group.add_argument("--max-env-steps", type=int, help="env step budget (coordinator.max_env_steps)")
    group.add_argument("--max-time-s", type=float, help="wall time budget (coordinator.max_time_s)")
    group.add_argument("--seed", type=int, help="seed of envs and networks (env.seed)")


def job_config(args: argparse.Namespace, **extra: object) -> RunConfig:
    """The job config from ``--config`` and the override flags."""
    overrides: dict[str, object] = {
        "env.id": args.env_id,
        "env.stop_value": args.stop_value,
        "env.seed": args.seed,
        "coordinator.max_env_steps": args.max_env_steps,
        "coordinator.max_time_s": args.max_time_s,
        **extra,
    }
    return RunConfig.load(args.config, **overrides)
