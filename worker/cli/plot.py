"""``warren plot RUN``: the learning curve of a run, as a PNG (RUN: its run.jsonl or its directory)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from messaging import ConfigurationError
from worker.cli.flags import add_output_flags, log_level
from worker.logs import setup_logging


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "plot",
        help="draw eval return and env steps/s against env steps from a run log",
        description="Read a run log (run.jsonl, written by the coordinator) and write a PNG. Needs warren[plot].",
    )
    parser.add_argument("run_log", type=Path, help="run.jsonl of a run, or the run's directory (runs/<id>)")
    parser.add_argument("-o", "--output", type=Path, help="PNG to write (default: run.png next to the run log)")
    add_output_flags(parser)
    parser.set_defaults(run=run)


#: The run log's name in a run directory (``warren run`` writes it there).
RUN_LOG_NAME = "run.jsonl"


def run_log_path(path: Path) -> Path:
    """The run log named by ``path``: the file itself, or the ``run.jsonl`` in a run directory.

    Raises:
        ConfigurationError: ``path`` is a directory without a run log.
    """
    if not path.is_dir():
        return path
    if not (path / RUN_LOG_NAME).is_file():
        raise ConfigurationError(f"{path} is a directory without a {RUN_LOG_NAME} (not a run directory?)")
    return path / RUN_LOG_NAME


def read_run_log(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The eval records and the summary (if the run finished) of a run log.

    Raises:
        ConfigurationError: the file cannot be read or holds no eval record.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc}") from None
    evals: list[dict[str, Any]] = []
    summary = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigurationError(f"{path}:{number} is not JSON") from None
        if record.get("kind") == "eval":
            evals.append(record)
        elif record.get("kind") == "summary":
            summary = record
    if not evals:
        raise ConfigurationError(f"{path} has no eval records yet")
    return evals, summary


def plot(path: Path, output: Path) -> Path:
    """Write the two-panel learning curve of the run log at ``path`` to ``output``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigurationError("warren plot needs matplotlib: pip install 'warren[plot]'") from None
    evals, summary = read_run_log(path)
    steps = [int(r["env_steps"]) for r in evals]
    returns = [float(r["reward_mean"]) for r in evals]
    rates = [float(r.get("steps_per_s", 0.0)) for r in evals]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    top.plot(steps, returns, marker="o")
    top.set_ylabel("eval return (mean)")
    if summary is not None:
        if math.isfinite(float(summary["stop_value"])):  # inf: a run meant to end on a budget
            top.axhline(float(summary["stop_value"]), color="grey", linestyle="--", label="stop value")
            top.legend(loc="lower right")
        title = f"{path.parent.name}: {'reached' if summary['success'] else 'did not reach'} stop value"
        top.set_title(f"{title} in {summary['wall_time_s']:.0f} s")
    bottom.plot(steps, rates, marker=".", color="tab:green")
    bottom.set_ylabel("env steps / s")
    bottom.set_xlabel("env steps")
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return output


def run(args: argparse.Namespace) -> int:
    setup_logging("plot", log_level(args))
    run_log = run_log_path(args.run_log)
    output = args.output or run_log.with_suffix(".png")
    print(plot(run_log, output))
    return 0
