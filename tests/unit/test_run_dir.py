"""A run's directory: a reused name is refused unless --resume continues it, and a dead run shows as interrupted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from messaging import ConfigurationError, Settings
from tests.fake_bus import FakeBus
from worker.cli import main
from worker.cli.children import Children
from worker.cli.run_dir import LOCK_NAME, RunLock, RunRecord, RunState, new_record, read_record, state_of
from worker.config import CoordinatorConfig
from worker.coordinator.loop import Coordinator
from worker.job import JobConfig


def record(run_id: str = "exp1") -> RunRecord:
    return new_record(run_id, f"warren-{run_id}", named=True, buffer_id="main", broker="amqp://guest:***@h/%2F")


def test_a_workdir_is_new_then_running_then_ended(tmp_path: Path) -> None:
    workdir = tmp_path / "exp1"
    assert state_of(workdir) is RunState.NEW
    lock = RunLock.acquire(workdir, record())
    assert state_of(workdir) is RunState.RUNNING
    written = read_record(workdir)
    assert written is not None and (written.run_id, written.prefix, written.named) == ("exp1", "warren-exp1", True)
    with pytest.raises(ConfigurationError, match="run exp1 is running"):
        RunLock.acquire(workdir, record())
    (workdir / "job.json").write_text("{}")
    lock.release()
    assert state_of(workdir) is RunState.ENDED and not (workdir / LOCK_NAME).exists()


def test_a_run_whose_process_died_without_cleaning_up_shows_as_interrupted(tmp_path: Path) -> None:
    workdir = tmp_path / "exp1"
    lock = RunLock.acquire(workdir, record())
    lock.unlock()  # what the kernel does when the process dies: the lock goes, the file stays
    assert state_of(workdir) is RunState.INTERRUPTED
    again = RunLock.take(workdir)  # a resume (or a clean-up) can take it over
    assert again is not None and state_of(workdir) is RunState.RUNNING
    again.release()


def used_workdir(tmp_path: Path) -> Path:
    workdir = tmp_path / "runs" / "exp1"
    (workdir / "logs").mkdir(parents=True)
    (workdir / "logs" / "learner.log").write_text("the first run's log\n")
    (workdir / "job.json").write_text(JobConfig().to_json())
    return workdir


def test_a_second_run_of_a_used_name_is_refused_and_leaves_the_first_runs_files_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = used_workdir(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WARREN_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2F")  # never reached
    assert main(["run", "--name", "exp1", "--progress", "off"]) == 2
    err = capsys.readouterr().err
    assert "run exp1 already has a run in runs/exp1, which ended: --resume continues it" in err
    assert (workdir / "logs" / "learner.log").read_text() == "the first run's log\n"
    assert sorted(p.name for p in workdir.iterdir()) == ["job.json", "logs"]


def test_a_used_workdir_is_refused_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = used_workdir(tmp_path)
    monkeypatch.setenv("WARREN_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2F")
    assert main(["run", "--workdir", str(workdir), "--progress", "off"]) == 2
    assert "--resume continues it" in capsys.readouterr().err


def test_resume_goes_past_the_workdir_check_to_the_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = used_workdir(tmp_path)
    monkeypatch.setenv("WARREN_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2F")  # nothing listens there
    args = ["run", "--workdir", str(workdir), "--resume", "--progress", "off", "--connect-timeout-s", "1"]
    assert main(args) == 1
    assert "no usable broker" in capsys.readouterr().err
    assert (workdir / "logs" / "learner.log").read_text() == "the first run's log\n"


def test_a_childs_log_is_appended_to_never_overwritten(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "version.log").write_text("the first run's log\n")
    children = Children({"PATH": "/usr/bin:/bin"}, logs)
    children.start("version", ["--version"])
    children.procs["version"].wait(60)
    children.stop()
    text = (logs / "version.log").read_text()
    assert text.startswith("the first run's log\n") and "warren" in text


def coordinator(run_log: Path, *, continue_ended: bool) -> Coordinator:
    job = JobConfig.load(None, **{"coordinator.eval_interval_s": 3600.0})
    config = CoordinatorConfig(transport=Settings(prefix="p"), job=job, run_log=run_log, progress="off")
    return Coordinator(config, bus=FakeBus(idle_workers=0), continue_ended=continue_ended)


def test_a_resumed_run_counts_on_from_where_the_ended_run_stopped(tmp_path: Path) -> None:
    # Given a run that counted 12,000 env steps and ended
    first = coordinator(tmp_path / "run.jsonl", continue_ended=False)
    first.stats.env_steps, first.stats.samples, first.stats.tasks_done = 12_000, 12_000, 6
    first.stop.set()
    first.run()
    # When it is resumed (warren run --resume), its counters go on; a fresh coordinator starts from zero
    resumed = coordinator(tmp_path / "run.jsonl", continue_ended=True)
    resumed.stop.set()
    summary = resumed.run()
    assert (summary["env_steps"], summary["samples"], summary["tasks_done"]) == (12_000, 12_000, 6)
    fresh = coordinator(tmp_path / "run.jsonl", continue_ended=False)
    fresh.stop.set()
    assert fresh.run()["env_steps"] == 0
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert kinds.count("summary") == 3


def test_resume_of_a_name_no_run_used_is_refused_naming_the_runs_there_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    used_workdir(tmp_path)  # runs/exp1, a run that ended
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WARREN_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2F")  # never reached
    # A mistyped name: it would otherwise train from scratch under that name
    assert main(["run", "--name", "exp2", "--resume", "--progress", "off"]) == 2
    err = capsys.readouterr().err
    assert "nothing to resume: no run used runs/exp2; runs in runs/: exp1 (ended)" in err
    assert not (tmp_path / "runs" / "exp2").exists()
    # No name at all: the run would get a fresh id, which no run used either
    assert main(["run", "--resume", "--progress", "off"]) == 2
    err = capsys.readouterr().err
    assert "--resume continues a run: give its --name (or its --workdir); runs in runs/: exp1 (ended)" in err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["exp1"]


DEAD_BROKER = "amqp://guest:guest@127.0.0.1:1/%2F"  # nothing listens there


def test_a_dead_broker_is_said_once_naming_the_bound_the_check_before_the_run_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WARREN_AMQP_URL", DEAD_BROKER)
    args = ["run", "--workdir", str(tmp_path / "new"), "--progress", "off", "--connect-timeout-s", "2"]
    assert main(args) == 1
    err = capsys.readouterr().err
    # One message, not a CRITICAL log line and the same words again on stderr
    assert err.count("no usable broker") == 1 and "CRITICAL" not in err
    (fatal,) = [line for line in err.splitlines() if "no usable broker" in line]
    assert fatal.startswith("warren run: no usable broker: could not connect to amqp://guest:***@127.0.0.1:1/%2F")
    # and the bound it states is the one the retries used, said to be this check's
    assert "retrying for up to 2 s" in err
    assert "warren run's check before it starts anything gives the broker 2 s" in fatal


def test_more_collectors_than_cpus_are_warned_about_with_what_that_cost_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from worker.config import cpu_budget

    monkeypatch.setenv("WARREN_AMQP_URL", DEAD_BROKER)
    cpus = cpu_budget()
    args = ["run", "--workdir", str(tmp_path / "new"), "--progress", "off", "--connect-timeout-s", "1"]
    assert main([*args, "--collectors", str(cpus + 1)]) == 1
    err = capsys.readouterr().err
    assert f"WARNING [run] worker.cli.run: {cpus + 1} collectors on {cpus} CPUs" in err
    assert "100 on 2 cores took 14 s to start and 3.6 GB, and 22 of them ever got a task" in err
    assert main([*args, "--collectors", str(cpus)]) == 1
    assert "collectors on" not in capsys.readouterr().err
