"""The exit codes of warren's commands, in one place so that every command and doc agrees.

A script that runs ``warren run`` tells from the code alone whether to look at the
job (2, 4), the machine (1), the budget (3) or the person at the keyboard (130, 143).
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What a warren command's exit status means."""

    OK = 0
    """The run reached its stop value (other commands: they did what was asked)."""
    FAILED = 1
    """The run could not go on: no broker, the learner or every collector gone."""
    USAGE = 2
    """A bad command line, config or input file, refused before anything started."""
    BUDGET = 3
    """A budget (env steps or time) ran out before the stop value."""
    PLUGIN_FAILING = 4
    """The job's plug-ins (env, model or algorithm) kept failing, and the run gave up on them."""
    INTERRUPTED = 130
    """Stopped by SIGINT (Ctrl-C), as a shell reports it: 128 + 2."""
    TERMINATED = 143
    """Stopped by SIGTERM: 128 + 15."""


def by_signal(signum: int) -> int:
    """The exit code of a command a signal stopped: 128 + the signal's number, as shells report it."""
    return 128 + signum


def of_ended_run(success: bool, signum: int | None) -> int:
    """The code of a run that ended without an error (``warren run``, ``warren coordinator``).

    0 at the stop value; 128 + ``signum`` when a signal stopped it (the first SIGINT or
    SIGTERM the process got: :func:`worker.lifecycle.stop_signal`); else a budget ran out.
    """
    if success:
        return ExitCode.OK
    return by_signal(signum) if signum is not None else ExitCode.BUDGET


def describe() -> str:
    """One line for ``--help``: each code and what it means."""
    return (
        "Exit codes: 0 the stop value was reached, 1 the run could not go on (no broker, the learner or every "
        "collector gone), 2 a bad command line or config, 3 a budget ran out, 4 a plug-in kept failing and the "
        "run gave up, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."
    )
