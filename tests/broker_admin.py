"""Test helpers that act on the broker from the outside (management HTTP API).

Every helper talks to ``WARREN_MANAGEMENT_URL`` (the shared broker's management API)
unless given ``management_url``: a private node's (``tests.rabbit_nodes``) is its own.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

MANAGEMENT_URL = os.environ.get("WARREN_MANAGEMENT_URL", "http://localhost:15672")


def _auth(amqp_url: str) -> str:
    parts = urlsplit(amqp_url)
    token = f"{parts.username or 'guest'}:{parts.password or 'guest'}".encode()
    return "Basic " + base64.b64encode(token).decode()


def api(amqp_url: str, method: str, path: str, body: Any = None, *, management_url: str | None = None) -> Any:
    """Call the management API with the credentials of ``amqp_url``; ``body`` is sent as JSON."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request((management_url or MANAGEMENT_URL) + path, data=data, method=method)
    request.add_header("Authorization", _auth(amqp_url))
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        data = response.read()
    return json.loads(data) if data else None


def vhost_of(amqp_url: str) -> str:
    path = urlsplit(amqp_url).path.lstrip("/")
    return unquote(path) or "/"


def connections(amqp_url: str, *, management_url: str | None = None) -> list[dict[str, Any]]:
    vhost = quote(vhost_of(amqp_url), safe="")
    result: list[dict[str, Any]] = api(
        amqp_url, "GET", f"/api/vhosts/{vhost}/connections", management_url=management_url
    )
    return result


def connection_names(amqp_url: str, *, management_url: str | None = None) -> list[str]:
    return [
        c.get("client_properties", {}).get("connection_name", "")
        for c in connections(amqp_url, management_url=management_url)
    ]


def close_connections(amqp_url: str, match: Callable[[str], bool], *, management_url: str | None = None) -> int:
    """Close, from the broker side, every connection whose connection_name matches."""
    closed = 0
    for conn in connections(amqp_url, management_url=management_url):
        if match(conn.get("client_properties", {}).get("connection_name", "")):
            try:
                path = "/api/connections/" + quote(conn["name"], safe="")
                api(amqp_url, "DELETE", path, management_url=management_url)
                closed += 1
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
    return closed


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll an outside condition (a file, a broker listing) until true or fail the test."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def queues(amqp_url: str, *, management_url: str | None = None) -> list[dict[str, Any]]:
    """Every queue of the URL's vhost, with its declared arguments."""
    vhost = quote(vhost_of(amqp_url), safe="")
    path = f"/api/queues/{vhost}?columns=name,arguments"
    result: list[dict[str, Any]] = api(amqp_url, "GET", path, management_url=management_url)
    return result


#: The protocol name the management API gives the Prometheus plugin's listener.
PROMETHEUS_PROTOCOL = "http/prometheus"


def prometheus_listener_url(overview: dict[str, Any], management_url: str | None = None) -> str | None:
    """The Prometheus endpoint the broker says it has (``/api/overview``'s listeners), or ``None``.

    The plugin's listener is on the management API's host (the API answered from there),
    on the port the broker names; a broker without the plugin lists no such listener.
    """
    ports = [int(x["port"]) for x in overview.get("listeners", []) if x.get("protocol") == PROMETHEUS_PROTOCOL]
    if not ports:
        return None
    host = urlsplit(management_url or MANAGEMENT_URL).hostname or "localhost"
    return f"http://{host}:{ports[0]}"


def prometheus_url(amqp_url: str) -> str | None:
    """Where the broker's Prometheus endpoint is: ``WARREN_PROMETHEUS_URL``, else what its
    management API says (``None``: the broker has no Prometheus plugin).

    Raises:
        OSError, urllib.error.URLError: the management API does not answer.
    """
    given = os.environ.get("WARREN_PROMETHEUS_URL")
    if given:
        return given
    return prometheus_listener_url(api(amqp_url, "GET", "/api/overview"))
