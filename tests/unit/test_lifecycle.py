"""Process set-up shared by the roles (worker/lifecycle.py)."""

from __future__ import annotations

import signal
import threading

import pytest
import torch

from worker import lifecycle
from worker.cli.exit_codes import ExitCode, of_ended_run
from worker.lifecycle import limit_torch_threads


def test_limit_torch_threads_sets_the_pool_size() -> None:
    before = torch.get_num_threads()
    try:
        limit_torch_threads(1)
        assert torch.get_num_threads() == 1
        limit_torch_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_first_stop_signal_is_remembered_so_a_run_it_stopped_exits_128_plus_its_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lifecycle, "_received", [])
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    stop = threading.Event()
    try:
        lifecycle.install_stop_handlers(stop)
        assert lifecycle.stop_signal() is None
        signal.raise_signal(signal.SIGTERM)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert stop.is_set() and lifecycle.stop_signal() == signal.SIGTERM
    # A run that ended because of it: 143, as a shell reports a process SIGTERM ended (not 3, a budget)
    assert of_ended_run(False, lifecycle.stop_signal()) == 143 == int(ExitCode.TERMINATED)
    assert of_ended_run(False, signal.SIGINT) == 130 == int(ExitCode.INTERRUPTED)
    assert of_ended_run(False, None) == ExitCode.BUDGET
    assert of_ended_run(True, signal.SIGTERM) == ExitCode.OK  # it had reached the stop value
