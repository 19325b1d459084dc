"""The broker a benchmark run uses: its URL, a private queue prefix, and the clean-up.

Every run owns the prefix ``bench-<random>``; at the end every queue and exchange whose
name starts with it is deleted through the management API, whatever the cases left.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import urllib.error
import urllib.request
import uuid
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pika

from messaging import Settings

logger = logging.getLogger(__name__)

DEFAULT_URL = "amqp://guest:guest@localhost:5672/%2F"
MANAGEMENT_URL = os.environ.get("WARREN_MANAGEMENT_URL", "http://localhost:15672")


def _auth_header(amqp_url: str) -> str:
    parts = urlsplit(amqp_url)
    token = f"{unquote(parts.username or 'guest')}:{unquote(parts.password or 'guest')}".encode()
    return "Basic " + base64.b64encode(token).decode()


def _management(amqp_url: str, method: str, path: str) -> Any:
    request = urllib.request.Request(MANAGEMENT_URL + path, method=method)
    request.add_header("Authorization", _auth_header(amqp_url))
    with urllib.request.urlopen(request, timeout=10) as response:
        data = response.read()
    return json.loads(data) if data else None


def management_get(amqp_url: str, path: str) -> Any:
    """GET a management API path with the credentials of ``amqp_url``."""
    return _management(amqp_url, "GET", path)


def vhost_of(amqp_url: str) -> str:
    return unquote(urlsplit(amqp_url).path.lstrip("/")) or "/"


class BenchBroker:
    """The broker of one benchmark run, under a prefix nothing else uses.

    Args:
        amqp_url: the broker (default: ``WARREN_AMQP_URL`` or the local guest account).
    """

    def __init__(self, amqp_url: str | None = None) -> None:
        self.amqp_url = amqp_url or os.environ.get("WARREN_AMQP_URL") or DEFAULT_URL
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}"
        self._sub = 0

    def sub_prefix(self, name: str) -> str:
        """A fresh prefix under the run's prefix, for one case or one repeat."""
        self._sub += 1
        return f"{self.prefix}.{name}{self._sub}"

    def settings(self, prefix: str | None = None, **overrides: Any) -> Settings:
        """warren settings on this broker (the run's prefix unless ``prefix`` is given)."""
        return Settings.from_env(
            {}, amqp_url=self.amqp_url, prefix=prefix or self.prefix, connect_timeout_s=10, **overrides
        )

    def parameters(self) -> pika.URLParameters:
        """pika parameters for the raw baselines (pika's defaults otherwise)."""
        return pika.URLParameters(self.amqp_url)

    def cleanup(self) -> int:
        """Delete every queue and exchange of this run; returns how many were deleted."""
        vhost = quote(vhost_of(self.amqp_url), safe="")
        deleted = 0
        for kind in ("queues", "exchanges"):
            try:
                items = _management(self.amqp_url, "GET", f"/api/{kind}/{vhost}?columns=name")
            except (OSError, ValueError) as exc:
                logger.warning("cannot list %s for clean-up: %s", kind, exc)
                continue
            for item in items:
                name = str(item.get("name", ""))
                if not name.startswith(self.prefix):
                    continue
                try:
                    _management(self.amqp_url, "DELETE", f"/api/{kind}/{vhost}/{quote(name, safe='')}")
                    deleted += 1
                except urllib.error.HTTPError as exc:
                    # 404: already gone; 400: an exclusive queue whose owner is closing right now.
                    if exc.code not in (400, 404):
                        logger.warning("cannot delete %s %s: %s", kind, name, exc)
        return deleted
