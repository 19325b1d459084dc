"""``warren check`` on an env that never returns from ``step``: the check ends, and a signal ends it at once.

The env comes from a test env package (``tests/env_packages/warren_test_sims.py``, through
``WARREN_ENV_PACKAGES``); it writes the id of the process stuck in ``step`` to a file, so a
test knows when the hang began and can tell that the process is gone afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker_admin import wait_until
from worker.cli.exit_codes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
ENV_PACKAGES = ROOT / "tests" / "env_packages"
#: A bound on each test's wait: a check that would never end fails the test instead of hanging it.
GIVE_UP_S = 120


def check_env(tmp_path: Path) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), str(ENV_PACKAGES), os.environ.get("PYTHONPATH")]))
    return {
        **os.environ,
        "PYTHONPATH": path,
        "WARREN_ENV_PACKAGES": "warren_test_sims",
        "WARREN_TEST_HANG_PID_FILE": str(tmp_path / "hanging.pid"),
        "PYTHONUNBUFFERED": "1",
    }


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_check_whose_env_never_returns_from_step_fails_within_its_time_limit_and_kills_the_env(
    tmp_path: Path,
) -> None:
    # Given an env whose step never returns, checked with a 3 s limit per check
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "check", "--env-id", "WarrenTestHang-v0", "--check-timeout-s", "3"],
        env=check_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=GIVE_UP_S,
        check=False,
    )
    # Then the command ends by itself, failing the check that hung and saying why
    assert done.returncode == ExitCode.FAILED, (done.stdout, done.stderr[-3000:])
    lines = done.stdout.splitlines()
    assert any(line.startswith("ok   the job loads") for line in lines), done.stdout
    assert any(
        line.startswith("FAIL gymnasium's env checker passes: no end within 3 s") and "--check-timeout-s" in line
        for line in lines
    ), done.stdout
    assert lines[-1] == "some checks FAILED"
    # and the process stuck in step is gone with it
    assert gone(int((tmp_path / "hanging.pid").read_text()))


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, ExitCode.TERMINATED), (signal.SIGINT, ExitCode.INTERRUPTED)]
)
def test_the_first_signal_ends_a_check_stuck_in_an_env_at_once(tmp_path: Path, signum: int, code: int) -> None:
    # Given a check stuck in an env's step, with its default time limit (minutes)
    check = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "check", "--env-id", "WarrenTestHang-v0"],
        env=check_env(tmp_path),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    marker = tmp_path / "hanging.pid"
    try:
        wait_until(lambda: marker.exists() and marker.read_text() != "", GIVE_UP_S, "the env's step to begin")
        # When it gets one SIGTERM (or Ctrl-C)
        check.send_signal(signum)
        out, err = check.communicate(timeout=GIVE_UP_S)
    finally:
        if check.poll() is None:
            check.kill()
            check.communicate()
    # Then it exits with that signal's code, saying so, and the process stuck in the env is gone
    assert check.returncode == code, (out, err[-3000:])
    assert f"stopped by {signal.Signals(signum).name}" in err
    assert gone(int(marker.read_text()))
