"""The whole job on the real broker: coordinator, collectors and learner train CartPole."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from messaging import BrokerLink, Names, RpcClient, Settings
from tests.broker_admin import queues, wait_until
from tests.observe import free_port_block, scalars, scrape, total
from tests.procs import Proc, role_env, wait_for_queue
from worker.cli.exit_codes import ExitCode
from worker.storage import PolicyStore

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _run_job(settings: Settings, workdir: Path, *extra: str, timeout_s: float = 240) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, **role_env(settings)}
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", "--workdir", str(workdir), "--progress", "log", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    summary_path = workdir / "summary.json"
    assert summary_path.exists(), done.stdout[-2000:] + done.stderr[-4000:]
    return done.returncode, json.loads(summary_path.read_text())


def _records(workdir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (workdir / "run.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_two_collectors_train_cartpole_to_the_stop_value(settings: Settings, tmp_path: Path) -> None:
    # Given the shipped job with 2 collectors, when it runs within a 180 s / 300k-step budget
    code, summary = _run_job(settings, tmp_path / "run", "--collectors", "2", "--max-time-s", "180")
    # Then it reaches 195 and everything stops cleanly
    assert code == 0 and summary["success"], summary
    assert summary["best_eval"] >= 195.0
    assert set(summary["workers_seen"]) == {"c0", "c1"}
    assert all(c == 0 for c in summary["children_exit_codes"].values()), summary["children_exit_codes"]
    assert not any(_alive(pid) for pid in summary["children_pids"].values())
    # The collectors read the learner's policies back: train_iter grows across tasks
    iters = [r["train_iter"] for r in _records(tmp_path / "run", "task")]
    assert iters[0] == 0 and max(iters) > 100
    assert iters == sorted(iters) or max(iters) > iters[0]
    # The learner deleted the step files it consumed (only unconsumed stragglers may remain)
    left = [p for p in (tmp_path / "run" / "data").iterdir()]
    assert len(left) < summary["samples"] / 32 / 4
    # TensorBoard shows the run from its directory: the evaluations up to 195 at their env steps
    board = tmp_path / "run" / "tensorboard"
    run_curves, learner_curves = scalars(board / "coordinator"), scalars(board / "learner")
    evals = _records(tmp_path / "run", "eval")
    assert [step for step, _ in run_curves["eval/return"]] == [r["env_steps"] for r in evals]
    assert [value for _, value in run_curves["eval/return"]] == pytest.approx([r["reward_mean"] for r in evals])
    assert run_curves["eval/return"][-1][1] >= 195.0
    # The run ended on a confirmed eval of a trained policy, and left that policy, kept, in its policy file
    (deciding,) = [r for r in evals if r.get("success")]
    assert deciding["confirms"] and deciding["train_iter"] == summary["policy_evaluated"] >= 1
    assert summary["policy_left"] == summary["policy_evaluated"]
    store = PolicyStore(tmp_path / "run" / "policy")
    assert store.version("policy_main") == summary["policy_evaluated"] and store.is_kept("policy_main")
    assert {"collect/episode_return", "collect/episode_length", "throughput/env_steps_per_s"} <= run_curves.keys()
    assert run_curves["run/tasks_rerun"][-1][1] == summary["tasks_rerun"]
    assert {"learner/loss", "learner/grad_norm", "learner/policy_lag", "learner/samples_per_s"} <= learner_curves.keys()


def test_a_collector_killed_mid_task_does_not_stop_the_run(settings: Settings, tmp_path: Path, link: Any) -> None:
    # Given a coordinator, a learner and three collectors with long collect tasks, one per
    # collector and one more waiting in the task queue for the next free collector
    job = tmp_path / "job.toml"
    job.write_text(  # few envs and many samples: a task lasts about a second, long enough to kill into
        "[env]\ncollector_env_num = 8\n[collector]\nn_sample = 16384\n"
        "[coordinator]\nstart_ahead = 1\neval_interval_s = 5.0\nmax_run_ahead_samples = 65536\n"
    )
    volume = {"WARREN_PATH_DATA": str(tmp_path / "data"), "WARREN_PATH_POLICY": str(tmp_path / "policy")}
    procs: list[Proc] = []
    names = Names(settings.prefix)
    try:
        procs.append(Proc(["learner", "--config", str(job)], env=role_env(settings, **volume), log=tmp_path / "l.log"))
        for i in range(3):
            procs.append(
                Proc(
                    ["collector", "--worker-id", f"c{i}"], env=role_env(settings, **volume), log=tmp_path / f"c{i}.log"
                )
            )
            wait_for_queue(link, names.collector_control(f"c{i}"))
        coordinator = Proc(
            [
                "coordinator",
                "--config",
                str(job),
                "--run-log",
                str(tmp_path / "run.jsonl"),
                "--progress",
                "log",
                "--max-time-s",
                "200",
                # Learning, not the budget, ends the run (400k env steps, the old default, were not always enough)
                "--max-env-steps",
                "4000000",
            ],
            env=role_env(settings),
            log=tmp_path / "coordinator.log",
        )
        procs.append(coordinator)
        # When one busy collector is killed with SIGKILL in the middle of its task
        victim = _busy_collector(settings, procs[1:4])
        victim.kill()
        # Then the run still reaches the stop value, and the lost task was run again elsewhere
        assert coordinator.wait(220) == 0, coordinator.log()[-3000:]
        summary = json.loads(coordinator.log().strip().splitlines()[-1])
        assert summary["success"] and summary["tasks_rerun"] >= 1
        assert "is gone" in coordinator.log()
    finally:
        for proc in procs:
            proc.kill()


def _busy_collector(settings: Settings, collectors: list[Proc]) -> Proc:
    deadline = time.monotonic() + 60
    names = Names(settings.prefix)
    with RpcClient(settings, "test-probe") as client:
        while time.monotonic() < deadline:
            for i, proc in enumerate(collectors):
                info = client.call(names.collector_control(f"c{i}"), {"name": "resource"}, timeout_s=5)
                if info["busy"] and str(info["task_id"]).startswith("collect"):
                    return proc
            time.sleep(0.2)
    raise AssertionError("no collector got busy")


def test_ctrl_c_stops_the_whole_job_and_leaves_no_process(settings: Settings, tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    env = {**os.environ, **role_env(settings)}
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker.cli",
            "run",
            "--workdir",
            str(workdir),
            "--progress",
            "log",
            "--collectors",
            "2",
            "--stop-value",
            "100000",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: (workdir / "run.jsonl").exists() and bool(_records(workdir, "task")), 60, "the first finished task"
        )
        # Ctrl-C: SIGINT to the whole foreground process group
        os.killpg(run.pid, signal.SIGINT)
        run.wait(60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    summary = json.loads((workdir / "summary.json").read_text())
    assert run.returncode == ExitCode.INTERRUPTED == 128 + signal.SIGINT and summary["reason"] == "stopped by signal"
    assert all(code == 0 for code in summary["children_exit_codes"].values()), summary["children_exit_codes"]
    assert not any(_alive(pid) for pid in summary["children_pids"].values())


def test_collect_tasks_follow_the_number_of_workers(settings: Settings, tmp_path: Path, link: Any) -> None:
    # Given the default job (collect_tasks = 0: one per worker) and three collectors
    job = tmp_path / "job.toml"
    job.write_text(  # long tasks (few envs, many samples), so the three overlap for seconds
        "[env]\ncollector_env_num = 4\n[collector]\nn_sample = 20000\n"
        "[coordinator]\neval_interval_s = 3600.0\nmax_env_steps = 60000\nmax_run_ahead_samples = 1000000\n"
        "[algorithm]\nlearning_starts = 100\n"
    )
    volume = {"WARREN_PATH_DATA": str(tmp_path / "data"), "WARREN_PATH_POLICY": str(tmp_path / "policy")}
    names = Names(settings.prefix)
    procs: list[Proc] = []
    try:
        procs.append(Proc(["learner", "--config", str(job)], env=role_env(settings, **volume), log=tmp_path / "l.log"))
        for i in range(3):
            env = role_env(settings, **volume)
            procs.append(Proc(["collector", "--worker-id", f"w{i}"], env=env, log=tmp_path / f"w{i}.log"))
            wait_for_queue(link, names.collector_control(f"w{i}"))
        # When the coordinator runs without being told how many workers there are
        coordinator = Proc(
            ["coordinator", "--config", str(job), "--run-log", str(tmp_path / "run.jsonl"), "--stop-value", "1e9"],
            env=role_env(settings),
            log=tmp_path / "coordinator.log",
        )
        procs.append(coordinator)
        assert coordinator.wait(120) == 3, coordinator.log()[-2000:]
    finally:
        for proc in procs:
            proc.kill()
    # Then all three workers collected at the same time
    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    # (a task done but not closed yet no longer holds its worker: not counted)
    concurrent = max(
        sum(not task["done"] for task in r["running"].values()) for r in records if r["kind"] == "checkpoint"
    )
    assert concurrent == 3
    assert {r["worker_id"] for r in records if r["kind"] == "task"} == {"w0", "w1", "w2"}
    assert "one collect task per worker" in coordinator.log()


def serves(port: int) -> bool:
    return scrape(port) is not None


def test_broker_and_metrics_flags_given_to_warren_run_reach_the_collectors(settings: Settings, tmp_path: Path) -> None:
    # Given warren run with a non-default metadata queue length, metrics from a first port on, and long collect tasks
    job = tmp_path / "job.toml"
    job.write_text("[collector]\nn_sample = 50000\n[coordinator]\nmax_run_ahead_samples = 50000\n")
    env = {**os.environ, **role_env(settings)}
    first = free_port_block(3)
    args = ["run", "--workdir", str(tmp_path / "run"), "--progress", "off", "--config", str(job)]
    args += ["--collectors", "1", "--metadata-queue-length", "3", "--max-time-s", "90", "--metrics-port", str(first)]
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", *args], env=env)
    lengths: set[int] = set()
    try:
        # When a collect task runs
        def declared() -> bool:
            for queue in queues(settings.amqp_url):
                if queue["name"].startswith(settings.prefix) and ".metadata." in queue["name"]:
                    lengths.add(queue["arguments"].get("x-max-length"))
            return bool(lengths)

        wait_until(declared, 60, "a metadata queue")
        # Then every process serves its metrics on its own port: coordinator, learner, collector c0
        roles = [("coordinator", "coordinator"), ("learner", "learner"), ("collector", "c0")]
        for port, (role, worker_id) in enumerate(roles, start=first):
            wait_until(partial(serves, port), 60, f"{role}'s /metrics on port {port}")
            assert total(scrape(port), "warren_build_info", role=role, worker_id=worker_id) == 1, (port, role)
        wait_until(lambda: total(scrape(first + 2), "warren_chunks_published_total") > 0, 60, "c0's first chunks")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    # And the collector declared its metadata queue with the flag's value, not the default
    assert lengths == {3}


def _run_command(
    settings: Settings, workdir: Path, *extra: str, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **role_env(settings)}
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", "--workdir", str(workdir), "--progress", "off", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--env-id", "NotAnEnv-v0"), "unknown env id 'NotAnEnv-v0'"),
        (("--env-id", "Pendulum-v1"), "algorithm 'dqn' cannot run this env: dqn needs Discrete actions"),
        (("--algorithm", "a3c"), "algorithm plug-in 'a3c' is not installed here"),
    ],
)
def test_a_job_whose_env_or_plugins_cannot_be_used_fails_before_any_child_starts(
    settings: Settings, tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    started = time.monotonic()
    done = _run_command(settings, tmp_path / "run", *args)
    assert done.returncode == 2  # a job that cannot run is a configuration error
    assert said in done.stderr
    assert time.monotonic() - started < 30  # not the 30-minute budget
    assert not (tmp_path / "run" / "logs").exists()  # no child was started


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("amqp://guest:guest@127.0.0.1:1/%2F", "no usable broker"),
        ("amqp://guest:not-the-password@127.0.0.1:5672/%2F", "no usable broker"),
    ],
)
def test_a_broker_that_cannot_be_used_fails_the_run_in_seconds(
    settings: Settings, tmp_path: Path, url: str, said: str
) -> None:
    started = time.monotonic()
    done = _run_command(settings, tmp_path / "run", "--amqp-url", url)
    assert done.returncode == 1 and said in done.stderr
    assert "password" not in done.stderr or "not-the-password" not in done.stderr
    assert time.monotonic() - started < 20
    assert "Traceback" not in done.stderr


def test_the_run_ends_when_its_learner_dies_and_leaves_the_broker_clean(settings: Settings, tmp_path: Path) -> None:
    # Given a run with a long budget
    env = {**os.environ, **role_env(settings)}
    args = ["run", "--workdir", str(tmp_path / "run"), "--progress", "off", "--collectors", "1", "--max-time-s", "300"]
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", *args], env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _child(proc.pid, "learner") is not None, 60, "the learner process")
        wait_until(lambda: bool(list((tmp_path / "run" / "policy").glob("policy_main"))), 60, "the first policy")
        # When the learner dies
        learner = _child(proc.pid, "learner")
        assert learner is not None
        os.kill(learner, signal.SIGKILL)
        # Then the run ends soon, failed, saying why
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "the learner exited" in stderr
    # and its queues and exchange are gone from the broker
    left = [q["name"] for q in queues(settings.amqp_url) if q["name"].startswith(settings.prefix + "-")]
    assert left == []
    assert not list((tmp_path / "run" / "data").iterdir())


def _child(parent: int, role: str) -> int | None:
    """The pid of ``parent``'s child running ``warren <role>``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == parent and role.encode() in cmdline:
            return int(entry.name)
    return None


def _join_command(log: Path) -> list[str] | None:
    """The join command a named run logs, as argv (``None`` until it is logged)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        if "warren collector --prefix" in line:
            return shlex.split(line.split("): ", 1)[1])
    return None


def test_a_collector_started_elsewhere_joins_a_named_run(settings: Settings, tmp_path: Path) -> None:
    # Given a named run with one collector of its own, run from tmp_path (its workdir: runs/<name>),
    # with collect tasks of a few seconds (few envs, many samples) and no evaluations
    job = tmp_path / "job.toml"
    job.write_text(
        "[env]\ncollector_env_num = 4\n[collector]\nn_sample = 8000\n"
        "[coordinator]\neval_interval_s = 3600.0\nmax_run_ahead_samples = 1000000\n[algorithm]\nlearning_starts = 100\n"
    )
    # Run elsewhere than the source tree, the run must still import this tree's warren.
    source = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        **role_env(settings),
        "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")])),
    }
    log = tmp_path / "run.log"
    args = ["run", "--name", "joinable", "--collectors", "1", "--progress", "off", "--config", str(job)]
    args += ["--stop-value", "1e9", "--max-env-steps", "100000000", "--max-time-s", "600"]  # ended by the test
    with log.open("wb") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", *args], env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT
        )
    workdir = tmp_path / "runs" / "joinable"
    names = Names(f"{settings.prefix}-joinable")
    procs: list[Proc] = []
    try:
        # When a collector is started separately with the command the run logged (the password filled in)
        def logged() -> bool:
            assert run.poll() is None, log.read_text()[-3000:]
            return _join_command(log) is not None

        wait_until(logged, 60, "the logged join command")
        command = _join_command(log)
        assert command is not None
        split = command.index("warren")
        joined_env = dict(word.split("=", 1) for word in command[:split])
        assert ":<password>@" in joined_env["WARREN_AMQP_URL"]
        assert f":{urlsplit(settings.amqp_url).password}@" not in log.read_text()  # never the real password
        joined_env["WARREN_AMQP_URL"] = settings.amqp_url
        argv = [*command[split + 1 :], "--worker-id", "elsewhere"]
        assert argv[:3] == ["collector", "--prefix", names.prefix]
        procs.append(Proc(argv, env=joined_env, log=tmp_path / "elsewhere.log"))

        # Then both the run's collector and the joined one run collect tasks of the run, at the
        # same time: the number of collect tasks follows the listening collectors, not --collectors
        def both_collected_together() -> bool:
            assert run.poll() is None, log.read_text()[-3000:]
            if not (workdir / "run.jsonl").exists():
                return False
            collects = [r for r in _records(workdir, "task") if not r["eval_flag"]]

            def ran(worker: str) -> list[tuple[float, float]]:
                # Each task record says when its collector ran it: [finish_time - duration, finish_time].
                mine = [r for r in collects if r["worker_id"] == worker]
                return [(r["finish_time"] - r["duration"], r["finish_time"]) for r in mine]

            ours, joined = ran("c0"), ran("elsewhere")
            return any(a0 < b1 and b0 < a1 for a0, a1 in ours for b0, b1 in joined)

        wait_until(both_collected_together, 120, "collect tasks run by c0 and the joined collector at once")
        run.send_signal(signal.SIGINT)
        assert run.wait(90) == ExitCode.INTERRUPTED, log.read_text()[-3000:]
        # A named run leaves its task queue and roster to the collectors still listening, and deletes its
        # learner's queue
        assert procs[0].alive()
        with BrokerLink(settings, "test-check") as link:  # a fresh link: one idle through the run may be gone
            assert link.queue_exists(names.collector_tasks)
            assert link.exchange_exists(names.collector_roster)
            assert not link.queue_exists(names.learner_data("main"))
        assert "kept " + names.collector_tasks in log.read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
        for proc in procs:
            proc.kill()
        with BrokerLink(settings, "test-cleanup") as link:
            link.delete_queue(names.collector_tasks)
            link.delete_queue(names.dead_letter_queue)
            link.delete_exchange(names.dead_letter_exchange)
            link.delete_exchange(names.collector_roster)
