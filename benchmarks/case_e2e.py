"""End to end: ``warren run --collectors 2`` trains CartPole-v1 to an eval return of 195.

The whole job as a user runs it (coordinator in the ``warren run`` process, 2 collector
processes, the learner process), from the command to its JSON summary. No baseline runs
here; the reference is DI-engine's parallel mode on the same kind of machine (about 50
env steps/s with 2 collectors on 2 cores). Skipped with ``--quick``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from benchmarks import procs
from benchmarks.common import CaseContext, CaseResult
from benchmarks.stats import Row, Series

NAME = "e2e"
TITLE = "end to end"
REFERENCE_STEPS_S = 50.0
#: Safety cap per run; the shipped job reaches 195 in well under a minute here.
MAX_TIME_S = 240


def run_job(ctx: CaseContext, prefix: str) -> dict[str, Any]:
    """One ``warren run``; returns its summary plus the wall time of the whole command."""
    with ctx.scratch("e2e") as workdir:
        argv = procs.python_module(
            "worker.cli",
            "run",
            "--collectors",
            "2",
            "--prefix",
            prefix,
            "--workdir",
            str(workdir / "run"),
            "--progress",
            "off",
            "--log-level",
            "WARNING",
            "--max-time-s",
            str(MAX_TIME_S),
        )
        env = {"WARREN_AMQP_URL": ctx.broker.amqp_url, "PYTHONUNBUFFERED": "1"}
        started = time.monotonic()
        done = subprocess.run(
            argv,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=MAX_TIME_S + 90,
            check=False,
        )
        command_s = time.monotonic() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"warren run printed no summary (exit {done.returncode}): {done.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(lines[-1])
    summary["command_s"] = command_s
    summary["exit_code"] = done.returncode
    return summary


def run(ctx: CaseContext) -> CaseResult:
    if ctx.quick:
        ctx.log("skipped with --quick")
        return CaseResult([], {"skipped": "--quick"})
    repeats = min(2, ctx.repeats)
    summaries = []
    for i in range(repeats):
        summary = run_job(ctx, ctx.broker.sub_prefix("e2e"))
        ctx.log(
            f"run {i + 1}/{repeats}: success={summary['success']} env_steps={summary['env_steps']} "
            f"wall_time_s={summary['wall_time_s']} command_s={summary['command_s']:.1f}"
        )
        summaries.append(summary)
    ok = [s for s in summaries if s["success"]]
    rows = [
        Row(TITLE, "time to eval 195 (coordinator)", "s", "lower", Series.of(s["wall_time_s"] for s in ok)),
        Row(TITLE, "whole command, start to exit", "s", "lower", Series.of(s["command_s"] for s in ok)),
        Row(TITLE, "env steps to eval 195", "env steps", "lower", Series.of(s["env_steps"] for s in ok)),
        Row(
            TITLE,
            "env steps/s, 2 collectors",
            "env steps/s",
            "higher",
            Series.of(s["env_steps"] / s["wall_time_s"] for s in ok),
            reference=f"DI-engine parallel ~{REFERENCE_STEPS_S:.0f} env steps/s",
        ),
    ]
    return CaseResult(rows, {"summaries": summaries, "successes": len(ok), "runs": len(summaries)})
