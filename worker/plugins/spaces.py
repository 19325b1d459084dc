"""Observation and action spaces as plain data: what crosses the wire, and what warren supports.

A learner builds its model from the spaces alone, never from an env it would have to
make (the env may not even be installed where the learner runs), so the spaces travel:
in the job, in every collect task, and as a digest in every policy file. The encoding is
a msgpack-able map per space (``docs/protocol.md`` section 7)::

    {"kind": "Box", "shape": [84, 84, 4], "dtype": "uint8", "low": 0, "high": 255}
    {"kind": "Discrete", "n": 2, "start": 0}
    {"kind": "MultiDiscrete", "nvec": [3, 4], "start": [0, 0]}
    {"kind": "MultiBinary", "shape": [5]}
    {"kind": "Dict", "spaces": {"image": {...}, "direction": {...}}}

``low`` and ``high`` of a ``Box`` are one number where every element has the same bound
(image spaces), else an array (codec extension). Infinite bounds are the strings
``"inf"``/``"-inf"`` inside a list when they are not uniform (msgpack floats carry them
too, but JSON does not). The digest is a hash of the canonical encoding: equal spaces,
equal digests, whichever process computed them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import gymnasium as gym
import numpy as np

from messaging import codec
from worker.errors import TaskError, short_repr

#: Space kinds warren's chunks, replay buffers and built-in models know.
LEAF_KINDS: Final = ("Box", "Discrete", "MultiDiscrete", "MultiBinary")
#: Most elements one observation or action may have (a 4 x 256 x 256 x 3 image is 786k).
MAX_ELEMENTS: Final = 4 * 1024 * 1024
#: Numeric dtypes a ``Box`` may have.
BOX_DTYPES: Final = frozenset(
    {"uint8", "int8", "uint16", "int16", "uint32", "int32", "int64", "float16", "float32", "float64", "bool"}
)


class UnsupportedSpace(TaskError):
    """A space warren cannot carry (``Text``, ``Graph``, nested ``Dict``...)."""


@dataclass(frozen=True)
class Spaces:
    """An env's observation and action spaces, with their wire encoding and digest."""

    observation: gym.Space[Any]
    action: gym.Space[Any]

    def __post_init__(self) -> None:
        check_observation_space(self.observation)
        check_action_space(self.action)

    def to_wire(self) -> dict[str, Any]:
        return {"observation": encode_space(self.observation), "action": encode_space(self.action)}

    @classmethod
    def from_wire(cls, wire: Any) -> Spaces:
        """Raises: TaskError: the map is not two encoded spaces of kinds warren supports."""
        if not isinstance(wire, Mapping) or set(wire) != {"observation", "action"}:
            raise TaskError(f"spaces must be a map with 'observation' and 'action', got {short_repr(wire)}")
        observation = decode_space(wire["observation"], "spaces.observation")
        return cls(observation, decode_space(wire["action"], "spaces.action"))

    @property
    def digest(self) -> str:
        """16 hex digits of SHA-256 over the canonical encoding (msgpack, sorted keys)."""
        return spaces_digest(self.to_wire())

    def describe(self) -> str:
        return f"observations {describe_space(self.observation)}, actions {describe_space(self.action)}"


def spaces_digest(wire: Mapping[str, Any]) -> str:
    """The digest of encoded spaces (see :attr:`Spaces.digest`)."""
    body = codec.encode(_canonical(wire))
    return hashlib.sha256(body).hexdigest()[:16]


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _canonical(value[key]) for key in sorted(value)}
    if isinstance(value, np.ndarray):
        return {"dtype": value.dtype.str, "shape": list(value.shape), "data": value.tobytes()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


# -- what warren supports ------------------------------------------------------------


def check_observation_space(space: Any) -> None:
    """Leaf spaces, or a one-level ``Dict`` of them.

    Raises:
        UnsupportedSpace: anything else, saying what.
    """
    if isinstance(space, gym.spaces.Dict):
        if not space.spaces:
            raise UnsupportedSpace("an empty Dict observation space carries nothing")
        for key, sub in space.spaces.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise UnsupportedSpace(f"Dict observation keys must be identifiers, got {key!r}")
            if isinstance(sub, gym.spaces.Dict):
                raise UnsupportedSpace(f"nested Dict observation spaces are not supported (key {key!r})")
            _check_leaf(sub, f"observation[{key!r}]")
        return
    _check_leaf(space, "observation")


def check_action_space(space: Any) -> None:
    """``Discrete``, ``MultiDiscrete``, ``MultiBinary``, or a flat ``Box``.

    Raises:
        UnsupportedSpace: anything else (``Dict`` or ``Tuple`` actions, image-shaped ``Box``).
    """
    _check_leaf(space, "action")
    if isinstance(space, gym.spaces.Box) and len(space.shape) != 1:
        raise UnsupportedSpace(f"Box actions must be flat (1-D), got shape {space.shape}")
    if isinstance(space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary) and len(space.shape) != 1:
        raise UnsupportedSpace(f"{type(space).__name__} actions must be flat (1-D), got shape {space.shape}")


def _check_leaf(space: Any, what: str) -> None:
    kind = type(space).__name__
    if not isinstance(space, gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
        raise UnsupportedSpace(f"{what} space {space} ({kind}) is not supported; supported: {', '.join(LEAF_KINDS)}")
    if isinstance(space, gym.spaces.Box) and space.dtype.name not in BOX_DTYPES:
        raise UnsupportedSpace(f"{what} Box dtype {space.dtype} is not supported")
    size = math.prod(space.shape) if space.shape else 1
    if size > MAX_ELEMENTS:
        raise UnsupportedSpace(f"{what} space has {size} elements, over the limit of {MAX_ELEMENTS}")


# -- encoding ------------------------------------------------------------------------


def encode_space(space: gym.Space[Any]) -> dict[str, Any]:
    """The wire map of a supported space (see the module docstring)."""
    if isinstance(space, gym.spaces.Dict):
        return {"kind": "Dict", "spaces": {key: encode_space(sub) for key, sub in space.spaces.items()}}
    if isinstance(space, gym.spaces.Box):
        return {
            "kind": "Box",
            "shape": list(space.shape),
            "dtype": space.dtype.name,
            "low": _bound(space.low),
            "high": _bound(space.high),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"kind": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"kind": "MultiDiscrete", "nvec": space.nvec.astype(np.int64).tolist(), "start": space.start.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"kind": "MultiBinary", "shape": list(space.shape)}
    raise UnsupportedSpace(f"cannot encode space {space}")


def _bound(values: np.ndarray) -> Any:
    flat = values.reshape(-1)
    if flat.size and bool((flat == flat[0]).all()):
        return _scalar(flat[0])
    return [_scalar(v) for v in flat]


def _scalar(value: Any) -> Any:
    number = value.item()
    if isinstance(number, float) and math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return number


def decode_space(wire: Any, where: str = "space") -> gym.Space[Any]:
    """A gymnasium space from its wire map.

    Raises:
        TaskError: an unknown kind, a missing or malformed key (the message names it).
    """
    if not isinstance(wire, Mapping):
        raise TaskError(f"{where} must be a map, got {short_repr(wire)}")
    kind = wire.get("kind")
    try:
        if kind == "Dict":
            subs = wire.get("spaces")
            if not isinstance(subs, Mapping) or not subs:
                raise TaskError(f"{where}.spaces must be a non-empty map")
            if any(isinstance(s, Mapping) and s.get("kind") == "Dict" for s in subs.values()):
                raise UnsupportedSpace(f"{where}: nested Dict spaces are not supported")
            return gym.spaces.Dict({str(k): decode_space(v, f"{where}.{k}") for k, v in subs.items()})
        if kind == "Box":
            shape = _shape(wire.get("shape"), f"{where}.shape")
            dtype = wire.get("dtype")
            if dtype not in BOX_DTYPES:
                raise TaskError(f"{where}.dtype must be one of {sorted(BOX_DTYPES)}, got {short_repr(dtype)}")
            low, high = (_bound_array(wire.get(k), shape, dtype, f"{where}.{k}") for k in ("low", "high"))
            return gym.spaces.Box(low=low, high=high, shape=shape, dtype=np.dtype(dtype))
        if kind == "Discrete":
            n, start = _int(wire.get("n"), f"{where}.n", 1), _int(wire.get("start", 0), f"{where}.start", None)
            return gym.spaces.Discrete(n, start=start)
        if kind == "MultiDiscrete":
            nvec = _ints(wire.get("nvec"), f"{where}.nvec", 1)
            starts = _ints(wire.get("start", [0] * len(nvec)), f"{where}.start", None)
            if len(starts) != len(nvec):
                raise TaskError(f"{where}.start must have as many entries as nvec")
            return gym.spaces.MultiDiscrete(np.array(nvec, dtype=np.int64), start=np.array(starts, dtype=np.int64))
        if kind == "MultiBinary":
            return gym.spaces.MultiBinary(list(_shape(wire.get("shape"), f"{where}.shape")))
    except (TypeError, ValueError, OverflowError) as exc:
        raise TaskError(f"{where} is not a valid {kind} space: {exc}") from None
    raise TaskError(f"{where}.kind must be one of {['Dict', *LEAF_KINDS]}, got {short_repr(kind)}")


def _shape(value: Any, where: str) -> tuple[int, ...]:
    dims = _ints(value, where, 1)
    if math.prod(dims) > MAX_ELEMENTS:
        raise UnsupportedSpace(f"{where} {dims} has more than {MAX_ELEMENTS} elements")
    return tuple(dims)


def _int(value: Any, where: str, low: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        raise TaskError(f"{where} must be an integer{'' if low is None else f' >= {low}'}, got {short_repr(value)}")
    return value


def _ints(value: Any, where: str, low: int | None) -> list[int]:
    if not isinstance(value, list | tuple) or len(value) > 64:
        raise TaskError(f"{where} must be a list of at most 64 integers, got {short_repr(value)}")
    return [_int(v, where, low) for v in value]


def _bound_array(value: Any, shape: tuple[int, ...], dtype: str, where: str) -> np.ndarray:
    def number(v: Any) -> float:
        if v in ("inf", "-inf"):
            return float(v)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise TaskError(f"{where} must hold numbers, got {short_repr(v)}")
        return float(v)

    if isinstance(value, list | tuple):
        if len(value) != math.prod(shape):
            raise TaskError(f"{where} has {len(value)} values for shape {list(shape)}")
        flat = np.array([number(v) for v in value], dtype=np.float64)
        array = flat.reshape(shape)
    else:
        array = np.full(shape, number(value), dtype=np.float64)
    if np.dtype(dtype).kind in "iub":
        info = np.iinfo(np.int64) if dtype == "bool" else np.iinfo(np.dtype(dtype))
        array = np.clip(array, info.min, info.max)
    return array.astype(np.dtype(dtype))


# -- sizes, for chunks and models ----------------------------------------------------


def describe_space(space: gym.Space[Any]) -> str:
    """A short human description: ``Box(84, 84, 4) uint8``, ``Discrete(6)``, ``Dict(image, direction)``."""
    if isinstance(space, gym.spaces.Dict):
        return "Dict(" + ", ".join(f"{k}: {describe_space(v)}" for k, v in space.spaces.items()) + ")"
    if isinstance(space, gym.spaces.Box):
        return f"Box{tuple(space.shape)} {space.dtype.name}"
    if isinstance(space, gym.spaces.Discrete):
        return f"Discrete({int(space.n)})"
    if isinstance(space, gym.spaces.MultiDiscrete):
        return f"MultiDiscrete({space.nvec.tolist()})"
    return f"{type(space).__name__}{tuple(space.shape or ())}"


def leaf_layout(space: gym.Space[Any]) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """Per-env shape and dtype of one sample of a leaf space, as chunks store it.

    ``Discrete`` is a scalar int64 (the index, ``start`` included), ``MultiDiscrete`` an
    int64 vector, ``MultiBinary`` int8, ``Box`` its own shape and dtype.
    """
    if isinstance(space, gym.spaces.Box):
        return tuple(space.shape), space.dtype
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tuple(space.shape), np.dtype(np.int64)
    if isinstance(space, gym.spaces.MultiBinary):
        return tuple(space.shape), np.dtype(np.int8)
    raise UnsupportedSpace(f"no layout for {space}")


def observation_keys(space: gym.Space[Any]) -> list[str] | None:
    """The keys of a ``Dict`` observation space, or ``None`` for a leaf space."""
    return list(space.spaces) if isinstance(space, gym.spaces.Dict) else None
