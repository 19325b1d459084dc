"""``warren plot RUN``: the learning curve of a run, as a PNG (RUN: its run.jsonl or its directory).

The curve is the run's eval returns. A run with no eval finished yet (a long eval interval,
a short try) is drawn from its training episodes instead: the mean return of the episodes
each collect task finished (exploring, so below what the greedy policy gets), which the
run log holds as it holds the evals; the title says which it is.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from messaging import ConfigurationError
from worker.cli.flags import add_output_flags, log_level
from worker.logs import setup_logging


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "plot",
        help="draw eval return and env steps/s against env steps from a run log",
        description=(
            "Read a run log (run.jsonl, written by the coordinator) and write a PNG: the eval returns, or, before "
            "any eval finished, the training episode returns. Needs warren[plot]."
        ),
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


@dataclass(frozen=True)
class RunCurves:
    """What a run log holds to draw: its evals, its training episodes, its rate, its summary."""

    evals: list[dict[str, Any]]
    training: list[dict[str, Any]]
    """Collect tasks that finished episodes: ``reward_mean`` is their episodes' mean return (exploring)."""
    checkpoints: list[dict[str, Any]]
    summary: dict[str, Any] | None


def read_run_log(path: Path) -> RunCurves:
    """The eval and training records, checkpoints and the summary (if the run finished) of a run log.

    Raises:
        ConfigurationError: the file cannot be read, or holds neither an eval nor a training episode.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc}") from None
    evals: list[dict[str, Any]] = []
    training: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    summary = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigurationError(f"{path}:{number} is not JSON") from None
        kind = record.get("kind")
        if kind == "eval":
            evals.append(record)
        elif kind == "task" and record.get("real_episode_count") and not record.get("eval_flag"):
            training.append(record)
        elif kind == "checkpoint":
            checkpoints.append(record)
        elif kind == "summary":
            summary = record
    if not evals and not training:
        raise ConfigurationError(f"{path} has no eval records and no finished training episode yet")
    return RunCurves(evals, training, checkpoints, summary)


def _rates(checkpoints: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Env steps/s between consecutive checkpoints, at the later one's env steps."""
    steps, rates = [], []
    for before, after in itertools.pairwise(checkpoints):
        seconds = float(after.get("elapsed_s", 0.0)) - float(before.get("elapsed_s", 0.0))
        if seconds > 0:
            steps.append(int(after["env_steps"]))
            rates.append((int(after["env_steps"]) - int(before["env_steps"])) / seconds)
    return steps, rates


def plot(path: Path, output: Path) -> Path:
    """Write the two-panel learning curve of the run log at ``path`` to ``output``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigurationError("warren plot needs matplotlib: pip install 'warren[plot]'") from None
    curves = read_run_log(path)
    summary = curves.summary
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    if curves.evals:
        steps = [int(r["env_steps"]) for r in curves.evals]
        top.plot(steps, [float(r["reward_mean"]) for r in curves.evals], marker="o", label="eval return")
        top.set_ylabel("eval return (mean)")
        rate_steps, rates = steps, [float(r.get("steps_per_s", 0.0)) for r in curves.evals]
        said = ""
    else:
        # No eval finished (yet): the episodes the collectors finished while training show the trend.
        steps = [int(r["env_steps"]) for r in curves.training]
        returns = [float(r["reward_mean"]) for r in curves.training]
        episodes = sum(int(r["real_episode_count"]) for r in curves.training)
        top.plot(steps, returns, marker=".", linestyle="-", alpha=0.7, label="training episode return (exploring)")
        top.set_ylabel("training episode return (mean per task)")
        rate_steps, rates = _rates(curves.checkpoints)
        said = f" (no eval finished: {episodes} training episodes)"
    if summary is not None and math.isfinite(float(summary["stop_value"])):  # inf: a run meant to end on a budget
        top.axhline(float(summary["stop_value"]), color="grey", linestyle="--", label="stop value")
    top.legend(loc="lower right")
    if summary is not None:
        title = f"{path.parent.name}: {'reached' if summary['success'] else 'did not reach'} stop value"
        top.set_title(f"{title} in {summary['wall_time_s']:.0f} s{said}")
    else:
        top.set_title(f"{path.parent.name}: running{said}")
    bottom.plot(rate_steps, rates, marker=".", color="tab:green")
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
