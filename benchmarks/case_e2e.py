"""End to end: ``warren run --collectors 2`` trains CartPole-v1 to an eval return of 195.

The whole job as a user runs it (coordinator in the ``warren run`` process, 2 collector
processes, the learner process), from the command to its JSON summary, once per seed.
Reported per seed: the time from the first collected data to the end of the run at 195
(an eval there and its confirmation; start-up excluded: importing torch and building envs),
the whole command's time, env
steps/s while collecting, the replay ratio the learner achieved (the summary's: the
learner's own train steps over the samples it learned from) against the configured one,
and the peak PSS of
the whole process tree. No baseline runs here; the reference is DI-engine's parallel
mode on the same kind of machine (about 50 env steps/s with 2 collectors on 2 cores).
Skipped with ``--quick``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import procs
from benchmarks.common import CaseContext, CaseResult
from benchmarks.stats import Row, Series

NAME = "e2e"
TITLE = "end to end"
REFERENCE_STEPS_S = 50.0
#: Safety cap per run; the shipped job reaches 195 in well under a minute here.
MAX_TIME_S = 240
SEEDS = (0, 1, 2, 3, 4)


def _tree(root: int) -> list[int]:
    """``root`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _pss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        match = re.search(r"^Pss:\s+(\d+) kB", text, re.MULTILINE)
        total += int(match.group(1)) if match else 0
    return total


class _PeakPss:
    """Samples the PSS of a process tree every 0.5 s while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.peak_kib = max(self.peak_kib, _pss_kib(_tree(self.pid)))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(2.0)
        return self.peak_kib


def run_job(ctx: CaseContext, prefix: str, seed: int) -> dict[str, Any]:
    """One ``warren run``; returns its summary plus the command's time and peak PSS."""
    with ctx.scratch("e2e") as workdir:
        argv = procs.python_module(
            "worker.cli", "run", "--collectors", "2", "--prefix", prefix, "--workdir", str(workdir / "run"),
            "--progress", "off", "--log-level", "INFO", "--max-time-s", str(MAX_TIME_S), "--seed", str(seed),
        )  # fmt: skip
        env = {"WARREN_AMQP_URL": ctx.broker.amqp_url, "PYTHONUNBUFFERED": "1"}
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        pss = _PeakPss(proc.pid)
        try:
            stdout, stderr = proc.communicate(timeout=MAX_TIME_S + 90)
        finally:
            peak_kib = pss.stop()
        command_s = time.monotonic() - started
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise RuntimeError(f"warren run printed no summary (exit {proc.returncode}): {stderr[-2000:]}")
        summary: dict[str, Any] = json.loads(lines[-1])
        summary.update(
            seed=seed,
            command_s=command_s,
            exit_code=proc.returncode,
            peak_pss_mib=peak_kib / 1024,
        )
    return summary


def run(ctx: CaseContext) -> CaseResult:
    if ctx.quick:
        ctx.log("skipped with --quick")
        return CaseResult([], {"skipped": "--quick"})
    summaries = []
    for seed in SEEDS:
        summary = run_job(ctx, ctx.broker.sub_prefix("e2e"), seed)
        ctx.log(
            f"seed {seed}: success={summary['success']} env_steps={summary['env_steps']} "
            f"collection_s={summary['collection_s']} command_s={summary['command_s']:.1f} "
            f"learner steps={summary['learner_train_steps']} pss={summary['peak_pss_mib']:.0f} MiB"
        )
        summaries.append(summary)
    ok = [s for s in summaries if s["success"]]
    ratios = [s["replay_ratio"] / s["replay_ratio_configured"] for s in ok if s["replay_ratio"] is not None]
    rows = [
        Row(TITLE, "time to eval 195, from first data", "s", "lower", Series.of(s["collection_s"] for s in ok),
            reference="target: median <= 10 s, every seed"),
        Row(TITLE, "whole command, start to exit", "s", "lower", Series.of(s["command_s"] for s in ok)),
        Row(TITLE, "env steps to eval 195", "env steps", "lower", Series.of(s["env_steps"] for s in ok)),
        Row(TITLE, "env steps/s while collecting", "env steps/s", "higher",
            Series.of(s["env_steps"] / s["collection_s"] for s in ok if s["collection_s"]),
            reference=f"target >= 7,000; DI-engine parallel ~{REFERENCE_STEPS_S:.0f} env steps/s"),
        Row(TITLE, "replay ratio achieved / configured", "x", "higher", Series.of(ratios),
            reference="learner's train steps / samples it learned from; target within 10%"),
        Row(TITLE, "peak PSS, whole job", "MiB", "lower", Series.of(s["peak_pss_mib"] for s in summaries),
            reference="target <= 600 MB"),
    ]  # fmt: skip
    return CaseResult(rows, {"summaries": summaries, "successes": len(ok), "runs": len(summaries)})
