"""Pixel collection: warren's two collectors on Pong against the bare vector-env loop, side by side.

Each repeat runs, one after the other (order rotating), on the same machine:

* ``bare``: two :mod:`benchmarks.pixel_worker` processes in ``bare`` mode: ale-py's vector
  env (8 envs, the same threads), the shipped Pong job's PPO actor (Nature CNN forward
  pass and sampling), stacks copied into a preallocated buffer, nothing written;
* ``null``: two processes running warren's Rollout with a sink that drops chunks;
* ``warren`` (``lz4``: its files lz4-compressed): two processes running the Rollout with
  the real sink (a step file per chunk on the local volume, its metadata through the
  broker), and a reader process that does what the learner does with them: read each
  file, check it and rebuild its stacks, delete it.

Reported: env steps/s of both collectors together (``warren`` over ``bare``, target
>= 0.9), bytes on disk per env step (target <= 7.5 KB; stacked would be 28.2 KB), and
where the collectors' CPU went (inside the sink: encoding and writing files, publishing;
the reader's CPU per env step is that of the learner's side).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import procs
from benchmarks.common import CaseContext, CaseResult, Measure, alternate
from benchmarks.stats import Row, Series

NAME = "pixels"
TITLE = "pixel collection (Pong)"
COLLECTORS = 2
ENVS = 8
THREADS = 1
STACKED_BYTES = 4 * 84 * 84


def _start(mode: str, *args: str) -> subprocess.Popen[str]:
    argv = procs.python_module("benchmarks.pixel_worker", "--mode", mode, *args)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"}
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _result(proc: subprocess.Popen[str], timeout_s: float = 600) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout_s)
    lines = [line for line in out.splitlines() if line.startswith("{") and "ready" not in line]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"pixel worker failed ({proc.returncode}): {err[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


class _Pixels:
    def __init__(self, ctx: CaseContext, workdir: Path, steps: int) -> None:
        self.ctx, self.workdir, self.steps = ctx, workdir, steps
        self.settings = ctx.broker.settings(ctx.broker.sub_prefix("pixels"))

    def _collectors(self, mode: str, extra: list[str]) -> list[dict[str, Any]]:
        started = [
            _start(mode, "--steps", str(self.steps), "--envs", str(ENVS), "--threads", str(THREADS),
                   "--seed", str(i), *extra)
            for i in range(COLLECTORS)
        ]  # fmt: skip
        # Every collector set up and reset before any timed loop starts.
        for proc in started:
            assert proc.stdout is not None and proc.stdin is not None
            if "ready" not in proc.stdout.readline():
                raise RuntimeError(f"a {mode} collector did not start: {proc.communicate()[1][-2000:]}")
        for proc in started:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        return [_result(p) for p in started]

    @staticmethod
    def _summary(results: list[dict[str, Any]]) -> dict[str, float]:
        steps = sum(r["steps"] for r in results)
        wall = max(r["wall_s"] for r in results)
        cpu = sum(r["cpu_s"] for r in results)
        return {
            "steps_s": steps / wall,
            "cpu_us_per_step": 1e6 * cpu / steps,
            "sink_share": sum(r["sink_cpu_s"] for r in results) / cpu,
            "other_threads_share": sum(r["cpu_s"] - r["main_cpu_s"] for r in results) / cpu,
            "bytes_per_step": sum(r["bytes"] for r in results) / steps,
        }

    def bare(self) -> dict[str, float]:
        return self._summary(self._collectors("bare", []))

    def null(self) -> dict[str, float]:
        return self._summary(self._collectors("null", []))

    def warren(self, compression: str = "none") -> dict[str, float]:
        queue = f"pixels-{uuid.uuid4().hex[:8]}"
        data = self.workdir / queue
        data.mkdir()
        common = ["--url", self.settings.amqp_url, "--prefix", self.settings.prefix, "--queue", queue,
                  "--data", str(data)]  # fmt: skip
        reader = _start("reader", *common, "--collectors", str(COLLECTORS))
        assert reader.stdout is not None
        ready = reader.stdout.readline()
        if "ready" not in ready:
            raise RuntimeError(f"the reader did not start: {ready!r}")
        results = self._collectors("warren", [*common, "--compression", compression])
        read = _result(reader)
        summary = self._summary(results)
        left = len(list(data.iterdir()))
        return {
            **summary,
            "reader_cpu_us_per_step": 1e6 * read["cpu_s"] / max(read["env_steps"], 1),
            "chunks": float(read["chunks"]),
            "files_left": float(left),
        }


def run(ctx: CaseContext) -> CaseResult:
    steps = 8_192 if ctx.quick else 24_576
    with ctx.scratch("pixels") as workdir:
        bench = _Pixels(ctx, workdir, steps)
        ctx.log(f"{COLLECTORS} collectors x {ENVS} envs x {steps} env steps per repeat, {THREADS} env thread each")
        variants: dict[str, Measure] = {
            "warren": bench.warren,
            "lz4": partial(bench.warren, "lz4"),
            "null": bench.null,
            "bare": bench.bare,
        }
        trials = alternate(ctx.repeats, variants, log=ctx.log)
    per_step = trials.series("warren", "bytes_per_step")
    rows = [
        Row(TITLE, f"{COLLECTORS} collectors x {ENVS} envs, files + broker", "env steps/s", "higher",
            trials.series("warren", "steps_s"), trials.series("bare", "steps_s"), "bare vector-env loop, same policy",
            "target: >= 0.9x"),
        Row(TITLE, f"{COLLECTORS} collectors x {ENVS} envs, null sink", "env steps/s", "higher",
            trials.series("null", "steps_s"), trials.series("bare", "steps_s"), "bare vector-env loop, same policy",
            "warren's loop without I/O"),
        Row(TITLE, "bytes on disk per env step", "bytes", "lower", per_step,
            Series.of([STACKED_BYTES] * per_step.n), "the stacked observation alone", "target: <= 7,500"),
        Row(TITLE, f"{COLLECTORS} collectors x {ENVS} envs, lz4 files + broker", "env steps/s", "higher",
            trials.series("lz4", "steps_s"), trials.series("warren", "steps_s"), "the same, uncompressed files",
            "WARREN_STEP_COMPRESSION=lz4"),
        Row(TITLE, "bytes on disk per env step, lz4", "bytes", "lower", trials.series("lz4", "bytes_per_step"),
            per_step, "uncompressed files", ""),
        Row(TITLE, "collector CPU inside the sink (files, encoding, broker)", "share", "lower",
            trials.series("warren", "sink_share")),
        Row(TITLE, "reader CPU per env step (read, check, rebuild stacks, delete)", "us", "lower",
            trials.series("warren", "reader_cpu_us_per_step")),
    ]  # fmt: skip
    return CaseResult.of(rows, trials, env_steps_per_repeat=steps * COLLECTORS, envs=ENVS, threads=THREADS)
