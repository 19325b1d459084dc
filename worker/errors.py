"""Errors raised by warren's roles; they all belong to :mod:`messaging.errors`' tree."""

from __future__ import annotations

import reprlib
from typing import Any

from messaging.errors import (
    ConfigurationError,
    CorruptFile,
    MissingFile,
    StorageError,
    TaskError,
    UnsafePath,
    WarrenError,
)

__all__ = [
    "CollectorError",
    "ConfigurationError",
    "CorruptFile",
    "MissingFile",
    "PolicyUnavailable",
    "StorageError",
    "TaskError",
    "UnsafePath",
    "WarrenError",
    "short_repr",
]


class CollectorError(TaskError):
    """A collector task failed while running (env crash, bad config...)."""


class PolicyUnavailable(TaskError):
    """No usable policy file appeared within the wait budget."""


def _bounded_repr() -> reprlib.Repr:
    bounded = reprlib.Repr()
    bounded.maxlevel, bounded.maxstring, bounded.maxother = 3, 80, 80
    bounded.maxlong, bounded.maxlist, bounded.maxdict = 40, 4, 4
    return bounded


_SHORT_REPR = _bounded_repr()


def short_repr(value: Any) -> str:
    """A bounded repr of an untrusted value, for error messages.

    Values from messages can be huge or nested a thousand levels deep; ``repr`` of those
    is slow or raises ``RecursionError``. This stays short and cheap.
    """
    return _SHORT_REPR.repr(value)
