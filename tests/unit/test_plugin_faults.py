"""Naming the plug-in at fault: the one line a failure is said in, read back, and what makes two failures alike."""

from __future__ import annotations

import re

import pytest

from worker.coordinator.giveup import FailureStreak
from worker.plugins.faults import PluginRef, blame, exception_problem, failure_key, fault_line, parse

GRID = PluginRef("env", "grid", "0.1.0", "my-envs", env_id="grid-v1", package="my_envs")
ALGORITHM = PluginRef("algorithm", "ppo", "0.1.0", "warren", package="worker.algorithms")
MODEL = PluginRef("model", "gridnet", "0.2.0", "my-models", package="tests.unit")


def test_a_fault_line_names_the_plugin_its_version_package_and_call_and_reads_back_as_data() -> None:
    line = fault_line(GRID, "step", "RuntimeError: lost its state")
    assert line == "env plug-in 'grid' 0.1.0 (from my-envs, env 'grid-v1'): step: RuntimeError: lost its state"
    assert parse(f"learner stops: {line}") == {
        "plugin": {"kind": "env", "name": "grid", "version": "0.1.0", "distribution": "my-envs", "env_id": "grid-v1"},
        "call": "step",
        "error": line,
    }
    assert parse("broker: connection lost") == {"plugin": None, "call": None, "error": "broker: connection lost"}


def test_failures_that_differ_only_in_numbers_and_ids_are_of_one_kind() -> None:
    one = fault_line(GRID, "step", "RuntimeError: step 40 of env 0x7f3a2c failed (in step at my_envs.grid:88)")
    two = fault_line(GRID, "step", "RuntimeError: step 41 of env 0x7f9b10 failed (in step at my_envs.grid:88)")
    other = fault_line(GRID, "reset", "RuntimeError: step 41 of env 0x7f9b10 failed (in step at my_envs.grid:88)")
    assert failure_key(one) == failure_key(two) != failure_key(other)


def _forward_that_raises() -> None:
    def forward() -> None:
        raise ValueError("mat1 and mat2 shapes cannot be multiplied (4x17 and 16x2)\nmore detail")

    forward()


def test_an_error_out_of_the_models_forward_is_the_models_and_says_where_in_its_code() -> None:
    with pytest.raises(ValueError) as raised:
        _forward_that_raises()
    assert blame(raised.value, ALGORITHM, MODEL, "act") == (MODEL, "forward")
    assert blame(raised.value, ALGORITHM, None, "act") == (ALGORITHM, "act")
    # the first line of the error, and the innermost place in the model's own code
    problem = exception_problem(raised.value, MODEL)
    assert problem.startswith("ValueError: mat1 and mat2 shapes cannot be multiplied (4x17 and 16x2) (in forward at ")
    assert re.fullmatch(r".* \(in forward at tests\.unit\.test_plugin_faults:\d+\)", problem)


def test_the_same_failure_in_a_row_gives_up_and_a_success_in_between_starts_the_count_again() -> None:
    streak = FailureStreak(3)
    error = fault_line(GRID, "step", "RuntimeError: step {} failed")
    assert streak.failed(error.format(1), "t1", "c0") is None
    assert streak.failed(error.format(2), "t2", "c0") is None
    streak.succeeded()
    assert streak.failed(error.format(3), "t3", "c0") is None and streak.backoff_s == pytest.approx(0.2)
    assert streak.failed(error.format(4), "t4", "c0") is None and streak.backoff_s == pytest.approx(0.4)
    gave_up = streak.failed(error.format(5), "t5", "c1")
    assert gave_up is not None
    assert gave_up.message() == (
        "env plug-in 'grid' 0.1.0 (from my-envs, env 'grid-v1') kept failing: step: RuntimeError: step 5 failed; "
        "3 tasks in a row failed the same way, so the run gives up (coordinator.max_consecutive_failures = 3; "
        "the last, t5, on worker c1)"
    )
    assert gave_up.to_record()["plugin"]["name"] == "grid" and gave_up.to_record()["tasks_in_a_row"] == 3


def test_failures_that_take_turns_between_kinds_give_up_too_after_three_times_the_limit() -> None:
    streak = FailureStreak(2)
    outcomes = [streak.failed(f"error {'ab'[i % 2]}x", f"t{i}", "c0") for i in range(6)]
    assert outcomes[:5] == [None] * 5 and outcomes[5] is not None and not outcomes[5].same_kind
