"""Guard: tests never stop, restart or reconfigure the shared broker.

Only ``tests/rabbit_nodes.py`` runs RabbitMQ's command-line tools, and only against
private nodes it started, in an environment that cannot reach the shared node.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import rabbit_nodes
from tests.rabbit_nodes import RESERVED_PORTS, NodeError, PrivateCluster, reap_orphans

ROOT = Path(__file__).resolve().parents[2]
# The tools that can stop, reset, re-cluster or reconfigure a node. rabbitmq-diagnostics
# is read-only (and named by the compose file's healthcheck, which the compose tests check).
CLI_NAME = re.compile(r"\brabbitmq(?:ctl|-server|-plugins|-queues|-upgrade|-streams)\b")
# A CLI call in a script that would stop, reset or re-cluster whatever node it reaches.
RESTARTING_CALL = re.compile(
    r"\brabbitmqctl\b[^#\n]*\s(?:stop_app|stop|shutdown|reset|force_reset|join_cluster|forget_cluster_node|hipe_compile)\b"
)


def _code_strings(path: Path) -> Iterator[tuple[int, str]]:
    """String literals of a module, docstrings and other bare string statements left out."""
    tree = ast.parse(path.read_text(), str(path))
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node.lineno, node.value


def test_only_the_private_node_module_names_a_rabbitmq_cli_tool() -> None:
    # This file names the tools only to check the private module's argv.
    allowed = {Path(rabbit_nodes.__file__).resolve(), Path(__file__).resolve()}
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path.resolve() not in allowed
        for line, text in _code_strings(path)
        if CLI_NAME.search(text)
    ]
    assert offenders == [], "run RabbitMQ CLI tools through tests.rabbit_nodes (a private node) only"


def test_no_script_stops_or_resets_a_broker_with_rabbitmqctl() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "scripts").iterdir())
        if path.is_file()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if RESTARTING_CALL.search(line)
    ]
    assert offenders == []


def test_a_private_node_never_reads_the_system_rabbitmq_settings(tmp_path: Path) -> None:
    # Given a cluster laid out but not started (a fake scripts folder: nothing runs)
    sbin = tmp_path / "sbin"
    cluster = PrivateCluster(3, tmp_path, sbin=sbin)
    try:
        ports = [p for n in cluster.nodes for p in n.ports.all()]
        assert len(set(ports)) == 12 and not set(ports) & RESERVED_PORTS
        for node in cluster.nodes:
            assert node.name.startswith("warren-test-") and node.name.endswith("@localhost")
            for env in (node.server_env(), node.cli_env()):
                # Then every file the scripts read is the cluster's own, the cookie is private,
                assert env["HOME"] == str(cluster.home)
                assert Path(env["RABBITMQ_CONF_ENV_FILE"]).is_relative_to(node.dir)
                assert env["RABBITMQ_NODENAME"] == node.name
                for key, value in env.items():
                    if key.endswith(("_FILE", "_BASE", "_FILES")):
                        assert Path(value).is_relative_to(node.dir), key
                    # and nothing names the shared node, its settings or its ports
                    assert "/etc/rabbitmq" not in value and "rabbit@" not in value, key
            assert node.cli_env()["RABBITMQ_CTL_DIST_PORT_MIN"] == "0"
            # and every CLI call is the package's own script with -n this node
            assert node.cli_argv("rabbitmqctl", "stop_app") == [
                str(sbin / "rabbitmqctl"),
                "-q",
                "-n",
                node.name,
                "stop_app",
            ]
        # A node renamed to anything not private is refused before any process starts
        cluster.nodes[0].name = "rabbit@localhost"
        with pytest.raises(NodeError):
            cluster.nodes[0].cli_argv("rabbitmqctl", "stop_app")
        with pytest.raises(ValueError):
            cluster.nodes[1].cli_argv("rabbitmq-plugins", "enable", "rabbitmq_management")
    finally:
        cluster.stop()


def test_reaping_an_orphaned_cluster_kills_only_processes_that_carry_its_marker(tmp_path: Path) -> None:
    # Given an orphaned cluster directory (its owner's start time does not match: a dead
    # owner) whose pid file names a process that is not a RabbitMQ node of it
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        orphan = tmp_path / "warren-test-deadbeef"
        (orphan / "node0").mkdir(parents=True)
        (orphan / "owner").write_text("1 -1\n")
        (orphan / "node0" / "rabbit.pid").write_text(f"{bystander.pid}\n")
        # When orphans are reaped
        assert reap_orphans(tmp_path) == ["warren-test-deadbeef"]
        # Then the directory is gone and the bystander lives
        assert not orphan.exists()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(10)
