"""What every case shares: its context, its result, and the alternating repeat loop."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.broker import BenchBroker
from benchmarks.stats import Row, Series
from benchmarks.sysinfo import CpuProbe

Measure = Callable[[], dict[str, float]]


@dataclass(frozen=True)
class CaseContext:
    """Where and how long a case runs."""

    broker: BenchBroker
    workdir: Path
    """A directory of the run; a case makes its own sub-directories in it."""
    quick: bool
    repeats: int

    def log(self, message: str) -> None:
        print(f"  {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)

    @contextmanager
    def scratch(self, name: str) -> Iterator[Path]:
        """A fresh directory for the block, deleted afterwards."""
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


@dataclass
class Trials:
    """Per variant, one measurement dict per repeat, with the CPU accounting of that repeat."""

    runs: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    cpu: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def series(self, variant: str, key: str) -> Series:
        return Series.of(run[key] for run in self.runs.get(variant, []))

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "cpu": self.cpu}

    def max_foreign_cpu(self) -> float:
        return max((c.get("foreign", 0.0) for runs in self.cpu.values() for c in runs), default=0.0)


def alternate(repeats: int, variants: Mapping[str, Measure], *, log: Callable[[str], None] | None = None) -> Trials:
    """Run every variant once per repeat, rotating which goes first, so drift hits all alike.

    With two variants the order is AB, BA, AB...; with three ABC, BCA, CAB...
    """
    names = list(variants)
    trials = Trials({name: [] for name in names}, {name: [] for name in names})
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            with CpuProbe() as probe:
                measured = variants[name]()
            trials.runs[name].append(measured)
            trials.cpu[name].append(probe.result)
            if log is not None:
                shown = ", ".join(f"{k}={v:.4g}" for k, v in measured.items())
                log(f"repeat {repeat + 1}/{repeats} {name}: {shown} (foreign cpu {probe.result['foreign']:.2f})")
    return trials


@dataclass
class CaseResult:
    """A case's rows for the table and everything else worth keeping in the JSON."""

    rows: list[Row]
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, rows: list[Row], trials: Trials, **details: Any) -> CaseResult:
        """Rows plus the trials' raw values and their worst foreign CPU use."""
        return cls(rows, {"trials": trials.to_dict(), "max_foreign_cpu": trials.max_foreign_cpu(), **details})
