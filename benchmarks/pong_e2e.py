"""``python -m benchmarks.pong_e2e``: Pong end to end with ``warren run``, as the learner on a GPU sees it.

Reported: env steps/s collected and learned, the learner's busy share, its GPU's
utilisation and memory, the return curve and the evaluations.

It runs ``warren run --config JOB --collectors N --max-time-s T --metrics-port P`` against
``WARREN_AMQP_URL`` (the job's stop value still ends it early), and meanwhile reads the
learner's ``/metrics`` (port ``P + 1``) every ``--sample-s``: its busy share
(``warren_learner_busy_ratio``) and, on a GPU, the device's utilisation and memory; where
``nvidia-smi`` is on the PATH, its utilisation too (a second opinion that needs no NVML
in the learner's Python). When the run is over it reads the run's ``summary.json``,
``run.jsonl`` (the collect tasks' returns and the evaluations) and the learner's log.

``--device`` sets ``WARREN_DEVICE`` for the run's learner (``cpu``: a CPU smoke of the GPU
job, ``--max-time-s 30``); by default the job's ``learner.device`` holds. It writes
``pong_e2e.json`` (and keeps the run's workdir) under ``--out``, and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "configs" / "pong_ppo_gpu.toml"
#: The learner's figures read off its /metrics, by metric (and label), under the names the report uses.
LEARNER_METRICS = {
    ("warren_learner_busy_ratio", ""): "busy",
    ("warren_learner_device_utilization_ratio", ""): "device_utilization",
    ("warren_learner_device_memory_bytes", "allocated"): "device_memory_allocated",
    ("warren_learner_device_memory_bytes", "used"): "device_memory_used",
    ("warren_learner_samples_waiting", ""): "samples_waiting",
    ("warren_policy_version", ""): "policy_version",
}


def learner_figures(text: str) -> dict[str, float]:
    """The :data:`LEARNER_METRICS` of one scrape of the learner's ``/metrics``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("kind", ""))
            if key in LEARNER_METRICS:
                out[LEARNER_METRICS[key]] = float(sample.value)
    return out


def scrape(port: int) -> dict[str, float]:
    """The learner's figures now (``{}`` while its endpoint does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2.0) as response:
            return learner_figures(response.read().decode())
    except OSError:
        return {}


def nvidia_smi() -> dict[str, float]:
    """The first GPU's utilisation (0-1) and used memory (bytes) as nvidia-smi reads them (``{}`` without it)."""
    if shutil.which("nvidia-smi") is None:
        return {}
    query = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
    try:
        line = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout.splitlines()[0]
        utilization, used_mib = (float(v) for v in line.split(","))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}
    return {"smi_utilization": utilization / 100.0, "smi_memory_used": used_mib * 2**20}


def returns(run_log: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The collect tasks' mean returns (where episodes ended) and the evaluations, with the run's time and env steps."""
    collect, evals = [], []
    start: float | None = None
    for line in run_log.read_text().splitlines() if run_log.exists() else []:
        record = json.loads(line)
        start = record.get("time") if start is None else start
        at = {"t": round(float(record.get("time", 0.0)) - float(start or 0.0), 1), "env_steps": record.get("env_steps")}
        if record.get("kind") == "task" and record.get("real_episode_count"):
            collect.append({**at, "mean_return": record["reward_mean"], "episodes": record["real_episode_count"]})
        elif record.get("kind") == "eval" and record.get("reward_mean") is not None:
            evals.append({**at, "mean_return": record["reward_mean"], "episodes": record.get("real_episode_count")})
    return collect, evals


def summarize(
    summary: dict[str, Any], samples: list[dict[str, float]], collect: list[dict[str, Any]], evals: list[dict[str, Any]]
) -> dict[str, Any]:
    """The figures of one run: rates from its summary, means of the sampled figures, the return curve."""
    wall = float(summary.get("wall_time_s") or 0.0) or 1e-9
    figures: dict[str, Any] = {
        "wall_s": wall,
        "env_steps": summary.get("env_steps"),
        "collected_env_steps_per_s": (summary.get("env_steps") or 0) / wall,
        "learned_env_steps_per_s": (summary.get("learner_samples") or 0) / wall,
        "updates": summary.get("learner_train_steps"),
        "success": summary.get("success"),
        "reason": summary.get("reason"),
        "best_eval": summary.get("best_eval"),
    }
    for name in sorted({k for s in samples for k in s}):
        values = [s[name] for s in samples if name in s]
        if name != "policy_version":
            figures[f"{name}_mean"] = statistics.fmean(values)
        if name.endswith(("memory_used", "memory_allocated")):
            figures[f"{name}_max"] = max(values)
    reached = [e for e in evals if e["mean_return"] >= float(summary.get("stop_value") or float("inf"))]
    figures["first_eval_at_stop_value"] = reached[0] if reached else None
    figures["evals"] = evals
    figures["collect_returns"] = collect
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = (args.out / "run").resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    argv = [
        sys.executable, "-m", "worker.cli", "run", "--config", str(args.config), "--collectors", str(args.collectors),
        "--max-time-s", str(args.max_time_s), "--progress", "log", "--workdir", str(workdir),
        "--metrics-port", str(args.metrics_port),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.device:
        env["WARREN_DEVICE"] = args.device
    log = (args.out / "warren-run.log").open("w")
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=args.out, env=env, stdout=log, stderr=subprocess.STDOUT)
    samples: list[dict[str, float]] = []
    try:
        while proc.poll() is None:
            time.sleep(args.sample_s)
            sample = {**scrape(args.metrics_port + 1), **nvidia_smi()}
            if sample:
                samples.append({"t": time.monotonic() - started, **sample})
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
        log.close()
    summary_file = workdir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    collect, evals = returns(workdir / "run.jsonl")
    figures = summarize(summary, [{k: v for k, v in s.items() if k != "t"} for s in samples], collect, evals)
    return {
        "command": " ".join(argv),
        "exit_code": code,
        "device": args.device or "the job's learner.device",
        "collectors": args.collectors,
        "figures": figures,
        "samples": samples,
        "workdir": str(workdir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pong_e2e", description=__doc__)
    parser.add_argument("--config", type=Path, default=JOB, help="the job (default configs/pong_ppo_gpu.toml)")
    parser.add_argument("--collectors", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--max-time-s", type=float, default=420.0)
    parser.add_argument("--device", default="", help="WARREN_DEVICE for the learner (default: the job's)")
    parser.add_argument(
        "--metrics-port", type=int, default=9460, help="the run's first /metrics port (the learner's + 1)"
    )
    parser.add_argument("--sample-s", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=Path("pong-e2e"))
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    if not args.config.exists() and not args.config.is_absolute():
        args.config = ROOT / args.config  # a job of this repository, named from elsewhere
    args.config = args.config.resolve()  # the run starts in --out
    args.out.mkdir(parents=True, exist_ok=True)
    report = run(args)
    (args.out / "pong_e2e.json").write_text(json.dumps(report, indent=2) + "\n")
    f = report["figures"]
    print(
        f"exit {report['exit_code']}; {f['wall_s']:.0f} s, {f['env_steps'] or 0:,} env steps: "
        f"{f['collected_env_steps_per_s']:,.0f} collected/s, {f['learned_env_steps_per_s']:,.0f} learned/s; "
        f"learner busy {f.get('busy_mean', float('nan')):.2f}, device utilization "
        f"{f.get('device_utilization_mean', f.get('smi_utilization_mean', float('nan'))):.2f}; "
        f"best eval {f['best_eval']} ({f['reason']})"
    )
    for point in f["evals"]:
        print(f"  eval at {point['t']:>6.0f} s, {point['env_steps']:>10,} env steps: {point['mean_return']:+.1f}")
    return 0 if report["exit_code"] in (0, 3) else 1


if __name__ == "__main__":
    sys.exit(main())
