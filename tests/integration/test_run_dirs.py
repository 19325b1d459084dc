"""Runs that reuse a name, and runs that die without cleaning up, on the real broker.

* A second ``warren run --name`` is refused, and ``--resume`` continues the first: its
  counters, its policy and its logs (appended, never overwritten).
* What an interrupted run leaves (a second Ctrl-C exits at once) is removed by the next
  ``warren run`` for an unnamed run, and by ``warren clean`` for any run; nothing of a run
  that is alive is touched.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from messaging import BrokerLink, Names, Settings
from tests.broker_admin import wait_until
from tests.procs import role_env
from worker.cli import main
from worker.cli.cleanup import remove_run_topology, sweep_interrupted_runs
from worker.cli.run_dir import LOCK_NAME, RunLock, RunState, new_record, state_of

pytestmark = pytest.mark.rabbitmq

SOURCE = str(Path(__file__).resolve().parents[2])


def run_env(settings: Settings) -> dict[str, str]:
    """A ``warren run`` from another directory (its runs/ there) that imports this tree's warren."""
    return {
        **os.environ,
        **role_env(settings),
        "PYTHONPATH": os.pathsep.join(filter(None, [SOURCE, os.environ.get("PYTHONPATH")])),
    }


def warren_run(settings: Settings, cwd: Path, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", "--progress", "log", "--collectors", "1", *args],
        env=run_env(settings),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def summary_of(workdir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((workdir / "summary.json").read_text())
    return summary


def updates_when_stopped(learner_log: str) -> int:
    """The updates the learner counted as it stopped (its last words in ``learner_log``)."""
    counts = re.findall(r"learner stopped after (\d+) updates", learner_log)
    assert counts, learner_log[-2000:]
    return int(counts[-1])


@pytest.mark.slow
def test_a_reused_run_name_is_refused_and_resume_continues_counters_policy_and_logs(
    settings: Settings, tmp_path: Path
) -> None:
    budget = ["--stop-value", "inf", "--max-env-steps"]
    # Given a named run that ended on its env step budget
    first = warren_run(settings, tmp_path, "--name", "again", *budget, "20000")
    workdir = tmp_path / "runs" / "again"
    assert first.returncode == 3, first.stderr[-3000:]
    before = summary_of(workdir)
    learner_log = (workdir / "logs" / "learner.log").read_text()
    assert before["learner_train_steps"] == updates_when_stopped(learner_log) > 0  # its last, not a lagging count
    # When the same name is run again without --resume, it is refused and changes nothing
    refused = warren_run(settings, tmp_path, "--name", "again", *budget, "20000")
    assert refused.returncode == 2 and "--resume continues it" in refused.stderr
    assert (workdir / "logs" / "learner.log").read_text() == learner_log
    assert summary_of(workdir) == before
    # When it is resumed with a larger budget
    resumed = warren_run(settings, tmp_path, "--name", "again", "--resume", *budget, "40000")
    assert resumed.returncode == 3, resumed.stderr[-3000:]
    after = summary_of(workdir)
    # Then its counters went on from the first run's, the learner's with its policy
    assert after["env_steps"] >= 40_000 > before["env_steps"] >= 20_000
    assert after["tasks_done"] > before["tasks_done"]
    assert after["learner_train_steps"] > before["learner_train_steps"] > 0
    assert after["policy_iter"] >= before["policy_iter"]
    # and the logs of both runs are there, the first run's first
    log = (workdir / "logs" / "learner.log").read_text()
    assert log.startswith(learner_log) and "resumed from the checkpoint at policy version" in log[len(learner_log) :]
    assert after["learner_train_steps"] == updates_when_stopped(log[len(learner_log) :])
    assert state_of(workdir) is RunState.ENDED


@pytest.mark.slow
def test_the_next_run_removes_what_a_run_stopped_by_a_second_ctrl_c_left(settings: Settings, tmp_path: Path) -> None:
    # Given an unnamed run that gets two Ctrl-Cs in a row once it collects
    log = tmp_path / "interrupted.log"
    with log.open("wb") as out:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worker.cli",
                "run",
                "--progress",
                "log",
                "--collectors",
                "1",
                "--stop-value",
                "inf",
            ],
            env=run_env(settings),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    runs = tmp_path / "runs"
    try:

        def collecting() -> bool:
            logs = list(runs.glob("*/run.jsonl"))
            return bool(logs) and '"kind": "task"' in logs[0].read_text()

        wait_until(collecting, 90, "the run's first finished task")
        run.send_signal(signal.SIGINT)
        wait_until(lambda: "stopping cleanly" in log.read_text(), 10, "the first Ctrl-C to be seen")
        run.send_signal(signal.SIGINT)
        assert run.wait(30) == 128 + signal.SIGINT, log.read_text()[-2000:]
    finally:
        if run.poll() is None:
            run.kill()
    (workdir,) = runs.iterdir()
    # Then it left its queues, no summary, and a workdir that shows it was interrupted
    names = Names(f"{settings.prefix}-{workdir.name}")
    with BrokerLink(settings, "test") as link:
        assert link.queue_exists(names.learner_data("main")) and link.queue_exists(names.collector_tasks)

        def children_gone() -> bool:
            return not (link.queue_consumers(names.learner_data("main")) or link.queue_consumers(names.collector_tasks))

        wait_until(children_gone, 60, "the interrupted run's learner and collector to stop")
    assert state_of(workdir) is RunState.INTERRUPTED and not (workdir / "summary.json").exists()
    # When the next run starts (and ends on a short budget)
    assert warren_run(settings, tmp_path, "--max-env-steps", "4096", "--stop-value", "inf").returncode == 3
    # Then the interrupted run's queues, step files and lock are gone, and it has a summary saying why
    with BrokerLink(settings, "test-check") as link:
        assert not link.queue_exists(names.learner_data("main"))
        assert not link.queue_exists(names.collector_tasks)
        assert not link.queue_exists(names.dead_letter_queue)
    assert not list((workdir / "data").iterdir())
    assert state_of(workdir) is RunState.ENDED and not (workdir / LOCK_NAME).exists()
    assert summary_of(workdir)["reason"].startswith("interrupted")


def fake_run(settings: Settings, runs: Path, name: str, *, named: bool = False) -> tuple[Path, Names, RunLock]:
    """A run's workdir and queues as ``warren run`` leaves them, with its lock held (release: it is alive)."""
    workdir = runs / name
    prefix = f"{settings.prefix}-{name}"
    record = new_record(name, prefix, named=named, buffer_id="main", broker=settings.redacted_url)
    lock = RunLock.acquire(workdir, record)
    (workdir / "data").mkdir()
    (workdir / "data" / "env_0_step").write_bytes(b"step data")
    names = Names(prefix)
    with BrokerLink(settings.replace(prefix=prefix), "test") as link:
        for decl in (names.collector_tasks_decl(), names.learner_data_decl("main")):
            link.declare(decl)
        link.publish(names.learner_data("main"), b"unread metadata", persistent=True)
    return workdir, names, lock


def exists(settings: Settings, queue: str) -> bool:
    with BrokerLink(settings, "test-check") as link:
        return link.queue_exists(queue)


def test_a_clean_up_removes_only_what_interrupted_runs_left(settings: Settings, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    dead, dead_names, dead_lock = fake_run(settings, runs, "dead")
    declare_roster(settings, dead_names)  # its collectors' roster exchange
    dead_lock.unlock()  # its process died
    alive, alive_names, alive_lock = fake_run(settings, runs, "alive")
    stopping, stopping_names, stopping_lock = fake_run(settings, runs, "stopping")
    stopping_lock.unlock()  # died, but its learner still consumes its queue
    named, named_names, named_lock = fake_run(settings, runs, "named", named=True)
    named_lock.unlock()
    consumer = BrokerLink(settings, "test-learner").open()
    try:
        consumer.subscribe(stopping_names.learner_data_decl("main"), declare=False)
        consumer.process_events(0.2)
        # When the next run starts: only the interrupted unnamed run that nobody uses is removed
        sweep_interrupted_runs(runs, settings, skip=tmp_path / "runs" / "me")
        for queue in (dead_names.learner_data("main"), dead_names.collector_tasks, dead_names.dead_letter_queue):
            assert not exists(settings, queue), queue
        assert not exchange_exists(settings, dead_names.collector_roster)
        assert not list((dead / "data").iterdir()) and state_of(dead) is RunState.ENDED
        assert summary_of(dead)["reason"].startswith("interrupted")
        assert exists(settings, alive_names.learner_data("main")) and list((alive / "data").iterdir())
        assert state_of(alive) is RunState.RUNNING
        assert exists(settings, stopping_names.learner_data("main")) and state_of(stopping) is RunState.INTERRUPTED
        assert exists(settings, named_names.learner_data("main")) and state_of(named) is RunState.INTERRUPTED
    finally:
        consumer.close()
    # And warren clean removes the interrupted named run's, and the stopping one's now it stopped
    assert main(["clean", str(named), str(stopping), str(alive), "--amqp-url", settings.amqp_url]) == 0
    for queue in (named_names.collector_tasks, named_names.dead_letter_queue, stopping_names.learner_data("main")):
        assert not exists(settings, queue), queue
    assert state_of(named) is RunState.ENDED and state_of(stopping) is RunState.ENDED
    assert exists(settings, alive_names.learner_data("main")) and state_of(alive) is RunState.RUNNING
    alive_lock.release()
    with BrokerLink(settings.replace(prefix=alive_names.prefix), "test-cleanup") as link:
        for queue in (alive_names.learner_data("main"), alive_names.collector_tasks, alive_names.dead_letter_queue):
            link.delete_queue(queue)
        link.delete_exchange(alive_names.dead_letter_exchange)


def exchange_exists(settings: Settings, exchange: str) -> bool:
    with BrokerLink(settings, "test-check", declare_dead_letters=False) as link:
        return link.exchange_exists(exchange)


def declare_roster(settings: Settings, names: Names) -> None:
    """What a run's collector declares: the roster exchange, with its control queue bound to it (then gone)."""
    with BrokerLink(settings.replace(prefix=names.prefix), "test-collector") as link:
        link.declare(names.collector_control_decl("c0"))
        link.delete_queue(names.collector_control("c0"))


def test_a_run_deletes_its_roster_exchange_at_its_end_and_a_named_run_keeps_it_for_joined_collectors(
    settings: Settings,
) -> None:
    for named in (False, True):
        names = Names(f"{settings.prefix}-{'named' if named else 'plain'}")
        declare_roster(settings, names)
        assert exchange_exists(settings, names.collector_roster)
        assert remove_run_topology(settings.replace(prefix=names.prefix), "main", keep_shared=named)
        assert exchange_exists(settings, names.collector_roster) is named, names.prefix
    with BrokerLink(settings.replace(prefix=names.prefix), "test-cleanup") as link:
        link.delete_queue(names.collector_tasks)
        link.delete_queue(names.dead_letter_queue)
        link.delete_exchange(names.dead_letter_exchange)
        link.delete_exchange(names.collector_roster)


def test_warren_clean_removes_what_an_ended_run_kept_and_says_only_what_it_removed_this_time(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a run that ended (an older warren's: it left its roster exchange too)
    workdir, names, lock = fake_run(settings, tmp_path / "runs", "old")
    declare_roster(settings, names)
    with BrokerLink(settings, "test") as link:
        link.delete_queue(names.learner_data("main"))  # a run deletes its learner's queue at its end
    lock.release()
    assert state_of(workdir) is RunState.ENDED
    argv = ["clean", str(workdir), "--amqp-url", settings.amqp_url]
    # When warren clean runs, it removes them and says so
    assert main(argv) == 0
    removed = [names.collector_tasks, names.dead_letter_queue, names.dead_letter_exchange, names.collector_roster]
    assert f"removed what run old kept: {', '.join(removed)}" in capsys.readouterr().err
    assert not exists(settings, names.collector_tasks) and not exists(settings, names.dead_letter_queue)
    assert not exchange_exists(settings, names.dead_letter_exchange)
    assert not exchange_exists(settings, names.collector_roster)
    # and run again, it finds nothing, says nothing, and looking brought nothing back
    assert main(argv) == 0
    assert "removed" not in capsys.readouterr().err
    assert not exists(settings, names.dead_letter_queue) and not exchange_exists(settings, names.dead_letter_exchange)
