"""``python -m benchmarks``: run the cases against the local broker, print one table, write JSON.

Each case runs warren and its baseline in this same run, alternating, several repeats;
the table shows medians with min-max and the ratio warren/baseline. Results go to
``--out`` and nowhere else, or by default to ``benchmarks/results/<timestamp>.json`` and
``benchmarks/results/last.json`` (the committed last run, which docs/performance.md quotes).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks import (
    case_collection,
    case_collector,
    case_e2e,
    case_first_run,
    case_metrics,
    case_node_loss,
    case_pixels,
    case_queue_type,
    case_rpc,
    case_sb3,
    case_scaling,
    case_steps,
    case_stream,
    sysinfo,
)
from benchmarks.broker import BenchBroker
from benchmarks.common import CaseContext, CaseResult
from benchmarks.stats import Row, format_table, largest_gap
from messaging import redact_url

RESULTS_DIR = Path(__file__).parent / "results"
#: Cases in the order they run (cheapest first, whole jobs last).
CASES: dict[str, ModuleType] = {
    module.NAME: module
    for module in (
        case_steps,
        case_rpc,
        case_stream,
        case_queue_type,
        case_node_loss,
        case_collector,
        case_pixels,
        case_metrics,
        case_scaling,
        case_collection,
        case_e2e,
        case_first_run,
        case_sb3,
    )
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and calls, no end-to-end run (< 2 min)")
    parser.add_argument("--cases", help=f"comma-separated subset of: {','.join(CASES)}")
    parser.add_argument("--repeats", type=int, help="repeats per case (default 5, --quick 3)")
    parser.add_argument(
        "--out",
        type=Path,
        help="JSON result file, the only one written (default benchmarks/results/<time>.json and last.json)",
    )
    parser.add_argument("--amqp-url", help="broker (default WARREN_AMQP_URL or amqp://guest:guest@localhost:5672/%%2F)")
    parser.add_argument("--workdir", type=Path, help="scratch directory for files and logs (default: a temp dir)")
    parser.add_argument(
        "--quiet-wait-s",
        type=float,
        help="before each case, wait up to this long for other processes to use < 0.2 CPU (default 15, --quick 0)",
    )
    return parser


def select_cases(spec: str | None) -> list[str]:
    if not spec:
        return list(CASES)
    chosen = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {list(CASES)}")
    return chosen


def run_case(name: str, ctx: CaseContext, *, attempts: int = 3) -> tuple[CaseResult | None, list[str]]:
    """Run one case; a failed attempt (e.g. the broker restarted under it) is retried, up to 3 attempts."""
    module = CASES[name]
    run: Callable[[CaseContext], CaseResult] = module.run
    errors: list[str] = []
    for attempt in range(1, attempts + 1):
        print(f"== {name}: {module.TITLE} (attempt {attempt})", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            return run(ctx), errors
        except Exception:
            errors.append(traceback.format_exc())
            print(f"case {name} failed:\n{errors[-1]}", file=sys.stderr, flush=True)
            _wait_for_broker(ctx.broker.amqp_url, 60.0)
        finally:
            print(f"   {name} took {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return None, errors


def _wait_for_broker(amqp_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not sysinfo.management_reachable(amqp_url) and time.monotonic() < deadline:
        time.sleep(2.0)
    time.sleep(3.0)  # the AMQP listener comes up a little after the management API


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    names = select_cases(args.cases)
    repeats = args.repeats or (3 if args.quick else 5)
    quiet_wait = args.quiet_wait_s if args.quiet_wait_s is not None else (0.0 if args.quick else 15.0)
    broker = BenchBroker(args.amqp_url)
    started = time.monotonic()
    report = _header(broker, argv, quick=args.quick, repeats=repeats)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="warren-bench-", dir=args.workdir) as tmp:
        ctx = CaseContext(broker=broker, workdir=Path(tmp), quick=args.quick, repeats=repeats)
        try:
            for name in names:
                report["cases"][name] = _case_entry(name, ctx, quiet_wait, rows)
        finally:
            report["queues_deleted"] = broker.cleanup()
    _close_report(report, broker, started, rows)
    print(report["table"])
    print(_footer(report, largest_gap(rows)))
    _write(report, args.out)
    failed = [name for name, entry in report["cases"].items() if "error" in entry]
    return 1 if failed else 0


def _header(broker: BenchBroker, argv: Sequence[str] | None, *, quick: bool, repeats: int) -> dict[str, Any]:
    """What the run was measured on and with (before any case runs)."""
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": ["python", "-m", "benchmarks", *(argv if argv is not None else sys.argv[1:])],
        "quick": quick,
        "repeats": repeats,
        "versions": sysinfo.versions(),
        "machine": sysinfo.machine(),
        "broker": {**sysinfo.broker_version(broker.amqp_url), "url": redact_url(broker.amqp_url)},
        "prefix": broker.prefix,
        "load_average_before": sysinfo.load_average(),
        "broker_uptime_s_before": sysinfo.broker_uptime_s(broker.amqp_url),
        "cases": {},
    }


def _case_entry(name: str, ctx: CaseContext, quiet_wait: float, rows: list[Row]) -> dict[str, Any]:
    """Wait for quiet, run one case, add its rows; returns its JSON entry."""
    foreign = sysinfo.quiet_wait(quiet_wait) if quiet_wait > 0 else None
    started = time.monotonic()
    result, errors = run_case(name, ctx)
    entry: dict[str, Any] = {
        "seconds": round(time.monotonic() - started, 1),
        "foreign_cpu_at_start": foreign,
        "failed_attempts": errors,
    }
    if result is None:
        entry["error"] = "failed (see failed_attempts)"
    else:
        rows.extend(result.rows)
        entry.update(rows=[row.to_dict() for row in result.rows], details=result.details)
    return entry


def _close_report(report: dict[str, Any], broker: BenchBroker, started: float, rows: list[Row]) -> None:
    report["load_average_after"] = sysinfo.load_average()
    report["wall_time_s"] = round(time.monotonic() - started, 1)
    uptime = sysinfo.broker_uptime_s(broker.amqp_url)
    report["broker_uptime_s_after"] = uptime
    # Only a restart of the whole node shows here; a restart of the rabbit app alone does not.
    report["broker_restarted"] = uptime is not None and uptime < report["wall_time_s"]
    gap = largest_gap(rows)
    report["largest_gap"] = gap.to_dict() if gap is not None else None
    report["table"] = format_table(rows)


def _footer(report: dict[str, Any], gap: Row | None) -> str:
    versions = report["versions"]
    lines = [
        "",
        f"python {versions['python']}, pika {versions['pika']}, msgpack {versions['msgpack']}, "
        f"torch {versions['torch']}, numpy {versions['numpy']}; {report['machine']['cpu_count']} CPUs; "
        f"RabbitMQ {report['broker'].get('rabbitmq')}; load average {report['load_average_before']} -> "
        f"{report['load_average_after']}; {report['wall_time_s']:.0f} s",
    ]
    if report.get("broker_restarted"):
        lines.append("WARNING: the broker restarted during this run (another process?): numbers may be off")
    for name, entry in report["cases"].items():
        if "error" in entry:
            lines.append(f"{name}: FAILED ({len(entry['failed_attempts'])} attempts); see the JSON")
        details = entry.get("details", {})
        foreign = details.get("max_foreign_cpu")
        if foreign is not None:
            lines.append(f"{name}: max foreign CPU during a repeat {foreign:.2f} CPUs")
    if gap is not None:
        lines.append(f"largest gap: {gap.case} / {gap.metric}: {gap.slowdown:.2f}x worse than {gap.baseline_name}")
    return "\n".join(lines)


def _write(report: dict[str, Any], out: Path | None) -> list[Path]:
    """Write the report to ``out`` alone, or to a timestamped file and ``last.json`` in ``RESULTS_DIR``.

    An explicit ``--out`` is a run kept apart (a trial, another machine): it must not
    replace the committed ``last.json``.
    """
    text = json.dumps(report, indent=2, default=str)
    if out is not None:
        targets = [out]
    else:
        targets = [RESULTS_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}.json", RESULTS_DIR / "last.json"]
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    print(f"results: {' and '.join(map(str, targets))}", file=sys.stderr)
    return targets
