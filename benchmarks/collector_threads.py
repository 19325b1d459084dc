"""``python -m benchmarks.collector_threads``: one Pong collector's env steps/s with its Nature CNN policy, by threads.

With the learner on a GPU, what bounds a Pong job is collection, and a collector's cost is
mostly its policy: a Nature CNN forward pass for its envs at every step, on the CPU. This
runs :mod:`benchmarks.pixel_worker` in ``bare`` mode (ale-py's vector env of ``--envs``
envs on ``--env-threads`` threads, the shipped Pong job's PPO actor, no files) once per
torch thread count of ``--torch-threads``, each in a fresh process, ``--repeats`` times in
rotating order, and reports per count: env steps/s (wall clock), env steps per CPU-second
of the process (what a core buys, less sensitive to other work on the machine), and the
share of the wall time spent in the actor (the forward pass and sampling). The processes get
``OMP_WAIT_POLICY=PASSIVE`` unless it is set, as ``warren run``'s collectors do.

It prints a table and writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def one(steps: int, envs: int, env_threads: int, torch_threads: int) -> dict[str, float]:
    """One ``pixel_worker --mode bare`` run's result."""
    argv = [
        sys.executable, "-m", "benchmarks.pixel_worker", "--mode", "bare", "--steps", str(steps), "--envs", str(envs),
        "--threads", str(env_threads), "--torch-threads", str(torch_threads),
    ]  # fmt: skip
    # As warren run starts its collectors: idle OpenMP threads sleep instead of spinning on the cores.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    done = subprocess.run(argv, input="\n", capture_output=True, text=True, timeout=1200, env=env, check=True)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    result: dict[str, float] = lines[-1]
    return result


def figures(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Medians of a thread count's runs: env steps/s, env steps per CPU-second, the actor's share of the wall time."""
    return {
        "env_steps_per_s": statistics.median(r["steps"] / r["wall_s"] for r in runs),
        "env_steps_per_cpu_s": statistics.median(r["steps"] / r["cpu_s"] for r in runs),
        "actor_share": statistics.median(r["act_s"] / r["wall_s"] for r in runs),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.collector_threads", description=__doc__)
    parser.add_argument("--torch-threads", default="1,2,4")
    parser.add_argument("--env-threads", type=int, default=1)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8192, help="env steps per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from benchmarks.sysinfo import load_average, machine, versions

    counts = [int(c) for c in args.torch_threads.split(",")]
    runs: dict[int, list[dict[str, float]]] = {c: [] for c in counts}
    load_before = load_average()
    for repeat in range(args.repeats):
        for count in counts[repeat % len(counts) :] + counts[: repeat % len(counts)]:
            runs[count].append(one(args.steps, args.envs, args.env_threads, count))
    results = {str(c): figures(r) for c, r in runs.items()}
    print(f"{'torch threads':>13} {'env steps/s':>12} {'per CPU-s':>10} {'actor share':>12}")
    for threads, result in results.items():
        print(
            f"{threads:>13} {result['env_steps_per_s']:>12,.0f} {result['env_steps_per_cpu_s']:>10,.0f}"
            f" {result['actor_share']:>12.0%}"
        )
    report = {
        "command": "python -m benchmarks.collector_threads " + " ".join(argv if argv is not None else sys.argv[1:]),
        "results": results,
        "cpus": os.cpu_count(),
        "load_average": {"before": load_before, "after": load_average()},
        "versions": versions(),
        "machine": machine(),
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
