"""Named retry policies (tenacity), so every reconnect in warren behaves the same way."""

from __future__ import annotations

import logging
from collections.abc import Callable

import tenacity

logger = logging.getLogger(__name__)


def connect_retrying(*, timeout_s: float, retry_if: Callable[[BaseException], bool]) -> tenacity.Retrying:
    """Jittered exponential backoff (up to 0.25 s, doubling, capped at 5 s) for at most ``timeout_s``.

    Jitter spreads the reconnects of many workers after a broker restart, so they do not
    all hit the broker in the same instant.
    """
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(retry_if),
        wait=tenacity.wait_random_exponential(multiplier=0.25, max=5.0),
        stop=tenacity.stop_after_delay(timeout_s),
        before_sleep=tenacity.before_sleep_log(logger, logging.WARNING),
        reraise=True,
    )
