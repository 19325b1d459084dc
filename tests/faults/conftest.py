"""A small cluster of real warren processes for the fault tests, cleaned up after each test."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from messaging import BrokerLink, MetadataConsumer, Names, Settings
from tests.procs import Proc, role_env, wait_for_queue
from worker.errors import StorageError
from worker.job import JobConfig
from worker.storage import PolicyStore, StepStore


class LearnerStandIn:
    """The test in the learner's place: takes the learner queue's items and reads each data_id's file once."""

    def __init__(self, link: BrokerLink, queue: str, data: Path) -> None:
        self.consumer = MetadataConsumer(link, queue, prefetch=64)
        self.store = StepStore(data)
        self.received: list[str] = []
        """Every delivery's data_id, duplicates included."""
        self.unreadable: list[str] = []
        """data_ids whose file was missing or not whole when first delivered."""

    def take(self, timeout_s: float) -> bool:
        """Handle one item if one arrives within ``timeout_s``; False if none did."""
        item = self.consumer.get(timeout_s)
        if item is None:
            return False
        data_id = item.message["data_id"]
        if data_id not in self.received:  # a learner reads (and would learn from) a data_id once
            try:
                self.store.read(data_id, wait_s=0)
            except StorageError:
                self.unreadable.append(data_id)
        self.received.append(data_id)
        item.ack()
        return True

    def take_until(self, done: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            self.take(0.2)


class Cluster:
    """Collectors, a coordinator and a learner sharing one volume and one queue prefix."""

    def __init__(self, settings: Settings, root: Path, link: BrokerLink) -> None:
        self.settings = settings
        self.root = root
        self.link = link
        self.names = Names.of(settings)
        self.data = root / "data"
        self.policy = root / "policy"
        self.run_log = root / "run.jsonl"
        self.job = root / "job.toml"
        self.procs: list[Proc] = []
        self._count = 0
        for path in (self.data, self.policy, root / "logs"):
            path.mkdir(parents=True, exist_ok=True)

    def env(self, **extra: str) -> dict[str, str]:
        return role_env(self.settings, WARREN_PATH_DATA=str(self.data), WARREN_PATH_POLICY=str(self.policy), **extra)

    def write_job(self, text: str) -> None:
        self.job.write_text(text)

    def _start(self, name: str, args: list[str], **env: str) -> Proc:
        self._count += 1
        proc = Proc(args, env=self.env(**env), log=self.root / "logs" / f"{name}-{self._count}.log")
        self.procs.append(proc)
        return proc

    def collector(self, worker_id: str, *args: str, **env: str) -> Proc:
        proc = self._start(worker_id, ["collector", "--worker-id", worker_id, *args], **env)
        wait_for_queue(self.link, self.names.collector_control(worker_id))
        return proc

    def learner(self) -> Proc:
        return self._start("learner", ["learner", "--config", str(self.job)])

    def coordinator(self, *args: str, **env: str) -> Proc:
        return self._start(
            "coordinator",
            ["coordinator", "--config", str(self.job), "--run-log", str(self.run_log), "--progress", "log", *args],
            **env,
        )

    def write_initial_policy(self) -> None:
        """A policy file for runs without a learner (the test plays the learner)."""
        job = JobConfig.load(self.job if self.job.exists() else None)
        weights = job.bound.make_learner(seed=0).actor_weights()  # what the job's learner publishes first
        header = {"algorithm": job.algorithm.name, "spaces_digest": job.spaces.digest}  # type: ignore[union-attr]
        PolicyStore(self.policy).write(job.coordinator.policy_name, weights, 0, header)

    def records(self, kind: str) -> list[dict[str, Any]]:
        if not self.run_log.exists():
            return []
        rows = [json.loads(line) for line in self.run_log.read_text().splitlines() if line.strip()]
        return [r for r in rows if r["kind"] == kind]

    def summary(self, coordinator: Proc) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(coordinator.log().strip().splitlines()[-1])
        return result

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.kill()


@pytest.fixture
def cluster(settings: Settings, tmp_path: Path, link: BrokerLink) -> Iterator[Cluster]:
    group = Cluster(settings, tmp_path, link)
    yield group
    group.stop_all()


@pytest.fixture
def cluster_on_private_broker(
    private_settings: Settings, tmp_path: Path, private_link: BrokerLink
) -> Iterator[Cluster]:
    """The same processes on the session's private broker, for tests that restart the broker."""
    group = Cluster(private_settings, tmp_path, private_link)
    yield group
    group.stop_all()
