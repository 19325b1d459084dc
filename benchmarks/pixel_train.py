"""Training Pong with PPO on CPU: the distributed job against the same model and PPO step in one process.

``python -m benchmarks.pixel_train --seconds 150`` runs, one after the other:

* ``warren``: ``warren run --config configs/pong_ppo.toml`` (a learner and two collector
  processes, the local broker) for ``--seconds``, with the peak PSS of the job's
  processes sampled once a second from ``/proc/<pid>/smaps_rollup``;
* ``single``: :class:`worker.inprocess.InProcessJob` on the same job file: collect a batch,
  run the PPO update, again, in one process (its torch uses every CPU while it updates).

It prints one JSON line: env steps/s collected and env steps/s learned from by each, the
learner's busy share (updates over wall time, from its log), and the peak PSS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "configs" / "pong_ppo.toml"


def pss_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    found = re.search(r"^Pss:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) if found else 0


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def return_curve(run_log: Path) -> list[tuple[int, float, int]]:
    """``(env steps, mean return, episodes)`` of every collect task in which episodes ended, in order."""
    curve = []
    for line in run_log.read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "task" and not record.get("eval_flag") and record.get("real_episode_count"):
            curve.append((int(record["env_steps"]), float(record["reward_mean"]), int(record["real_episode_count"])))
    return curve


def windows(curve: list[tuple[int, float, int]], width: int) -> list[dict[str, Any]]:
    """The return curve as episode-weighted means per ``width`` env steps (a task counts where it ended)."""
    sums: dict[int, list[float]] = {}
    for env_steps, mean, episodes in curve:
        total = sums.setdefault(env_steps // width, [0.0, 0.0])
        total[0] += mean * episodes
        total[1] += episodes
    return [
        {"from": k * width, "to": (k + 1) * width, "mean_return": total / count, "episodes": int(count)}
        for k, (total, count) in sorted(sums.items())
    ]


def distributed(seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pixel-train-") as tmp:
        argv = [sys.executable, "-m", "worker.cli", "run", "--config", str(JOB), "--progress", "log",
                "--max-time-s", str(seconds), "--stop-value", "inf"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, sum(pss_kib(p) for p in tree(proc.pid)))
            time.sleep(1.0)
        (workdir,) = (Path(tmp) / "runs").iterdir()
        summary = json.loads((workdir / "summary.json").read_text())
        log = (workdir / "logs" / "learner.log").read_text()
        busy = re.findall(r"\((\d+)% busy\)", log)
        per_step = re.findall(r"step files: (\d+) bytes an env step", log)
        wall = float(summary["wall_time_s"])
        return {
            "returns": return_curve(workdir / "run.jsonl"),
            "evals": summary.get("evals"),
            "best_eval": summary.get("best_eval"),
            "env_steps_s": summary["env_steps"] / wall,
            "learned_steps_s": summary["learner_samples"] / wall,
            "updates": summary["learner_train_steps"],
            "learner_busy": float(busy[-1]) / 100 if busy else None,
            "step_file_bytes_per_env_step": float(per_step[-1]) if per_step else None,
            "peak_pss_mib": peak / 1024,
            "wall_s": wall,
        }


def single(seconds: float) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from worker.config import cpu_budget
    from worker.inprocess import InProcessJob
    from worker.job import JobConfig
    from worker.lifecycle import limit_torch_threads
    from worker.plugins.registry import import_env_packages

    import_env_packages("ale_py")
    limit_torch_threads(cpu_budget())
    run = InProcessJob(JobConfig.load(JOB))
    started = time.monotonic()
    update_s = 0.0
    try:
        while time.monotonic() - started < seconds:
            run.collect()
            t = time.monotonic()
            run.train()
            update_s += time.monotonic() - t
    finally:
        run.close()
    wall = time.monotonic() - started
    return {
        "env_steps_s": run.env_steps / wall,
        "learned_steps_s": run.env_steps / wall,
        "updates": run.updates,
        "update_share": update_s / wall,
        "peak_rss_mib": __import__("resource").getrusage(__import__("resource").RUSAGE_SELF).ru_maxrss / 1024,
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--only", choices=["warren", "single"])
    parser.add_argument("--curve", type=Path, help="only print the return by env-step window of this run.jsonl")
    parser.add_argument("--window", type=int, default=50_000, help="env steps per window of --curve")
    args = parser.parse_args(argv)
    if args.curve is not None:
        for row in windows(return_curve(args.curve), args.window):
            span = f"{row['from']:>9,}-{row['to']:<9,}"
            print(f"{span} mean return {row['mean_return']:7.2f} ({row['episodes']} episodes)")
        return 0
    result: dict[str, Any] = {}
    if args.only in (None, "warren"):
        result["warren"] = distributed(args.seconds)
    if args.only in (None, "single"):
        result["single"] = single(args.seconds)
    if "warren" in result and "single" in result:
        result["ratio_env_steps"] = result["warren"]["learned_steps_s"] / result["single"]["learned_steps_s"]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
