"""warren against Stable-Baselines3 on the shipped jobs: wall-clock from process start to the stop value.

For each job and seed, alternating which goes first: ``warren run --config configs/<job>
--collectors 2`` and :mod:`benchmarks.sb3_peer` (single process, rl-baselines3-zoo's
hyperparameters for the env, torch's threads as SB3 leaves them, as a user runs it;
``--sb3-threads 1`` pins it to one thread, a labelled second variant), both evaluated the same way: the
deterministic policy, the job's ``evaluator_env_num x eval_episodes`` episodes, every
``eval_interval_s`` seconds of wall time, and an evaluation at the stop value ends the run
only with a policy that trained (one update at least) and once the job's
``confirm_episodes`` other episodes of that policy reach the stop value too. A run's time
is from the moment its process was started (imports and start-up included) to the
wall-clock time of that confirmation (the evaluation that ended the run); its env steps
are those counted then. An evaluation at the stop value that did not end the run (an
untrained policy, a confirmation that missed) is no time to solve. A seed that does not
reach the stop value within the budget is a failure, reported as such.

A long benchmark (:attr:`Job.fixed_budget`: HalfCheetah, whose runs on 2 cores may or may
not reach the registered threshold within the budget) is measured the other way round:
both sides run for the same wall-clock budget, and a run's figure is the mean return of
its last evaluation that ended within the budget (counted from process start), with the
env steps of then; a run that reaches the stop value ends there, so its figure is that
evaluation's. A run with no evaluation within the budget is a failure. The time to the
stop value of the runs that reached it is a third row, with how many did.

``python -m benchmarks --cases sb3`` runs the quick jobs (:data:`DEFAULT_JOBS`, 3 seeds);
``python -m benchmarks.case_sb3 --jobs lunarlander_ppo,pendulum_sac --seeds 0 1 2 3 4``
any of :data:`JOBS`, with their budgets (the long ones take hours on 2 cores).
``--sides warren --warren-set SECTION.KEY=VALUE`` runs warren's side alone on a variant of a
job (a setting measured both ways), each run recorded with the settings it changed.

It is one case, over 400 lines: running both sides, reading their evaluations the same
way and comparing them are the one rule above, and split they would only restate it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
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
    fixed_budget: bool = False
    """Measured by the return reached within ``budget_s``, not by the time to the stop value."""


JOBS: dict[str, Job] = {
    "cartpole_ppo": Job("cartpole_ppo.toml", "ppo", "CartPole-v1", 180),
    "cartpole_dqn": Job("cartpole_dqn.toml", "dqn", "CartPole-v1", 300),
    "acrobot_dqn": Job("acrobot_dqn.toml", "dqn", "Acrobot-v1", 600),
    "pendulum_sac": Job("pendulum_sac.toml", "sac", "Pendulum-v1", 600),
    "lunarlander_ppo": Job("lunarlander_ppo.toml", "ppo", "LunarLander-v3", 3600),
    "lunarlandercontinuous_sac": Job("lunarlandercontinuous_sac.toml", "sac", "LunarLanderContinuous-v3", 7200),
    "halfcheetah_sac": Job("halfcheetah_sac.toml", "sac", "HalfCheetah-v5", 1200, fixed_budget=True),
    # Memory: warren's lstm model against sb3-contrib's RecurrentPPO (rl-baselines3-zoo's ppo_lstm.yml).
    "cartpole_novel_ppo_lstm": Job("cartpole_novel_ppo_lstm.toml", "ppo_lstm", "CartPoleNoVel-v1", 900),
    "pendulum_novel_ppo_lstm": Job("pendulum_novel_ppo_lstm.toml", "ppo_lstm", "PendulumNoVel-v1", 1200),
}
#: What ``python -m benchmarks --cases sb3`` runs (minutes, not hours).
DEFAULT_JOBS = ("cartpole_ppo", "cartpole_dqn", "acrobot_dqn", "pendulum_sac")
DEFAULT_SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Eval:
    """One greedy evaluation of a run."""

    seconds: float
    """Wall-clock seconds from the start of the run's process to the evaluation's end."""
    env_steps: int
    value: float
    """Mean return of its episodes."""
    counts: bool = True
    """Whether it may count as reaching the stop value: the evaluation that ended its run (a confirmed
    one, of a policy that trained), not one that only passed (awaiting or failing its confirmation)."""


def job_settings(job: Job) -> dict[str, Any]:
    """The shipped job's stop value and evaluation rule, as the file (and warren's defaults) give them."""
    from worker.job import JobConfig

    loaded = JobConfig.load(CONFIGS / job.config)
    return {
        "stop_value": loaded.env.stop_value,
        "eval_envs": loaded.env.evaluator_env_num,
        "eval_episodes": loaded.env.eval_episodes,
        "eval_interval_s": loaded.coordinator.eval_interval_s,
        "confirm_episodes": loaded.env.confirm_episodes,
    }


#: Who runs: warren's side and SB3's.
SIDES = ("warren", "sb3")

#: The exit codes of a run that ended as planned: 0 at the stop value, 3 when its budget ran out (both sides).
FINISHED = (0, 3)


def run_bounded(argv: list[str], env: dict[str, str], budget_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; a run still going 180 s past its budget is killed and reported as such, not raised."""
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=budget_s + 180, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return subprocess.CompletedProcess(argv, -9, out, f"{err}\nkilled: still running {budget_s + 180:g} s in")


def warren_argv(job: Job, seed: int, workdir: Path, prefix: str, overrides: tuple[str, ...] = ()) -> list[str]:
    """The command of one warren run of ``job``; ``overrides`` (``SECTION.KEY=VALUE``) go as ``--set``."""
    return procs.python_module(
        "worker.cli", "run", "--config", str(CONFIGS / job.config), "--collectors", "2", "--seed", str(seed),
        "--prefix", prefix, "--workdir", str(workdir), "--progress", "off", "--log-level", "WARNING",
        "--max-time-s", str(job.budget_s), *(arg for o in overrides for arg in ("--set", o)),
    )  # fmt: skip


def run_warren(
    job: Job, seed: int, workdir: Path, amqp_url: str, prefix: str, *, overrides: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], list[Eval]]:
    argv = warren_argv(job, seed, workdir, prefix, overrides)
    env = {**os.environ, "WARREN_AMQP_URL": amqp_url, "PYTHONPATH": str(procs.REPO_ROOT)}
    started = time.time()
    done = run_bounded(argv, env, job.budget_s)
    log = workdir / "run.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, warren_evals(records, started)


def warren_evals(records: list[dict[str, Any]], started: float) -> list[Eval]:
    """The evaluations in a warren run log; the one that ended the run (``"success"``) alone counts."""
    return [
        Eval(r["time"] - started, int(r["env_steps"]), float(r["reward_mean"]), bool(r.get("success")))
        for r in records
        if r["kind"] == "eval"
    ]


#: SB3's torch and BLAS threads: 0, SB3 as a user runs it (torch's own default); ``--sb3-threads`` sets it.
SB3_THREADS = {"threads": 0}


def run_sb3(job: Job, seed: int, settings: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], list[Eval]]:
    threads = str(SB3_THREADS["threads"])
    argv = procs.python_module(
        "benchmarks.sb3_peer", "--algo", job.algo, "--env-id", job.env_id, "--seed", str(seed), "--threads", threads,
        "--stop-value", str(settings["stop_value"]), "--eval-envs", str(settings["eval_envs"]),
        "--eval-episodes", str(settings["eval_episodes"]), "--eval-interval-s", str(settings["eval_interval_s"]),
        "--confirm-episodes", str(settings["confirm_episodes"]), "--max-time-s", str(job.budget_s),
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(procs.REPO_ROOT)}
    started = time.time()
    done = run_bounded(argv, env, job.budget_s)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    evals = [
        Eval(r["t"] - started, int(r["steps"]), float(r["value"]), bool(r.get("success")))
        for r in lines
        if r.get("event") == "eval"
    ]
    return done, evals


def outcome(
    side: str,
    seed: int,
    done: subprocess.CompletedProcess[str],
    evals: list[Eval],
    *,
    stop_value: float,
    within_s: float | None = None,
) -> dict[str, Any]:
    """One run's record from its evaluations; stderr is kept for a run that failed.

    ``reached``, ``seconds`` and ``env_steps``: the first evaluation at or above
    ``stop_value`` that :attr:`Eval.counts` (else the last one's steps). With ``within_s`` (a fixed-budget job) the
    run is judged by ``return_at_budget``, its last evaluation within that many seconds,
    and ``ok`` says whether it has one and the run ended as planned (:data:`FINISHED`);
    otherwise ``ok`` is ``reached``. Evaluations timed before the run started (a log some
    earlier run left) are not the run's and are dropped.
    """
    evals = [e for e in evals if e.seconds >= 0]
    first = next((e for e in evals if e.value >= stop_value and e.counts), None)
    record: dict[str, Any] = {
        "side": side,
        "seed": seed,
        "reached": first is not None,
        "seconds": first.seconds if first else None,
        "env_steps": first.env_steps if first else (evals[-1].env_steps if evals else None),
        "best": max((e.value for e in evals), default=None),
        "exit_code": done.returncode,
    }
    if within_s is None:
        record["ok"] = first is not None
    else:
        last = next((e for e in reversed(evals) if e.seconds <= within_s), None)
        record.update(
            ok=last is not None and done.returncode in FINISHED,
            return_at_budget=last.value if last else None,
            env_steps_at_budget=last.env_steps if last else None,
            evals=[[round(e.seconds, 1), e.env_steps, round(e.value, 1)] for e in evals],
        )
    record["stderr"] = "" if record["ok"] else done.stderr[-1500:]
    return record


def job_rows(name: str, job: Job, settings: dict[str, Any], results: dict[str, list[dict[str, Any]]]) -> list[Row]:
    """The table's rows of one job: time and env steps to the stop value, or return and steps at the budget."""
    ok = {side: [r for r in results[side] if r["ok"]] for side in results}
    failed = {side: len(results[side]) - len(ok[side]) for side in results}
    said = f"failures: warren {failed['warren']}, SB3 {failed['sb3']}"
    if job.fixed_budget:
        reached = {side: [r for r in ok[side] if r["reached"]] for side in results}
        got = ", ".join(f"{side} {len(reached[side])}/{len(results[side])}" for side in results) + " reached it"
        return [
            Row(
                f"{TITLE} {name}", f"return after {job.budget_s:g} s", "return", "higher",
                Series.of(r["return_at_budget"] for r in ok["warren"]),
                Series.of(r["return_at_budget"] for r in ok["sb3"]),
                baseline_name="SB3", reference=f"last eval within the budget; {said}", notes={"failures": failed},
            ),
            Row(
                f"{TITLE} {name}", f"env steps after {job.budget_s:g} s", "env steps", "higher",
                Series.of(r["env_steps_at_budget"] for r in ok["warren"]),
                Series.of(r["env_steps_at_budget"] for r in ok["sb3"]),
                baseline_name="SB3",
            ),
            Row(
                f"{TITLE} {name}", "wall-clock to the stop value, runs that reached it", "s", "lower",
                Series.of(r["seconds"] for r in reached["warren"]), Series.of(r["seconds"] for r in reached["sb3"]),
                baseline_name="SB3", reference=f"stop {settings['stop_value']:g}; {got}",
                notes={"reached": {side: len(reached[side]) for side in results}},
            ),
        ]  # fmt: skip
    return [
        Row(
            f"{TITLE} {name}", "wall-clock to the stop value", "s", "lower",
            Series.of(r["seconds"] for r in ok["warren"]), Series.of(r["seconds"] for r in ok["sb3"]),
            baseline_name="SB3", reference=f"stop {settings['stop_value']:g}; {said}", notes={"failures": failed},
        ),
        Row(
            f"{TITLE} {name}", "env steps to the stop value", "env steps", "lower",
            Series.of(r["env_steps"] for r in ok["warren"]), Series.of(r["env_steps"] for r in ok["sb3"]),
            baseline_name="SB3",
        ),
    ]  # fmt: skip


def compare(
    jobs: list[str],
    seeds: list[int],
    workdir: Path,
    *,
    amqp_url: str,
    prefix: str,
    sb3_at_once: int = 1,
    budget_s: float | None = None,
    sides: tuple[str, ...] = SIDES,
    overrides: tuple[str, ...] = (),
    out: Path | None = None,
    log: Any = print,
) -> tuple[list[Row], list[dict[str, Any]]]:
    """Every job on every seed, on ``sides``: the table's rows and every run's record.

    ``budget_s`` replaces each job's own budget; ``overrides`` change warren's job settings
    (a variant of a shipped job, such as one setting measured both ways: warren's side
    alone then); ``out`` gets the JSON of what is done after each job (a run of hours keeps
    what it measured if it is stopped).
    """
    rows: list[Row] = []
    runs: list[dict[str, Any]] = []
    for name in jobs:
        job = JOBS[name] if budget_s is None else dataclasses.replace(JOBS[name], budget_s=budget_s)
        job_rows_, job_runs = compare_job(
            name, job, seeds, workdir / prefix, amqp_url=amqp_url, prefix=prefix, sb3_at_once=sb3_at_once,
            sides=sides, overrides=overrides, log=log,
        )  # fmt: skip
        rows.extend(job_rows_)
        runs.extend(job_runs)
        if out is not None:
            out.write_text(json.dumps({"rows": [r.to_dict() for r in rows], "runs": runs}, indent=2))
    return rows, runs


def compare_job(
    name: str,
    job: Job,
    seeds: list[int],
    workdir: Path,
    *,
    amqp_url: str,
    prefix: str,
    sb3_at_once: int,
    sides: tuple[str, ...] = SIDES,
    overrides: tuple[str, ...] = (),
    log: Any,
) -> tuple[list[Row], list[dict[str, Any]]]:
    """One job on every seed, both sides, alternating which goes first; warren's runs in ``workdir/<name>-<seed>``.

    ``sb3_at_once`` > 1: SB3's runs go that many at a time, after warren's (each SB3 run
    is one thread, so two share two cores without slowing each other much: 2% measured
    here), instead of alternating one by one with warren's; for the jobs where SB3 takes
    hours a seed.
    """
    settings = job_settings(job)
    within_s = job.budget_s if job.fixed_budget else None
    results: dict[str, list[dict[str, Any]]] = {"warren": [], "sb3": []}

    def record(side: str, seed: int, done: subprocess.CompletedProcess[str], evals: list[Eval]) -> None:
        result = outcome(side, seed, done, evals, stop_value=settings["stop_value"], within_s=within_s)
        result["job"] = name
        if side == "warren" and overrides:
            result["overrides"] = list(overrides)
        results[side].append(result)
        log(f"{name} seed {seed} {side}: {shown(result)}")

    def warren(seed: int) -> None:
        # The job's index, not its name, in the queue prefix: warren adds a run id, and the whole stays under 64.
        run_prefix = f"{prefix}-{list(JOBS).index(name)}-{seed}"
        record(
            "warren",
            seed,
            *run_warren(job, seed, workdir / f"{name}-{seed}", amqp_url, run_prefix, overrides=overrides),
        )

    def sb3(seed: int) -> tuple[subprocess.CompletedProcess[str], list[Eval]]:
        return run_sb3(job, seed, settings)

    if sb3_at_once > 1:
        for seed in seeds if "warren" in sides else []:
            warren(seed)
        with ThreadPoolExecutor(max_workers=sb3_at_once) as pool:
            for seed, (done, evals) in zip(seeds, pool.map(sb3, seeds if "sb3" in sides else []), strict=False):
                record("sb3", seed, done, evals)
    else:
        for i, seed in enumerate(seeds):
            order = ["warren", "sb3"] if i % 2 == 0 else ["sb3", "warren"]
            for side in (s for s in order if s in sides):
                if side == "warren":
                    warren(seed)
                else:
                    record("sb3", seed, *sb3(seed))
    return job_rows(name, job, settings, results), results["warren"] + results["sb3"]


def shown(result: dict[str, Any]) -> str:
    """A run's outcome in a log line."""
    if "return_at_budget" in result:
        if not result["ok"]:
            said = result["stderr"].strip().splitlines()[-1:] or [""]
            return f"no evaluation within the budget; exit {result['exit_code']}: {said[0]}"
        return f"return {result['return_at_budget']:.1f} after {result['env_steps_at_budget']} env steps"
    if not result["reached"]:
        said = result["stderr"].strip().splitlines()[-1:] or [""]
        steps, best, code = result["env_steps"], result["best"], result["exit_code"]
        return f"NOT reached, {steps} env steps, best {best}; exit {code}: {said[0]}"
    return f"{result['seconds']:.1f} s, {result['env_steps']} env steps, best {result['best']}"


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
    parser.add_argument("--budget-s", type=float, help="each run's wall-clock budget (default: the job's)")
    parser.add_argument(
        "--sb3-at-once", type=int, default=1, help="SB3 runs of a job at a time, after warren's (default 1: alternate)"
    )
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated, of: warren,sb3 (default both)")
    parser.add_argument(
        "--warren-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a setting of warren's job changed (as warren run --set; repeatable), recorded with each run",
    )
    parser.add_argument(
        "--sb3-threads", type=int, default=0, help="SB3's torch threads (default 0: its own default, as users run it)"
    )
    args = parser.parse_args(argv)
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        parser.error(f"unknown jobs {unknown}; known: {list(JOBS)}")
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error("--budget-s must be positive")
    if args.sb3_at_once < 1:
        parser.error("--sb3-at-once must be at least 1")
    sides = tuple(s.strip() for s in args.sides.split(",") if s.strip())
    if not sides or any(s not in SIDES for s in sides):
        parser.error(f"--sides takes a comma-separated list of {','.join(SIDES)}, got {args.sides!r}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    SB3_THREADS["threads"] = max(0, args.sb3_threads)
    prefix = f"bench-sb3-{int(time.time())}"

    def log(message: str) -> None:
        print(f"  {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)

    rows, _ = compare(
        jobs,
        args.seeds,
        args.workdir,
        amqp_url=args.amqp_url,
        prefix=prefix,
        sb3_at_once=args.sb3_at_once,
        budget_s=args.budget_s,
        sides=sides,
        overrides=tuple(args.warren_set),
        out=args.out,
        log=log,
    )
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
