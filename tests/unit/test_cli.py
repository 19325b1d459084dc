"""The ``warren`` command line: version, each role's flags, and values refused at parsing."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
from pathlib import Path

import pytest

from messaging import ConfigurationError
from messaging.connection import connection_name
from worker.cli import build_parser, main
from worker.cli.exit_codes import ExitCode
from worker.cli.flags import log_level, read_environment
from worker.cli.run_plan import collector_id, plan_run
from worker.job import JobConfig

#: The flags that decide when a run ends: only the coordinator (and ``warren run``) decide that.
RUN_END_FLAGS = ("--stop-value", "--max-env-steps", "--max-time-s")


def help_text(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([command, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def parse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"warren {importlib.metadata.version('warren')}"


def test_the_learner_offers_only_the_job_flags_it_uses(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text("learner", capsys)
    for flag in ("--config", "--env-id", "--seed"):
        assert flag in text
    for flag in RUN_END_FLAGS:
        assert flag not in text
    assert "--max-env-steps" in parse_error(["learner", "--max-env-steps", "10"], capsys)


@pytest.mark.parametrize("command", ["coordinator", "run"])
def test_the_roles_that_end_a_run_take_the_stop_value_and_budgets(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_text(command, capsys)
    for flag in ("--config", "--env-id", "--seed", *RUN_END_FLAGS):
        assert flag in text


def test_a_collector_takes_no_job_flags(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text("collector", capsys)
    for flag in ("--config", "--env-id", *RUN_END_FLAGS):
        assert flag not in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--collectors", "0"], "argument --collectors: must be at least 1, got 0"),
        (["run", "--collectors", "-1"], "argument --collectors: must be at least 1, got -1"),
        (["run", "--collectors", "two"], "argument --collectors: 'two' is not a number"),
        (["coordinator", "--collect-tasks", "-1"], "argument --collect-tasks: must be 0 or more, got -1"),
        (["coordinator", "--max-env-steps", "0"], "argument --max-env-steps: must be at least 1"),
        (["run", "--max-time-s", "-5"], "argument --max-time-s: must be more than 0"),
        (["coordinator", "--stop-value", "nan"], "argument --stop-value: must be a number"),
        (["learner", "--log-level", "loud"], "argument --log-level: invalid choice"),
    ],
)
def test_impossible_values_are_refused_at_argument_parsing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in parse_error(argv, capsys)


def test_zero_collect_tasks_means_one_per_worker_and_inf_runs_to_a_budget() -> None:
    args = build_parser().parse_args(["coordinator", "--collect-tasks", "0", "--stop-value", "inf"])
    assert args.collect_tasks == 0 and args.stop_value == float("inf")


def test_verbose_logs_at_debug_for_every_role() -> None:
    parser = build_parser()
    for command in ("collector", "coordinator", "learner", "run"):
        assert log_level(parser.parse_args([command, "--verbose"])) == "DEBUG"
        assert log_level(parser.parse_args([command, "-v"])) == "DEBUG"
        assert log_level(parser.parse_args([command, "--log-level", "warning"])) == "WARNING"
        assert log_level(parser.parse_args([command])) == "INFO"


def test_warren_run_gives_its_collectors_short_ids_so_names_read_well() -> None:
    assert [collector_id(i) for i in range(3)] == ["c0", "c1", "c2"]
    # The collector puts its role in front of its id (worker.collector.service): no doubled word
    assert connection_name(f"collector-{collector_id(0)}").startswith("warren-collector-c0@")


def command_parser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found: argparse.ArgumentParser = subcommands.choices[command]
    return found


def test_every_command_takes_verbose(tmp_path: Path) -> None:
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for command in subcommands.choices:
        positional = {
            "plot": [str(tmp_path)],
            "eval": [str(tmp_path)],
            "export": [str(tmp_path), "--onnx", str(tmp_path / "actor.onnx")],
        }.get(command, [])
        args = parser.parse_args([command, *positional, "--verbose"])
        assert log_level(args) == "DEBUG", command


def documented_exit_codes(command: str) -> dict[str, int]:
    """``{what: code}`` from the ``Exit codes: 0 ..., 1 ...`` sentence of ``command``'s ``--help``."""
    description = " ".join((command_parser(command).description or "").split())
    sentence = description.split("Exit codes: ", 1)[1].split(".", 1)[0]
    return {what: int(code) for code, what in re.findall(r"(\d+) (.+?)(?=, \d+ |$)", sentence)}


def test_the_exit_code_warren_run_documents_for_an_unusable_env_is_the_one_it_returns() -> None:
    assert "An env the job cannot use is a bad config" in (command_parser("run").description or "")
    (documented,) = [
        code for what, code in documented_exit_codes("run").items() if "bad command line or config" in what
    ]
    assert main(["run", "--env-id", "NoSuchEnv-v0", "--connect-timeout-s", "1"]) == documented


@pytest.mark.parametrize("command", ["run", "coordinator"])
def test_the_commands_that_run_a_job_list_every_exit_code_in_their_help(command: str) -> None:
    assert sorted(documented_exit_codes(command).values()) == sorted(int(code) for code in ExitCode)


def test_commands_that_use_no_broker_or_only_its_address_offer_nothing_more(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("plot", "check"):
        assert "pika" not in help_text(command, capsys), command
    clean = help_text("clean", capsys)
    assert "--amqp-url" in clean and "--amqp-ca-file" in clean and "pika" in clean
    # warren clean takes each run's prefix from its run.json and connects with a budget of its own
    for flag in ("--prefix", "--heartbeat-s", "--connect-timeout-s", "--rpc-timeout-s", "--queue-type"):
        assert flag not in clean, flag
    assert "--metadata-queue-length" not in clean


def run_job(*argv: str) -> JobConfig:
    """The job ``warren run ARGV`` would train (and write to its job.json)."""
    args = build_parser().parse_args(["run", *argv])
    read_environment(args, {})
    return plan_run(args, {}).job


def test_set_changes_any_job_setting_typed_as_in_the_file_and_job_json_holds_it(tmp_path: Path) -> None:
    config = tmp_path / "job.toml"
    config.write_text("[algorithm]\nlr = 0.01\nbatch_size = 64\n")
    job = run_job(
        "--config",
        str(config),
        "--set",
        "algorithm.lr=5e-4",
        "--set",
        "model.hidden_sizes=[64, 32]",
        "--set",
        "env.id=Acrobot-v1",  # a bare word: a string
        "--set",
        "collector.n_sample = 1024",
        "--set",
        "algorithm.double_dqn=false",
        "--set",
        "algorithm.lr=2e-4",  # the last of a key wins
    )
    assert (job.bound.config.lr, job.bound.config.batch_size, job.bound.config.double_dqn) == (2e-4, 64, False)
    assert job.bound.model.config.hidden_sizes == (64, 32)
    assert (job.env.id, job.collector.n_sample) == ("Acrobot-v1", 1024)
    written = json.loads(job.to_json())  # what warren run writes to runs/<id>/job.json
    assert written["algorithm"]["lr"] == 2e-4 and written["model"]["hidden_sizes"] == [64, 32]
    assert written["env"]["id"] == "Acrobot-v1" and written["collector"]["n_sample"] == 1024


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("env.sed=3", r"unknown keys in \[env\]: \['sed'\]; known: \['collector_env_num', "),
        ("algorithm.lrr=0.1", r"algorithm: unknown keys \['lrr'\]; known: \['backend', 'batch_size', "),
        ("evn.id=CartPole-v1", r"unknown config section \[evn\]; known: \['algorithm', "),
        ('env.seed="3"', r"env\.seed must be a int, got '3'"),
        ("algorithm.lr=2.0", r"algorithm\.lr must be a number in \(0\.0, 1\.0\]"),
    ],
)
def test_set_is_checked_like_the_job_file(setting: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        run_job("--set", setting)


def test_set_that_disagrees_with_a_named_flag_or_its_variable_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"--set env\.seed=4 conflicts with env\.seed = 3 from --seed"):
        run_job("--seed", "3", "--set", "env.seed=4")
    args = build_parser().parse_args(["run", "--set", "env.seed=4"])
    read_environment(args, {"WARREN_SEED": "3"})
    with pytest.raises(ConfigurationError, match=r"from --seed \(or WARREN_SEED\)"):
        plan_run(args, {})
    assert run_job("--seed", "4", "--set", "env.seed=4").env.seed == 4  # the same value twice is no conflict


@pytest.mark.parametrize("text", ["lr=3e-4", "algorithm.lr", "algorithm=3", ".lr=1", "env.kwargs.x=1"])
def test_set_needs_one_key_of_one_section(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "argument --set: must be SECTION.KEY=VALUE" in parse_error(["run", "--set", text], capsys)


def test_the_learner_and_the_coordinator_take_set_too() -> None:
    from worker.cli import coordinator, learner

    for command, configure in (("learner", learner.configure), ("coordinator", coordinator.configure)):
        args = build_parser().parse_args([command, "--set", "algorithm.lr=5e-4"])
        read_environment(args, {})
        assert configure(args).job.bound.config.lr == 5e-4, command


def test_warren_check_says_a_config_mistake_without_pointing_into_warrens_source(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from worker.cli.check import Report

    report = Report()
    assert not report.attempt("the job loads", lambda: str(JobConfig.load(None, **{"env.sed": 3})))
    out = capsys.readouterr().out
    assert "FAIL the job loads: unknown keys in [env]: ['sed']" in out
    assert " at " not in out and ".py:" not in out
    # A plug-in's own bug still says where it happened
    assert not report.attempt("a plug-in", lambda: str(1 / 0))
    assert "in <lambda>" in capsys.readouterr().out
