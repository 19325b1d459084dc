"""The coordinator's decisions, with an in-memory bus in place of the broker (tests/fake_bus.py).

The real-broker tests (tests/integration/test_job.py, tests/faults/) run the same code
against RabbitMQ and real workers; these pin down what it decides, turn by turn.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from messaging import MessagingError, Settings
from tests.fake_bus import FakeBus, Sent
from worker import json_text
from worker.config import CoordinatorConfig
from worker.coordinator import driver as driver_module
from worker.coordinator import loop as loop_module
from worker.coordinator.checkpoint import checkpoint_record, last_checkpoint, restore
from worker.coordinator.loop import Coordinator
from worker.coordinator.progress import status_text
from worker.coordinator.roster import Requirement, Roster
from worker.coordinator.stats import RunStats
from worker.coordinator.task import Kind, State
from worker.errors import PolicyKept
from worker.job import JobConfig
from worker.plugins import installed
from worker.protocol import DataItem, FinishInfo, InfoItem, Refusal, StartReply, StartTask, TaskName
from worker.storage import PolicyStore

PREFIX = "p"


def make(
    tmp_path: Path, *, idle: int = 1, collect_tasks: int = 0, env: dict[str, Any] | None = None, **coordinator: Any
) -> tuple[Coordinator, FakeBus]:
    settings = {"collect_tasks": collect_tasks, "eval_interval_s": 3600.0, **coordinator}
    overrides = {f"coordinator.{k}": v for k, v in settings.items()} | {f"env.{k}": v for k, v in (env or {}).items()}
    job = JobConfig.load(None, **overrides)
    config = CoordinatorConfig(
        transport=Settings(prefix=PREFIX),
        job=job,
        run_log=tmp_path / "run.jsonl",
        progress="off",
        path_policy=tmp_path / "policy",  # made by the tests that have a learner's policy file
    )
    bus = FakeBus(idle_workers=idle)
    coordinator_ = Coordinator(config, bus=bus)
    bus.open()
    coordinator_.schedule.idle_workers = idle
    return coordinator_, bus


def data(task_id: str, n: int, *, steps: int, policy_iter: int = 3) -> dict[str, Any]:
    return DataItem(
        data_id=f"env_0_{task_id}_{n}",
        policy_iter=policy_iter,
        unroll_len=2,
        env_num=4,
        sample_count=8,
        cur_episode=0,
        cur_sample=8 * n,
        cur_step=steps,
        task_id=task_id,
        buffer_id="main",
    ).to_wire()


def info(task_id: str, *, steps: int, done: bool = False, **extra: Any) -> dict[str, Any]:
    return InfoItem(
        collector_done=done, cur_episode=1, cur_sample=steps, cur_step=steps, task_id=task_id, **extra
    ).to_wire()


def finished(*, eval_flag: bool, train_iter: int, steps: int, returns: list[float]) -> FinishInfo:
    """A worker's close reply after ``steps`` env steps and these episode returns."""
    return FinishInfo.measured(
        eval_flag=eval_flag,
        env_num=5,
        duration=1.0,
        train_iter=train_iter,
        collector_done=True,
        predefined_episode_count=len(returns) if eval_flag else 0,
        steps=steps,
        samples=0 if eval_flag else steps,
        returns=returns,
    )


def started(bus: FakeBus, coordinator: Coordinator, worker: str = "w1") -> tuple[Sent, str]:
    """Run a turn, accept the newest start request on ``worker``; returns it and its metadata queue."""
    coordinator.turn()
    sent = bus.starts()[-1]
    reply = bus.accept(sent, worker)
    coordinator.turn()
    return sent, reply.metadata_queue


def last_close(bus: FakeBus) -> Sent:
    """The newest close request sent."""
    return [s for s in bus.sent if s.body.get("name") == TaskName.CLOSE.value][-1]


def records(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_one_collect_task_is_started_per_idle_worker_and_one_waits_for_the_next_free_worker(tmp_path: Path) -> None:
    # Given three workers listening on the task queue (and room for their tasks in the rate limit)
    coordinator, bus = make(tmp_path, idle=3, max_run_ahead_samples=10**6)
    # When the coordinator runs a turn
    coordinator.turn()
    # Then it sent three valid collect tasks to the shared queue, and one more to wait there
    # (start_ahead -1: one per 8 collectors, at least one), each free when done
    starts = bus.starts()
    assert len(starts) == 4
    assert {s.queue for s in starts} == {"p.collector.tasks"}
    tasks = [StartTask.from_wire(s.body) for s in starts]
    assert all(t.cfg.n_sample and not t.cfg.eval_flag and t.free_when_done for t in tasks)
    coordinator.turn()
    assert len(bus.starts()) == 4


def test_with_no_start_ahead_exactly_one_collect_task_is_started_per_idle_worker(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, idle=3, max_run_ahead_samples=10**6, start_ahead=0)
    coordinator.turn()
    coordinator.turn()
    assert len(bus.starts()) == 3


def test_the_starts_waiting_ahead_grow_with_the_collectors_counted(tmp_path: Path) -> None:
    # Given 17 collectors, all busy with tasks of this run
    coordinator, bus = make(tmp_path, idle=17, max_run_ahead_samples=10**9)
    coordinator.turn()
    for n, sent in enumerate(bus.starts()[:17]):
        bus.accept(sent, f"w{n}", frees=True)
    coordinator.turn()
    bus.idle_workers = 0
    # When the coordinator counts the workers again
    coordinator.schedule.count_idle_workers()
    coordinator.turn()
    # Then three starts wait for the next free worker (one per 8 collectors, rounded up)
    waiting = [t for t in coordinator.driver.tasks.values() if t.state.value == "starting"]
    assert coordinator.schedule.start_ahead() == 3 and len(waiting) == 3


def test_a_task_done_on_a_worker_that_frees_itself_lets_the_next_start_go_before_its_close(tmp_path: Path) -> None:
    # Given one worker running a task it said it frees itself from once done, no start waiting ahead
    coordinator, bus = make(tmp_path, idle=1, max_run_ahead_samples=10**6, start_ahead=0)
    coordinator.turn()
    first = bus.starts()[0]
    reply = bus.accept(first, "w1", frees=True)
    coordinator.turn()
    assert len(bus.starts()) == 1
    # When its stream says it is done
    task_id = StartTask.from_wire(first.body).task_id
    bus.push(reply.metadata_queue, info(task_id, steps=100, done=True))
    coordinator.turn()
    # Then the next start went out in the same turn as the close of the task before
    closes = [s for s in bus.sent if s.body.get("name") == TaskName.CLOSE.value]
    assert len(bus.starts()) == 2 and [c.body["task_id"] for c in closes] == [task_id]


def test_a_done_task_on_a_worker_that_did_not_say_it_frees_itself_holds_it_until_the_close(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, idle=1, max_run_ahead_samples=10**6, start_ahead=0)
    coordinator.turn()
    first = bus.starts()[0]
    reply = bus.accept(first, "w1")  # an older worker: no free_when_done in its reply
    coordinator.turn()
    bus.push(reply.metadata_queue, info(StartTask.from_wire(first.body).task_id, steps=100, done=True))
    coordinator.turn()
    assert len(bus.starts()) == 1


def test_collection_never_runs_further_ahead_of_the_learner_than_the_limit(tmp_path: Path) -> None:
    # Given three idle workers and room for two tasks' samples ahead of training
    n_sample = JobConfig().collector.n_sample
    coordinator, bus = make(tmp_path, idle=3, max_run_ahead_samples=2 * n_sample)
    # Then only two tasks start
    coordinator.turn()
    assert len(bus.starts()) == 2 and coordinator.stats.held_back
    # When one delivers its samples and ends while the learner has not taken them yet
    first = bus.starts()[0]
    reply = bus.accept(first, "w1")
    coordinator.turn()
    bus.push(reply.metadata_queue, {**data(reply.task_id, 1, steps=n_sample), "sample_count": n_sample})
    bus.push(reply.metadata_queue, info(reply.task_id, steps=n_sample, done=True))
    bus.learner_backlog = 1  # the chunk is forwarded, and waits in the learner's queue
    coordinator.turn()
    bus.replies[last_close(bus).correlation_id] = finished(
        eval_flag=False, train_iter=0, steps=n_sample, returns=[]
    ).to_wire()
    coordinator.schedule.idle_workers = 3
    coordinator.turn()
    coordinator.turn()
    # Then no new task starts until the learner takes that chunk in
    assert len(bus.starts()) == 2
    bus.learner_backlog = 0
    coordinator.turn()
    assert len(bus.starts()) == 3


def test_a_fixed_number_of_collect_tasks_ignores_the_worker_count(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, idle=5, collect_tasks=2)
    coordinator.turn()
    assert len(bus.starts()) == 2


def test_data_is_forwarded_to_the_learner_before_its_stream_item_is_acked(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    # When the worker publishes two data items and an info
    bus.push(queue, data(task_id, 1, steps=8))
    bus.push(queue, data(task_id, 2, steps=16, policy_iter=5))
    bus.push(queue, info(task_id, steps=16))
    coordinator.turn()
    # Then both data items went to the learner, in order, and every item was acked,
    # the data ones only after the broker confirmed their copies
    assert [m["data_id"] for q, m in bus.forwarded if q == "p.learner.main"] == [
        f"env_0_{task_id}_1",
        f"env_0_{task_id}_2",
    ]
    assert [(outcome, "data_id" in m) for _, outcome, m in bus.settled] == [
        ("ack", False),
        ("ack", True),
        ("ack", True),
    ]
    stats = coordinator.stats
    assert (stats.samples, stats.data_items, stats.env_steps, stats.policy_iter) == (16, 2, 16, 5)


def test_data_whose_copy_was_not_confirmed_goes_back_to_its_stream(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.push(queue, data(task_id, 1, steps=8))
    bus.confirm_failure = MessagingError("not confirmed in time")
    with pytest.raises(MessagingError):
        coordinator.driver.advance_all()
    assert [outcome for _, outcome, _ in bus.settled] == ["requeue"]


def test_repeated_counters_are_counted_once(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.push(queue, info(task_id, steps=40))
    bus.push(queue, info(task_id, steps=40))  # a redelivery
    bus.push(queue, info(task_id, steps=30))  # an older one, late
    coordinator.turn()
    assert coordinator.stats.env_steps == 40
    assert coordinator.stats.episodes == 1


def test_malformed_metadata_is_dead_lettered_and_the_task_goes_on(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.push(queue, {"hello": "world"})
    bus.push(queue, {**data(task_id, 1, steps=8), "cur_step": "many"})
    bus.push(queue, data(task_id, 2, steps=8))
    coordinator.turn()
    assert [outcome for _, outcome, _ in bus.settled] == ["dead-letter", "dead-letter", "ack"]
    assert len(bus.forwarded) == 1
    assert task_id in coordinator.driver.tasks


def test_collector_done_closes_the_task_and_logs_its_finish_info(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.push(queue, info(task_id, steps=256, done=True))
    coordinator.turn()
    close = bus.sent[-1]
    assert close.queue == "p.collector.control.w1" and close.body == {"name": TaskName.CLOSE.value, "task_id": task_id}
    bus.replies[close.correlation_id] = finished(eval_flag=False, train_iter=7, steps=256, returns=[20.0]).to_wire()
    coordinator.turn()
    # Then the task is done, its metadata queue deleted, and a new one took its slot
    assert task_id not in coordinator.driver.tasks
    assert queue in bus.deleted
    (record,) = records(tmp_path, "task")
    assert record["task_id"] == task_id and record["step_count"] == 256 and "reward_raw" not in record
    assert coordinator.stats.tasks_done == 1
    coordinator.turn()
    assert len(bus.starts()) == 2


def run_eval(bus: FakeBus, coordinator: Coordinator, *, train_iter: int, returns: list[float]) -> StartTask:
    """Turn until an eval task starts, let it end with ``returns`` by policy ``train_iter``; returns its start."""
    coordinator.turn()
    sent = [s for s in bus.starts() if StartTask.from_wire(s.body).cfg.eval_flag][-1]
    reply = bus.accept(sent, "w9")
    coordinator.turn()
    bus.push(reply.metadata_queue, info(reply.task_id, steps=1000, done=True))
    coordinator.turn()
    bus.replies[bus.sent[-1].correlation_id] = finished(
        eval_flag=True, train_iter=train_iter, steps=1000, returns=returns
    ).to_wire()
    coordinator.turn()
    return StartTask.from_wire(sent.body)


def test_an_eval_reaching_the_stop_value_ends_the_run_when_confirmation_is_off(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, idle=0, eval_interval_s=0.0, env={"confirm_episodes": 0})
    run_eval(bus, coordinator, train_iter=99, returns=[200.0] * 5)
    assert coordinator.success and coordinator._finished()
    assert coordinator.stats.best_eval == 200.0
    (record,) = records(tmp_path, "eval")
    assert record["reward_mean"] == 200.0 and record["train_iter"] == 99 and record["success"] is True
    summary = coordinator.summary()
    assert (summary["policy_evaluated"], summary["best_eval_policy"], summary["confirm_eval"]) == (99, 99, None)


def test_an_eval_at_the_stop_value_ends_the_run_only_once_more_episodes_of_that_policy_reach_it_too(
    tmp_path: Path,
) -> None:
    # Given an eval of policy 99 whose five episodes reach the stop value
    coordinator, bus = make(tmp_path, idle=0, eval_interval_s=3600.0)
    coordinator.schedule.next_eval = 0.0
    first = run_eval(bus, coordinator, train_iter=99, returns=[200.0] * 5)
    # Then the run does not end yet: the next eval, at once, confirms it over 20 other episodes
    assert not coordinator.success
    confirmation = run_eval(bus, coordinator, train_iter=99, returns=[190.0, 230.0] * 10)
    spec = confirmation.cfg
    assert (spec.env.env_num, spec.n_episode, spec.policy_update_path) == (20, 1, first.cfg.policy_update_path)
    assert spec.env.seed != first.cfg.env.seed
    # And their mean (210) reaching it too ends the run, naming the policy evaluated
    assert coordinator.success and "confirmed: 210.0 over 20" in coordinator.reason
    passed, confirmed = records(tmp_path, "eval")
    assert "success" not in passed and confirmed["confirms"] == passed["task_id"] and confirmed["success"] is True
    summary = coordinator.summary()
    assert (summary["policy_evaluated"], summary["confirm_eval"]) == (99, 210.0)


def test_an_eval_whose_confirmation_misses_the_stop_value_lets_the_run_go_on(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, idle=0, eval_interval_s=3600.0)
    coordinator.schedule.next_eval = 0.0
    run_eval(bus, coordinator, train_iter=40, returns=[200.0] * 5)
    # When the policy's 20 other episodes average 150
    run_eval(bus, coordinator, train_iter=40, returns=[150.0] * 20)
    # Then the run goes on, and the next eval is a regular one again, an hour later
    assert not coordinator.success and not coordinator._finished()
    coordinator.turn()
    assert len([s for s in bus.starts() if StartTask.from_wire(s.body).cfg.eval_flag]) == 2
    assert coordinator.summary()["policy_evaluated"] is None


def test_an_eval_of_the_untrained_policy_cannot_end_the_run(tmp_path: Path) -> None:
    # Given a job without confirmation, and an eval of policy version 0 (no update yet) returning 500
    coordinator, bus = make(tmp_path, idle=0, eval_interval_s=3600.0, env={"confirm_episodes": 0})
    coordinator.schedule.next_eval = 0.0
    run_eval(bus, coordinator, train_iter=0, returns=[500.0] * 5)
    # Then the run goes on, and no confirmation is started either
    assert not coordinator.success and not coordinator._finished()
    assert coordinator.stop_rule.confirming is None
    assert coordinator.summary()["best_eval_policy"] == 0


def test_the_policy_a_run_leaves_is_the_one_its_eval_passed_not_the_learners_newest(tmp_path: Path) -> None:
    # Given the learner's policy file at version 5 when an eval starts
    store = PolicyStore(tmp_path / "policy")
    store.write("policy_main", {"w": torch.zeros(2)}, iter=5)
    coordinator, bus = make(tmp_path, idle=0, eval_interval_s=3600.0)
    coordinator.schedule.next_eval = 0.0
    first = run_eval(bus, coordinator, train_iter=5, returns=[200.0] * 5)
    # (the eval reads a copy; the learner has gone on to version 9 by the confirmation)
    assert first.cfg.policy_update_path == "policy_main.eval"
    store.write("policy_main", {"w": torch.ones(2)}, iter=9)
    run_eval(bus, coordinator, train_iter=5, returns=[199.0] * 20)
    assert coordinator.success
    # When the run ends
    coordinator._shutdown()
    # Then the policy file is version 5, its weights, kept: the learner's next write is refused
    left = store.read("policy_main")
    assert left is not None and left.iter == 5 and torch.equal(left.state_dict["w"], torch.zeros(2))
    with pytest.raises(PolicyKept):
        store.write("policy_main", {"w": torch.ones(2)}, iter=10)
    (summary,) = records(tmp_path, "summary")
    assert summary["policy_evaluated"] == summary["policy_left"] == 5
    assert not (tmp_path / "policy" / "policy_main.eval").exists()
    # And the next run's coordinator releases it for its learner
    make(tmp_path)[0].policy.release()
    assert not store.is_kept("policy_main")


def test_a_busy_worker_refusal_frees_the_slot_for_a_new_task(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    coordinator.turn()
    first = bus.starts()[0]
    bus.refuse(first, Refusal.WORKER_BUSY.value)
    coordinator.turn()
    assert coordinator.stats.tasks_rerun == 1
    coordinator.schedule.fill_after = 0.0  # past the back-off
    coordinator.turn()
    assert len(bus.starts()) == 2
    assert StartTask.from_wire(bus.starts()[1].body).task_id != StartTask.from_wire(first.body).task_id


def test_a_refusal_other_than_busy_is_not_counted_as_a_rerun(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    coordinator.turn()
    bus.refuse(bus.starts()[0], Refusal.UNKNOWN_ENV.value)
    coordinator.turn()
    assert coordinator.stats.tasks_rerun == 0


def test_a_start_nobody_took_is_sent_again_after_its_deadline(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1, start_timeout_s=0.001)
    coordinator.driver.timeouts = type(coordinator.driver.timeouts)(0.001, 30.0, 60.0, start_grace_s=0.0)
    coordinator.turn()
    first = bus.starts()[0]
    time.sleep(0.01)  # past the deadline
    coordinator.turn()
    assert first.correlation_id in bus.abandoned
    assert len(bus.starts()) == 2
    # the same task, sent again
    assert bus.starts()[1].body == first.body


def test_a_start_request_the_broker_nacks_keeps_its_slot_and_is_sent_again_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver_module, "REJECTED_START_RETRY_S", 0.05)
    coordinator, bus = make(tmp_path, collect_tasks=1)
    # Given a broker that nacks the first start request (the link's own resends included)
    bus.nacks = 1
    coordinator.turn()
    # Then the run goes on, no request is out, and the slot is not given to a second task
    assert bus.starts() == []
    (task,) = coordinator.driver.tasks.values()
    assert task.state is State.STARTING and task.correlation_id is None
    coordinator.turn()
    assert bus.starts() == [] and len(coordinator.driver.tasks) == 1
    # And after the pause the same task is sent
    time.sleep(0.06)
    coordinator.turn()
    (sent,) = bus.starts()
    assert StartTask.from_wire(sent.body).task_id == task.task_id


def test_shutdown_drops_a_start_whose_request_never_reached_the_queue(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    bus.nacks = 1
    coordinator.turn()
    coordinator.driver.close_all()
    assert coordinator.driver.tasks == {}
    assert bus.starts() == []


def test_a_worker_gone_on_two_checks_gets_its_task_rerun_keeping_its_data(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.push(queue, data(task_id, 1, steps=8))
    # When the worker's control queue vanishes (its connection died)
    bus.alive.clear()
    coordinator.driver.check_liveness()
    assert task_id in coordinator.driver.tasks  # one miss could be a reconnect
    coordinator.driver.check_liveness()
    # Then what it published was forwarded, and the task is re-run
    assert [m["data_id"] for _, m in bus.forwarded] == [f"env_0_{task_id}_1"]
    assert task_id not in coordinator.driver.tasks
    assert coordinator.stats.tasks_rerun == 1
    coordinator.turn()
    assert len(bus.starts()) == 2


def test_a_task_whose_metadata_queue_died_with_its_node_is_run_again_and_its_worker_told_to_close_it(
    tmp_path: Path,
) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.push(queue, data(task_id, 1, steps=8))
    coordinator.turn()
    # When the node of the task's (classic) metadata queue dies: reading it fails from now on
    bus.lost.add(queue)
    coordinator.turn()
    # Then the task is given up at once and run again (its worker lives on another node)
    assert task_id not in coordinator.driver.tasks
    assert coordinator.stats.tasks_rerun == 1
    assert last_close(bus).body == {"name": TaskName.CLOSE.value, "task_id": task_id}
    assert queue in bus.deleted
    # and what was read before is kept
    assert [m["data_id"] for _, m in bus.forwarded] == [f"env_0_{task_id}_1"]
    coordinator.turn()
    assert len(bus.starts()) == 2


def test_a_task_whose_metadata_queue_died_before_its_first_read_is_run_again_instead_of_holding_its_slot(
    tmp_path: Path,
) -> None:
    # Given a start a worker took, declaring the task's metadata queue on its node
    coordinator, bus = make(tmp_path, collect_tasks=1)
    coordinator.turn()
    sent = bus.starts()[-1]
    task_id = StartTask.from_wire(sent.body).task_id
    reply = bus.accept(sent, "w1")
    # When that node dies before the coordinator reads the reply and the queue
    del bus.queues[reply.metadata_queue]
    coordinator.turn()
    # Then the task is given up at once, its worker told to close it, and it runs again
    assert task_id not in coordinator.driver.tasks
    assert coordinator.stats.tasks_rerun == 1
    assert last_close(bus).body == {"name": TaskName.CLOSE.value, "task_id": task_id}
    coordinator.turn()
    assert len(bus.starts()) == 2


def test_a_metadata_queue_lost_after_the_tasks_last_item_lets_the_close_go_on(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.push(queue, info(task_id, steps=256, done=True))
    coordinator.turn()
    bus.lost.add(queue)
    close = bus.sent[-1]
    assert close.body["name"] == TaskName.CLOSE.value
    bus.replies[close.correlation_id] = finished(eval_flag=False, train_iter=1, steps=256, returns=[]).to_wire()
    coordinator.turn()
    assert task_id not in coordinator.driver.tasks
    assert coordinator.stats.tasks_rerun == 0 and coordinator.stats.tasks_done == 1


def test_an_aborted_task_is_run_elsewhere(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.push(queue, info(task_id, steps=8, aborted=True))
    coordinator.turn()
    assert task_id not in coordinator.driver.tasks
    assert coordinator.stats.tasks_rerun == 1


def test_a_silent_task_is_closed(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, _queue = started(bus, coordinator)
    task = coordinator.driver.tasks[StartTask.from_wire(sent.body).task_id]
    task.last_heard -= coordinator.job.coordinator.task_silence_s + 1
    coordinator.driver.check_liveness()
    assert task.state is State.CLOSING
    assert bus.sent[-1].body == {"name": TaskName.CLOSE.value, "task_id": task.task_id}


def test_a_close_lost_on_its_way_is_sent_again_instead_of_holding_the_slot_until_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.push(queue, info(task_id, steps=256, done=True))
    coordinator.turn()
    first = bus.sent[-1]
    assert first.body == {"name": TaskName.CLOSE.value, "task_id": task_id}
    # When no reply comes for longer than the resend interval (the request or its reply was lost)
    monkeypatch.setattr(driver_module, "CLOSE_RESEND_S", 0.0)
    coordinator.driver.tasks[task_id].resend_at = 0.0
    coordinator.turn()
    # Then the close is sent again, the first given up, and the new one's reply completes the task
    again = bus.sent[-1]
    assert again.body == first.body and again.correlation_id != first.correlation_id
    assert first.correlation_id in bus.abandoned
    bus.replies[again.correlation_id] = finished(eval_flag=False, train_iter=1, steps=256, returns=[]).to_wire()
    coordinator.turn()
    assert task_id not in coordinator.driver.tasks and coordinator.stats.tasks_done == 1


def test_a_close_to_a_vanished_worker_completes_the_task_from_its_last_info(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.alive.clear()
    bus.push(queue, info(task_id, steps=256, done=True))
    coordinator.turn()
    (record,) = records(tmp_path, "task")
    assert record["task_id"] == task_id and record["cur_step"] == 256


def eval_running(tmp_path: Path) -> tuple[Coordinator, FakeBus, StartReply]:
    """A coordinator whose eval, started at once, runs on worker w9; its start reply."""
    coordinator, bus = make(tmp_path, idle=0, eval_interval_s=3600.0)
    coordinator.schedule.next_eval = 0.0
    coordinator.turn()
    sent = [s for s in bus.starts() if StartTask.from_wire(s.body).cfg.eval_flag][-1]
    reply = bus.accept(sent, "w9")
    coordinator.turn()
    return coordinator, bus, reply


def test_an_eval_whose_worker_left_before_its_close_reply_is_run_again_at_once(tmp_path: Path) -> None:
    # Given an eval that played its episodes on a worker
    coordinator, bus, reply = eval_running(tmp_path)
    # When the worker dies before its close reply, which carries the eval's result
    bus.alive.clear()
    bus.push(reply.metadata_queue, info(reply.task_id, steps=1000, done=True))
    coordinator.turn()
    # Then the eval is counted as a rerun and another one starts at once, not an interval later
    assert reply.task_id not in coordinator.driver.tasks
    assert coordinator.stats.tasks_rerun == 1 and records(tmp_path, "eval") == []
    coordinator.turn()
    evals = [s for s in bus.starts() if StartTask.from_wire(s.body).cfg.eval_flag]
    assert len(evals) == 2


def test_an_eval_that_said_it_failed_and_lost_its_worker_counts_as_a_failure_not_a_rerun(tmp_path: Path) -> None:
    coordinator, bus, reply = eval_running(tmp_path)
    bus.alive.clear()
    bus.push(reply.metadata_queue, info(reply.task_id, steps=10, done=True, error="env.step: boom"))
    coordinator.turn()
    assert reply.task_id not in coordinator.driver.tasks and coordinator.stats.tasks_rerun == 0
    assert coordinator.failures.streaks[Kind.EVAL].in_a_row == 1  # a plug-in failing evals still ends the run


def test_an_eval_without_its_close_reply_as_the_run_ends_is_not_run_again(tmp_path: Path) -> None:
    coordinator, bus, reply = eval_running(tmp_path)
    bus.alive.clear()
    coordinator.driver.close_all()
    assert reply.task_id not in coordinator.driver.tasks and coordinator.stats.tasks_rerun == 0


def test_shutdown_closes_running_tasks_and_starting_ones_once_they_start(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1, eval_interval_s=0.0)
    coordinator.turn()
    collect, evaluation = bus.starts()
    bus.accept(collect, "w1")  # the collect task runs; the eval task is still starting
    coordinator.turn()
    coordinator.driver.close_all()
    states = {t.kind: t.state for t in coordinator.driver.tasks.values()}
    assert states == {Kind.COLLECT: State.CLOSING, Kind.EVAL: State.STARTING}
    # When the eval's worker answers after all, the task is closed at once
    bus.accept(evaluation, "w2")
    coordinator.driver.advance_all()
    eval_id = StartTask.from_wire(evaluation.body).task_id
    assert bus.sent[-1].queue == "p.collector.control.w2"
    assert bus.sent[-1].body == {"name": TaskName.CLOSE.value, "task_id": eval_id}


def test_shutdown_frees_the_queue_of_a_start_never_answered(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    coordinator.turn()
    (start,) = bus.starts()
    coordinator.shutdown_s = 0.0  # the worker never answers
    coordinator._shutdown()
    task_id = StartTask.from_wire(start.body).task_id
    assert f"p.metadata.{task_id}" in bus.deleted and start.correlation_id in bus.abandoned


def test_a_checkpoint_restores_the_counters_and_the_running_tasks(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    bus.push(queue, data(task_id, 1, steps=8))
    bus.push(queue, info(task_id, steps=24))
    coordinator.turn()
    coordinator.stats.record_eval(150.0)
    record = json.loads(json.dumps(checkpoint_record(coordinator.stats, coordinator.driver.tasks.values(), 7)))

    stats = RunStats()
    seq, tasks = restore(record, stats)

    assert seq > 7
    assert stats.to_record() | {"elapsed_s": 0} == coordinator.stats.to_record() | {"elapsed_s": 0}
    (task,) = tasks
    assert (task.task_id, task.state, task.metadata_queue, task.steps_counted) == (task_id, State.RUNNING, queue, 24)


def test_a_restarted_coordinator_resumes_from_the_run_log(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, queue = started(bus, coordinator)  # writes a checkpoint when the task runs
    task_id = StartTask.from_wire(sent.body).task_id
    assert last_checkpoint(tmp_path / "run.jsonl") is not None

    again = Coordinator(coordinator.config, bus=bus)
    again._resume(last_checkpoint(tmp_path / "run.jsonl") or {})

    assert list(again.driver.tasks) == [task_id]
    bus.push(queue, data(task_id, 1, steps=8))
    again.turn()
    assert len(bus.forwarded) == 1


@pytest.mark.parametrize("refusal", list(Refusal))
def test_every_refusal_code_says_whether_retrying_can_help(refusal: Refusal) -> None:
    # A missing plug-in is permanent for the worker that said it, not for the job: another may have it.
    assert refusal.worker_specific is (refusal is Refusal.MISSING_PLUGIN)
    transient = {
        Refusal.MISSING_PLUGIN,
        Refusal.WORKER_BUSY,
        Refusal.NO_DATA_YET,
        Refusal.NO_RUNNING_COLLECTOR,
        Refusal.COLLECTOR_FAILED,
        Refusal.WRONG_QUEUE,
        Refusal.BAD_REQUEST,
        Refusal.INTERNAL_ERROR,
        Refusal.BAD_METADATA,
    }
    assert refusal.permanent is (refusal not in transient)


def test_a_run_stopped_at_once_shuts_down_in_order(tmp_path: Path) -> None:
    # Given a coordinator whose stop event is already set (Ctrl-C during start-up)
    coordinator, bus = make(tmp_path, idle=2)
    coordinator.stop.set()
    # When it runs
    summary = coordinator.run()
    # Then it declared its queues, counted the workers, sent nothing, wrote the summary last and closed
    assert bus.declared[-2:] == ["p.collector.tasks", "p.learner.main"]
    assert summary["reason"] == "stopped by signal" and not summary["success"]
    assert records(tmp_path, "summary") == [json.loads((tmp_path / "run.jsonl").read_text().splitlines()[-1])]
    assert bus.closed


def test_a_refused_close_completes_the_task_from_its_last_info(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, queue = started(bus, coordinator)
    task_id = StartTask.from_wire(sent.body).task_id
    # an info without ids: the record still names the task the coordinator knows
    bus.push(queue, {"collector_done": True, "cur_episode": 3, "cur_sample": 64, "cur_step": 64, "get_info_time": 12.5})
    coordinator.turn()
    bus.refuse(bus.sent[-1], Refusal.NO_RUNNING_COLLECTOR.value)
    coordinator.turn()
    (record,) = records(tmp_path, "task")
    assert (record["task_id"], record["worker_id"], record["cur_step"]) == (task_id, "w1", 64)
    assert record["get_info_time"] == 12.5


def test_a_checkpoint_of_the_previous_format_still_resumes_a_finished_task(tmp_path: Path) -> None:
    saved = {
        "kind": "collect",
        "worker_id": "w1",
        "control_queue": "p.collector.control.w1",
        "metadata_queue": "p.metadata.t1",
        "counted": {"cur_step": 40, "cur_episode": 2},
        "last_info": {"collector_done": True, "cur_episode": 2, "cur_sample": 40, "cur_step": 40},
    }
    _seq, (task,) = restore({"running": {"t1": saved}}, RunStats())
    assert task.done and task.last_info is not None and task.last_info.cur_step == 40


def test_a_start_no_worker_can_ever_accept_ends_the_run_with_the_reason(tmp_path: Path) -> None:
    # Given a job whose env the workers cannot run
    coordinator, bus = make(tmp_path, collect_tasks=1)
    coordinator.turn()
    bus.refuse(bus.starts()[0], Refusal.UNSUPPORTED_ENV.value)
    # When the refusal arrives, the run ends at once, as a failure saying why; nothing is resent
    coordinator.turn()
    assert coordinator._finished() and not coordinator.success
    assert coordinator.error is not None and "unsupported env" in coordinator.error
    assert len(bus.starts()) == 1
    assert coordinator.summary()["error"] == coordinator.error


def test_transient_refusals_back_off_instead_of_resending_every_turn(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, collect_tasks=1)
    coordinator.turn()
    bus.refuse(bus.starts()[0], Refusal.WORKER_BUSY.value)
    coordinator.turn()
    for _ in range(20):  # a second of loop turns would have been 20 start requests before
        coordinator.turn()
    assert len(bus.starts()) == 1
    coordinator.schedule.fill_after = 0.0  # the pause is over
    coordinator.turn()
    assert len(bus.starts()) == 2
    assert not coordinator._finished()


def test_abort_from_another_thread_ends_the_run_as_failed(tmp_path: Path) -> None:
    coordinator, _bus = make(tmp_path)
    threading.Thread(target=coordinator.abort, args=("the learner exited with code 1",)).start()
    summary = coordinator.run()
    assert summary["error"] == summary["reason"] == "the learner exited with code 1"
    assert not summary["success"]


def test_a_task_started_twice_is_closed_where_nobody_follows_it(tmp_path: Path) -> None:
    # Given a task running on w1, whose start request a broker restart delivered again, to w2
    coordinator, bus = make(tmp_path, collect_tasks=1)
    sent, _ = started(bus, coordinator, "w1")
    task_id = StartTask.from_wire(sent.body).task_id
    bus.alive.add("p.collector.control.w2")
    second = StartReply("w2", task_id, "p.collector.control.w2", f"p.metadata.{task_id}")
    # and w1 saying "started" again for the same run (a repeat, not a second run)
    repeat = StartReply("w1", task_id, "p.collector.control.w1", f"p.metadata.{task_id}")
    bus.stray = [second.to_wire(), repeat.to_wire(), {"unrelated": True}]
    # When the coordinator runs a turn
    coordinator.turn()
    # Then w2 is asked to close its run (its reply is not waited for), and w1's task is left alone
    closes = [s for s in bus.sent if s.body.get("name") == TaskName.CLOSE.value]
    assert [(c.queue, c.body.get("task_id")) for c in closes] == [("p.collector.control.w2", task_id)]
    assert closes[0].correlation_id in bus.abandoned
    assert coordinator.driver.tasks[task_id].state is State.RUNNING
    assert coordinator.driver.tasks[task_id].worker_id == "w1"


# -- the roster: which workers can run the job --------------------------------------------


def everything() -> dict[str, dict[str, str]]:
    """The plug-ins of a worker with warren's built-ins at this version (what the job's tasks name)."""
    return installed().inventory()


def without_dqn() -> dict[str, dict[str, str]]:
    plugins = everything()
    return {**plugins, "algorithms": {k: v for k, v in plugins["algorithms"].items() if k != "dqn"}}


def heard(coordinator: Coordinator) -> None:
    """Let the roster send its ``resource`` broadcast and take in the answers (two refreshes)."""
    coordinator.roster.refresh()
    coordinator.roster.refresh()


def test_the_roster_asks_every_collector_for_its_plugins_and_the_shared_queue_serves_capable_workers(
    tmp_path: Path,
) -> None:
    # Given two workers listening that both have the job's plug-ins at its versions
    coordinator, bus = make(tmp_path, idle=2, max_run_ahead_samples=10**6)
    bus.listening("w1", plugins=everything())
    bus.listening("w2", plugins=everything())
    # When the coordinator runs two turns
    coordinator.turn()
    coordinator.turn()
    # Then it broadcast a resource request to the roster exchange (not to a queue of tasks)
    assert [b.body for b in bus.broadcasts] == [{"name": TaskName.RESOURCE.value}]
    assert all(s.body.get("name") != TaskName.RESOURCE.value for s in bus.sent)
    # and, nobody lacking anything, the starts went to the shared task queue as always
    assert not coordinator.roster.mixed and coordinator.roster.lacking == {}
    assert {s.queue for s in bus.starts()} == {"p.collector.tasks"} and len(bus.starts()) == 3  # one ahead


def test_once_a_worker_lacks_the_jobs_algorithm_starts_go_only_to_workers_that_have_it(tmp_path: Path) -> None:
    # Given w1 with every built-in, and w2 without dqn (the job's algorithm)
    coordinator, bus = make(tmp_path, idle=2, max_run_ahead_samples=10**6)
    bus.listening("w1", plugins=everything())
    bus.listening("w2", plugins=without_dqn())
    heard(coordinator)
    # When the coordinator fills its slots
    coordinator.turn()
    coordinator.turn()
    # Then w2 is marked with the reason, and the one task that can run went straight to w1's control queue
    assert "w2" in coordinator.roster.lacking and "dqn" in coordinator.roster.lacking["w2"]
    assert [s.queue for s in bus.starts()] == ["p.collector.control.w1"]
    (task,) = coordinator.driver.tasks.values()
    assert task.target_worker == "w1"
    assert not coordinator._finished()


def test_a_worker_with_another_version_of_a_plugin_counts_as_lacking_it(tmp_path: Path) -> None:
    coordinator, bus = make(tmp_path, idle=2)
    plugins = everything()
    bus.listening("w1", plugins=everything())
    bus.listening("old", plugins={**plugins, "models": {**plugins["models"], "mlp": "0.0.1-old"}})

    heard(coordinator)

    assert set(coordinator.roster.lacking) == {"old"}
    assert "'mlp' 0.0.1-old" in coordinator.roster.lacking["old"]
    assert [w.worker_id for w in coordinator.roster.capable()] == ["w1"]


def test_a_worker_that_does_not_list_its_plugins_is_taken_to_have_them(tmp_path: Path) -> None:
    # (a DI-engine worker: it refuses with "missing plugin" if not, see below)
    coordinator, bus = make(tmp_path, idle=1)
    bus.listening("di", plugins=None)
    heard(coordinator)
    assert not coordinator.roster.mixed and [w.worker_id for w in coordinator.roster.capable()] == ["di"]


def test_a_missing_plugin_refusal_marks_that_worker_and_the_run_goes_on_elsewhere(tmp_path: Path) -> None:
    # Given a worker the roster has not heard lacking anything, that refuses the first start
    coordinator, bus = make(tmp_path, collect_tasks=1)
    bus.listening("w1", plugins=everything())
    coordinator.turn()
    first = bus.starts()[0]
    assert first.queue == "p.collector.tasks"
    bus.refuse(first, Refusal.MISSING_PLUGIN.value, worker_id="w2", plugin={"kind": "algorithm", "name": "dqn"})
    # When the refusal arrives
    coordinator.turn()
    # Then the run is not over (another worker may have the plug-in), w2 gets no more of its tasks,
    # and the next start goes to w1, which can run it
    assert not coordinator._finished() and coordinator.error is None
    assert "w2" in coordinator.roster.lacking and coordinator.stats.tasks_rerun == 0
    heard(coordinator)
    coordinator.schedule.fill_after = 0.0
    coordinator.turn()
    assert [s.queue for s in bus.starts()] == ["p.collector.tasks", "p.collector.control.w1"]


def test_when_no_worker_listening_can_run_the_job_the_run_ends_saying_what_they_lack(tmp_path: Path) -> None:
    # Given the only worker listening lacks the job's algorithm
    coordinator, bus = make(tmp_path, idle=1, start_timeout_s=0.01)
    bus.listening("w2", plugins=without_dqn())
    heard(coordinator)
    coordinator.turn()
    # Then nothing is started anywhere
    assert bus.starts() == []
    assert not coordinator._finished()  # not at once: a capable worker may still come
    # and once that lasted start_timeout_s, the run ends as a failure naming the plug-in and the worker
    time.sleep(0.02)
    assert coordinator._finished() and not coordinator.success
    assert coordinator.error is not None
    assert "no worker listening can run this job" in coordinator.error
    assert "w2" in coordinator.error and "'dqn'" in coordinator.error


def test_a_start_for_a_worker_that_vanished_is_dropped_and_sent_to_another(tmp_path: Path) -> None:
    # Given a mixed roster in which w1 can run the job
    coordinator, bus = make(tmp_path, collect_tasks=1)
    bus.listening("w1", plugins=everything())
    bus.listening("w2", plugins=without_dqn())
    heard(coordinator)
    # When w1's control queue is gone by the time the start is sent
    bus.alive.discard("p.collector.control.w1")
    coordinator.turn()
    # Then no start was sent and no task waits for an answer that cannot come
    assert bus.starts() == [] and coordinator.driver.tasks == {}
    # and when w1 is back, its next fill reaches it
    bus.alive.add("p.collector.control.w1")
    coordinator.turn()
    assert [s.queue for s in bus.starts()] == ["p.collector.control.w1"]


def test_the_roster_forgets_a_worker_that_missed_two_rounds() -> None:
    # Given a roster that heard of a worker lacking the job's algorithm
    bus = FakeBus()
    bus.listening("w2", plugins=without_dqn())
    roster = Roster(bus, (Requirement("algorithm", "dqn", None),), refresh_s=1.0)
    roster.refresh(now=0.0)
    roster.refresh(now=0.1)
    assert roster.mixed
    # When it stops answering for more than two rounds
    bus.roster = []
    for now in (1.0, 2.0, 3.0):
        roster.refresh(now=now)
    # Then it no longer counts either way, and each round's broadcast was closed before the next
    assert not roster.mixed and roster.workers == {}
    assert len(bus.broadcasts) == 4 and bus.finished_broadcasts == [b.correlation_id for b in bus.broadcasts[:3]]


def test_an_eval_cut_short_by_the_end_of_the_run_is_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an eval task running when the run ends
    coordinator, bus = make(tmp_path, idle=0, eval_interval_s=0.0)
    coordinator.turn()
    (evaluation,) = [s for s in bus.starts() if StartTask.from_wire(s.body).cfg.eval_flag]
    bus.accept(evaluation, "w9")
    coordinator.turn()
    # When the shutdown closes it and its worker answers with no episode finished
    coordinator.stop.set()
    with caplog.at_level("INFO", logger="worker.coordinator.stop_rule"):
        coordinator.driver.close_all()
        bus.replies[bus.sent[-1].correlation_id] = finished(
            eval_flag=True, train_iter=9, steps=40, returns=[]
        ).to_wire()
        coordinator._shutdown()
    # Then it is said at INFO, not warned about
    (record,) = [r for r in caplog.records if "eval task" in r.getMessage()]
    assert record.levelname == "INFO" and "cut short by the end of the run" in record.getMessage()


def test_the_run_log_and_summary_of_a_run_without_a_stop_value_are_strict_json(tmp_path: Path) -> None:
    coordinator, _bus = make(tmp_path, idle=0)
    coordinator.job = JobConfig.load(None, **{"env.stop_value": math.inf})
    coordinator.stop.set()
    summary = coordinator.run()

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    written = [json.loads(line, parse_constant=refuse) for line in lines][-1]
    assert written["stop_value"] == "inf" and float(written["stop_value"]) == summary["stop_value"]
    assert json.loads(json_text.dumps(summary), parse_constant=refuse)["stop_value"] == "inf"


class Clock:
    """Simulated monotonic time that moves only when the coordinator waits on its bus."""

    def __init__(self) -> None:
        self.now = time.monotonic()  # where the coordinator's own deadlines were set from

    def __call__(self) -> float:
        return self.now


def on_a_clock(monkeypatch: pytest.MonkeyPatch, bus: FakeBus) -> Clock:
    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)

    def wait(seconds: float) -> None:
        clock.now += seconds

    monkeypatch.setattr(bus, "wait", wait)
    return clock


def test_the_end_of_a_run_waits_for_a_start_nobody_takes_about_a_second_not_the_close_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a run whose start request no collector takes (none listens)
    coordinator, bus = make(tmp_path, idle=0, collect_tasks=1)
    coordinator.turn()
    assert len(bus.starts()) == 1
    clock = on_a_clock(monkeypatch, bus)
    began = clock.now
    # When the run ends (its budget, say)
    coordinator._shutdown()
    # Then it gave the start about a second, not the SHUTDOWN_S a running task's close gets
    assert clock.now - began <= loop_module.START_CANCEL_S + 0.2 < coordinator.shutdown_s
    assert not coordinator.driver.tasks and bus.closed


def test_a_coordinator_with_no_collector_listening_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator, bus = make(tmp_path, idle=0, collect_tasks=1)
    clock = on_a_clock(monkeypatch, bus)
    ended = clock.now + 30.0
    with caplog.at_level("INFO", logger="worker.coordinator.loop"):
        while clock.now < ended:
            coordinator.turn()
    said = [r for r in caplog.records if "no collector is listening" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING" and "p.collector.tasks" in said[0].getMessage()
    assert coordinator.stats.no_workers
    assert "no collector listening" in status_text(coordinator.stats, "workers 0")
    # And once one listens, the status line stops saying it
    bus.idle_workers = 1
    ended = clock.now + 5.0
    while clock.now < ended:
        coordinator.turn()
    assert not coordinator.stats.no_workers
    assert "no collector listening" not in status_text(coordinator.stats, "workers 0")


def test_a_coordinator_whose_collectors_listen_says_nothing_of_missing_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator, bus = make(tmp_path, idle=2, collect_tasks=1)
    clock = on_a_clock(monkeypatch, bus)
    ended = clock.now + 30.0
    with caplog.at_level("INFO", logger="worker.coordinator.loop"):
        while clock.now < ended:
            coordinator.turn()
    assert not [r for r in caplog.records if "no collector" in r.getMessage()]
