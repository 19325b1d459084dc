"""Every ``WARREN_*`` variable against every command: each reads what docs/configuration.md's table says.

docs/configuration.md promises that the processes read ``WARREN_*`` variables, overridden by flags.
Here each variable is set, one at a time, to a value that is not its default, and every
command's settings are built as the command builds them (its flags parsed, the variables
read): a command the table names as a reader must end up with the value, any other must
not. ``warren run`` is checked with its learner's and collectors' settings too, built from
the environment it gives them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from pathlib import Path

import pytest

from messaging import ConfigurationError, Settings
from messaging.settings import to_env
from tests.compose import CLUSTER_FILE, COMPOSE_FILE, read_env_file
from worker.cli import build_parser, collector, coordinator, learner, main
from worker.cli.flags import ENV_FLAGS, env_variable, read_environment
from worker.cli.run_plan import RUN_SETS, plan_run
from worker.config import CollectorConfig, CoordinatorConfig, LearnerConfig, role_config
from worker.job import JobConfig

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION_DOC = ROOT / "docs" / "configuration.md"
COMMANDS = ("collector", "learner", "coordinator", "run")
#: Read by docker compose only (the tag of warren's image), documented in docs/compose.md.
COMPOSE_ONLY = {"WARREN_IMAGE"}

#: A value for every variable that is none of warren's defaults, written as warren writes it back.
SAMPLES = {
    "WARREN_AMQP_URL": "amqp://audit:secret@broker.example:5673/audit",
    "WARREN_QUEUE_TYPE": "quorum",
    "WARREN_AMQP_NODE_ORDER": "given",
    "WARREN_AMQP_CA_FILE": "/etc/audit/ca.pem",
    "WARREN_PREFIX": "audit",
    "WARREN_HEARTBEAT_S": "7",
    "WARREN_BLOCKED_CONNECTION_TIMEOUT_S": "61.0",
    "WARREN_CONNECT_TIMEOUT_S": "31.0",
    "WARREN_PREFETCH": "3",
    "WARREN_RPC_TIMEOUT_S": "32.0",
    "WARREN_MAX_MESSAGE_BYTES": "1000000",
    "WARREN_METADATA_QUEUE_LENGTH": "5",
    "WARREN_METADATA_QUEUE_EXPIRES_S": "3601.0",
    "WARREN_REPLY_QUEUE_EXPIRES_S": "301.0",
    "WARREN_WORKER_ID": "audit-worker",
    "WARREN_PATH_DATA": "/audit/data",
    "WARREN_PATH_POLICY": "/audit/policy",
    "WARREN_DATA_WAIT_S": "11.0",
    "WARREN_POLICY_WAIT_S": "61.0",
    "WARREN_CLOSE_WAIT_S": "62.0",
    "WARREN_STALL_TIMEOUT_S": "301.0",
    "WARREN_STOP_GRACE_S": "21.0",
    "WARREN_FSYNC": "1",
    "WARREN_HANDLER_THREADS": "5",
    "WARREN_PLUGINS": "audit-plugins",
    "WARREN_ENV_PACKAGES": "audit_envs",
    "WARREN_ENV_THREADS": "3",
    "WARREN_STEP_COMPRESSION": "lz4",
    "WARREN_TORCH_THREADS": "3",
    "WARREN_DEVICE": "cpu",
    "WARREN_RUN_LOG": "/audit/run.jsonl",
    "WARREN_PROGRESS": "off",
    "WARREN_METRICS_PORT": "19464",
    "WARREN_METRICS_ADDR": "10.1.2.3",
    "WARREN_TENSORBOARD_DIR": "/audit/tensorboard",
    "WARREN_ENV_ID": "Acrobot-v1",
    "WARREN_ALGORITHM": "random",
    "WARREN_SEED": "7",
    "WARREN_STOP_VALUE": "150.0",
    "WARREN_MAX_ENV_STEPS": "1234",
    "WARREN_MAX_TIME_S": "56.0",
    "WARREN_COLLECT_TASKS": "3",
    "WARREN_COLLECTORS": "3",
}


def documented_readers() -> dict[str, set[str]]:
    """``{variable: commands}`` from docs/configuration.md's table of variables (its "read by" column)."""
    readers: dict[str, set[str]] = {}
    table = CONFIGURATION_DOC.read_text()
    for match in re.finditer(r"^\| `(WARREN_[A-Z_]+)` \| [^|]* \| ([^|]*) \|", table, re.MULTILINE):
        text = match.group(2)
        named = set(COMMANDS) if "every command" in text else {c for c in COMMANDS if re.search(rf"\b{c}\b", text)}
        readers[match.group(1)] = named
    return readers


def setting_variables() -> set[str]:
    """Every variable a role's settings read (:func:`messaging.settings.load`) or a job flag reads."""
    names = {
        f.name for cls in (Settings, CollectorConfig, LearnerConfig, CoordinatorConfig) for f in dataclasses.fields(cls)
    }
    names -= {"transport", "job"}
    return {"WARREN_" + name.upper() for name in names} | {env_variable(flag) for flag in ENV_FLAGS}


def deployment_variables() -> set[str]:
    """The ``WARREN_*`` variables .env.example and the compose files name."""
    text = COMPOSE_FILE.read_text() + CLUSTER_FILE.read_text()
    return {v for v in re.findall(r"\$\{(WARREN_[A-Z_]+)", text)} | {
        k for k in read_env_file() if k.startswith("WARREN_")
    }


def job_variables(job: JobConfig) -> dict[str, str]:
    return {
        "WARREN_ENV_ID": job.env.id,
        "WARREN_ALGORITHM": job.algorithm.name,
        "WARREN_SEED": str(job.env.seed),
        "WARREN_STOP_VALUE": str(job.env.stop_value),
        "WARREN_MAX_ENV_STEPS": str(job.coordinator.max_env_steps),
        "WARREN_MAX_TIME_S": str(job.coordinator.max_time_s),
        "WARREN_COLLECT_TASKS": str(job.coordinator.collect_tasks),
    }


def parsed(command: str) -> argparse.Namespace:
    args = build_parser().parse_args([command])
    read_environment(args)
    return args


def effective(command: str, tmp_path: Path) -> dict[str, str]:
    """What ``command`` ends up with, written as the ``WARREN_*`` variables of its settings and job."""
    args = parsed(command)
    if command == "collector":
        return to_env(collector.configure(args))
    if command == "learner":
        learner_config = learner.configure(args)
        return {**to_env(learner_config), **job_variables(learner_config.job)}
    if command == "coordinator":
        coordinator_config = coordinator.configure(args)
        return {**to_env(coordinator_config), **job_variables(coordinator_config.job)}
    plan = plan_run(args)
    # Its learner and collectors, as they are started (the learner with job.json, the collectors with ids).
    job_file = tmp_path / "job.json"
    job_file.write_text(plan.job.to_json())
    child_learner = role_config(LearnerConfig, plan.children_env, job=JobConfig.load(job_file))
    child_collector = role_config(CollectorConfig, plan.children_env, worker_id="c0")
    return {
        **to_env(child_collector),
        **to_env(child_learner),
        **to_env(plan.config),
        **job_variables(plan.job),
        "WARREN_COLLECTORS": str(plan.collectors),
    }


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No ``WARREN_*`` variable of the calling shell (or of the test run's broker) left."""
    for name in [n for n in os.environ if n.startswith("WARREN_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_the_configuration_doc_lists_every_variable_warren_and_its_deployment_files_use() -> None:
    documented = set(documented_readers())
    assert setting_variables() <= documented, sorted(setting_variables() - documented)
    assert deployment_variables() - COMPOSE_ONLY <= documented, sorted(deployment_variables() - documented)
    assert documented <= setting_variables() | {"WARREN_COLLECTORS"}, sorted(documented - setting_variables())
    assert set(SAMPLES) == documented  # this test sets every one


@pytest.mark.parametrize("variable", sorted(SAMPLES))
def test_every_command_reads_exactly_the_variables_the_configuration_doc_says_it_reads(
    variable: str, clean_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    readers = documented_readers()[variable]
    value = SAMPLES[variable]
    clean_environment.setenv(variable, value)
    for command in COMMANDS:
        got = effective(command, tmp_path).get(variable)
        if command == "run" and variable == "WARREN_PREFIX":
            assert got is not None and got.startswith(value + "-"), (command, got)  # the run adds its id
        elif command in readers:
            assert got == value, f"{command} ignores {variable}={value} (got {got})"
        else:
            assert got != value, f"{command} reads {variable}, which docs/configuration.md does not say"
    if variable in RUN_SETS:
        assert "run" not in readers and variable in plan_run(parsed("run")).ignored  # and warren run says so


def test_warren_run_says_which_variables_it_sets_itself(clean_environment: pytest.MonkeyPatch) -> None:
    for variable in RUN_SETS:
        clean_environment.setenv(variable, SAMPLES[variable])
    plan = plan_run(parsed("run"))
    assert set(plan.ignored) == set(RUN_SETS)
    assert plan.config.run_log == plan.identity.workdir / "run.jsonl"
    assert plan.children_env["WARREN_PATH_DATA"] == str(plan.identity.workdir / "data")


@pytest.mark.parametrize(
    ("variable", "value", "commands"),
    [
        ("WARREN_PROGRESS", "bogus", ("coordinator", "run")),
        ("WARREN_MAX_TIME_S", "-1", ("coordinator", "run")),
        ("WARREN_COLLECTORS", "0", ("run",)),
    ],
)
def test_a_value_a_command_cannot_use_is_refused_before_it_starts(
    variable: str,
    value: str,
    commands: tuple[str, ...],
    clean_environment: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    clean_environment.setenv(variable, value)
    clean_environment.setenv("WARREN_CONNECT_TIMEOUT_S", "1")
    for command in commands:
        assert main([command]) == 2, command
        assert variable.removeprefix("WARREN_").lower() in capsys.readouterr().err.lower(), command


def test_a_variable_refused_names_itself(clean_environment: pytest.MonkeyPatch) -> None:
    clean_environment.setenv("WARREN_MAX_ENV_STEPS", "many")
    with pytest.raises(ConfigurationError, match="WARREN_MAX_ENV_STEPS='many'"):
        parsed("coordinator")
