"""JSON that every reader accepts: the files and lines warren writes for people and tools.

Python's ``json`` writes an infinite float as ``Infinity``, which is not JSON: ``jq`` turns
it into 1.797e308 and strict parsers refuse the file. A run that ends only on a budget has
``stop_value = inf``, so ``job.json``, ``summary.json`` and the run log would carry it.
Here non-finite floats are written as the strings ``"inf"``, ``"-inf"`` and ``"nan"``
(what ``float()`` reads back), and anything else that is not JSON is refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

#: How a non-finite float is written: ``float(text)`` gives the value back.
NON_FINITE_TEXT = {math.inf: "inf", -math.inf: "-inf"}


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (in nested dicts, lists and tuples) as its text."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else NON_FINITE_TEXT[value]
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def dumps(value: Any, *, indent: int | None = None, default: Callable[[Any], Any] | None = None) -> str:
    """Strict JSON text of ``value`` (non-finite floats as strings, see :func:`finite`)."""
    return json.dumps(finite(value), indent=indent, default=default, allow_nan=False)
