"""warren against Stable-Baselines3 on the shipped jobs: wall-clock from process start to the stop value.

For each job and seed, alternating which goes first: ``warren run --config configs/<job>
--collectors 2`` and :mod:`benchmarks.sb3_peer` (single process, rl-baselines3-zoo's
hyperparameters for the env, the same thread count), both evaluated the same way: the
deterministic policy, the job's ``evaluator_env_num x eval_episodes`` episodes, every
``eval_interval_s`` seconds of wall time. A run's time is from the moment its process was
started (imports and start-up included) to the wall-clock time of its first evaluation
at or above the stop value; its env steps are those counted at that evaluation. A seed
that does not reach the stop value within the budget is a failure, reported as such.

``python -m benchmarks --cases sb3`` runs the quick jobs (:data:`DEFAULT_JOBS`, 3 seeds);
``python -m benchmarks.case_sb3 --jobs lunarlander_ppo,pendulum_sac --seeds 0 1 2 3 4``
any of :data:`JOBS`, with their budgets (the long ones take hours on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import procs
from benchmarks.common import CaseContext, CaseResult
from benchmarks.stats import Row, Series, format_table

NAME = "sb3"
TITLE = "vs SB3"
CONFIGS = procs.REPO_ROOT / "configs"


@dataclass(frozen=True)
class Job:
    """A shipped job and what SB3 runs for it."""

    config: str
    algo: str
    env_id: str
    budget_s: float
    """Wall-clock budget of one run (each side)."""


JOBS: dict[str, Job] = {
    "cartpole_ppo": Job("cartpole_ppo.toml", "ppo", "CartPole-v1", 180),
    "cartpole_dqn": Job("cartpole_dqn.toml", "dqn", "CartPole-v1", 300),
    "pendulum_sac": Job("pendulum_sac.toml", "sac", "Pendulum-v1", 600),
    "lunarlander_ppo": Job("lunarlander_ppo.toml", "ppo", "LunarLander-v3", 3600),
    "lunarlandercontinuous_sac": Job("lunarlandercontinuous_sac.toml", "sac", "LunarLanderContinuous-v3", 7200),
}
#: What ``python -m benchmarks --cases sb3`` runs (minutes, not hours).
DEFAULT_JOBS = ("cartpole_ppo", "cartpole_dqn", "pendulum_sac")
DEFAULT_SEEDS = (0, 1, 2)


def job_settings(job: Job) -> dict[str, Any]:
    """The shipped job's stop value and evaluation rule, as the file (and warren's defaults) give them."""
    from worker.job import JobConfig

    loaded = JobConfig.load(CONFIGS / job.config)
    return {
        "stop_value": loaded.env.stop_value,
        "eval_envs": loaded.env.evaluator_env_num,
        "eval_episodes": loaded.env.eval_episodes,
        "eval_interval_s": loaded.coordinator.eval_interval_s,
    }


def run_warren(job: Job, seed: int, workdir: Path, amqp_url: str, prefix: str) -> dict[str, Any]:
    argv = procs.python_module(
        "worker.cli", "run", "--config", str(CONFIGS / job.config), "--collectors", "2", "--seed", str(seed),
        "--prefix", prefix, "--workdir", str(workdir), "--progress", "off", "--log-level", "WARNING",
        "--max-time-s", str(job.budget_s),
    )  # fmt: skip
    env = {**os.environ, "WARREN_AMQP_URL": amqp_url, "PYTHONPATH": str(procs.REPO_ROOT)}
    started = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=job.budget_s + 180, check=False)
    log = workdir / "run.jsonl"
    evals = [r for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == "eval"] if log.exists() else []
    summary_path = workdir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    stop = float(summary.get("stop_value", "inf"))
    reached = [r for r in evals if r["reward_mean"] >= stop]
    first = reached[0] if reached else None
    return outcome(
        "warren", seed, done,
        seconds=first["time"] - started if first else None,
        env_steps=first["env_steps"] if first else summary.get("env_steps"),
        best=summary.get("best_eval"),
    )  # fmt: skip


def run_sb3(job: Job, seed: int, settings: dict[str, Any]) -> dict[str, Any]:
    argv = procs.python_module(
        "benchmarks.sb3_peer", "--algo", job.algo, "--env-id", job.env_id, "--seed", str(seed), "--threads", "1",
        "--stop-value", str(settings["stop_value"]), "--eval-envs", str(settings["eval_envs"]),
        "--eval-episodes", str(settings["eval_episodes"]), "--eval-interval-s", str(settings["eval_interval_s"]),
        "--max-time-s", str(job.budget_s),
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(procs.REPO_ROOT)}
    started = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=job.budget_s + 180, check=False)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    evals = [r for r in lines if r.get("event") == "eval"]
    reached = [r for r in evals if r["value"] >= settings["stop_value"]]
    first = reached[0] if reached else None
    return outcome(
        "sb3", seed, done,
        seconds=first["t"] - started if first else None,
        env_steps=first["steps"] if first else (evals[-1]["steps"] if evals else None),
        best=max((r["value"] for r in evals), default=None),
    )  # fmt: skip


def outcome(
    side: str, seed: int, done: subprocess.CompletedProcess[str], *, seconds: float | None, env_steps: Any, best: Any
) -> dict[str, Any]:
    """One run's record: reached is whether it got to the stop value; stderr is kept for a run that did not."""
    return {
        "side": side,
        "seed": seed,
        "reached": seconds is not None,
        "seconds": seconds,
        "env_steps": env_steps,
        "best": best,
        "exit_code": done.returncode,
        "stderr": done.stderr[-1500:] if seconds is None else "",
    }


def compare(
    jobs: list[str], seeds: list[int], workdir: Path, *, amqp_url: str, prefix: str, log: Any = print
) -> tuple[list[Row], list[dict[str, Any]]]:
    rows: list[Row] = []
    runs: list[dict[str, Any]] = []
    for name in jobs:
        job = JOBS[name]
        settings = job_settings(job)
        results: dict[str, list[dict[str, Any]]] = {"warren": [], "sb3": []}
        for i, seed in enumerate(seeds):
            order = ["warren", "sb3"] if i % 2 == 0 else ["sb3", "warren"]
            for side in order:
                if side == "warren":
                    result = run_warren(job, seed, workdir / f"{name}-{seed}", amqp_url, f"{prefix}-{name}-{seed}")
                else:
                    result = run_sb3(job, seed, settings)
                result["job"] = name
                results[side].append(result)
                runs.append(result)
                shown = f"{result['seconds']:.1f} s" if result["reached"] else "NOT reached"
                log(f"{name} seed {seed} {side}: {shown}, {result['env_steps']} env steps, best {result['best']}")
        ok = {side: [r for r in results[side] if r["reached"]] for side in results}
        failed = {side: len(results[side]) - len(ok[side]) for side in results}
        reference = f"stop {settings['stop_value']:g}; failures: warren {failed['warren']}, SB3 {failed['sb3']}"
        rows.append(
            Row(
                f"{TITLE} {name}", "wall-clock to the stop value", "s", "lower",
                Series.of(r["seconds"] for r in ok["warren"]), Series.of(r["seconds"] for r in ok["sb3"]),
                baseline_name="SB3", reference=reference, notes={"failures": failed},
            )
        )  # fmt: skip
        rows.append(
            Row(
                f"{TITLE} {name}", "env steps to the stop value", "env steps", "lower",
                Series.of(r["env_steps"] for r in ok["warren"]), Series.of(r["env_steps"] for r in ok["sb3"]),
                baseline_name="SB3",
            )
        )  # fmt: skip
    return rows, runs


def run(ctx: CaseContext) -> CaseResult:
    if ctx.quick:
        ctx.log("skipped with --quick")
        return CaseResult([], {"skipped": "--quick"})
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        ctx.log("stable-baselines3 is not installed (pip install -e '.[sb3]'): skipped")
        return CaseResult([], {"skipped": "no stable-baselines3"})
    rows, runs = compare(
        list(DEFAULT_JOBS),
        list(DEFAULT_SEEDS),
        ctx.workdir,
        amqp_url=ctx.broker.amqp_url,
        prefix=ctx.broker.sub_prefix("sb3"),
        log=ctx.log,
    )
    return CaseResult(rows, {"runs": runs})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.case_sb3", description=__doc__)
    parser.add_argument("--jobs", default=",".join(DEFAULT_JOBS), help=f"comma-separated, of: {','.join(JOBS)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS))
    parser.add_argument(
        "--amqp-url", default=os.environ.get("WARREN_AMQP_URL", "amqp://guest:guest@localhost:5672/%2F")
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/warren-vs-sb3"))
    parser.add_argument("--out", type=Path, help="JSON file of every run and the rows")
    args = parser.parse_args(argv)
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        parser.error(f"unknown jobs {unknown}; known: {list(JOBS)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    prefix = f"bench-sb3-{int(time.time())}"

    def log(message: str) -> None:
        print(f"  {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)

    rows, runs = compare(jobs, args.seeds, args.workdir, amqp_url=args.amqp_url, prefix=prefix, log=log)
    print(format_table(rows))
    if args.out is not None:
        args.out.write_text(json.dumps({"rows": [r.to_dict() for r in rows], "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
