"""Shared fixtures: a private RabbitMQ vhost per test session and a queue prefix per test.

Tests that need the broker skip when none answers locally, but fail in CI (CI=true),
where a missing broker is a broken setup rather than a reason to skip.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from messaging import BrokerLink, Settings
from messaging.errors import ConnectionFailed

# pika logs every channel the broker closes (expected in tests of missing queues).
logging.getLogger("pika").setLevel(logging.ERROR)

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
BASE_URL = os.environ.get("WARREN_AMQP_URL", "amqp://guest:guest@localhost:5672/%2F")


def _rabbitmqctl(*args: str) -> bool:
    if shutil.which("rabbitmqctl") is None:
        return False
    done = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, timeout=60, check=False)
    return done.returncode == 0


def _with_vhost(url: str, vhost: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """URL of a vhost of our own for this session (deleted at the end), or the base URL."""
    probe = Settings.from_env({}, amqp_url=BASE_URL, connect_timeout_s=5)
    try:
        BrokerLink(probe, "probe", reconnect=False).open().close()
    except ConnectionFailed as exc:
        if CI:
            raise
        pytest.skip(f"RabbitMQ is not reachable: {exc}")
    vhost = f"warren-test-{uuid.uuid4().hex[:8]}"
    user = urlsplit(BASE_URL).username or "guest"
    if _rabbitmqctl("add_vhost", vhost) and _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*"):
        yield _with_vhost(BASE_URL, vhost)
        _rabbitmqctl("delete_vhost", vhost)
    else:
        yield BASE_URL


@pytest.fixture
def prefix() -> str:
    """A queue-name prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def settings(amqp_url: str, prefix: str) -> Settings:
    """Transport settings on the session vhost with this test's own prefix."""
    return Settings.from_env({}, amqp_url=amqp_url, prefix=prefix, connect_timeout_s=10, rpc_timeout_s=10)


@pytest.fixture
def link(settings: Settings) -> Iterator[BrokerLink]:
    """A broker link for the test body's own thread."""
    with BrokerLink(settings, "test") as test_link:
        yield test_link
