"""The reply envelope shared by every RPC in warren.

A reply body is ``{"ok": true, "result": {...}}`` or
``{"ok": false, "error": {"message": str, "result": {...}}}``: DI-engine's
``TaskFail`` shape, so a coordinator can tell a refused task from a transport failure.
"""

from __future__ import annotations

from typing import Any

from messaging.errors import DecodeError, RemoteError


def ok(result: dict[str, Any]) -> dict[str, Any]:
    """A successful reply carrying ``result``."""
    return {"ok": True, "result": result}


def error(message: str, result: dict[str, Any] | None = None) -> dict[str, Any]:
    """A refusal: ``message`` says why in words, ``result`` carries machine-readable detail."""
    return {"ok": False, "error": {"message": message, "result": dict(result or {})}}


def unwrap(reply: Any) -> dict[str, Any]:
    """The ``result`` of a successful reply.

    Raises:
        RemoteError: the reply says ``ok: false``.
        DecodeError: the reply does not have the envelope's shape.
    """
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise DecodeError(f"reply is not a warren reply envelope: {reply!r:.200}")
    if reply["ok"]:
        result = reply.get("result")
        if not isinstance(result, dict):
            raise DecodeError("successful reply without a result map")
        return result
    err = reply.get("error")
    if not isinstance(err, dict):
        raise DecodeError("error reply without an error map")
    result = err.get("result")
    raise RemoteError(str(err.get("message", "unknown error")), result if isinstance(result, dict) else {})
