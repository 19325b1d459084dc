"""Whole runs of the jobs that need no training and no installed plug-in, as real processes.

* ``warren run --algorithm random``: the learner takes every chunk, counts it and deletes
  its step file, and writes no policy (random actions need none); the run ends on its
  budget like any other.
* ``WARREN_ENV_PACKAGES``: a gymnasium id that only a module named there registers passes
  the checks of every process, not only the collectors': ``warren run``'s own, and those
  of a learner and a coordinator started alone. A module that fails to import stops the
  run before anything starts, naming it.

The env package is ``tests/env_packages/warren_test_sims.py`` (put on ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from messaging import BrokerLink, Names, Settings
from tests.broker_admin import wait_until
from tests.procs import Proc, role_env
from worker.cli.exit_codes import ExitCode
from worker.storage.counters import counters_path, read_counters

pytestmark = pytest.mark.rabbitmq

ROOT = Path(__file__).resolve().parents[2]
ENV_PACKAGES = ROOT / "tests" / "env_packages"
#: A bound on each command: one that never ends fails the test instead of hanging it.
GIVE_UP_S = 240


def env_of(settings: Settings, packages: str | None = None) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), str(ENV_PACKAGES), os.environ.get("PYTHONPATH")]))
    extra = {"WARREN_ENV_PACKAGES": packages} if packages else {}
    return {**os.environ, **role_env(settings), "PYTHONPATH": path, **extra}


def warren_run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", "--progress", "log", "--workdir", "run", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=GIVE_UP_S,
        check=False,
    )


def summary_of(workdir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((workdir / "summary.json").read_text())
    return summary


@pytest.mark.slow
def test_a_random_run_moves_data_through_the_learner_and_ends_on_its_budget(settings: Settings, tmp_path: Path) -> None:
    # Given a run of the random algorithm with an env step budget well above the rate
    # limit's 4096 samples (so collection must wait for the learner to take data), and evals
    # often enough that some finish before the budget ends the run on a fast machine
    done = warren_run(env_of(settings), tmp_path, "--algorithm", "random", "--stop-value", "inf",
                      "--max-env-steps", "12000", "--set", "coordinator.eval_interval_s=0.25")  # fmt: skip
    workdir = tmp_path / "run"
    # Then it ends cleanly on its budget, every process with it
    assert done.returncode == ExitCode.BUDGET, done.stderr[-3000:]
    summary = summary_of(workdir)
    assert summary["error"] is None and summary["reason"] == "env step budget of 12,000 used", summary
    assert summary["env_steps"] >= 12_000 and summary["evals"] >= 1
    assert set(summary["children_exit_codes"].values()) == {0}, summary["children_exit_codes"]
    # and the learner took data without training on it (its counters, written as it stopped, say
    # so; the summary's copy may be older), writing no policy file
    counted = read_counters(counters_path(workdir / "policy", "policy_main"))
    assert counted is not None and 0 < counted.samples <= summary["samples"], (counted, summary)
    assert counted.train_steps == 0 and summary["learner_train_steps"] == 0 and summary["policy_iter"] == 0
    assert not (workdir / "policy" / "policy_main").exists()
    assert not list((workdir / "data").iterdir())


@pytest.mark.slow
def test_warren_run_trains_on_an_env_id_that_only_a_module_of_warren_env_packages_registers(
    settings: Settings, tmp_path: Path
) -> None:
    # Given an env id that only the module warren_test_sims registers, named in WARREN_ENV_PACKAGES
    env = env_of(settings, "warren_test_sims")
    done = warren_run(env, tmp_path, "--env-id", "WarrenTestSim-v0", "--stop-value", "inf", "--max-env-steps", "3000")
    # Then the run's checks accept it, and its collectors and learner run it to the end of its budget
    assert done.returncode == ExitCode.BUDGET, done.stderr[-3000:]
    summary = summary_of(tmp_path / "run")
    assert summary["error"] is None and summary["env_steps"] >= 3000, summary
    assert set(summary["children_exit_codes"].values()) == {0}, summary["children_exit_codes"]
    assert json.loads((tmp_path / "run" / "job.json").read_text())["env"]["id"] == "WarrenTestSim-v0"


def test_a_learner_and_a_coordinator_started_alone_accept_an_env_id_of_warren_env_packages(
    settings: Settings, link: BrokerLink, tmp_path: Path
) -> None:
    path = env_of(settings)["PYTHONPATH"]
    env = {**role_env(settings), "PYTHONPATH": path, "WARREN_ENV_PACKAGES": "warren_test_sims",
           "WARREN_PATH_DATA": str(tmp_path / "data"), "WARREN_PATH_POLICY": str(tmp_path / "policy")}  # fmt: skip
    job = ["--env-id", "WarrenTestSim-v0"]
    # Given a learner started alone on an env id that only warren_test_sims registers
    learner = Proc(["learner", *job], env=env, log=tmp_path / "learner.log")
    try:
        # Then it loads the job and serves its data queue until told to stop
        queue = Names.of(settings).learner_data("main")
        wait_until(lambda: not learner.alive() or link.queue_exists(queue), GIVE_UP_S, f"queue {queue}")
        assert learner.alive(), learner.log()[-3000:]
        learner.signal(signal.SIGTERM)
        assert learner.wait(GIVE_UP_S) == 0, learner.log()[-3000:]
    finally:
        learner.kill()
    # And a coordinator started alone loads the same job and runs until its budget ends it
    coordinator = Proc(["coordinator", *job, "--stop-value", "inf", "--max-time-s", "1", "--progress", "off"],
                       env=env, log=tmp_path / "coordinator.log")  # fmt: skip
    try:
        assert coordinator.wait(GIVE_UP_S) == ExitCode.BUDGET, coordinator.log()[-3000:]
    finally:
        coordinator.kill()


def test_an_env_package_that_fails_to_import_stops_warren_run_before_anything_starts_naming_it(
    settings: Settings, tmp_path: Path
) -> None:
    # Given WARREN_ENV_PACKAGES naming a module that raises as it is imported
    env = env_of(settings, "warren_test_sims,warren_test_broken_sims")
    done = warren_run(env, tmp_path, "--env-id", "WarrenTestSim-v0")
    # Then warren run refuses to start, naming the module and why it failed
    assert done.returncode == ExitCode.USAGE, done.stderr[-3000:]
    assert "env package warren_test_broken_sims failed to import: ImportError: libsims.so" in done.stderr
    assert not (tmp_path / "run").exists()
