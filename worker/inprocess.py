"""A whole job in one process, without broker or files: collect, learn, evaluate, in turn.

The same pieces the distributed job runs (the env batch, the algorithm's actor in a
:class:`~worker.rl.rollout.Rollout`, chunks checked by :func:`~worker.rl.chunks.read_chunk`,
the algorithm's learner), wired directly: a collect task's chunks go straight into the
learner, and the actor reads the learner's newest published weights. It is the quickest
way to try an algorithm's settings (``scripts/train_inprocess.py``), the single-process
baseline of the benchmarks, and what ``warren check`` drives.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from worker.job import JobConfig
from worker.plugins import Learner, installed
from worker.plugins.binding import env_plugin, make_env_context
from worker.protocol import CollectorSpec
from worker.rl.chunks import ChunkLayout, read_chunk
from worker.rl.envs import VecEnvBatch
from worker.rl.rollout import Rollout
from worker.storage.policy_format import PolicySnapshot


class _LearnerSink:
    """A sample sink that hands each chunk to the learner, checked as the learner process checks it."""

    def __init__(self, run: InProcessJob) -> None:
        self.run = run
        self.samples = 0

    def add_chunk(self, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        run = self.run
        chunk = read_chunk(samples, run.layout, run.spaces, int(meta["policy_iter"]))
        self.samples += run.learner.add(chunk)

    def add_info(self, info: dict[str, Any]) -> None:
        pass


class _NullSink:
    def add_chunk(self, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        pass

    def add_info(self, info: dict[str, Any]) -> None:
        pass


class InProcessJob:
    """One job's collection, training and evaluation in this process; see the module docstring.

    Args:
        job: the job (its algorithm, model, env and collector sections are used).
        seed: seeds the envs and the learner (default: the job's).
    """

    def __init__(self, job: JobConfig, seed: int | None = None) -> None:
        self.job = job
        self.seed = job.env.seed if seed is None else seed
        self.algorithm = job.bound
        assert job.spaces is not None
        self.spaces = job.spaces
        self.layout = ChunkLayout.of_algorithm(self.algorithm)
        self.learner: Learner = self.algorithm.make_learner(self.seed)
        self.envs = job_envs(job, job.env.collector_env_num, self.seed)
        self.env_steps = 0
        self.updates = 0
        self._snapshot = self.publish()

    def publish(self) -> PolicySnapshot:
        """Make the learner's current weights the ones actors load (the distributed job's policy file)."""
        self._snapshot = PolicySnapshot(self.learner.actor_weights(), self.learner.version)
        return self._snapshot

    def read(self) -> PolicySnapshot | None:
        """The :class:`~worker.rl.rollout.PolicySource` side: the last published weights."""
        return self._snapshot

    def collect(self, spec: CollectorSpec | None = None) -> int:
        """Run one collect task (the job's, at the current env step count) into the learner; returns its env steps."""
        spec = spec or self.job.collect_spec(self.env_steps)
        sink = _LearnerSink(self)
        rollout = Rollout(spec, self.algorithm, self.envs, sink, self, stop=threading.Event())
        rollout.run()
        steps = rollout.finish_info().step_count
        self.env_steps += steps
        return steps

    def train(self, *, publish_every: int = 0) -> int:
        """Run every update the learner can run now; returns how many. Publishes the weights after them,
        and every ``publish_every`` updates along the way (0: only at the end)."""
        done = 0
        while self.learner.can_update():
            self.learner.update()
            done += 1
            if publish_every and done % publish_every == 0:
                self.publish()
        self.updates += done
        if done:
            self.publish()
        return done

    def evaluate(self, seed: int | None = None, spec: CollectorSpec | None = None) -> float:
        """The mean return of one eval task with the published weights (fresh envs): the job's, or ``spec``."""
        spec = spec or self.job.eval_spec()
        envs = job_envs(self.job, spec.env.env_num, spec.env.seed if seed is None else seed)
        try:
            rollout = Rollout(spec, self.algorithm, envs, _NullSink(), self, stop=threading.Event())
            rollout.run()
            return float(rollout.finish_info().reward_mean)
        finally:
            envs.close()

    def close(self) -> None:
        self.envs.close()


def job_envs(job: JobConfig, num_envs: int, seed: int | None, threads: int = 1) -> VecEnvBatch:
    """``num_envs`` envs of the job's env, made by its env plug-in as a collector makes them."""
    plugin = env_plugin(installed(), job.env.plugin, job.env.plugin_version)
    ctx = make_env_context(job.env.id, num_envs, kwargs=job.env.kwargs, seed=seed, threads=threads)
    return VecEnvBatch(plugin, ctx)
