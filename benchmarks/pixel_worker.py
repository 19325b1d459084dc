"""One side of the pixel collection case, as a child process: collect Pong with the shipped job's policy, or read.

``--mode`` picks what runs, and the result is one JSON line on stdout:

* ``bare``: no warren code: ale-py's vector env, the job's PPO actor (the Nature CNN
  forward pass and sampling), each stacked observation copied into a preallocated
  ``[T + 1, N, 4, 84, 84]`` buffer, the chunk dropped;
* ``null``: :class:`worker.rl.rollout.Rollout` with the job's algorithm and env batch, a
  sink that drops the chunks (warren's loop, frame dedup included, no I/O);
* ``warren``: the same Rollout with :class:`worker.collector.sink.BrokerSink`: a step file
  per chunk, then its metadata through the broker;
* ``reader``: what the learner does with those: consume the metadata, read each file,
  check and rebuild it (:func:`worker.rl.chunks.read_chunk`), delete it, until ``--collectors``
  tasks said ``collector_done``.

CPU is split by thread: the rollout thread's CPU time inside the sink (encoding and writing
files, handing metadata to the publisher) and the rest of the process (the publisher's I/O
thread, ale-py's env threads) are reported apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from messaging import BrokerLink, ConfirmedPublisher, MetadataConsumer, MetadataPublisher, Names, Settings
from worker.collector.sink import BrokerSink
from worker.inprocess import job_envs
from worker.job import JobConfig
from worker.lifecycle import limit_torch_threads
from worker.plugins.registry import import_env_packages
from worker.protocol import CollectorSpec
from worker.rl.chunks import ChunkLayout, read_chunk
from worker.rl.rollout import Rollout
from worker.storage import PolicySnapshot, StepStore

JOB = Path(__file__).resolve().parents[1] / "configs" / "pong_ppo.toml"


def wait_for_go() -> None:
    """Say ready (set up, envs reset), then wait for the case's go, so the collectors' timed loops start together."""
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Weights:
    """A policy source that always has the job's initial weights."""

    def __init__(self, job: JobConfig) -> None:
        self.snapshot = PolicySnapshot(job.bound.make_learner(job.env.seed).actor_weights(), 0)

    def read(self) -> PolicySnapshot | None:
        return self.snapshot


class SizedStore(StepStore):
    """A step store that adds up the sizes of the files it writes (before any reader can delete them)."""

    bytes = 0

    def write(self, data_id: str, samples: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> Path:
        path = super().write(data_id, samples, meta)
        self.bytes += path.stat().st_size
        return path


class TimedSink:
    """Wraps a sink, adding up the rollout thread's CPU time spent inside it; ``inner=None`` drops chunks."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner
        self.cpu_s = 0.0
        self.bytes = 0
        self.chunks = 0

    def add_chunk(self, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        started = time.thread_time()
        if self.inner is not None:
            self.inner.add_chunk(samples, meta)
            self.bytes = self.inner.store.bytes
        self.chunks += 1
        self.cpu_s += time.thread_time() - started

    def add_info(self, info: dict[str, Any]) -> None:
        started = time.thread_time()
        if self.inner is not None:
            self.inner.add_info(info)
        self.cpu_s += time.thread_time() - started


def spec(job: JobConfig, steps: int, envs: int) -> CollectorSpec:
    base = job.collect_spec(0)
    return dataclasses.replace(
        base, n_sample=steps, env=dataclasses.replace(base.env, env_num=envs), policy_update_path="bench",
        update_policy_second=3600.0,
    )  # fmt: skip


def bare(job: JobConfig, steps: int, envs: int, threads: int) -> dict[str, float]:
    actor = job.bound.make_actor(0)
    actor.load_weights(Weights(job).snapshot.state_dict)
    vec = gym.make_vec(job.env.id, num_envs=envs, vectorization_mode="vector_entry_point", num_threads=threads)
    rows = job.collector.traj_len
    obs, _ = vec.reset(seed=0)
    buffer = np.zeros((rows + 1, envs, *obs.shape[1:]), np.uint8)
    wait_for_go()
    wall, cpu, thread_cpu = time.monotonic(), cpu_s(), time.thread_time()
    done, act_s = 0, 0.0
    while done < steps:
        for t in range(rows):
            acting = time.perf_counter()
            action, _ = actor.act(obs, explore=True, settings={})
            act_s += time.perf_counter() - acting
            buffer[t] = obs
            obs, _reward, _terminated, _truncated, _ = vec.step(action)
        buffer[rows] = obs
        done += rows * envs
    wall, cpu, thread_cpu = time.monotonic() - wall, cpu_s() - cpu, time.thread_time() - thread_cpu
    vec.close()
    return {
        "steps": done, "wall_s": wall, "cpu_s": cpu, "main_cpu_s": thread_cpu, "sink_cpu_s": 0.0, "bytes": 0,
        "act_s": act_s,
    }  # fmt: skip


def collect(job: JobConfig, args: argparse.Namespace) -> dict[str, float]:
    envs = job_envs(job, args.envs, seed=args.seed, threads=args.threads)
    publisher = link = None
    if args.mode == "warren":
        settings = Settings.from_env({}, amqp_url=args.url, prefix=args.prefix)
        link = ConfirmedPublisher(settings, f"bench-pixels-{args.seed}").open()
        decl = Names(settings.prefix).metadata_decl(args.queue, max_length=64, expires_s=600)
        publisher = MetadataPublisher(link, decl)
        store = SizedStore(Path(args.data), compression=args.compression)
        sink = TimedSink(BrokerSink(store, publisher, task_id=args.queue, buffer_id="bench"))
    else:
        sink = TimedSink()
    rollout = Rollout(spec(job, args.steps, args.envs), job.bound, envs, sink, Weights(job), stop=threading.Event())
    envs.reset()
    wait_for_go()
    wall, cpu, thread_cpu = time.monotonic(), cpu_s(), time.thread_time()
    rollout.run()
    wall, cpu, thread_cpu = time.monotonic() - wall, cpu_s() - cpu, time.thread_time() - thread_cpu
    envs.close()
    if link is not None:
        link.close()
    steps = rollout.finish_info().step_count
    return {
        "steps": steps, "wall_s": wall, "cpu_s": cpu, "main_cpu_s": thread_cpu, "sink_cpu_s": sink.cpu_s,
        "bytes": sink.bytes, "chunks": sink.chunks,
    }  # fmt: skip


def read(job: JobConfig, args: argparse.Namespace) -> dict[str, float]:
    settings = Settings.from_env({}, amqp_url=args.url, prefix=args.prefix)
    store = StepStore(Path(args.data))
    assert job.spaces is not None
    layout = ChunkLayout.of_algorithm(job.bound)
    link = BrokerLink(settings, "bench-pixels-reader").open()
    names = Names(settings.prefix)
    link.declare(names.metadata_decl(args.queue, max_length=64, expires_s=600))
    consumer = MetadataConsumer(link, names.metadata(args.queue), prefetch=64)
    print(json.dumps({"ready": True}), flush=True)
    finished = chunks = rows = 0
    cpu, busy = cpu_s(), 0.0
    while finished < args.collectors:
        item = consumer.get(60.0)
        if item is None:
            raise RuntimeError("no metadata for 60 s")
        started = time.thread_time()
        message = item.message
        if "data_id" in message:
            stored = store.read(message["data_id"])
            chunk = read_chunk(stored.fields, layout, job.spaces, 0)
            store.delete(message["data_id"])
            chunks += 1
            rows += chunk.steps * chunk.num_envs
        elif message.get("collector_done"):
            finished += 1
        item.ack()
        busy += time.thread_time() - started
    consumer.close()
    link.close()
    return {"chunks": chunks, "env_steps": rows, "cpu_s": cpu_s() - cpu, "read_cpu_s": busy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=["bare", "null", "warren", "reader"], required=True)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--collectors", type=int, default=2)
    parser.add_argument("--url", default="")
    parser.add_argument("--prefix", default="bench")
    parser.add_argument("--queue", default="pixels")
    parser.add_argument("--data", default="")
    parser.add_argument("--compression", choices=["none", "lz4"], default="none")
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="the actor's torch threads (warren's collectors: 1)"
    )
    args = parser.parse_args(argv)
    limit_torch_threads(args.torch_threads)
    import_env_packages("ale_py")
    job = JobConfig.load(JOB)
    if args.mode == "bare":
        result = bare(job, args.steps, args.envs, args.threads)
    elif args.mode == "reader":
        result = read(job, args)
    else:
        result = collect(job, args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
