"""Named retry policies (tenacity), so every reconnect in warren behaves the same way."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Final

import tenacity

logger = logging.getLogger(__name__)

#: First ceiling and largest ceiling of the jittered wait between connection attempts.
CONNECT_WAIT_FIRST_S: Final = 0.25
CONNECT_WAIT_MAX_S: Final = 5.0


def connect_retrying(
    *,
    timeout_s: float,
    retry_if: Callable[[BaseException], bool],
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> tenacity.Retrying:
    """Jittered exponential backoff (up to 0.25 s, doubling, capped at 5 s) for at most ``timeout_s``.

    Jitter spreads the reconnects of many workers after a broker restart, so they do not
    all hit the broker in the same instant. No wait goes past the budget (see
    :func:`within_budget`): the last attempt is made when it runs out, so "retrying for up
    to 5 s" gives up after 5 s and that last attempt, not after a 5 s wait begun at 4.9 s.

    Args:
        timeout_s: total time spent retrying.
        retry_if: whether an error is worth another attempt.
        on_retry: called before each wait with the failed attempt's number, its error and
            the wait in seconds (the caller knows what to say: which broker, which role);
            by default tenacity's own warning.
    """
    if on_retry is None:
        before_sleep: Callable[[tenacity.RetryCallState], None] = tenacity.before_sleep_log(logger, logging.WARNING)
    else:
        report = on_retry

        def before_sleep(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            wait_s = state.next_action.sleep if state.next_action is not None else 0.0
            if error is not None:
                report(state.attempt_number, error, wait_s)

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(retry_if),
        wait=within_budget(
            tenacity.wait_random_exponential(multiplier=CONNECT_WAIT_FIRST_S, max=CONNECT_WAIT_MAX_S), timeout_s
        ),
        stop=tenacity.stop_after_delay(timeout_s),
        before_sleep=before_sleep,
        reraise=True,
    )


def within_budget(
    wait: Callable[[tenacity.RetryCallState], float], budget_s: float
) -> Callable[[tenacity.RetryCallState], float]:
    """``wait``, cut to what is left of ``budget_s`` since the first attempt (never below 0)."""

    def capped(state: tenacity.RetryCallState) -> float:
        return max(0.0, min(wait(state), budget_s - (state.seconds_since_start or 0.0)))

    return capped


class Backoff:
    """The same jittered exponential policy, as waits to schedule rather than to sleep.

    For code that must not block its thread while it waits (an I/O loop that keeps
    heartbeats and confirms flowing): it asks for the next wait and sets a timer.
    Each wait is drawn from the upper half of a ceiling that doubles up to ``max_s``, so
    waits spread many clients apart without collapsing to zero (a retry storm).
    """

    def __init__(self, first_s: float, max_s: float) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self._ceiling = first_s

    def next_wait(self) -> float:
        ceiling = self._ceiling
        self._ceiling = min(ceiling * 2, self.max_s)
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        """Start again from the first wait (after a success)."""
        self._ceiling = self.first_s


def connect_backoff() -> Backoff:
    """The connect retry's waits (see :func:`connect_retrying`), for an I/O loop."""
    return Backoff(CONNECT_WAIT_FIRST_S, CONNECT_WAIT_MAX_S)
