"""The learner's own counters on the shared volume, and the replay ratio the run reports from them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from messaging import Settings
from tests.fake_bus import FakeBus
from worker.config import CoordinatorConfig, LearnerConfig
from worker.coordinator.loop import Coordinator
from worker.job import JobConfig
from worker.learner.service import Learner
from worker.storage.counters import LearnerCounters, counters_path, read_counters, write_counters

POLICY = JobConfig().coordinator.policy_name


def test_counters_are_written_whole_and_read_back(tmp_path: Path) -> None:
    path = counters_path(tmp_path, POLICY)
    counters = LearnerCounters.now(train_steps=2739, samples=89_798, policy_iter=2739)
    write_counters(path, counters)
    assert read_counters(path) == counters
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
    assert counters.replay_ratio == pytest.approx(2739 / 89_798)


@pytest.mark.parametrize(
    "text",
    ["", "{", "[]", '{"train_steps": 1}', '{"train_steps": -1, "samples": 2, "policy_iter": 0, "written_at": 1}'],
)
def test_a_counters_file_the_learner_did_not_write_is_ignored(tmp_path: Path, text: str) -> None:
    path = counters_path(tmp_path, POLICY)
    path.write_text(text)
    assert read_counters(path) is None
    assert read_counters(tmp_path / "missing.learner.json") is None


def test_the_learner_writes_its_counters_with_its_policy_and_a_resumed_one_goes_on_from_them(tmp_path: Path) -> None:
    config = LearnerConfig(path_data=tmp_path / "data", path_policy=tmp_path / "policy")
    config.path_policy.mkdir()
    first = Learner(config)
    first._resume_or_start()
    first.stats.train_steps, first.stats.samples = 300, 9_600
    first._write_policy()
    first._write_checkpoint()
    written = read_counters(counters_path(config.path_policy, POLICY))
    assert written is not None and (written.train_steps, written.samples) == (300, 9_600)
    # A learner that resumes the run's checkpoint resumes its counters too: one run, one ratio
    again = Learner(config)
    again._resume_or_start()
    assert (again.stats.train_steps, again.stats.samples) == (300, 9_600)


def coordinator_seeing(tmp_path: Path) -> Coordinator:
    job = JobConfig.load(None, **{"coordinator.eval_interval_s": 3600.0, "coordinator.collect_tasks": 1})
    config = CoordinatorConfig(
        transport=Settings(prefix="p"), job=job, run_log=tmp_path / "run.jsonl", progress="off", path_policy=tmp_path
    )
    return Coordinator(config, bus=FakeBus(idle_workers=1))


def test_the_summary_reports_the_replay_ratio_the_learner_achieved(tmp_path: Path) -> None:
    # Given a run whose coordinator relayed more samples than the learner took in, and saw an older iteration
    coordinator = coordinator_seeing(tmp_path)
    coordinator.stats.count_data(89_798 + 8_192, policy_iter=2_100)
    write_counters(
        counters_path(tmp_path, POLICY), LearnerCounters.now(train_steps=2_739, samples=89_798, policy_iter=2_739)
    )
    # When the run sums up
    summary = coordinator.summary()
    # Then the ratio is the learner's train steps over the samples it learned from
    assert summary["replay_ratio"] == round(2_739 / 89_798, 4)
    assert (summary["learner_train_steps"], summary["learner_samples"]) == (2_739, 89_798)
    assert json.loads(json.dumps(summary))["replay_ratio"] == summary["replay_ratio"]


def test_counters_older_than_the_run_are_not_reported_as_its_replay_ratio(tmp_path: Path) -> None:
    path = counters_path(tmp_path, POLICY)
    write_counters(path, LearnerCounters(train_steps=10, samples=100, policy_iter=10, written_at=time.time() - 3600))
    coordinator = coordinator_seeing(tmp_path)
    coordinator.stats.count_data(2_048, policy_iter=5)
    summary = coordinator.summary()
    assert summary["replay_ratio"] is None and summary["learner_train_steps"] is None
