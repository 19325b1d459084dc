from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from messaging import ConfigurationError, Names, Settings, redact_url
from messaging.settings import to_env
from worker.cli import build_parser
from worker.cli.run_plan import child_env
from worker.config import CollectorConfig, CoordinatorConfig, LearnerConfig, role_config
from worker.job import JobConfig, LearnerSection


def test_defaults_without_environment() -> None:
    settings = Settings.from_env({})
    assert settings.amqp_url == "amqp://guest:guest@localhost:5672/%2F"
    assert settings.prefix == "warren"
    assert Names(settings.prefix).collector_tasks == "warren.collector.tasks"


def test_environment_then_flags_override_defaults() -> None:
    env = {"WARREN_PREFIX": "lab", "WARREN_RPC_TIMEOUT_S": "2.5", "WARREN_PREFETCH": "3"}
    settings = Settings.from_env(env, prefix="flag", heartbeat_s=None)
    assert settings.prefix == "flag"  # a flag wins over the environment
    assert settings.rpc_timeout_s == 2.5
    assert settings.prefetch == 3
    assert settings.heartbeat_s == 30  # None flags do not override


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"WARREN_PREFETCH": "many"}, "WARREN_PREFETCH must be a int"),
        ({"WARREN_PREFETCH": "0"}, "prefetch must be >= 1"),
        ({"WARREN_AMQP_URL": "http://x"}, "amqp://"),
        ({"WARREN_PREFIX": "../etc"}, "prefix must match"),
        ({"WARREN_RPC_TIMEOUT_S": "-1"}, "rpc_timeout_s must be > 0"),
        ({"WARREN_QUEUE_TYPE": "stream"}, "queue_type must be one of classic, quorum"),
        ({"WARREN_AMQP_URL": "amqp://a:1/,http://b/"}, "amqp://"),
        ({"WARREN_AMQP_URL": " , "}, "names no broker"),
    ],
)
def test_bad_values_are_configuration_errors(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Settings.from_env(env)


def test_several_broker_urls_are_tried_in_the_order_given_and_every_password_is_hidden() -> None:
    settings = Settings.from_env({"WARREN_AMQP_URL": "amqp://u:pw1@n1:5672/v, amqp://u:pw2@n2:5673/v,"})
    assert settings.amqp_urls == ("amqp://u:pw1@n1:5672/v", "amqp://u:pw2@n2:5673/v")
    assert settings.redacted_url == "amqp://u:***@n1:5672/v,amqp://u:***@n2:5673/v"
    assert "pw" not in repr(settings)
    assert Settings().amqp_urls == (Settings().amqp_url,)


def test_the_queue_type_is_a_setting_with_a_flag_and_classic_by_default() -> None:
    assert Settings.from_env({}).queue_type == "classic"
    assert Settings.from_env({"WARREN_QUEUE_TYPE": "quorum"}).queue_type == "quorum"
    for command in ("collector", "coordinator", "learner", "run"):
        args = build_parser().parse_args([command, "--queue-type", "quorum"])
        assert args.queue_type == "quorum"
    config = role_config(CollectorConfig, {"WARREN_QUEUE_TYPE": "classic"}, queue_type="quorum")
    assert config.transport.queue_type == "quorum"  # the flag wins


def test_settings_are_frozen() -> None:
    settings = Settings.from_env({})
    with pytest.raises(AttributeError):
        settings.prefix = "other"  # type: ignore[misc]


def test_passwords_never_appear_in_redacted_urls() -> None:
    assert redact_url("amqp://bob:s3cret@broker:5672/%2F") == "amqp://bob:***@broker:5672/%2F"
    assert redact_url("amqps://broker/vh") == "amqps://broker/vh"
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({"WARREN_AMQP_URL": "http://bob:s3cret@broker/"})
    assert "s3cret" not in str(info.value)


def test_every_setting_survives_the_trip_through_a_child_environment() -> None:
    # Given settings that differ from the defaults in every field
    settings = Settings(
        amqp_url="amqps://u:p@broker:5671/v",
        amqp_node_order="given",
        amqp_ca_file="/ca.pem",
        prefix="run-7",
        heartbeat_s=7,
        blocked_connection_timeout_s=8.5,
        connect_timeout_s=9.5,
        prefetch=3,
        rpc_timeout_s=11.0,
        max_message_bytes=1234,
        metadata_queue_length=5,
        metadata_queue_expires_s=13.0,
        reply_queue_expires_s=14.0,
        queue_type="quorum",
    )
    assert all(getattr(settings, f.name) != getattr(Settings(), f.name) for f in fields(Settings))
    # When a parent passes them as environment variables, a child reads back the same
    assert Settings.from_env(to_env(settings)) == settings


def test_warren_run_hands_its_children_every_transport_setting(tmp_path: Path) -> None:
    transport = Settings(prefix="warren-run1", metadata_queue_length=3, rpc_timeout_s=12.0)
    env = child_env(transport, tmp_path)
    collector = role_config(CollectorConfig, env)
    learner = role_config(LearnerConfig, env)
    assert collector.transport == learner.transport == transport
    assert collector.path_data == learner.path_data == tmp_path / "data"
    assert learner.path_policy == tmp_path / "policy"


def test_warren_run_children_wait_passively_for_openmp_work_unless_told_otherwise(tmp_path: Path) -> None:
    assert child_env(Settings(), tmp_path, {})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert child_env(Settings(), tmp_path, {"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"


@pytest.mark.parametrize(
    "process, job, runs",
    [(0, 0, 1), (0, 2, 2), (3, 2, 3), (1, 4, 1)],
    ids=["neither: one", "the job's", "the process's wins", "an explicit one wins"],
)
def test_the_learner_runs_the_torch_threads_of_its_process_else_of_its_job(process: int, job: int, runs: int) -> None:
    config = LearnerConfig(torch_threads=process, job=JobConfig(learner=LearnerSection(torch_threads=job)))
    assert config.learner_threads == runs


def test_a_job_asking_for_negative_learner_threads_is_refused() -> None:
    with pytest.raises(ValueError, match=r"learner\.torch_threads must be 0"):
        LearnerSection(torch_threads=-1)


def test_every_role_config_reads_the_environment_and_lets_flags_win() -> None:
    env = {"WARREN_PREFIX": "envp", "WARREN_STALL_TIMEOUT_S": "12", "WARREN_FSYNC": "yes", "WARREN_TORCH_THREADS": "2"}
    collector = role_config(CollectorConfig, env, prefix="flagp", stall_timeout_s=None)
    assert (collector.transport.prefix, collector.stall_timeout_s, collector.fsync) == ("flagp", 12.0, True)
    assert role_config(LearnerConfig, env).torch_threads == 2
    coordinator = role_config(CoordinatorConfig, env, progress="log", run_log=Path("r.jsonl"))
    assert (coordinator.transport.prefix, coordinator.progress, coordinator.run_log) == ("envp", "log", Path("r.jsonl"))
    with pytest.raises(ConfigurationError, match="unknown settings"):
        role_config(CollectorConfig, env, no_such_setting=1)
    with pytest.raises(ConfigurationError, match="WARREN_FSYNC must be a bool"):
        role_config(CollectorConfig, {"WARREN_FSYNC": "perhaps"})
