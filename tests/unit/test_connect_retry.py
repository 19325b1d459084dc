"""The connect retry (messaging.retry): its budget bounds the time spent retrying, the last wait included."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import tenacity

from messaging.retry import connect_retrying


def test_a_connect_retry_makes_its_last_attempt_when_its_budget_runs_out_not_a_wait_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A clock that only the retry's waits move: every attempt fails at once, like a refused port.
    now = [0.0]
    monkeypatch.setattr(tenacity, "time", SimpleNamespace(monotonic=lambda: now[0]))
    attempts: list[float] = []
    waits: list[float] = []

    def attempt() -> None:
        attempts.append(now[0])
        raise ConnectionRefusedError("nothing listens there")

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    retrying = connect_retrying(timeout_s=5.0, retry_if=lambda _exc: True).copy(sleep=sleep)
    with pytest.raises(ConnectionRefusedError):
        retrying(attempt)
    # The waits were cut to the budget: the last attempt came when it ran out (not up to 5 s after)
    assert len(attempts) > 2 and all(wait >= 0 for wait in waits)
    assert attempts[-1] == pytest.approx(5.0, abs=1e-9)
    assert attempts[-2] < 5.0
