"""``warren run --name``: names, prefixes, workdirs, and the command that joins a run from elsewhere."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from messaging import ConfigurationError, Settings
from worker.cli import build_parser
from worker.cli.flags import flag_values
from worker.cli.named_run import URL_PLACEHOLDER_TEXT, join_command, loopback_hosts, run_identity, url_placeholder
from worker.config import CollectorConfig, role_config


@pytest.mark.parametrize("name", ["a", "cartpole-7", "Exp_2.b", "x" * 62])
def test_a_valid_name_fixes_the_prefix_and_the_workdir(name: str) -> None:
    identity = run_identity("w", name)
    assert identity.named
    assert (identity.run_id, identity.prefix, identity.workdir) == (name, f"w-{name}", Path("runs") / name)
    Settings(prefix=identity.prefix)  # a prefix the transport accepts


def test_the_same_name_gives_the_same_identity_and_no_name_a_fresh_one() -> None:
    assert run_identity("warren", "shared") == run_identity("warren", "shared")
    first, second = run_identity("warren"), run_identity("warren")
    assert not first.named and first.prefix != second.prefix
    assert first.prefix.startswith("warren-") and first.workdir == Path("runs") / first.run_id


def test_workdir_flag_wins_over_the_name() -> None:
    assert run_identity("warren", "shared", Path("/vol/run")).workdir == Path("/vol/run")


@pytest.mark.parametrize("name", ["", "-lead", ".hidden", "a/b", "../up", "sp ace", "x" * 65, "é"])
def test_names_that_are_not_one_plain_component_are_refused_at_parsing(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["run", f"--name={name}"])
    assert exited.value.code == 2
    assert "argument --name: must match" in capsys.readouterr().err
    with pytest.raises(ConfigurationError):
        run_identity("warren", name)


def test_a_name_that_makes_the_prefix_too_long_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="shorter --name or --prefix"):
        run_identity("p" * 10, "n" * 60)


def test_passwords_become_a_placeholder_in_every_url_of_a_list() -> None:
    urls = "amqp://u:s3cret@rabbitmq-1:5672/%2F,amqps://u:s3cret@rabbitmq-2:5671/vh,amqp://rabbitmq-3/%2F"
    shown = url_placeholder(urls)
    assert "s3cret" not in shown
    assert shown.split(",") == [
        f"amqp://u:{URL_PLACEHOLDER_TEXT}@rabbitmq-1:5672/%2F",
        f"amqps://u:{URL_PLACEHOLDER_TEXT}@rabbitmq-2:5671/vh",
        "amqp://rabbitmq-3/%2F",
    ]
    assert loopback_hosts(urls) == []
    assert loopback_hosts("amqp://g:g@localhost:5672/%2F,amqp://g:g@127.0.0.1:5673/%2F") == ["localhost", "127.0.0.1"]


def test_the_join_command_starts_a_collector_of_this_run_without_the_password(tmp_path: Path) -> None:
    transport = Settings(
        amqp_url="amqps://warren:s3cret@broker.example:5671/%2F",
        amqp_ca_file="/etc/ssl/ca.pem",
        prefix="warren-shared",
        metadata_queue_length=3,
    )
    command = join_command(transport, tmp_path / "run data", tmp_path / "policy")
    assert "s3cret" not in command
    words = shlex.split(command)
    env = dict(word.split("=", 1) for word in words[: words.index("warren")])
    # Settings that shape the queues' declarations travel along; defaults and the password do not.
    assert env == {
        "WARREN_METADATA_QUEUE_LENGTH": "3",
        "WARREN_AMQP_URL": f"amqps://warren:{URL_PLACEHOLDER_TEXT}@broker.example:5671/%2F",
    }
    argv = words[words.index("warren") + 1 :]
    assert argv[0] == "collector"
    args = build_parser().parse_args(argv)
    # Over there, with the real password in the URL:
    there = {**env, "WARREN_AMQP_URL": transport.amqp_url}
    config = role_config(CollectorConfig, there, **flag_values(args, CollectorConfig))
    assert config.transport.prefix == "warren-shared"
    assert config.transport.metadata_queue_length == 3
    assert config.transport.amqp_ca_file == "/etc/ssl/ca.pem"
    assert (config.path_data, config.path_policy) == (tmp_path / "run data", tmp_path / "policy")
