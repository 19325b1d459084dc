"""Errors raised by warren's roles; they all belong to :mod:`messaging.errors`' tree."""

from __future__ import annotations

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
]


class CollectorError(TaskError):
    """A collector task failed while running (env crash, bad config...)."""


class PolicyUnavailable(TaskError):
    """No usable policy file appeared within the wait budget."""
