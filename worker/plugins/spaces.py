"""Observation and action spaces as plain data: what crosses the wire, and what warren supports.

A learner builds its model from the spaces alone, never from an env it would have to
make (the env may not even be installed where the learner runs), so the spaces travel:
in the job, in every collect task, in the start reply, and as a digest in every policy
file. The encoding is a msgpack-able map per space (``docs/protocol.md`` section 7)::

    {"kind": "Box", "shape": [4, 84, 84], "dtype": "uint8", "low": 0, "high": 255}
    {"kind": "Discrete", "n": 2, "start": 0}
    {"kind": "MultiDiscrete", "nvec": [3, 4], "start": [0, 0]}
    {"kind": "MultiBinary", "shape": [5]}
    {"kind": "Dict", "spaces": {"image": {...}, "direction": {...}}}

Several writings of one space are accepted (a uint8 bound as ``255`` or ``255.0``, an
infinity as ``"inf"`` or a msgpack float, a float32 bound as ``0.42`` or as the float32's
exact value, ``start`` left out, a uniform bound as one number or as a list). Everything
that arrives is decoded to a gymnasium space, and only its **canonical form**, what
:func:`encode_space` writes, is digested: a Box bound is written in the space's own dtype
(an integer for integer dtypes, a boolean for ``bool``, the exact float for float dtypes,
``"inf"``/``"-inf"`` for infinities, ``0.0`` for a zero of either sign), one number when
every element has the same bound, else a list in C order; ``start`` is always present.
So every accepted writing of the same spaces has the same digest, and a third party that
writes the canonical form and hashes it as the doc says reproduces it.
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
#: gymnasium's other space kinds: a wire space of one of these is a space warren does not
#: carry (``unsupported env``), not a malformed one (``bad collector_cfg``).
OTHER_GYMNASIUM_KINDS: Final = frozenset({"Text", "Tuple", "Sequence", "Graph", "OneOf"})
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
        """16 hex digits of SHA-256 over the canonical form (:meth:`to_wire`) as msgpack, map keys sorted."""
        return _digest_of_canonical(self.to_wire())

    def describe(self) -> str:
        return f"observations {describe_space(self.observation)}, actions {describe_space(self.action)}"


def spaces_digest(wire: Mapping[str, Any]) -> str:
    """The digest of spaces in any accepted writing: that of their canonical form (see :attr:`Spaces.digest`).

    Raises:
        TaskError: the map is not two encoded spaces of kinds warren supports.
    """
    return Spaces.from_wire(wire).digest


def _digest_of_canonical(canonical: Mapping[str, Any]) -> str:
    body = codec.encode(_sorted_keys(canonical))
    return hashlib.sha256(body).hexdigest()[:16]


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [_sorted_keys(v) for v in value]
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
    # The bound in the space's own dtype: a Python int, bool or float (a float32 widened
    # exactly to a double); infinities as text (JSON has none) and zero without a sign.
    number = value.item()
    if isinstance(number, float):
        if math.isinf(number):
            return "inf" if number > 0 else "-inf"
        if number == 0.0:
            return 0.0
    return number


def decode_space(wire: Any, where: str = "space") -> gym.Space[Any]:
    """A gymnasium space from its wire map, in any writing warren accepts (see the module docstring).

    Raises:
        UnsupportedSpace: a space warren does not carry (a gymnasium kind such as ``Text``,
            a nested ``Dict``, too many elements).
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
    if isinstance(kind, str) and kind in OTHER_GYMNASIUM_KINDS:
        raise UnsupportedSpace(
            f"{where}.kind: {kind} spaces are not supported; supported: Dict, {', '.join(LEAF_KINDS)}"
        )
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
    """A Box bound from its wire value(s), exactly in ``dtype``; see the module docstring.

    Integer dtypes take whole numbers in the dtype's range (``"inf"``/``"-inf"``: its largest
    and smallest value), ``bool`` takes booleans or 0 and 1, float dtypes take any number,
    rounded to the dtype's nearest value, that does not overflow it, and infinities. No NaN.
    """
    np_dtype = np.dtype(dtype)
    values = value if isinstance(value, list | tuple) else [value]
    if isinstance(value, list | tuple) and len(value) != math.prod(shape):
        raise TaskError(f"{where} has {len(value)} values for shape {list(shape)}")
    if np_dtype.kind == "f":
        wide = np.array([_float_bound(v, where) for v in values], dtype=np.float64)
        with np.errstate(over="ignore"):
            array = wide.astype(np_dtype)  # each to the dtype's nearest value
        overflow = np.isfinite(wide) & ~np.isfinite(array)
        if overflow.any():
            raise TaskError(f"{where}: {float(wide[overflow][0])!r} is out of the range of {dtype}")
    elif np_dtype.kind == "b":
        array = np.array([_bool_bound(v, where) for v in values], dtype=np_dtype)
    else:
        info = np.iinfo(np_dtype)
        low, high = int(info.min), int(info.max)
        array = np.array([_int_bound(v, low, high, dtype, where) for v in values], dtype=np_dtype)
    return array.reshape(shape) if isinstance(value, list | tuple) else np.full(shape, array[0], dtype=np_dtype)


def _infinity(v: Any) -> float | None:
    """``+inf``/``-inf`` for an infinity written either way (text, or a msgpack float), else None."""
    if v in ("inf", "-inf"):
        return float(v)
    if isinstance(v, float) and math.isinf(v):
        return v
    return None


def _plain_number(v: Any, where: str) -> int | float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TaskError(f'{where} must hold numbers (or "inf", "-inf"), got {short_repr(v)}')
    if isinstance(v, float) and math.isnan(v):
        raise TaskError(f"{where} must not be NaN")
    return v


def _float_bound(v: Any, where: str) -> float:
    infinity = _infinity(v)
    return infinity if infinity is not None else float(_plain_number(v, where))


def _bool_bound(v: Any, where: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float) and v in (0, 1):
        return bool(v)
    raise TaskError(f"{where} of a bool Box must hold booleans (or 0 and 1), got {short_repr(v)}")


def _int_bound(v: Any, low: int, high: int, dtype: str, where: str) -> int:
    infinity = _infinity(v)
    if infinity is not None:
        return high if infinity > 0 else low
    number = _plain_number(v, where)
    if isinstance(number, float):
        if not number.is_integer():
            raise TaskError(f"{where} of a {dtype} Box must hold whole numbers, got {short_repr(v)}")
        number = int(number)
    if not low <= number <= high:
        raise TaskError(f"{where}: {short_repr(v)} is out of the range of {dtype} ({low}..{high})")
    return number


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
