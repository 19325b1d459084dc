"""Step files read ahead on a thread of their own: results in order, bounded, and the learner's settling unchanged."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from messaging import MetadataItem
from tests.unit.test_learner_service import Settled, data_item, make_learner, write_chunk
from worker.learner.reader import StepReader


def test_at_depth_zero_each_read_runs_at_once_on_the_callers_thread() -> None:
    threads: list[str] = []

    def read(key: int) -> int:
        threads.append(threading.current_thread().name)
        if key < 0:
            raise ValueError("negative")
        return key * 10

    reader: StepReader[int, int] = StepReader(read, 0)
    reader.submit(1)
    reader.submit(-1)
    assert threads == [threading.current_thread().name] * 2
    (first, done), (second, failed) = reader.ready()
    assert (first, done.result()) == (1, 10)
    assert second == -1 and isinstance(failed.exception(), ValueError)
    assert reader.has_room and len(reader) == 0


def test_reads_run_on_their_own_thread_at_most_depth_at_once_and_come_back_in_order() -> None:
    gates = {key: threading.Event() for key in range(3)}

    def read(key: int) -> str:
        assert gates[key].wait(10)
        return f"{threading.current_thread().name}:{key}"

    reader: StepReader[int, str] = StepReader(read, 2)
    reader.submit(0)
    reader.submit(1)
    assert not reader.has_room
    with pytest.raises(RuntimeError, match="2 reads are in flight already"):
        reader.submit(2)
    gates[1].set()  # the second finishes first: it waits behind the first
    assert reader.ready(wait_s=0.05) == []
    gates[0].set()
    results = reader.ready(wait_s=10)
    while len(results) < 2:
        results += reader.ready(wait_s=10)
    assert [key for key, _ in results] == [0, 1]
    assert all(result.result().startswith("step-reader") for _, result in results)
    assert reader.has_room
    reader.submit(2)
    gates[2].set()
    assert reader.close() == [2]  # never taken back: the caller leaves its message to be requeued


def test_a_learner_reading_ahead_learns_every_file_in_the_order_the_messages_came(tmp_path: Path) -> None:
    # Given a learner that reads two files ahead on the reader's thread
    job = {"learner.read_ahead": 2, "learner.read_wait_s": 0.05, "algorithm.learning_starts": 10_000}
    learner = make_learner(tmp_path, **job)
    assert learner.reader.depth == 2
    settled = Settled()
    items = []
    for i in range(5):
        write_chunk(learner, f"d{i}", seed=i)
        items.append(settled.item(data_item(f"d{i}")))
    items.append(settled.item(data_item("missing")))  # its file never appears

    class Consumer:
        """Hands over at most the learner's prefetch (its read-ahead depth) of unsettled messages, as a broker."""

        handed = 0

        def get(self, wait_s: float) -> MetadataItem | None:
            if not items or self.handed - len(settled.outcomes) >= learner.reader.depth:
                time.sleep(wait_s)  # as the queue does when empty
                return None
            self.handed += 1
            return items.pop(0)

    # When it takes the messages (none is learned from before its read is done)
    consumer = Consumer()
    for _ in range(20):
        learner._take(consumer, 0.5)  # type: ignore[arg-type]
        if not items and not len(learner.reader):
            break
    # Then every file was learned from, in order, and every message settled once
    assert learner.stats.items == 5 and learner.stats.samples == 5 * 32
    assert learner.stats.missing_files == 1
    assert settled.outcomes == ["ack"] * 6
    assert list(learner._recent_order) == [f"d{i}" for i in range(5)]
    learner.reader.close()


def test_a_file_read_ahead_that_the_updates_made_stale_is_dropped_when_its_turn_comes(tmp_path: Path) -> None:
    learner = make_learner(tmp_path, **{"learner.read_ahead": 2, "algorithm.name": "ppo"})
    write_chunk(learner, "d0", seed=0)
    settled = Settled()
    to_read = learner._check(settled.item(data_item("d0", policy_iter=0)))
    assert to_read is not None
    learner.reader.submit(to_read)
    learner.learner.version = 2  # two updates ran while it was read: PPO takes data at most max_lag = 1 old
    learner._learn_ready(wait_s=10)
    assert learner.stats.stale_chunks == 1 and learner.stats.items == 0
    assert settled.outcomes == ["ack"]
    assert not learner.steps.path("d0").exists()
    learner.reader.close()


def test_on_the_cpu_the_learner_reads_between_updates_as_before(tmp_path: Path) -> None:
    learner = make_learner(tmp_path)
    assert learner.reader.depth == 0
    job: Any = learner.job
    assert job.learner.read_ahead == -1
