"""The first run a user makes: ``warren run --collectors 2`` with the defaults, over many seeds and repeats.

The README's quick start without Docker must reach its stop value every time. This case runs the
defaults (or ``--config``) as a user does, one run at a time, each seed ``--repeats``
times (a seed fixes the envs and the networks' first weights; the runs of one seed still
differ in how the processes interleave), and reports how many reached the stop value, the
spread of the time to it and of the env steps, and what the run left: the policy file's
version against the one the deciding eval ran, and that policy's mean greedy return over
``--episodes`` episodes no eval of the run played (did the stop rule keep a policy that
is there?). The time to the stop value is the deciding eval's (the confirmation's) time
from the coordinator's start; the whole command's time includes start-up and shutdown::

    python -m benchmarks.case_first_run --seeds 0 1 2 3 4 5 6 7 8 9 --repeats 3
    python -m benchmarks.case_first_run --config configs/acrobot_dqn.toml --seeds 0 1 2 3 4 --repeats 1
    python -m benchmarks --cases first-run        # seeds 0-9, --repeats (default 5) each

Skipped with ``--quick``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import procs
from benchmarks.common import CaseContext, CaseResult
from benchmarks.stats import Row, Series, format_table
from benchmarks.stop_rule import TRUTH_SEED

NAME = "first-run"
TITLE = "first run"
#: Seeds of the suite's run (``python -m benchmarks``), each run ``--repeats`` times.
SEEDS = tuple(range(10))
#: Greedy episodes that tell the return of the policy a run left.
EPISODES = 100
#: Safety cap of one run (the defaults' own budget is 2M env steps).
MAX_TIME_S = 600


def run_once(
    workdir: Path, seed: int, *, amqp_url: str, prefix: str, config: Path | None, episodes: int
) -> dict[str, Any]:
    """One ``warren run --collectors 2 --seed SEED``: its outcome, times, env steps and the policy it left."""
    argv = procs.python_module(
        "worker.cli", "run", "--collectors", "2", "--seed", str(seed), "--prefix", prefix,
        "--workdir", str(workdir), "--progress", "off", "--log-level", "WARNING", "--max-time-s", str(MAX_TIME_S),
        *(["--config", str(config)] if config is not None else []),
    )  # fmt: skip
    env = {**os.environ, "WARREN_AMQP_URL": amqp_url, "PYTHONPATH": str(procs.REPO_ROOT)}
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=MAX_TIME_S + 120, check=False)
    command_s = time.monotonic() - started
    summary_file = workdir / "summary.json"
    if not summary_file.exists():
        return {"seed": seed, "success": False, "exit_code": done.returncode, "stderr": done.stderr[-1500:]}
    summary = json.loads(summary_file.read_text())
    records = [json.loads(line) for line in (workdir / "run.jsonl").read_text().splitlines()]
    deciding = next((r for r in records if r["kind"] == "eval" and r.get("success")), None)
    result: dict[str, Any] = {
        "seed": seed,
        "success": bool(summary["success"]),
        "exit_code": done.returncode,
        "reason": summary["reason"],
        "seconds": deciding["elapsed_s"] if deciding else None,
        "env_steps": deciding["env_steps"] if deciding else summary["env_steps"],
        "command_s": round(command_s, 2),
        "evals": summary["evals"],
        "best_eval": summary["best_eval"],
        "policy_evaluated": summary.get("policy_evaluated"),
        "policy_left": summary.get("policy_left"),
        "stderr": "" if summary["success"] else done.stderr[-1500:],
    }
    left = greedy_return(workdir, episodes)
    if left is not None:
        result["policy_file_version"], result["policy_left_return"] = left
    return result


def greedy_return(workdir: Path, episodes: int) -> tuple[int, float] | None:
    """The version of the policy file a run left and its mean return over ``episodes`` greedy episodes.

    The episodes are seeded apart from the run's evals and confirmations, one an env, all
    stepped together, as a collector's eval task steps them.
    """
    from worker.inprocess import job_envs
    from worker.job import JobConfig
    from worker.rl.rollout import Rollout
    from worker.storage import PolicySnapshot, PolicyStore

    job = JobConfig.load(workdir / "job.json")
    algorithm = job.bound
    snapshot = PolicyStore(workdir / "policy").read(
        job.coordinator.policy_name, numpy=algorithm.kind != "none" and algorithm.weights_format == "numpy"
    )
    if snapshot is None:
        return None
    policy: PolicySnapshot = snapshot

    class Source:
        def read(self) -> PolicySnapshot:
            return policy

    class Nowhere:
        def add_chunk(self, samples: Any, meta: dict[str, Any]) -> None:
            pass

        def add_info(self, info: dict[str, Any]) -> None:
            pass

    spec = job.confirm_spec(job.coordinator.policy_name)
    spec = dataclasses.replace(spec, env=dataclasses.replace(spec.env, env_num=episodes, seed=TRUTH_SEED))
    envs = job_envs(job, episodes, TRUTH_SEED)
    try:
        rollout = Rollout(spec, algorithm, envs, Nowhere(), Source(), stop=threading.Event())
        rollout.run()
        return policy.iter, round(float(rollout.finish_info().reward_mean), 1)
    finally:
        envs.close()


def measure(
    seeds: list[int],
    repeats: int,
    workdir: Path,
    *,
    amqp_url: str,
    prefix: str,
    config: Path | None = None,
    episodes: int = EPISODES,
    log: Any = print,
) -> tuple[list[Row], list[dict[str, Any]]]:
    """Every seed ``repeats`` times, one run at a time; the table's rows and every run's record."""
    runs: list[dict[str, Any]] = []
    for repeat in range(repeats):
        for seed in seeds:
            run_dir = workdir / f"seed{seed}-r{repeat}"
            result = run_once(
                run_dir, seed, amqp_url=amqp_url, prefix=f"{prefix}-{seed}-{repeat}", config=config, episodes=episodes
            )
            result["repeat"] = repeat
            runs.append(result)
            log(f"seed {seed} repeat {repeat}: {shown(result)}")
            for sub in ("data", "tensorboard"):  # what is big, or of no use once measured
                subprocess.run(["rm", "-rf", str(run_dir / sub)], check=False)
    return rows(runs, config, episodes), runs


def shown(result: dict[str, Any]) -> str:
    """A run's outcome in a log line."""
    left = result.get("policy_left_return")
    tail = f"; policy file {result.get('policy_file_version')} returns {left} over the extra episodes"
    if not result["success"]:
        return f"did NOT reach the stop value (exit {result['exit_code']}, best {result.get('best_eval')}){tail}"
    return (
        f"{result['seconds']:.1f} s, {result['env_steps']:,} env steps, command {result['command_s']:.1f} s, "
        f"policy evaluated {result['policy_evaluated']}{tail}"
    )


def rows(runs: list[dict[str, Any]], config: Path | None, episodes: int) -> list[Row]:
    """The table: how many reached the stop value, the spread of time and env steps, the policy left."""
    job = config.stem if config is not None else "defaults"
    ok = [r for r in runs if r["success"]]
    kept = [r for r in ok if r.get("policy_file_version") == r["policy_evaluated"]]
    returns = [r["policy_left_return"] for r in ok if r.get("policy_left_return") is not None]
    case = f"{TITLE} ({job})"
    return [
        Row(case, "runs reaching the stop value", "runs", "higher", Series.of([len(ok)]),
            reference=f"{len(ok)} of {len(runs)}; target: every run", notes={"runs": len(runs)}),
        Row(case, "time to the stop value (confirmed eval)", "s", "lower", Series.of(r["seconds"] for r in ok),
            reference="from the coordinator's start"),
        Row(case, "whole command, start to exit", "s", "lower", Series.of(r["command_s"] for r in ok)),
        Row(case, "env steps to the stop value", "env steps", "lower", Series.of(r["env_steps"] for r in ok)),
        Row(case, f"policy left: mean return over {episodes} other episodes", "return", "higher",
            Series.of(returns), reference=f"policy file = policy evaluated in {len(kept)} of {len(ok)}"),
    ]  # fmt: skip


def run(ctx: CaseContext) -> CaseResult:
    if ctx.quick:
        ctx.log("skipped with --quick")
        return CaseResult([], {"skipped": "--quick"})
    table, runs = measure(
        list(SEEDS), ctx.repeats, ctx.workdir / NAME, amqp_url=ctx.broker.amqp_url,
        prefix=ctx.broker.sub_prefix("first"), log=ctx.log,
    )  # fmt: skip
    return CaseResult(table, {"runs": runs, "successes": sum(r["success"] for r in runs)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.case_first_run", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--config", type=Path, help="a job file (default: the defaults, as `warren run` runs them)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--repeats", type=int, default=1, help="runs of each seed")
    parser.add_argument("--episodes", type=int, default=EPISODES, help="greedy episodes of the policy left")
    parser.add_argument(
        "--amqp-url", default=os.environ.get("WARREN_AMQP_URL", "amqp://guest:guest@localhost:5672/%2F")
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/warren-first-run"))
    parser.add_argument("--out", type=Path, help="JSON of every run and the table (default benchmarks/results/...)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or not 1 <= args.episodes <= 256:
        parser.error("--repeats must be at least 1 and --episodes 1 to 256")
    args.workdir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")

    def log(message: str) -> None:
        print(f"  {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)

    table, runs = measure(
        args.seeds, args.repeats, args.workdir / stamp, amqp_url=args.amqp_url, prefix=f"bench-first-{stamp}",
        config=args.config, episodes=args.episodes, log=log,
    )  # fmt: skip
    text = format_table(table)
    print(text)
    out = args.out or procs.REPO_ROOT / "benchmarks" / "results" / f"first-run-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "command": ["python", "-m", "benchmarks.case_first_run", *(argv if argv is not None else sys.argv[1:])],
        "started": stamp,
        "table": text,
        "rows": [row.to_dict() for row in table],
        "runs": runs,
    }
    out.write_text(json.dumps(report, indent=2, default=str))
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
