"""scripts/test says what it is about to install and run before it does anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_plan_of_a_first_run_names_the_installs_and_changes_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    done = subprocess.run(
        [str(ROOT / "scripts" / "test"), "--plan", "tests/unit", "-x"],
        env={**os.environ, "WARREN_VENV": str(venv)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "scripts/test will:" in done.stdout
    assert f"create the virtualenv {venv}" in done.stdout
    assert "pip install -e '.[test,plot]'" in done.stdout and "several minutes the first time" in done.stdout
    assert "run ruff, mypy and pytest tests/unit -x" in done.stdout
    assert not venv.exists()  # --plan only tells


def test_the_plan_installs_the_rabbitmq_package_for_private_nodes_even_when_a_broker_answers(tmp_path: Path) -> None:
    # Given a machine whose RabbitMQ server scripts are not where the private nodes look
    done = subprocess.run(
        [str(ROOT / "scripts" / "test"), "--plan", "tests/unit"],
        env={**os.environ, "WARREN_VENV": str(tmp_path / "venv"), "WARREN_RABBITMQ_SBIN": str(tmp_path / "no-sbin")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # Then the plan installs the package (whatever answers on WARREN_AMQP_URL)
    assert "for the private test nodes" in done.stdout  # apt-get install of the server package
