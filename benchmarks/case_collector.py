"""Collector speed: env steps/s of one rollout, with and without its communication.

Three variants of the same work, CartPole-v1 with 64 envs and the shipped job's DQN
(its ``mlp`` model, 128x128), in this one process:

* ``bare``: a plain loop with no warren code: gymnasium's vector env, a numpy forward
  pass and epsilon-greedy actions, the step written into preallocated ``[64, 64]``
  arrays. What the machine can do; the baseline of ``null``.
* ``null``: :class:`worker.rl.rollout.Rollout` with the job's algorithm (its actor) and
  env batch, and a sink that drops every chunk.
* ``comm``: the same Rollout with :class:`worker.collector.sink.BrokerSink`: an atomic
  step file per 64x64 chunk, then a persistent metadata message through a
  :class:`messaging.ConfirmedPublisher` (a window of confirms, no wait per message), the
  task's metadata queue read by the :mod:`benchmarks.drain` child. Its baseline is ``null``.

Two policies, because the info rate follows the episode length:

* ``eps 1.0``: random actions through the DQN forward pass (start of training):
  ~22-step episodes;
* ``balancing``: a Q-network whose weights encode a stabilising linear controller
  (like a trained agent) with eps 0.05: long episodes.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from benchmarks import procs
from benchmarks.common import CaseContext, CaseResult, Trials, alternate
from benchmarks.stats import Row
from messaging import BrokerLink, ConfirmedPublisher, MetadataPublisher, Names, Settings
from worker.algorithms.dqn import DQN
from worker.collector.sink import BrokerSink
from worker.inprocess import job_envs
from worker.job import JobConfig
from worker.protocol import CollectorSpec
from worker.rl.rollout import Rollout
from worker.storage import PolicySnapshot, StepStore

NAME = "collector"
TITLE = "collector overhead"
ENV_ID = "CartPole-v1"
ENV_NUM = 64
CHUNK_ROWS = 64
#: Push right when the pole leans or falls right: keeps CartPole-v1 up for hundreds of steps.
CONTROLLER = (0.0, 0.0, 1.0, 0.5)


def bench_job() -> JobConfig:
    """The shipped DQN job with this case's envs and chunks."""
    return JobConfig.load(None, **{"env.collector_env_num": ENV_NUM, "collector.traj_len": CHUNK_ROWS})


def _dqn() -> DQN:
    algorithm = bench_job().bound
    assert isinstance(algorithm, DQN)
    return algorithm


def random_weights() -> dict[str, torch.Tensor]:
    """The job's Q-network with seeded initial weights (what a learner publishes at version 0)."""
    weights: dict[str, torch.Tensor] = _dqn().q_network(seed=0).state_dict()
    return weights


def controller_weights() -> dict[str, torch.Tensor]:
    """Q(s, right) - Q(s, left) = CONTROLLER . s, carried through the ReLUs as relu(x) - relu(-x)."""
    net = _dqn().q_network(seed=0)
    linears = net.linear_layers()
    with torch.no_grad():
        for layer in linears:
            layer.weight.zero_()
            layer.bias.zero_()
        v = torch.tensor(CONTROLLER)
        linears[0].weight[0] = v
        linears[0].weight[1] = -v
        for layer in linears[1:-1]:
            layer.weight[0, 0] = 1.0
            layer.weight[1, 1] = 1.0
        linears[-1].weight[1, 0] = 1.0
        linears[-1].weight[1, 1] = -1.0
    weights: dict[str, torch.Tensor] = net.state_dict()
    return weights


class FixedPolicy:
    """A :class:`worker.rl.rollout.PolicySource` that always has the same weights."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.snapshot = PolicySnapshot(dict(state_dict), 0)

    def read(self) -> PolicySnapshot | None:
        return self.snapshot


class NullSink:
    """Drops every chunk and info: the rollout without any communication."""

    def __init__(self) -> None:
        self.chunks = 0

    def add_chunk(self, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        self.chunks += 1

    def add_info(self, info: dict[str, Any]) -> None:
        pass


class _Collector:
    """One policy setting: the comm-on and comm-off variants over the same env batch."""

    def __init__(
        self,
        settings: Settings,
        reader: procs.Child,
        data: Path,
        *,
        eps: float,
        weights: dict[str, Any],
    ) -> None:
        self.settings, self.reader, self.data = settings, reader, data
        self.names = Names(settings.prefix)
        self.link = BrokerLink(settings, "bench-collector").open()
        self.confirmed = ConfirmedPublisher(settings, "bench-collector-publisher").open()
        self.source = FixedPolicy(weights)
        self.job = bench_job()
        self.algorithm = self.job.bound
        self.envs = job_envs(self.job, ENV_NUM, seed=0)
        self.weights = weights
        self.eps = eps
        self.seq = 0
        self.messages: list[int] = []

    def close(self) -> None:
        self.envs.close()
        self.confirmed.close()
        self.link.close()

    def spec(self, steps: int) -> CollectorSpec:
        """The job's collect task, for ``steps`` samples at this case's eps."""
        return dataclasses.replace(
            self.job.collect_spec(0),
            n_sample=steps,
            collect_setting={"eps": self.eps},
            policy_update_path="bench",
            update_policy_second=1.0,
        )

    def _rollout(self, steps: int, sink: Any) -> tuple[Rollout, float]:
        rollout = Rollout(self.spec(steps), self.algorithm, self.envs, sink, self.source, stop=threading.Event())
        started = time.monotonic()
        rollout.run()
        return rollout, started

    def bare(self, steps: int) -> dict[str, float]:
        """The loop without warren: vector env, numpy forward, columnar buffers."""
        layers = [
            (w.numpy().T.copy(), b.numpy().copy())
            for w, b in zip(list(self.weights.values())[::2], list(self.weights.values())[1::2], strict=True)
        ]
        rng = np.random.default_rng(0)
        envs = gym.make_vec(ENV_ID, num_envs=ENV_NUM, vectorization_mode="vector_entry_point")
        obs, _ = envs.reset(seed=0)
        # The chunk layout warren writes: T + 1 rows of observations, T of the rest.
        rows: dict[str, np.ndarray] = {
            "obs": np.zeros((CHUNK_ROWS + 1, ENV_NUM, 4), np.float32),
            "action": np.zeros((CHUNK_ROWS, ENV_NUM), np.int64),
            "reward": np.zeros((CHUNK_ROWS, ENV_NUM), np.float32),
            "done": np.zeros((CHUNK_ROWS, ENV_NUM), bool),
            "truncated": np.zeros((CHUNK_ROWS, ENV_NUM), bool),
            "valid": np.ones((CHUNK_ROWS, ENV_NUM), bool),
        }
        started = time.monotonic()
        done = 0
        while done < steps:
            for t in range(CHUNK_ROWS):
                h = obs.astype(np.float32)
                for i, (w, b) in enumerate(layers):
                    h = h @ w + b
                    if i < len(layers) - 1:
                        np.maximum(h, 0.0, out=h)
                action = h.argmax(axis=1)
                u = rng.random(ENV_NUM)
                explore = u < self.eps
                action[explore] = (u[explore] / self.eps * 2).astype(np.int64)
                next_obs, reward, terminated, truncated, _ = envs.step(action)
                rows["obs"][t], rows["action"][t] = obs, action
                rows["reward"][t], rows["done"][t], rows["truncated"][t] = reward, terminated, truncated
                obs = next_obs
            rows["obs"][CHUNK_ROWS] = obs
            chunk = {name: array.copy() for name, array in rows.items()}
            done += chunk["action"].size
        seconds = time.monotonic() - started
        envs.close()
        return {"steps_s": done / seconds}

    def null(self, steps: int) -> dict[str, float]:
        rollout, started = self._rollout(steps, NullSink())
        seconds = time.monotonic() - started
        return {"steps_s": rollout.finish_info().step_count / seconds}

    def comm(self, steps: int) -> dict[str, float]:
        self.seq += 1
        task_id = f"collector{self.seq}"
        decl = self.names.metadata_decl(
            task_id,
            max_length=self.settings.metadata_queue_length,
            expires_s=self.settings.metadata_queue_expires_s,
        )
        publisher = MetadataPublisher(self.confirmed, decl)
        nacks_before = self.confirmed.nacks
        self.reader.send({"mode": "warren", "queue": decl.name, "count": None, "prefetch": 64})
        procs.wait_ready(self.reader)
        # A fresh directory per repeat, deleted only with the case: creating files right
        # after many were deleted nearby is 10x slower on this VM's no-journal ext4.
        sink = BrokerSink(StepStore(self.data / task_id), publisher, task_id=task_id, buffer_id="bench")
        rollout, started = self._rollout(steps, sink)
        seconds = time.monotonic() - started
        answer = self.reader.receive(60)
        self.confirmed.forget(decl.name)
        self.link.delete_queue(decl.name)
        if not answer.get("done"):
            raise RuntimeError(f"the reader did not see the end of {decl.name}: {answer}")
        self.messages.append(int(answer["count"]))
        info = rollout.finish_info()
        return {
            "steps_s": info.step_count / seconds,
            "messages_per_step": answer["count"] / max(1, info.step_count),
            "files": float(len(sink.written)),
            "full_waits": float(self.confirmed.nacks - nacks_before),  # messages the full queue refused
        }


def run(ctx: CaseContext) -> CaseResult:
    steps = 100_000 if ctx.quick else 400_000
    settings = ctx.broker.settings(ctx.broker.sub_prefix("collector"))
    settings_by_label = {"eps 1.0": (1.0, random_weights()), "balancing": (0.05, controller_weights())}
    rows: list[Row] = []
    trials_by_label: dict[str, Trials] = {}
    with ctx.scratch("collector") as workdir:
        reader = procs.Child(
            procs.python_module("benchmarks.drain", "--url", ctx.broker.amqp_url, "--prefix", settings.prefix),
            env={},
            log=workdir / "drain.log",
            talk=True,
        )
        try:
            for label, (eps, weights) in settings_by_label.items():
                collector = _Collector(settings, reader, workdir / label.replace(" ", ""), eps=eps, weights=weights)
                try:
                    collector.null(20_000)  # untimed: torch and the envs warm up
                    ctx.log(f"policy {label}: {steps} env steps per repeat, {ENV_NUM} envs")
                    trials = alternate(
                        ctx.repeats,
                        {
                            "comm": partial(collector.comm, steps),
                            "null": partial(collector.null, steps),
                            "bare": partial(collector.bare, steps),
                        },
                        log=ctx.log,
                    )
                finally:
                    collector.close()
                trials_by_label[label] = trials
                rows += _rows(label, trials)
        finally:
            procs.stop_all([reader])
    details = {
        "trials": {label: t.to_dict() for label, t in trials_by_label.items()},
        "max_foreign_cpu": max(t.max_foreign_cpu() for t in trials_by_label.values()),
        "env_steps_per_repeat": steps,
        "env_num": ENV_NUM,
    }
    return CaseResult(rows, details)


def _rows(label: str, trials: Trials) -> list[Row]:
    per_step = trials.series("comm", "messages_per_step").median
    return [
        Row(
            TITLE,
            f"{ENV_NUM} envs, {label}, null sink",
            "env steps/s",
            "higher",
            trials.series("null", "steps_s"),
            trials.series("bare", "steps_s"),
            "bare loop, no warren",
            "target: >= 100,000 env steps/s",
        ),
        Row(
            TITLE,
            f"{ENV_NUM} envs, {label}, broker sink",
            "env steps/s",
            "higher",
            trials.series("comm", "steps_s"),
            trials.series("null", "steps_s"),
            "same loop, null sink",
            f"target: >= 0.9x ({per_step * 1000:.2f} msgs per 1,000 steps)",
            notes={"messages_per_step": per_step},
        ),
    ]
