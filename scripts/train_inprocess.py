"""warren's training loop in one process, without a broker: the quickest way to try DQN settings.

The distributed job spreads this loop over processes (collectors, learner, coordinator);
here the same pieces of :mod:`worker.rl` run in turn: a collect task (a :class:`Rollout`
whose sink fills the replay buffer and whose policy source is the learner itself), then
train steps at the spec's replay ratio, and every ``--eval-every`` env steps a greedy
eval task (1 episode on each of 5 envs), until the eval return reaches ``--target``.
One JSON line per seed: solved or not, env steps, train steps, seconds, the last evals.

    python scripts/train_inprocess.py --seeds 0 1 2
    python scripts/train_inprocess.py --set lr=5e-4 --set target_update_interval=250

``tests/unit/test_train_inprocess.py`` runs it with a small budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from worker.protocol import CollectorSpec, EnvSpec, PolicySpec
from worker.rl.config import LearnerSpec
from worker.rl.dqn import ReplayBuffer
from worker.rl.envs import VecEnvBatch
from worker.rl.fast_dqn import NumpyDQNLearner
from worker.rl.policy import limit_torch_threads
from worker.rl.rollout import Rollout
from worker.storage import PolicySnapshot

ENV_ID = "CartPole-v1"


class ReplaySink:
    """Sink that feeds sample chunks straight into the replay buffer."""

    def __init__(self, buffer: ReplayBuffer) -> None:
        self.buffer = buffer

    def add_chunk(self, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        self.buffer.add(samples)

    def add_info(self, info: dict[str, Any]) -> None:
        pass


class LearnerSource:
    """Policy source that hands out the learner's weights as of its last :meth:`publish`.

    Publishing only every few train steps mimics the policy lag of the distributed job,
    where collectors re-read the policy file every ``update_policy_second``.
    """

    def __init__(self, learner: NumpyDQNLearner) -> None:
        self.learner = learner
        self.snapshot = PolicySnapshot(learner.policy_state(), learner.iter)

    def publish(self) -> None:
        self.snapshot = PolicySnapshot(self.learner.policy_state(), self.learner.iter)

    def read(self) -> PolicySnapshot | None:
        return self.snapshot


def evaluate(source: LearnerSource, hidden: tuple[int, ...], seed: int) -> float:
    spec = CollectorSpec(
        env=EnvSpec(ENV_ID, 5, seed=seed),
        policy=PolicySpec("dqn", hidden),
        n_episode=1,
        eval_flag=True,
        policy_update_path="in-process",
    )
    rollout = Rollout(spec, ReplaySink(ReplayBuffer(1, 4)), source, stop=threading.Event())
    rollout.run()
    return float(rollout.finish_info().reward_mean)


def train(seed: int, spec: LearnerSpec, args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    learner = NumpyDQNLearner(spec, obs_dim=4, n_actions=2, seed=seed)
    buffer = ReplayBuffer(spec.replay_capacity, 4, n_actions=2)
    sink, source = ReplaySink(buffer), LearnerSource(learner)
    envs = VecEnvBatch(ENV_ID, args.env_num, seed=seed * 1000) if args.persistent_envs else None
    start, credit, next_eval, task = time.perf_counter(), 0.0, args.eval_every, 0
    history: list[tuple[int, float]] = []
    while buffer.total_added < args.max_steps:
        task += 1
        # -- collect one task
        collect = CollectorSpec(
            env=EnvSpec(ENV_ID, args.env_num, seed=seed * 1000 + task * args.env_num),
            policy=PolicySpec("dqn", spec.hidden_sizes),
            n_sample=args.n_sample,
            traj_len=args.traj_len,
            eps=spec.epsilon(buffer.total_added),
            policy_update_path="in-process",
        )
        before = buffer.total_added
        Rollout(collect, sink, source, stop=threading.Event(), envs=envs).run()
        # -- train at the replay ratio
        if len(buffer) >= spec.learning_starts:
            credit += (buffer.total_added - before) * spec.train_steps_per_sample
            while credit >= 1.0:
                learner.train_step(buffer.sample_arrays(spec.batch_size, rng))
                credit -= 1.0
                if learner.iter % args.publish_every == 0:
                    source.publish()
        # -- eval
        if buffer.total_added >= next_eval:
            next_eval += args.eval_every
            current = LearnerSource(learner)  # eval the newest weights, as the distributed job would
            reward = evaluate(current, spec.hidden_sizes, seed=10_000 + task)
            history.append((buffer.total_added, reward))
            if args.verbose:
                print(f"  seed {seed} steps {buffer.total_added} iter {learner.iter} eval {reward:.1f}", flush=True)
            if reward >= args.target:
                break
    if envs is not None:
        envs.close()
    solved = bool(history) and history[-1][1] >= args.target
    return {
        "seed": seed,
        "solved": solved,
        "env_steps": buffer.total_added,
        "train_iter": learner.iter,
        "seconds": round(time.perf_counter() - start, 1),
        "evals": history,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--env-num", type=int, default=64)
    parser.add_argument("--n-sample", type=int, default=4096)
    parser.add_argument("--traj-len", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=4096)
    parser.add_argument("--target", type=float, default=195.0)
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--publish-every", type=int, default=32, help="train steps between policy publications")
    parser.add_argument("--fresh-envs", dest="persistent_envs", action="store_false")
    parser.add_argument("--set", action="append", default=[], help="LearnerSpec override, key=value (JSON value)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = json.loads(value)
    spec = dataclasses.replace(LearnerSpec(), **overrides)
    limit_torch_threads(1)
    print("spec:", spec)
    for seed in args.seeds:
        result = train(seed, spec, args)
        result["evals"] = result["evals"][-5:]
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
