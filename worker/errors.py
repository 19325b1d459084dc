"""Errors raised by warren's roles; they all derive from :class:`messaging.errors.WarrenError`.

The transport's errors (broker, codec, RPC, configuration, ``TaskError``) live in
:mod:`messaging.errors`; the ones only the roles raise (storage, collector failures) here.
"""

from __future__ import annotations

import reprlib
from typing import Any

from messaging.errors import ConfigurationError, TaskError, WarrenError

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


class StorageError(WarrenError):
    """A file on the shared volume is missing, corrupt or outside the volume."""


class UnsafePath(StorageError):
    """A path taken from a message would leave the shared volume."""


class CorruptFile(StorageError):
    """A file exists but is not what it claims to be."""


class MissingFile(StorageError):
    """A file that should exist was not found within the wait budget."""


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
