"""Summaries of repeated measurements and the one table the suite prints.

Every number in the table is the median over repeats, with the spread (min-max) next to
it, and the ratio of warren's median to the baseline's median measured in the same run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Better = Literal["higher", "lower"]


@dataclass(frozen=True)
class Series:
    """The values of one metric over the repeats of a case."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Series:
        return cls(tuple(float(v) for v in values))

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan

    @property
    def low(self) -> float:
        return min(self.values) if self.values else math.nan

    @property
    def high(self) -> float:
        return max(self.values) if self.values else math.nan

    def quartiles(self) -> tuple[float, float]:
        """First and third quartile (inclusive method); the value itself for one repeat."""
        if len(self.values) < 2:
            return self.low, self.high
        q = statistics.quantiles(self.values, n=4, method="inclusive")
        return q[0], q[2]

    def to_dict(self) -> dict[str, Any]:
        q1, q3 = self.quartiles()
        return {
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "q1": q1,
            "q3": q3,
            "n": self.n,
            "values": list(self.values),
        }


@dataclass(frozen=True)
class Row:
    """One line of the table: a metric of one case, for warren and for its baseline.

    ``baseline`` is ``None`` where no baseline runs in the same process run (end to end);
    ``reference`` is a published or previously measured figure, for orientation only.
    """

    case: str
    metric: str
    unit: str
    better: Better
    warren: Series
    baseline: Series | None = None
    baseline_name: str = ""
    reference: str = ""
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """warren median / baseline median (>1 is more of the unit: better for rates, worse for times)."""
        if self.baseline is None:
            return None
        base = self.baseline.median
        if base == 0 or math.isnan(base):
            return None
        return self.warren.median / base

    @property
    def slowdown(self) -> float | None:
        """How many times worse than the baseline warren is (1 = on par, <1 = faster)."""
        ratio = self.ratio
        if ratio is None or ratio == 0:
            return None
        return 1.0 / ratio if self.better == "higher" else ratio

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "metric": self.metric,
            "unit": self.unit,
            "better": self.better,
            "warren": self.warren.to_dict(),
            "baseline": self.baseline.to_dict() if self.baseline is not None else None,
            "baseline_name": self.baseline_name,
            "ratio": self.ratio,
            "slowdown": self.slowdown,
            "reference": self.reference,
            "notes": self.notes,
        }


def fmt_number(value: float) -> str:
    """Three significant figures, thousands separated: 0.431, 12.3, 2,270."""
    if math.isnan(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def fmt_series(series: Series | None) -> str:
    """``median (min-max)``, or just the median for a single repeat."""
    if series is None or series.n == 0:
        return ""
    if series.n == 1:
        return fmt_number(series.median)
    return f"{fmt_number(series.median)} ({fmt_number(series.low)}-{fmt_number(series.high)})"


def fmt_ratio(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


HEADERS = ("case", "metric", "unit", "better", "warren", "baseline", "ratio", "n", "reference")


def table_cells(row: Row) -> tuple[str, ...]:
    n = str(row.warren.n) if row.baseline is None else f"{row.warren.n}/{row.baseline.n}"
    baseline = fmt_series(row.baseline)
    if baseline and row.baseline_name:
        baseline = f"{baseline} [{row.baseline_name}]"
    return (
        row.case,
        row.metric,
        row.unit,
        row.better,
        fmt_series(row.warren),
        baseline,
        fmt_ratio(row.ratio),
        n,
        row.reference,
    )


def format_table(rows: Sequence[Row]) -> str:
    """A GitHub-flavoured markdown table (readable as plain text too)."""
    cells = [HEADERS, *(table_cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADERS))]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)) + " |"

    out = [line(HEADERS), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(c) for c in cells[1:])
    return "\n".join(out)


def largest_gap(rows: Sequence[Row]) -> Row | None:
    """The row where warren is furthest behind its baseline.

    Rows comparing two warren configurations (``notes["versus"]``: quorum vs classic
    queues) are not warren against a baseline, and are left out.
    """
    scored = [(row.slowdown, row) for row in rows if row.slowdown is not None and "versus" not in row.notes]
    if not scored:
        return None
    return max(scored, key=lambda pair: pair[0] or 0.0)[1]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
