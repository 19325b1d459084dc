"""Metrics on and off, side by side: what warren's ``/metrics`` costs a collector, and a learner.

* **collector**: the broker-sink rollout of :mod:`benchmarks.case_collector` (CartPole-v1,
  64 envs, random actions through the DQN network: the shortest episodes, so the most
  collector infos and counter updates per env step), with an atomic step file and a
  confirmed metadata message per 64x64 chunk (the files in memory, /dev/shm, where a disk's
  writeback cannot stall a repeat), read by the :mod:`benchmarks.drain` child.
  *On* is what ``warren collector --metrics-port`` runs: the collector's counters
  installed for the task's sink, the transport's counters (:mod:`messaging.stats`) on
  for its publisher, and ``/metrics`` served while a child process scrapes it every
  0.5 s (ten times as often as docker-compose's Prometheus). *Off* is the default:
  no-op counters, transport counting off, no server. Metrics: the collector process's
  CPU time per env step (all its threads), and env steps/s; the issue's budget is 2%.
* **learner**: the learner's train step (:class:`worker.algorithms.dqn.numpy_step.NumpyDQNStep`, the
  job's batch from a full replay buffer) with the calls ``worker/learner/service.py``
  makes around it (its duration, the algorithm's statistics): *on* with ``/metrics``
  served and scraped and TensorBoard means written, *off* with the no-op telemetry.
  Metric: train steps/s.

Both variants of each run alternate in one process (order rotated every repeat); a pair
of repeats beside which other work used a quarter of a CPU or more is left out of the
medians. On this shared 2-core machine a repeat's rate still moves by 10% and more with
the machine, more than the budget; CPU time per env step moves less (it does not count
the time other processes take the core), and the case also times the metrics work
alone, where no neighbour blurs it: the counting per metadata message (sink meter and
transport counters) and the building of one ``/metrics`` answer, put against the
on-runs' message rate with one scrape per 5 s (the compose stack's) and per 0.5 s (this
case's scraper).

It is one case, over 400 lines: the two halves share the alternation of on and off, the
quiet-repeat filter and the accounting, and its rows put the halves side by side.
"""

from __future__ import annotations

import dataclasses
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks import procs
from benchmarks.case_collector import ENV_NUM, FixedPolicy, bench_job, random_weights
from benchmarks.common import CaseContext, CaseResult, Trials, alternate
from benchmarks.stats import Row, Series
from messaging import BrokerLink, ConfirmedPublisher, MetadataPublisher, Names, Settings, stats
from messaging.stats import LinkStats
from worker.algorithms.dqn.learner import DQNLearner
from worker.collector.sink import BrokerSink
from worker.inprocess import job_envs
from worker.rl.replay import ReplayBuffer
from worker.rl.rollout import Rollout
from worker.storage import StepStore
from worker.telemetry.collector import CollectorMetrics, PrometheusCollectorMetrics, install
from worker.telemetry.learner import LearnerTelemetry
from worker.telemetry.metrics import MetricsEndpoint
from worker.telemetry.tensorboard import ScalarLog

NAME = "metrics"
TITLE = "metrics on vs off"
#: How often the scraper child GETs each /metrics (docker-compose's Prometheus: every 5 s).
SCRAPE_EVERY_S = 0.5
#: The scraper: GET every port's /metrics every SCRAPE_EVERY_S, one line per answered scrape on stdout.
SCRAPER = """
import sys, time, urllib.request
ports, every = [int(p) for p in sys.argv[2:]], float(sys.argv[1])
while True:
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                print(len(response.read()), flush=True)
        except OSError:
            pass
    time.sleep(every)
"""


@contextmanager
def _served(endpoint: MetricsEndpoint | None, port: int) -> Iterator[None]:
    """``/metrics`` of ``endpoint`` on ``port`` for the block (nothing for the off variant)."""
    if endpoint is None:
        yield
        return
    endpoint.serve("127.0.0.1", port)
    try:
        yield
    finally:
        endpoint.close()


class _Collector:
    """The collector of every variant: one env batch, and a publisher with and one without counting.

    The variants share the envs (the same work in every repeat) and differ only in what
    they are given: the counters, the publisher, a served ``/metrics``.
    """

    def __init__(self, settings: Settings, reader: procs.Child, data: Path) -> None:
        self.settings, self.reader, self.data = settings, reader, data
        self.names = Names(settings.prefix)
        self.link = BrokerLink(settings, "bench-metrics").open()
        # The transport counts for a publisher from its opening on: one of each.
        stats.disable()
        self.uncounted = ConfirmedPublisher(settings, "bench-metrics-off").open()
        stats.enable()
        self.counted = ConfirmedPublisher(settings, "bench-metrics-on").open()
        self.job = bench_job()
        self.algorithm = self.job.bound
        self.envs = job_envs(self.job, ENV_NUM, seed=0)
        self.source = FixedPolicy(random_weights())
        self.seq = 0

    def close(self) -> None:
        self.envs.close()
        self.uncounted.close()
        self.counted.close()
        self.link.close()

    def run(self, steps: int, metrics: CollectorMetrics, port: int) -> dict[str, float]:
        """One task of ``steps`` env steps: metrics on when ``metrics`` serves them, else off."""
        endpoint = metrics.endpoint if isinstance(metrics, PrometheusCollectorMetrics) else None
        confirmed = self.counted if endpoint is not None else self.uncounted
        self.seq += 1
        task_id = f"metrics-{self.seq}"
        decl = self.names.metadata_decl(
            task_id, max_length=self.settings.metadata_queue_length, expires_s=self.settings.metadata_queue_expires_s
        )
        publisher = MetadataPublisher(confirmed, decl)
        self.reader.send({"mode": "warren", "queue": decl.name, "count": None, "prefetch": 64})
        procs.wait_ready(self.reader)
        install(metrics)  # what the collector's service does at start: the sink counts into it
        metrics.task_started(eval_flag=False)
        spec = dataclasses.replace(
            self.job.collect_spec(0),
            n_sample=steps,
            collect_setting={"eps": 1.0},
            policy_update_path="bench",
            update_policy_second=1.0,
            max_env_steps=2 * steps,
        )
        sink = BrokerSink(StepStore(self.data / task_id), publisher, task_id=task_id, buffer_id="bench")
        rollout = Rollout(spec, self.algorithm, self.envs, sink, self.source, stop=threading.Event())
        with _served(endpoint, port):
            started, cpu_started = time.monotonic(), _process_cpu_s()
            rollout.run()
            seconds, cpu_s = time.monotonic() - started, _process_cpu_s() - cpu_started
        answer = self.reader.receive(60)
        shutil.rmtree(self.data / task_id, ignore_errors=True)  # as a learner would: the files are read
        info = rollout.finish_info()
        metrics.task_ended(info)
        install(CollectorMetrics())
        confirmed.forget(decl.name)
        self.link.delete_queue(decl.name)
        if not answer.get("done"):
            raise RuntimeError(f"the reader did not see the end of {decl.name}: {answer}")
        return {
            "steps_s": info.step_count / seconds,
            "cpu_us_per_step": cpu_s / info.step_count * 1e6,
            "steps": float(info.step_count),
            "messages": float(answer["count"]),
        }


class _Learner:
    """One variant's learner loop: the train step and the telemetry calls the learner makes around it."""

    def __init__(self, telemetry: LearnerTelemetry, port: int) -> None:
        algorithm = bench_job().bound
        self.config = algorithm.config
        self.telemetry, self.port = telemetry, port
        dqn_learner = algorithm.make_learner(0)
        assert isinstance(dqn_learner, DQNLearner)
        self.learner = dqn_learner  # its train step, as the learner process runs it
        rng = np.random.default_rng(0)
        rows = self.config.replay_capacity
        self.buffer = ReplayBuffer(
            rows,
            {"obs": ((4,), np.float32), "next_obs": ((4,), np.float32), "action": ((), np.int64),
             "reward": ((), np.float32), "done": ((), bool)},
        )  # fmt: skip
        self.buffer.add(
            {
                "obs": rng.normal(size=(rows, 4)).astype(np.float32),
                "next_obs": rng.normal(size=(rows, 4)).astype(np.float32),
                "action": rng.integers(0, 2, rows),
                "reward": np.ones(rows, np.float32),
                "done": rng.random(rows) < 0.05,
            }
        )
        self.rng = np.random.default_rng(1)

    def run(self, steps: int) -> dict[str, float]:
        learner, telemetry, batch_size = self.learner, self.telemetry, self.config.batch_size
        with _served(telemetry.endpoint, self.port):
            started = time.perf_counter()
            for _ in range(steps):
                batch = self.buffer.sample(batch_size, self.rng)
                t0 = time.perf_counter()
                statistics = learner.learn(batch)
                telemetry.train_step(time.perf_counter() - t0)
                telemetry.record(statistics, step=learner.version)
            seconds = time.perf_counter() - started
        return {"steps_s": steps / seconds}


@contextmanager
def _scraped(ports: list[int], log: Path) -> Iterator[procs.Child]:
    scraper = procs.Child([sys.executable, "-c", SCRAPER, str(SCRAPE_EVERY_S), *map(str, ports)], env={}, log=log)
    try:
        yield scraper
    finally:
        procs.stop_all([scraper])


def run(ctx: CaseContext) -> CaseResult:
    # Long enough repeats (~3 s of collection) for several scrapes to land in each
    steps = 200_000 if ctx.quick else 1_600_000
    train_steps = 2_000 if ctx.quick else 10_000
    repeats = max(ctx.repeats, 3 if ctx.quick else 11)  # a 2% budget needs more repeats than the others
    settings = ctx.broker.settings(ctx.broker.sub_prefix("metrics"))
    with ctx.scratch("metrics") as workdir, _memory_dir() as files:
        # Served only while an "on" variant runs: the scraper finds nothing listening otherwise.
        collector_endpoint = MetricsEndpoint("collector", "bench")
        learner_endpoint = MetricsEndpoint("learner")
        ports = [_free_port(), _free_port()]
        reader = procs.Child(
            procs.python_module("benchmarks.drain", "--url", ctx.broker.amqp_url, "--prefix", settings.prefix),
            env={},
            log=workdir / "drain.log",
            talk=True,
        )
        board = ScalarLog(workdir / "tensorboard" / "learner")
        collector = _Collector(settings, reader, files)
        on_metrics = PrometheusCollectorMetrics(collector_endpoint)
        # "off again": the control, off against off, shows how far two identical variants drift apart here.
        variants = {"off": CollectorMetrics(), "on": on_metrics, "off again": CollectorMetrics()}
        learners = {
            "off": _Learner(LearnerTelemetry(), ports[1]),
            "on": _Learner(LearnerTelemetry(endpoint=learner_endpoint, board=board), ports[1]),
        }
        try:
            with _scraped(ports, workdir / "scrapes.log") as scraper:
                for metrics in variants.values():
                    collector.run(20_000, metrics, ports[0])  # untimed: torch and the envs warm up
                ctx.log(f"collector: {steps} env steps per repeat, {ENV_NUM} envs, eps 1.0, {repeats} repeats")
                collector_trials = alternate(
                    repeats,
                    {name: partial(collector.run, steps, metrics, ports[0]) for name, metrics in variants.items()},
                    log=ctx.log,
                )
                ctx.log(f"learner: {train_steps} train steps per repeat")
                learner_trials = alternate(
                    repeats, {name: partial(lr.run, train_steps) for name, lr in learners.items()}, log=ctx.log
                )
                scrapes = _count_lines(scraper)
            ctx.log("the metrics work alone: per message, per scrape")
            accounted = _accounted(collector_endpoint, on_metrics, workdir, repeats)
        finally:
            collector.close()
            procs.stop_all([reader])
            board.close()
            stats.disable()
    rows = _rows(collector_trials, learner_trials, accounted)
    details = {
        "trials": {"collector": collector_trials.to_dict(), "learner": learner_trials.to_dict()},
        "max_foreign_cpu": max(collector_trials.max_foreign_cpu(), learner_trials.max_foreign_cpu()),
        "env_steps_per_repeat": steps,
        "train_steps_per_repeat": train_steps,
        "repeats": repeats,
        "scrape_every_s": SCRAPE_EVERY_S,
        "scrapes_answered": scrapes,
        "timed_alone": {name: list(values) for name, values in accounted.items()},
    }
    return CaseResult(rows, details)


#: Repetitions of the per-message counting in one timing of it.
_MESSAGES_TIMED = 20_000
#: Scrapes built in one timing of them.
_SCRAPES_TIMED = 100


def _accounted(
    endpoint: MetricsEndpoint, metrics: CollectorMetrics, workdir: Path, repeats: int
) -> dict[str, list[float]]:
    """The metrics work itself, timed ``repeats`` times: microseconds per message and per scrape."""
    path = workdir / "a-step-file"
    path.write_bytes(b"x" * 70_000)
    meta = {"eval_flag": False, "policy_iter": 3, "sample_count": 4096, "cur_episode": 0, "cur_step": 0}
    per_message, per_scrape = [], []
    for _ in range(repeats):
        meter, link = metrics.task_meter(), LinkStats()
        started = time.perf_counter()
        for i in range(_MESSAGES_TIMED):
            # Each message: the sink's counting (a step file's, the costlier kind) and the transport's
            counters = {**meta, "cur_step": 4096 * i, "cur_episode": i}
            meter.chunk_written(path, counters)
            meter.chunk_published()
            link.published(1)
            link.confirmed([0.002])
        per_message.append((time.perf_counter() - started) / _MESSAGES_TIMED * 1e6)
        started = time.perf_counter()
        for _ in range(_SCRAPES_TIMED):
            endpoint.exposition()
        per_scrape.append((time.perf_counter() - started) / _SCRAPES_TIMED * 1e6)
    return {"us_per_message": per_message, "us_per_scrape": per_scrape}


@contextmanager
def _memory_dir() -> Iterator[Path]:
    """Where the step files go: memory (/dev/shm) where there is one.

    A disk's writeback of hundreds of MB of step files stalls the rollout at random, by
    more than the 2% this case looks for; files in memory leave the difference to the metrics.
    """
    shm = Path("/dev/shm")
    path = Path(tempfile.mkdtemp(prefix="warren-bench-metrics-", dir=shm if shm.is_dir() else None))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _process_cpu_s() -> float:
    """CPU seconds of this process so far, all its threads (the rollout's, the publisher's, the server's)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _count_lines(child: procs.Child) -> int:
    """Scrapes the scraper got an answer to (one stdout line each, in its log)."""
    text = child.log_path.read_text(errors="replace") if child.log_path.exists() else ""
    return sum(1 for line in text.splitlines() if line.strip().isdigit())


#: A repeat counts as quiet when the rest of the machine used less than this (CPUs) meanwhile.
QUIET_FOREIGN_CPU = 0.25


def _quiet(trials: Trials, key: str, on: str = "on", off: str = "off") -> tuple[Series, Series, str]:
    """The ``on`` and ``off`` values of ``key`` from the repeats in which both ran on a quiet machine.

    Other work on a shared 2-core machine moves a repeat by far more than the 2% looked
    for; a pair where it ran beside either variant is left out (all are kept, and said so,
    when fewer than 3 pairs were quiet).
    """
    pairs = list(zip(trials.runs[on], trials.runs[off], trials.cpu[on], trials.cpu[off], strict=True))
    quiet = [(a, b) for a, b, ca, cb in pairs if max(ca["foreign"], cb["foreign"]) < QUIET_FOREIGN_CPU]
    kept, said = (
        (quiet, f"{len(quiet)} of {len(pairs)} pairs quiet")
        if len(quiet) >= 3
        else (
            [(a, b) for a, b, _, _ in pairs],
            f"only {len(quiet)} of {len(pairs)} pairs quiet: all kept",
        )
    )
    return Series.of(a[key] for a, _ in kept), Series.of(b[key] for _, b in kept), said


def _rows(collector: Trials, learner: Trials, accounted: dict[str, list[float]]) -> list[Row]:
    notes = {"versus": "metrics off"}  # two warren configurations: not a gap behind a baseline
    runs = collector.runs["on"]
    messages_per_s = statistics.median(run["messages"] * run["steps_s"] / run["steps"] for run in runs)
    per_message, per_scrape = (statistics.median(accounted[k]) for k in ("us_per_message", "us_per_scrape"))

    def share(scrape_every_s: float) -> Series:
        """Percent of each second of collection spent on metrics, from each timing's two costs."""
        return Series.of(
            100 * (messages_per_s * m + s / scrape_every_s) / 1e6
            for m, s in zip(accounted["us_per_message"], accounted["us_per_scrape"], strict=True)
        )

    timed = f"{per_message:.1f} us/message x {messages_per_s:.0f} messages/s + {per_scrape / 1000:.1f} ms/scrape"
    cpu_on, cpu_off, cpu_quiet = _quiet(collector, "cpu_us_per_step")
    rate_on, rate_off, rate_quiet = _quiet(collector, "steps_s")
    control_on, control_off, control_quiet = _quiet(collector, "cpu_us_per_step", on="off again")
    train_on, train_off, train_quiet = _quiet(learner, "steps_s")
    sink = f"broker sink, {ENV_NUM} envs, eps 1.0, /metrics scraped every {SCRAPE_EVERY_S:g} s"
    return [
        Row(
            TITLE,
            f"collector CPU per env step ({sink})",
            "CPU us/env step",
            "lower",
            cpu_on,
            cpu_off,
            "metrics off",
            f"budget: <= 1.02x; all its threads; {cpu_quiet}",
            notes=notes,
        ),
        Row(
            TITLE,
            "collector CPU per env step, control: off again against off",
            "CPU us/env step",
            "lower",
            control_on,
            control_off,
            "metrics off",
            f"two identical variants: how far they drift apart here; {control_quiet}",
            notes=notes,
        ),
        Row(
            TITLE,
            f"collector env steps/s ({sink})",
            "env steps/s",
            "higher",
            rate_on,
            rate_off,
            "metrics off",
            f"budget: >= 0.98x; {rate_quiet}",
            notes=notes,
        ),
        Row(
            TITLE,
            "collector: metrics work timed alone, scraped every 5 s",
            "% of collection",
            "lower",
            share(5.0),
            reference=f"budget: <= 2% ({timed})",
        ),
        Row(
            TITLE,
            f"collector: metrics work timed alone, scraped every {SCRAPE_EVERY_S:g} s",
            "% of collection",
            "lower",
            share(SCRAPE_EVERY_S),
            reference="budget: <= 2%",
        ),
        Row(
            TITLE,
            f"learner train steps/s (DQN's numpy step, batch {bench_job().bound.config.batch_size}, TensorBoard means)",
            "train steps/s",
            "higher",
            train_on,
            train_off,
            "metrics off",
            train_quiet,
            notes=notes,
        ),
    ]
