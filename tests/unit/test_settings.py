from __future__ import annotations

import pytest

from messaging import ConfigurationError, Names, Settings, redact_url


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
    ],
)
def test_bad_values_are_configuration_errors(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Settings.from_env(env)


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
