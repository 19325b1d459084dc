"""scripts/test says what it is about to install and run before it does anything; the suite checks
what the broker has before it uses it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.broker_admin import prometheus_listener_url

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
    assert (
        "pip install -e '.[test,plot,box2d,mujoco,atari,sb3,video,export]'" in done.stdout
        and "several minutes the first time" in done.stdout
    )
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


def test_the_prometheus_check_goes_where_the_broker_lists_its_plugin_and_nowhere_else() -> None:
    # /api/overview of a broker with the management API but without rabbitmq_prometheus
    without = {"listeners": [{"protocol": "amqp", "port": 5672}, {"protocol": "http", "port": 15672}]}
    assert prometheus_listener_url(without, "http://rmq.example:15672") is None
    with_plugin = {"listeners": [*without["listeners"], {"protocol": "http/prometheus", "port": 15692}]}
    assert prometheus_listener_url(with_plugin, "http://rmq.example:15672") == "http://rmq.example:15692"
