"""The ``warren`` command line: version, each role's flags, and values refused at parsing."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
from pathlib import Path

import pytest

from messaging.connection import connection_name
from worker.cli import build_parser, main
from worker.cli.flags import log_level
from worker.cli.run import collector_id

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
        positional = [str(tmp_path)] if command == "plot" else []
        args = parser.parse_args([command, *positional, "--verbose"])
        assert log_level(args) == "DEBUG", command


def test_the_exit_code_warren_run_documents_for_an_unusable_env_is_the_one_it_returns() -> None:
    description = " ".join((command_parser("run").description or "").split())
    clauses = re.findall(r"(\d) (?:when|for) (.+?)(?=, \d (?:when|for) |\.$)", description)
    (documented,) = [int(code) for code, what in clauses if "env the job cannot use" in what]
    assert main(["run", "--env-id", "NoSuchEnv-v0", "--connect-timeout-s", "1"]) == documented
