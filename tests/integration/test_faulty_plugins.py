"""What a third party's faulty plug-ins do to a run: it stops naming them, or it rides out what comes and goes.

The plug-ins are a package of their own (``tests/faulty_plugins``, distribution
``warren-faulty-plugins``), found the way an installed package's are: its entry points,
here from a ``.dist-info`` on ``PYTHONPATH``. Each test runs ``warren run`` with one
collector and a learner as separate processes on the session's broker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from messaging import Settings
from tests.procs import role_env
from worker.cli.exit_codes import ExitCode

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

FAULTY_PLUGINS = Path(__file__).resolve().parents[1] / "faulty_plugins"
#: How the faulty package names itself in every message about it.
GRID = "env plug-in 'grid' 0.1.0 (from warren-faulty-plugins, env '{}')"

PPO = """
[algorithm]
name = "ppo"
batch_steps = 256
minibatch_size = 64
epochs = 2
"""
DQN = """
[algorithm]
name = "dqn"
batch_size = 32
learning_starts = 64
train_steps_per_sample = 0.25
"""


def job(env_id: str, *, model: str = "gridnet", algorithm: str = PPO, kwargs: str = "", coordinator: str = "") -> str:
    """A job of the grid env (one fault, picked by its id) that ends on a budget: no stop value, no evals."""
    return f"""
[env]
plugin = "grid"
id = "{env_id}"
collector_env_num = 4
evaluator_env_num = 2
stop_value = inf

[env.kwargs]
{kwargs}
{algorithm}
[model]
name = "{model}"

[collector]
n_sample = 256
traj_len = 16

[coordinator]
max_run_ahead_samples = 512
eval_interval_s = 1000
{coordinator}
"""


@dataclass
class Ran:
    code: int
    console: str
    """What ``warren run`` wrote to stderr: its log and its last word."""
    summary: dict[str, Any]
    tasks: list[dict[str, Any]]
    """The run log's task records, in the order they completed."""
    workdir: Path

    def failed_tasks(self) -> list[dict[str, Any]]:
        return [task for task in self.tasks if task.get("error")]


def run_job(text: str, settings: Settings, tmp_path: Path) -> Ran:
    config = tmp_path / "job.toml"
    config.write_text(text)
    workdir = tmp_path / "run"
    path = os.pathsep.join(p for p in (str(FAULTY_PLUGINS), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, **role_env(settings), "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", "--config", str(config), "--collectors", "1",
         "--workdir", str(workdir), "--progress", "log"],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    summary = json.loads((workdir / "summary.json").read_text())
    records = [json.loads(line) for line in (workdir / "run.jsonl").read_text().splitlines()]
    return Ran(done.returncode, done.stderr, summary, [r for r in records if r["kind"] == "task"], workdir)


@dataclass(frozen=True)
class Fault:
    env_id: str
    model: str
    culprit: str
    call: str
    error: str


@pytest.mark.parametrize(
    "fault",
    [
        Fault(
            "grid-raises", "gridnet", GRID.format("grid-raises"), "step", "RuntimeError: grid step 40: the simulator"
        ),
        Fault("grid-bad-obs", "gridnet", GRID.format("grid-bad-obs"), "reset", "ValueError: "),
        Fault(
            "grid",
            "gridnet-wide",
            "model plug-in 'gridnet-wide' 0.1.0 (from warren-faulty-plugins)",
            "forward",
            "returned [2, 17] for 2 observations; its out_dim says [2, 16]",
        ),
    ],
    ids=["step-raises", "wrong-obs-shape", "model-wider-than-out-dim"],
)
def test_a_plugin_that_always_fails_stops_the_run_naming_the_plugin_its_call_and_its_error(
    settings: Settings, tmp_path: Path, fault: Fault
) -> None:
    # Given a job whose env raises in every step after 40, whose observations have the wrong
    # shape, or whose model's output is wider than its out_dim says
    kwargs = "fail_after = 40" if fault.env_id == "grid-raises" else ""
    ran = run_job(
        job(fault.env_id, model=fault.model, kwargs=kwargs, coordinator="max_time_s = 120"), settings, tmp_path
    )
    # Then the run gives up, with its own exit code, instead of retrying until its budget
    summary = ran.summary
    assert ran.code == ExitCode.PLUGIN_FAILING, (ran.code, ran.console[-3000:])
    assert summary["success"] is False and "budget" not in summary["reason"]
    # and its error says which plug-in (name, version, package), which call, and the error's first line
    assert f"{fault.culprit} kept failing: {fault.call}: {fault.error}" in summary["error"] or (
        f"{fault.culprit}: {fault.call}: {fault.error}" in summary["error"]  # the learner, building the model, said it
    ), summary["error"]
    failure = summary["failure"]
    assert failure["call"] == fault.call and failure["plugin"]["version"] == "0.1.0"
    assert failure["plugin"]["distribution"] == "warren-faulty-plugins"
    assert f"warren run: {summary['error']}" in ran.console
    # and it gave up after the same failure 5 times in a row (coordinator.max_consecutive_failures), not
    # thousands: a sixth may have failed too, the start that waited in the queue for the next free
    # collector (coordinator.start_ahead, 1 here) taken before the run ended
    assert len(ran.failed_tasks()) <= 5 + 1


def test_a_collector_replaces_envs_that_raised_so_a_failure_that_comes_and_goes_does_not_stop_the_run(
    settings: Settings, tmp_path: Path
) -> None:
    # Given an env that breaks every 500 env steps of its process: the step that breaks raises,
    # and every later call of that env raises too, while new envs work
    text = job("grid-breaks", kwargs="fail_after = 500\nbreak_every = 500",
               coordinator="max_env_steps = 4000\nmax_time_s = 120")  # fmt: skip
    ran = run_job(text, settings, tmp_path)
    # Then the run goes on to its env step budget, although more tasks failed than the give-up limit
    assert ran.code == ExitCode.BUDGET, (ran.code, ran.console[-3000:])
    assert ran.summary["reason"] == "env step budget of 4,000 used" and ran.summary["error"] is None
    failed = ran.failed_tasks()
    assert len(failed) > 5
    assert all(GRID.format("grid-breaks") + ": step: RuntimeError: grid step" in t["error"] for t in failed)
    # because after each failure the collector made new envs: its next task did its work
    for before, after in zip(ran.tasks, ran.tasks[1:], strict=False):
        if before.get("error"):
            assert after["worker_id"] == before["worker_id"] == "c0"
            assert not after.get("error") and after["sample_count"] > 0, (before, after)


def test_an_env_that_gives_nan_observations_stops_the_run_naming_the_field_and_the_plugin(
    settings: Settings, tmp_path: Path
) -> None:
    # Given an env whose observations are NaN (and a model that reads NaN as 0, so the actor acts)
    ran = run_job(job("grid-nan", coordinator="max_time_s = 120"), settings, tmp_path)
    # Then the learner rejects every chunk, and after 20 in a row it stops, and the run with it
    assert ran.code == ExitCode.PLUGIN_FAILING, (ran.code, ran.console[-3000:])
    error = ran.summary["error"]
    assert GRID.format("grid-nan") + ": step: the learner rejected 20 chunks in a row" in error, error
    assert "sample chunk field 'obs.pos' holds NaN" in error
    assert ran.summary["failure"]["role"] == "learner" and ran.summary["failure"]["plugin"]["env_id"] == "grid-nan"
    assert ran.summary["children_exit_codes"]["learner"] == ExitCode.PLUGIN_FAILING


def test_a_learner_that_stops_says_why_on_the_console(settings: Settings, tmp_path: Path) -> None:
    # Given a model that acts fine but whose training output is NaN: the learner's first update diverges
    ran = run_job(job("grid", model="gridnet-nan-training", algorithm=DQN, coordinator="max_time_s = 120"),
                  settings, tmp_path)  # fmt: skip
    # Then the console says why the learner exited, in its own words, not only its exit code
    assert ran.code == ExitCode.PLUGIN_FAILING, (ran.code, ran.console[-3000:])
    said = (
        "learner exited with code 4: learner stops: algorithm plug-in 'dqn' 0.1.0 (from warren): update: with model "
        "'gridnet-nan-training' 0.1.0, update 1 gave non-finite"
    )
    assert said in ran.console, ran.console[-3000:]
    assert said in ran.summary["error"]


def test_a_task_hung_in_an_env_is_counted_as_run_again_and_its_close_says_where_it_hangs(
    settings: Settings, tmp_path: Path
) -> None:
    # Given an env whose step never returns after 60 steps, and a short silence limit
    text = job("grid-hangs", kwargs="fail_after = 60", coordinator="max_time_s = 30\ntask_silence_s = 3")
    ran = run_job(text, settings, tmp_path)
    assert ran.code == ExitCode.BUDGET, (ran.code, ran.console[-3000:])
    # Then each task closed for its silence is counted as one run again
    silent = [line for line in ran.console.splitlines() if "closing it and running it elsewhere" in line]
    assert len(silent) >= 1 and ran.summary["tasks_rerun"] == len(silent)
    # and the message names the job's plug-ins with their versions, not only the env id
    assert all(GRID.format("grid-hangs") in line for line in silent)
    # and the collector answered the close without waiting out its stop grace: the task is stuck in step
    hung = [task for task in ran.tasks if task.get("error")]
    assert hung and all(GRID.format("grid-hangs") + ": step: did not return in" in t["error"] for t in hung)
    assert not re.search(r"no close reply from \S+$", ran.console, re.MULTILINE)
    collector_log = (ran.workdir / "logs" / "collector-0.log").read_text()
    assert "did not stop within" not in collector_log
    assert ran.summary["children_exit_codes"] == {"learner": 0, "collector-0": 0}
