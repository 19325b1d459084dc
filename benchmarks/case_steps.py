"""Step data: chunks of 32 samples written with ``StepStore.write`` and read with ``StepStore.read``.

Two chunk sizes: CartPole (``obs``/``next_obs`` float32[32, 4], about 1 KB a file) and
Atari (uint8[32, 4, 84, 84], about 1.8 MB). Baseline: the same bytes (warren's encoded
file) written raw, tempfile + ``os.replace``, and read back with a plain ``read()``, so
the ratio is what encoding, validation and decoding cost on top of the file system.
Every repeat writes into a fresh directory (the no-journal ext4 here is slow to create
files where many were just deleted) after one untimed pass (fresh memory is slow to
touch on this VM).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CaseContext, CaseResult, Trials, alternate
from benchmarks.stats import Row
from worker.storage import StepStore

NAME = "steps"
TITLE = "step data"
SAMPLES = 32


def chunk(kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One chunk of ``SAMPLES`` transitions with the fields a collector writes."""
    obs: np.ndarray
    next_obs: np.ndarray
    if kind == "cartpole":
        obs = rng.standard_normal((SAMPLES, 4)).astype(np.float32)
        next_obs = rng.standard_normal((SAMPLES, 4)).astype(np.float32)
    else:
        obs = rng.integers(0, 256, (SAMPLES, 4, 84, 84), dtype=np.uint8)
        next_obs = rng.integers(0, 256, (SAMPLES, 4, 84, 84), dtype=np.uint8)
    return {
        "obs": obs,
        "next_obs": next_obs,
        "action": rng.integers(0, 2, SAMPLES, dtype=np.int64),
        "reward": np.ones(SAMPLES, dtype=np.float32),
        "done": np.zeros(SAMPLES, dtype=bool),
        "truncated": np.zeros(SAMPLES, dtype=bool),
    }


META = {"env_id": 0, "policy_iter": 1234, "unroll_len": SAMPLES, "cur_step": 4096}


class _Files:
    """Writes and reads ``files`` chunk files per repeat, warren's way or the raw way."""

    def __init__(self, root: Path, samples: dict[str, np.ndarray], files: int) -> None:
        self.root, self.samples, self.files = root, samples, files
        self.dirs = 0
        # The baseline writes warren's own file bytes (same length of data_id, too).
        self.body = StepStore(root / "probe").write("env_0_999999", samples, META).read_bytes()

    @property
    def file_bytes(self) -> int:
        return len(self.body)

    def _fresh(self) -> Path:
        self.dirs += 1
        return self.root / f"d{self.dirs}"

    def _timed(self, write: Callable[[str], Any], read: Callable[[str], Any]) -> dict[str, float]:
        ids = [f"env_0_{i:06d}" for i in range(self.files)]
        # Untimed: touch memory and code once, under other names (replacing an existing
        # file frees its blocks, which with ``discard`` costs milliseconds here).
        for i in range(max(1, self.files // 10)):
            write(f"warm_{i:06d}")
            read(f"warm_{i:06d}")
        started = time.perf_counter()
        for data_id in ids:
            write(data_id)
        wrote = time.perf_counter()
        for data_id in ids:
            read(data_id)
        done = time.perf_counter()
        n_samples = self.files * SAMPLES
        mb = self.files * self.file_bytes / 1e6
        return {
            "write_samples_s": n_samples / (wrote - started),
            "write_mb_s": mb / (wrote - started),
            "read_samples_s": n_samples / (done - wrote),
            "read_mb_s": mb / (done - wrote),
        }

    def warren(self) -> dict[str, float]:
        store = StepStore(self._fresh())
        return self._timed(lambda i: store.write(i, self.samples, META), lambda i: store.read(i, wait_s=0.0))

    def raw(self) -> dict[str, float]:
        directory = self._fresh()
        directory.mkdir(parents=True)
        body = self.body

        def write(data_id: str) -> None:
            final = directory / data_id
            tmp = directory / f".{data_id}.tmp"
            with open(tmp, "wb") as handle:
                handle.write(body)
            os.replace(tmp, final)

        def read(data_id: str) -> bytes:
            with open(directory / data_id, "rb") as handle:
                return handle.read()

        return self._timed(write, read)


def run(ctx: CaseContext) -> CaseResult:
    rng = np.random.default_rng(0)
    counts = {"cartpole": 300 if ctx.quick else 1000, "atari": 20 if ctx.quick else 60}
    rows: list[Row] = []
    all_trials: dict[str, Trials] = {}
    sizes: dict[str, int] = {}
    with ctx.scratch("steps") as root:
        for kind, files in counts.items():
            target = _Files(root / kind, chunk(kind, rng), files)
            sizes[kind] = target.file_bytes
            ctx.log(f"{kind}: {files} files of {target.file_bytes:,} bytes per repeat")
            trials = alternate(ctx.repeats, {"warren": target.warren, "raw": target.raw}, log=ctx.log)
            all_trials[kind] = trials
            rows.extend(_rows(kind, trials, target.file_bytes))
    foreign = max(t.max_foreign_cpu() for t in all_trials.values())
    details = {
        "trials": {kind: t.to_dict() for kind, t in all_trials.items()},
        "max_foreign_cpu": foreign,
        "file_bytes": sizes,
        "files_per_repeat": counts,
        "samples_per_file": SAMPLES,
    }
    return CaseResult(rows, details)


def _rows(kind: str, trials: Trials, file_bytes: int) -> list[Row]:
    label = "CartPole" if kind == "cartpole" else "Atari"
    rows = []
    for op in ("write", "read"):
        warren_mb = trials.series("warren", f"{op}_mb_s").median
        raw_mb = trials.series("raw", f"{op}_mb_s").median
        rows.append(
            Row(
                TITLE,
                f"{label} {op} ({file_bytes / 1e3:,.0f} KB/file)",
                "samples/s",
                "higher",
                trials.series("warren", f"{op}_samples_s"),
                trials.series("raw", f"{op}_samples_s"),
                "raw " + ("tmp+os.replace" if op == "write" else "read()"),
                f"{warren_mb:,.0f} vs {raw_mb:,.0f} MB/s",
                notes={"warren_mb_s": warren_mb, "raw_mb_s": raw_mb},
            )
        )
    return rows
