"""Naming the plug-in at fault: one line that says whose code failed, in which call, and how.

A plug-in's code fails in ways warren cannot repair: a ``step`` that raises, an encoder
wider than its ``out_dim``, NaN where numbers were due, a call that never returns. Each
such failure is said in one line of one form::

    env plug-in 'grid' 0.1.0 (from my-envs, env 'grid-v1'): step: RuntimeError: lost (in step at my_envs.grid:88)

so that whoever reads it knows which package to open (the plug-in's name, version and
distribution), which call of the contract failed, and the error's first line. The
collector writes that line into the task's ``error``; the coordinator tells failures of
the same kind from one-off ones by the line with its numbers taken out
(:func:`failure_key`), and reports one as data by reading the line back (:func:`parse`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import TracebackType
from typing import Any

#: Longest error text kept of a plug-in's exception (its first line).
MAX_PROBLEM_CHARS = 300

_LINE = re.compile(
    r"\b(?P<kind>env|model|algorithm) plug-in '(?P<name>[^']*)' (?P<version>\S+)"
    r"(?: \((?:from (?P<distribution>[^,)]*))?(?:, )?(?:env '(?P<env_id>[^']*)')?\))?"
    r": (?P<call>[A-Za-z_][\w.]*): (?P<problem>.*)$"
)
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-fA-F]*\d[0-9a-fA-F]*\b|\d+")


@dataclass(frozen=True)
class PluginRef:
    """One plug-in as a failure names it: kind, name, version, and the package it came from."""

    kind: str
    name: str
    version: str = "?"
    distribution: str = ""
    env_id: str | None = None
    """For an env plug-in: the env it made (one plug-in may make several)."""
    package: str = ""
    """The Python package its code lives in, to find its frames in a traceback ("" if unknown)."""

    def describe(self) -> str:
        """``env plug-in 'grid' 0.1.0 (from my-envs, env 'grid-v1')``."""
        where = [f"from {self.distribution}"] if self.distribution else []
        if self.env_id is not None:
            where.append(f"env {self.env_id!r}")
        return f"{self.kind} plug-in {self.name!r} {self.version}" + (f" ({', '.join(where)})" if where else "")

    def owns(self, module: str) -> bool:
        """Whether code of ``module`` is this plug-in's."""
        return bool(self.package) and (module == self.package or module.startswith(self.package + "."))


@dataclass(frozen=True)
class TaskPlugins:
    """The three plug-ins a task runs: what its failures are blamed on."""

    env: PluginRef
    algorithm: PluginRef
    model: PluginRef | None
    """``None`` for an algorithm that builds no model (``random``)."""


def fault_line(plugin: PluginRef, call: str, problem: str) -> str:
    """The one line that reports a plug-in's failure (see the module docstring)."""
    return f"{plugin.describe()}: {call}: {problem}"


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, at most :data:`MAX_PROBLEM_CHARS` long."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= MAX_PROBLEM_CHARS else line[: MAX_PROBLEM_CHARS - 3] + "..."


def exception_problem(exc: BaseException, plugin: PluginRef | None = None) -> str:
    """``Type: first line of the message``, and where in ``plugin``'s code it was raised, if there."""
    message = first_line(str(exc))
    problem = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    where = _innermost_frame(exc.__traceback__, plugin) if plugin is not None else None
    return f"{problem} (in {where[0]} at {where[1]}:{where[2]})" if where is not None else problem


def blame(exc: BaseException, algorithm: PluginRef, model: PluginRef | None, call: str) -> tuple[PluginRef, str]:
    """Whose ``call`` failed, the algorithm's (``act``, ``update``...) or its model's: the model's when the
    error came out of the model's ``forward``, and the call is then ``forward``."""
    if model is not None and model.package != algorithm.package:
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code.co_name == "forward" and model.owns(str(frame.f_globals.get("__name__", ""))):
                return model, "forward"
            tb = tb.tb_next
    return algorithm, call


def _innermost_frame(tb: TracebackType | None, plugin: PluginRef) -> tuple[str, str, int] | None:
    found = None
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if plugin.owns(module):
            found = (tb.tb_frame.f_code.co_name, module, tb.tb_lineno)
        tb = tb.tb_next
    return found


def failure_key(error: str) -> str:
    """What makes two failures "the same": the error's first line, its numbers and ids taken out.

    ``grid step 40 failed`` and ``grid step 41 failed`` are one kind of failure; a task id,
    an address or a count in a message must not make every failure look new.
    """
    return _NUMBERS.sub("#", first_line(error))


def parse(error: str) -> dict[str, Any]:
    """A failure as data: ``plugin`` (kind, name, version, distribution, env id), ``call`` and ``error``.

    The line may say something before the fault line (``learner stops: ...``): ``error`` is
    the fault line itself. ``plugin`` and ``call`` are ``None`` when the line holds none (a
    failure of warren's own, or one a worker of an older version said); ``error`` is then
    the whole line.
    """
    line = first_line(error)
    match = _LINE.search(line)
    if match is None:
        return {"plugin": None, "call": None, "error": line}
    plugin = {
        "kind": match["kind"],
        "name": match["name"],
        "version": match["version"],
        "distribution": match["distribution"] or None,
    }
    if match["env_id"] is not None:
        plugin["env_id"] = match["env_id"]
    return {"plugin": plugin, "call": match["call"], "error": line[match.start() :]}
