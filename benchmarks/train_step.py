"""``python -m benchmarks.train_step``: one train step of each built-in algorithm, numpy against torch, on one thread.

For the shipped CartPole and Pendulum jobs (their networks, batch sizes and
hyperparameters), three implementations of the same step on the same batches:

* ``numpy``: warren's numpy step (what MLP jobs run, ``algorithm.backend = "auto"``);
* ``torch``: warren's torch step (what every other model runs, ``backend = "torch"``);
* ``raw torch``: a hand-written torch step (:mod:`benchmarks.raw_steps`), the floor
  that warren's torch step is held to.

Each is warmed up, then the three run in turns (the order rotated every repeat), a block
of steps per turn; a cell is the median CPU time of one step over the repeats, with the
fastest and slowest (the JSON holds wall-clock times too). No broker, no files: it takes
about a minute. It prints one table and writes JSON to ``--out`` (default
``benchmarks/results/train_step.json``).
"""

from __future__ import annotations

from worker.lifecycle import single_threaded_math

single_threaded_math()  # one BLAS thread, as warren's learner runs: before numpy loads

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks import raw_steps  # noqa: E402
from benchmarks.sysinfo import load_average, machine, versions  # noqa: E402
from worker.job import JobConfig  # noqa: E402
from worker.lifecycle import limit_torch_threads  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).parent / "results" / "train_step.json"
VARIANTS = ("numpy", "torch", "raw torch")
Step = Callable[[Any], dict[str, float]]


@dataclass(frozen=True)
class Case:
    name: str
    config: str | None
    """The job file (``None``: the defaults, ``warren run``'s job)."""
    what: str


CASES = (
    Case("dqn-cartpole", "configs/cartpole_dqn.toml", "DQN, 64x64 ReLU, batch 64"),
    Case("dqn-default", None, "DQN, 128x128 ReLU, batch 256 (warren run)"),
    Case("ppo-cartpole", "configs/cartpole_ppo.toml", "PPO, 64x64 tanh, two bodies, minibatch 256"),
    Case("sac-pendulum", "configs/pendulum_sac.toml", "SAC, 64+64 ReLU, batch 256"),
)


def job(case: Case, backend: str) -> JobConfig:
    path = ROOT / case.config if case.config else None
    return JobConfig.load(path, **{"algorithm.backend": backend})


def batches(case: Case, job: JobConfig, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Random batches of the job's shapes: replay batches (DQN, SAC) or PPO minibatches."""
    rng = np.random.default_rng(seed)
    algo = job.bound
    obs_dim = int(np.prod(algo.spaces.observation.shape))  # type: ignore[arg-type]
    cfg: Any = algo.config
    out = []
    for _ in range(count):
        if case.name.startswith("ppo"):
            n = cfg.minibatch_size
            out.append(
                {
                    "obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
                    "actions": rng.integers(0, int(algo.spaces.action.n), n),  # type: ignore[attr-defined]
                    "old_logp": rng.normal(-0.7, 0.1, n).astype(np.float32),
                    "old_values": rng.normal(size=n).astype(np.float32),
                    "advantages": rng.normal(size=n).astype(np.float32),
                    "returns": rng.normal(size=n).astype(np.float32),
                }
            )
            continue
        n = cfg.batch_size
        batch: dict[str, Any] = {
            "obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
            "next_obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
            "reward": rng.normal(size=n).astype(np.float32),
            "done": rng.random(n) < 0.05,
        }
        action = algo.spaces.action
        if case.name.startswith("dqn"):
            batch["action"] = rng.integers(0, int(action.n), n)  # type: ignore[attr-defined]
        else:
            low, high = action.low, action.high  # type: ignore[attr-defined]
            batch["action"] = rng.uniform(low, high, size=(n, len(low))).astype(np.float32)
        out.append(batch)
    return out


def warren_step(case: Case, backend: str) -> Step:
    """The learner's train step for ``backend`` (:attr:`DQNLearner.step` and the others'), taking :func:`batches`'."""
    learner: Any = job(case, backend).bound.make_learner(seed=0)
    if case.name.startswith("ppo"):
        from worker.algorithms.ppo.batch import Batch

        return lambda mb: learner.step.train_step(Batch(**mb))
    step: Step = learner.step.train_step
    return step


def raw_step(case: Case) -> Step:
    algo: Any = job(case, "torch").bound
    cfg, spaces, hidden = algo.config, algo.spaces, list(algo.model.config.hidden_sizes)
    obs_dim = int(np.prod(spaces.observation.shape))
    if case.name.startswith("dqn"):
        return raw_steps.dqn_step(obs_dim, int(spaces.action.n), hidden, cfg)
    if case.name.startswith("ppo"):
        return raw_steps.ppo_step(obs_dim, int(spaces.action.n), hidden, cfg)
    action = spaces.action
    return raw_steps.sac_step(obs_dim, len(action.low), hidden[-1], low=action.low, high=action.high, cfg=cfg)


def measure(case: Case, repeats: int, block_s: float) -> dict[str, dict[str, list[float]]]:
    """Milliseconds per step of each variant, one value per repeat: CPU time (``cpu``) and wall-clock (``wall``).

    CPU time is the process's: on a machine shared with other work it leaves out the time
    the step waited for a core, which wall-clock time counts.
    """
    data = batches(case, job(case, "auto"), 16)
    steps = {"numpy": warren_step(case, "numpy"), "torch": warren_step(case, "torch"), "raw torch": raw_step(case)}
    sizes: dict[str, int] = {}
    for name, step in steps.items():  # warm up, and size each block to about block_s
        for batch in data:
            step(batch)
        started = time.perf_counter()
        for batch in data * 4:
            step(batch)
        per_step = (time.perf_counter() - started) / (4 * len(data))
        sizes[name] = max(len(data), round(block_s / per_step / len(data)) * len(data))
    times: dict[str, dict[str, list[float]]] = {name: {"cpu": [], "wall": []} for name in steps}
    order = list(steps)
    for repeat in range(repeats):
        for name in order[repeat % len(order) :] + order[: repeat % len(order)]:
            step, count = steps[name], sizes[name]
            wall, cpu = time.perf_counter(), time.process_time()
            for i in range(count):
                step(data[i % len(data)])
            times[name]["cpu"].append((time.process_time() - cpu) / count * 1e3)
            times[name]["wall"].append((time.perf_counter() - wall) / count * 1e3)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_step", description=__doc__)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--block-s", type=float, default=0.25, help="seconds of steps per turn")
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    limit_torch_threads(1)
    wanted = args.cases.split(",")
    unknown = sorted(set(wanted) - {c.name for c in CASES})
    if unknown:
        parser.error(f"unknown cases {unknown}")
    load_before = load_average()
    results: dict[str, Any] = {}
    print("CPU ms per step, median (min-max) over the repeats")
    print(f"{'case':<14} {'step':<48} " + " ".join(f"{v:>22}" for v in VARIANTS))
    for case in CASES:
        if case.name not in wanted:
            continue
        times = measure(case, args.repeats, args.block_s)
        results[case.name] = {"what": case.what, "ms_per_step": times}
        cells = [f"{statistics.median(t['cpu']):.3f} ({min(t['cpu']):.3f}-{max(t['cpu']):.3f})" for t in times.values()]
        print(f"{case.name:<14} {case.what:<48} " + " ".join(f"{c:>22}" for c in cells), flush=True)
    report = {
        "command": "python -m benchmarks.train_step " + " ".join(argv if argv is not None else sys.argv[1:]),
        "results": results,
        "versions": versions(),
        "machine": machine(),
        "load_average": {"before": load_before, "after": load_average()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
