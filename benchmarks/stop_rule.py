"""How often an eval at the stop value passes a policy that is not there: a single eval against a confirmed one.

In one process (:class:`worker.inprocess.InProcessJob`, no broker), per seed: train the
job, evaluate it every ``--eval-every`` env steps as the coordinator does (the job's
``evaluator_env_num x eval_episodes`` greedy episodes), and at every eval that reaches the
stop value with a policy that trained, run the same weights over ``--truth`` other
episodes (the policy's return, as near as that many episodes tell) and over the job's
confirmation (``confirm_episodes`` episodes, seeded as the coordinator seeds them).
Training goes on until a pass is confirmed, or ``--max-steps``.

Reported per job: the seeds whose *first* single pass (where the run used to stop) was
of a policy whose truth is below the stop value, and the same for the first *confirmed*
pass (where it stops now); every pass and what the confirmation cost in env steps and
seconds::

    python -m benchmarks.stop_rule --seeds 0 1 2 3 4 5 6 7 8 9
    python -m benchmarks.stop_rule --config configs/acrobot_dqn.toml --eval-every 4096 --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from worker.inprocess import InProcessJob
from worker.job import JobConfig
from worker.lifecycle import limit_torch_threads

#: The seed of the truth's first env: apart from the evals' (seed + 10,000) and the confirmation's (+ 20,000).
TRUTH_SEED = 50_000


def truth_spec(job: JobConfig, episodes: int) -> Any:
    """``episodes`` greedy episodes at once, one an env, seeded apart from the run's evals."""
    spec = job.confirm_spec(job.coordinator.policy_name)
    return dataclasses.replace(spec, env=dataclasses.replace(spec.env, env_num=episodes, seed=TRUTH_SEED))


def one_seed(job: JobConfig, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``job`` on ``seed`` until a pass is confirmed or ``args.max_steps``; every pass with its truth."""
    run = InProcessJob(job, seed)
    stop, passes = job.env.stop_value, list[dict[str, Any]]()
    started, next_eval, evals = time.perf_counter(), args.eval_every, 0
    confirm = job.confirm_spec(job.coordinator.policy_name) if job.env.confirm_episodes else None
    try:
        while run.env_steps < args.max_steps:
            run.collect()
            run.train(publish_every=args.publish_every)
            if run.env_steps < next_eval:
                continue
            next_eval += args.eval_every
            evals += 1
            value = run.evaluate()
            version = run.learner.version
            if value < stop or version < 1:
                continue
            confirmed_at = time.perf_counter()
            confirmation = run.evaluate(spec=confirm) if confirm is not None else None
            confirm_s = time.perf_counter() - confirmed_at
            passes.append(
                {
                    "env_steps": run.env_steps,
                    "seconds": round(confirmed_at - started, 2),
                    "policy": version,
                    "eval": round(value, 1),
                    "confirmation": None if confirmation is None else round(confirmation, 1),
                    "confirm_s": round(confirm_s, 3),
                    "truth": round(run.evaluate(spec=truth_spec(job, args.truth)), 1),
                }
            )
            if confirmation is None or confirmation >= stop:
                break
    finally:
        run.close()
    first = passes[0] if passes else None
    confirmed = next((p for p in passes if p["confirmation"] is None or p["confirmation"] >= stop), None)
    return {
        "seed": seed,
        "evals": evals,
        "passes": passes,
        "single_false": first is not None and first["truth"] < stop,
        "confirmed_false": confirmed is not None and confirmed["truth"] < stop,
        "single": first,
        "confirmed": confirmed,
    }


def summarise(name: str, stop: float, results: list[dict[str, Any]]) -> dict[str, Any]:
    single = [r["single"] for r in results if r["single"] is not None]
    confirmed = [r["confirmed"] for r in results if r["confirmed"] is not None]
    passes = [p for r in results for p in r["passes"]]
    cost = [c["env_steps"] - s["env_steps"] for r in results if (s := r["single"]) and (c := r["confirmed"])]
    return {
        "job": name,
        "stop_value": stop,
        "seeds": len(results),
        "passes": len(passes),
        "passes_below_stop": sum(p["truth"] < stop for p in passes),
        "confirmations_passed_below_stop": sum(
            p["truth"] < stop and p["confirmation"] is not None and p["confirmation"] >= stop for p in passes
        ),
        "stopped_single": len(single),
        "stopped_single_below_stop": sum(r["single_false"] for r in results),
        "stopped_confirmed": len(confirmed),
        "stopped_confirmed_below_stop": sum(r["confirmed_false"] for r in results),
        "extra_env_steps_median": statistics.median(cost) if cost else None,
        "confirm_s_median": statistics.median(p["confirm_s"] for p in passes) if passes else None,
        "truth_at_single": [s["truth"] for s in single],
        "truth_at_confirmed": [c["truth"] for c in confirmed],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stop_rule", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, help="a job file (default: warren's defaults)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--eval-every", type=int, default=32_768, help="env steps between evals")
    parser.add_argument("--max-steps", type=int, help="env steps per seed (default: the job's max_env_steps)")
    parser.add_argument("--truth", type=int, default=100, help="episodes that tell a policy's return")
    parser.add_argument("--publish-every", type=int, default=32, help="updates between weight publications")
    parser.add_argument("--set", action="append", default=[], help="job override, section.key=value (JSON value)")
    parser.add_argument("--out", type=Path, help="JSON of every seed")
    args = parser.parse_args(argv)
    overrides = {key: json.loads(value) for key, _, value in (item.partition("=") for item in args.set)}
    job = JobConfig.load(args.config, **overrides)
    args.max_steps = args.max_steps or job.coordinator.max_env_steps
    limit_torch_threads(1)
    results = []
    for seed in args.seeds:
        result = one_seed(job, seed, args)
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "passes"}), file=sys.stderr, flush=True)
    name = args.config.stem if args.config else "defaults"
    summary = summarise(name, job.env.stop_value, results)
    print(json.dumps(summary))
    if args.out is not None:
        args.out.write_text(json.dumps({"summary": summary, "args": vars(args) | {"config": str(args.config)},
                                        "seeds": results}, indent=2, default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
