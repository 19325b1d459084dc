"""Shared fixtures: a private RabbitMQ vhost per test session and a queue prefix per test.

Tests that need the broker skip when none answers locally, but fail in CI (CI=true),
where a missing broker is a broken setup rather than a reason to skip.

The broker on ``WARREN_AMQP_URL`` is shared: tests only add and delete their own vhost
on it (through its management API). Tests that stop, restart or kill a broker use
``private_broker``, a node this session starts itself (``tests.rabbit_nodes``).
"""

from __future__ import annotations

import logging
import os
import urllib.error
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from messaging import BrokerLink, Settings
from messaging.errors import ConnectionFailed
from tests import broker_admin
from tests.rabbit_nodes import PrivateCluster, PrivateNode, find_sbin

# pika logs every channel the broker closes (expected in tests of missing queues).
logging.getLogger("pika").setLevel(logging.ERROR)

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
BASE_URL = os.environ.get("WARREN_AMQP_URL", "amqp://guest:guest@localhost:5672/%2F")


def _admin(method: str, path: str, body: object = None) -> bool:
    """A management API call on the shared broker; False when it is refused or unreachable.

    The API, not ``rabbitmqctl``: it reaches the broker of ``WARREN_MANAGEMENT_URL`` with the
    test's own credentials, where the CLI on the PATH would switch user and act on whatever
    node the machine's rabbitmq-env.conf names (not necessarily the one the tests use).
    """
    try:
        broker_admin.api(BASE_URL, method, path, body)
    except (OSError, urllib.error.URLError, ValueError):
        return False
    return True


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
    path = "/" + quote(vhost, safe="")
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    if _admin("PUT", "/api/vhosts" + path, {}) and _admin("PUT", f"/api/permissions{path}/{quote(user)}", everything):
        yield _with_vhost(BASE_URL, vhost)
        _admin("DELETE", "/api/vhosts" + path)
    else:
        _admin("DELETE", "/api/vhosts" + path)  # created, but permissions refused
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


def _need_rabbitmq_package() -> None:
    if find_sbin() is None:
        reason = "private RabbitMQ nodes need the RabbitMQ server package's own scripts"
        if CI:
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def private_broker() -> Iterator[PrivateNode]:
    """A one-node RabbitMQ this session starts itself: the one broker tests may stop or kill.

    Session-scoped, so its start (~15 s) is paid once; tests that take it get it running
    (``private_settings`` starts it again if a test before left it down).
    """
    _need_rabbitmq_package()
    cluster = PrivateCluster.start(1)
    try:
        yield cluster.nodes[0]
    finally:
        cluster.stop()


@pytest.fixture
def private_settings(private_broker: PrivateNode, prefix: str) -> Settings:
    """Transport settings on the private broker (its default vhost) with this test's prefix."""
    private_broker.ensure_running()
    return Settings.from_env(
        {}, amqp_url=private_broker.amqp_url, prefix=prefix, connect_timeout_s=10, rpc_timeout_s=10
    )


@pytest.fixture
def private_link(private_settings: Settings) -> Iterator[BrokerLink]:
    """A broker link to the private broker for the test body's own thread."""
    with BrokerLink(private_settings, "test") as test_link:
        yield test_link


@pytest.fixture
def start_private_cluster() -> Iterator[Callable[[int], PrivateCluster]]:
    """Start private clusters of N nodes (``start_private_cluster(3)``); all stopped after the test."""
    _need_rabbitmq_package()
    started: list[PrivateCluster] = []

    def start(size: int) -> PrivateCluster:
        cluster = PrivateCluster.start(size)
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()
