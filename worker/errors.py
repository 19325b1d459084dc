"""Errors raised by warren's roles; they all derive from :class:`messaging.errors.WarrenError`.

The transport's errors (broker, codec, RPC, configuration) live in :mod:`messaging.errors`;
the ones only the roles raise (refused and failed tasks, storage) here.
"""

from __future__ import annotations

import reprlib
from typing import Any

from messaging.errors import ConfigurationError, RequestRefused, WarrenError

__all__ = [
    "CollectorError",
    "ConfigurationError",
    "CorruptChunk",
    "CorruptFile",
    "DeviceOutOfMemory",
    "MissingFile",
    "PluginFailed",
    "PolicyKept",
    "PolicyMismatch",
    "PolicyUnavailable",
    "StorageError",
    "TaskError",
    "UnsafePath",
    "WarrenError",
    "short_repr",
]


class TaskError(RequestRefused):
    """A task cannot be carried out; the worker replies with ``ok: false`` and keeps serving.

    ``result`` is sent back to the caller as the error's structured detail (DI-engine's
    ``TaskFail.result``); a refusal puts its :class:`~worker.protocol.Refusal` code there.
    """


class StorageError(WarrenError):
    """A file on the shared volume is missing, corrupt or outside the volume."""


class UnsafePath(StorageError):
    """A path taken from a message would leave the shared volume."""


class CorruptFile(StorageError):
    """A file exists but is not what it claims to be."""


class CorruptChunk(CorruptFile):
    """A step file whose field ``field`` does not fit the job's spaces (its shape, its dtype, NaN values...)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class MissingFile(StorageError):
    """A file that should exist was not found within the wait budget."""


class PolicyKept(StorageError):
    """A policy file is kept as its run left it (``<name>.kept``): writes of it are refused until it is released."""


class DeviceOutOfMemory(WarrenError):
    """The learner's device (a CUDA GPU) ran out of memory; the message names the job's settings to lower."""


class PolicyMismatch(WarrenError):
    """A trained policy does not fit what it is asked to act on: another env's spaces, observations of another shape.

    The message names both sides (the policy's spaces digest and the env's, or the shapes).
    """


class CollectorError(TaskError):
    """A collector task failed while running (env crash, bad config...)."""


class PluginFailed(TaskError):
    """A plug-in's code raised, hung, or broke the plug-in contract (an encoder wider than its ``out_dim``, NaN).

    The message is one line that names the plug-in, its version and package, and the call
    (:func:`worker.plugins.faults.fault_line`), so that whoever reads it knows whose code to open.
    """


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
