"""A small cluster of real warren processes for the fault tests, cleaned up after each test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from messaging import BrokerLink, Names, Settings
from tests.procs import Proc, role_env, wait_for_queue
from worker.job import JobConfig
from worker.rl.policy import QNetwork
from worker.storage import PolicyStore


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

    def coordinator(self, *args: str) -> Proc:
        return self._start(
            "coordinator",
            ["coordinator", "--config", str(self.job), "--run-log", str(self.run_log), "--progress", "log", *args],
        )

    def write_initial_policy(self) -> None:
        """A policy file for runs without a learner (the test plays the learner)."""
        hidden = JobConfig.load(self.job if self.job.exists() else None).learner.hidden_sizes
        torch.manual_seed(0)
        PolicyStore(self.policy).write("policy_main", QNetwork(4, 2, hidden).state_dict(), 0)

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
