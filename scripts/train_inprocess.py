"""warren's training loop in one process, without a broker: the quickest way to try an algorithm's settings.

The distributed job spreads collection, training and evaluation over processes that meet
through RabbitMQ and the shared volume; here the same pieces run in turn in one process
(:class:`worker.inprocess.InProcessJob`): a collect task whose chunks go straight into
the learner, every update the learner can run, and an eval task now and then, until an
eval reaches the target or the env-step budget runs out. Any job file works::

    python scripts/train_inprocess.py --config configs/cartpole_dqn.toml --seeds 0 1 2
    python scripts/train_inprocess.py --set algorithm.lr=0.002 --set model.hidden_sizes=[64,64]

Each seed prints one JSON line: solved, env steps, updates, seconds, the last evals.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.inprocess import InProcessJob
from worker.job import JobConfig
from worker.lifecycle import limit_torch_threads


def train(job: JobConfig, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    run = InProcessJob(job, seed)
    start, next_eval = time.perf_counter(), args.eval_every
    history: list[tuple[int, float]] = []
    try:
        while run.env_steps < args.max_steps:
            run.collect()
            run.train(publish_every=args.publish_every)
            if run.env_steps >= next_eval:
                next_eval += args.eval_every
                reward = run.evaluate(seed=10_000 + seed * 1000 + len(history))
                history.append((run.env_steps, reward))
                if args.verbose:
                    print(f"  seed {seed} steps {run.env_steps} version {run.learner.version} eval {reward:.1f}")
                if reward >= args.target:
                    break
    finally:
        run.close()
    return {
        "seed": seed,
        "solved": bool(history) and history[-1][1] >= args.target,
        "env_steps": run.env_steps,
        "updates": run.updates,
        "policy_version": run.learner.version,
        "seconds": round(time.perf_counter() - start, 1),
        "evals": history,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, help="a job file (default: the shipped CartPole DQN job)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-every", type=int, default=4096, help="env steps between evals")
    parser.add_argument("--target", type=float, help="eval return that ends a seed (default: the job's stop value)")
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--publish-every", type=int, default=32, help="updates between weight publications")
    parser.add_argument("--set", action="append", default=[], help="job override, section.key=value (JSON value)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = json.loads(value)
    job = JobConfig.load(args.config, **overrides)
    if args.target is None:
        args.target = job.env.stop_value
    limit_torch_threads(1)
    print("job:", json.dumps({"algorithm": job.to_dict()["algorithm"], "model": job.to_dict()["model"]}))
    for seed in args.seeds:
        result = train(job, seed, args)
        result["evals"] = result["evals"][-5:]
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
