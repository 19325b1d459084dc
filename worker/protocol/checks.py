"""Validation of untrusted values from the wire: one rule per type, one error per problem.

Every helper returns the value in the type code past the edge may rely on, or raises a
:class:`~worker.errors.TaskError` whose message names the offending key, so a worker can
refuse a task with a clear reply instead of failing somewhere deep inside.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, cast

import numpy as np

from worker.errors import TaskError, short_repr

#: Largest count (steps, samples, episodes) a task may ask for.
MAX_COUNT: Final = 10**9


def is_int(value: Any) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def check_int(value: Any, key: str, lo: int, hi: int) -> int:
    if not is_int(value) or not lo <= int(value) <= hi:
        raise TaskError(f"{key} must be an integer between {lo} and {hi}, got {short_repr(value)}")
    return int(value)


def check_float(value: Any, key: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    ok = (is_int(value) or isinstance(value, float | np.floating)) and math.isfinite(float(value))
    if ok:
        number = float(value)
        ok = (lo < number if lo_open else lo <= number) and number <= hi
    if not ok:
        bracket = "(" if lo_open else "["
        raise TaskError(f"{key} must be a number in {bracket}{lo}, {hi}], got {short_repr(value)}")
    return float(value)


def check_bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise TaskError(f"{key} must be a boolean, got {short_repr(value)}")
    return bool(value)


def check_warmup_fits(learning_starts: int, replay_capacity: int, prefix: str) -> None:
    """A replay learner trains once its buffer holds ``learning_starts`` transitions; one that
    holds fewer would collect for ever without a train step, so such a config is refused."""
    if learning_starts > replay_capacity:
        raise TaskError(
            f"{prefix}.learning_starts ({learning_starts}) must be at most {prefix}.replay_capacity "
            f"({replay_capacity}): the replay buffer could never hold enough transitions to start training"
        )


def check_str(value: Any, key: str, max_len: int = 4096) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= max_len:
        raise TaskError(f"{key} must be a non-empty string of at most {max_len} characters, got {short_repr(value)}")
    return value


def check_sizes(value: Any, key: str) -> tuple[int, ...]:
    """Hidden layer widths: 1 to 4 integers in 1..1024."""
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= 4:
        raise TaskError(f"{key} must be a list of 1 to 4 layer widths, got {short_repr(value)}")
    return tuple(check_int(width, f"{key}[{i}]", 1, 1024) for i, width in enumerate(value))


def mapping(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TaskError(f"{key} must be a map, got {short_repr(value)}")
    return cast(Mapping[str, Any], value)


def required(cfg: Mapping[str, Any], name: str, prefix: str) -> Any:
    if name not in cfg:
        raise TaskError(f"{prefix}.{name} is missing")
    return cfg[name]


#: How deep and how big a plain-data map from the wire may be (plug-in configs, env kwargs).
_PLAIN_MAX_DEPTH: Final = 4
_PLAIN_MAX_ITEMS: Final = 256


def check_plain(value: Any, key: str, depth: int = 0) -> Any:
    """Plain data only (str keys; str, int, float, bool, None, lists and maps of those), bounded.

    Plug-in configs and env keyword arguments travel as such maps: the plug-in's own
    config class then checks the keys and values it knows.
    """
    if depth > _PLAIN_MAX_DEPTH:
        raise TaskError(f"{key} is nested more than {_PLAIN_MAX_DEPTH} levels deep")
    if value is None or isinstance(value, bool | str):
        return value
    if is_int(value):
        return int(value)
    if isinstance(value, float | np.floating):
        if not math.isfinite(float(value)):
            raise TaskError(f"{key} must be finite, got {short_repr(value)}")
        return float(value)
    if isinstance(value, list | tuple):
        if len(value) > _PLAIN_MAX_ITEMS:
            raise TaskError(f"{key} has more than {_PLAIN_MAX_ITEMS} items")
        return [check_plain(v, f"{key}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        if len(value) > _PLAIN_MAX_ITEMS:
            raise TaskError(f"{key} has more than {_PLAIN_MAX_ITEMS} keys")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TaskError(f"{key} keys must be strings, got {short_repr(k)}")
            out[k] = check_plain(v, f"{key}.{k}", depth + 1)
        return out
    raise TaskError(f"{key} must be plain data, got {type(value).__name__}")


def check_settings(value: Any, key: str) -> dict[str, float]:
    """``collect_setting``: a map of names to finite numbers (an exploration rate...)."""
    cfg = mapping(value, key)
    if len(cfg) > 64:
        raise TaskError(f"{key} has more than 64 entries")
    out: dict[str, float] = {}
    for name, number in cfg.items():
        if not isinstance(name, str):
            raise TaskError(f"{key} keys must be strings, got {short_repr(name)}")
        out[name] = check_float(number, f"{key}.{name}", -1e12, 1e12)
    return out
