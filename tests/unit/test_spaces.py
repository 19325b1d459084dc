"""Spaces as wire data (worker/plugins/spaces.py): every supported kind round trips, stable digests, refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import OrderedDict
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messaging import decode, encode
from worker.errors import TaskError
from worker.plugins import Spaces, UnsupportedSpace
from worker.plugins.spaces import (
    MAX_ELEMENTS,
    decode_space,
    describe_space,
    encode_space,
    leaf_layout,
    spaces_digest,
)

INF = np.inf
#: The digest of CartPole-v1's spaces. Policy files and checkpoints carry it: a change to the
#: canonical encoding makes every earlier file unreadable, so it must be deliberate.
CARTPOLE_DIGEST = "24c0b0e32a50e06f"
#: The canonical form of ale-py's Pong (4 stacked 84 x 84 grey frames, 6 actions) and its digest.
PONG: dict[str, dict[str, Any]] = {
    "observation": {"kind": "Box", "shape": [4, 84, 84], "dtype": "uint8", "low": 0, "high": 255},
    "action": {"kind": "Discrete", "n": 6, "start": 0},
}
PONG_DIGEST = "424f47d6eb7b754b"
#: CartPole-v1's, with its float32 bounds widened exactly to doubles.
CARTPOLE: dict[str, dict[str, Any]] = {
    "observation": {
        "kind": "Box",
        "shape": [4],
        "dtype": "float32",
        "low": [-4.800000190734863, "-inf", -0.41887903213500977, "-inf"],
        "high": [4.800000190734863, "inf", 0.41887903213500977, "inf"],
    },
    "action": {"kind": "Discrete", "n": 2, "start": 0},
}

OBSERVATIONS: dict[str, gym.Space[Any]] = {
    "flat float Box, infinite bounds": gym.spaces.Box(-INF, INF, (4,), np.float32),
    "flat float Box, per-element bounds, some infinite": gym.spaces.Box(
        np.array([-4.8, -INF, -0.42, -1.5], np.float32), np.array([4.8, INF, 0.42, 2.0], np.float32)
    ),
    "uint8 image": gym.spaces.Box(0, 255, (84, 84, 3), np.uint8),
    "stacked uint8 frames": gym.spaces.Box(0, 255, (4, 64, 64), np.uint8),
    "float64 matrix": gym.spaces.Box(-1.0, 1.0, (3, 2), np.float64),
    "int64 Box": gym.spaces.Box(-10, 10, (2,), np.int64),
    "int8 Box with mixed bounds": gym.spaces.Box(np.array([-3, 0], np.int8), np.array([3, 7], np.int8)),
    "Discrete": gym.spaces.Discrete(5),
    "Discrete with a start": gym.spaces.Discrete(3, start=-1),
    "MultiDiscrete": gym.spaces.MultiDiscrete([3, 4, 2]),
    "MultiDiscrete with starts": gym.spaces.MultiDiscrete([3, 4], start=[1, -2]),
    "MultiBinary": gym.spaces.MultiBinary(5),
    "2-D MultiBinary": gym.spaces.MultiBinary([2, 3]),
    "Dict of every leaf kind": gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
            "direction": gym.spaces.Discrete(4),
            "inventory": gym.spaces.MultiDiscrete([5, 5]),
            "flags": gym.spaces.MultiBinary(3),
            "position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        }
    ),
}
ACTIONS: dict[str, gym.Space[Any]] = {
    "Discrete": gym.spaces.Discrete(6),
    "Discrete with a start": gym.spaces.Discrete(2, start=1),
    "MultiDiscrete": gym.spaces.MultiDiscrete([3, 3]),
    "MultiBinary": gym.spaces.MultiBinary(4),
    "continuous Box": gym.spaces.Box(-2.0, 2.0, (1,), np.float32),
    "continuous Box, per-element bounds": gym.spaces.Box(
        np.array([-1.0, 0.0, 0.0], np.float32), np.array([1.0, 1.0, 1.0], np.float32)
    ),
}


def same_space(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, gym.spaces.Dict):
        return list(a.spaces) == list(b.spaces) and all(same_space(a[k], b[k]) for k in a.spaces)
    if isinstance(a, gym.spaces.Box):
        return (
            a.shape == b.shape
            and a.dtype == b.dtype
            and np.array_equal(a.low, b.low)
            and np.array_equal(a.high, b.high)
            and a.low.dtype == b.low.dtype
        )
    if isinstance(a, gym.spaces.MultiBinary):  # (gymnasium tells MultiBinary(5) from MultiBinary([5]))
        return bool(a.shape == b.shape)
    return bool(a == b)


@pytest.mark.parametrize("name", list(OBSERVATIONS))
def test_every_supported_observation_space_round_trips_over_msgpack_and_json(name: str) -> None:
    # Given an env's spaces with this observation space
    spaces = Spaces(OBSERVATIONS[name], gym.spaces.Discrete(2))
    wire = spaces.to_wire()
    # When they cross the wire (msgpack, tasks) and land in a job.json (JSON)
    for carried in (decode(encode(wire)), json.loads(json.dumps(wire))):
        back = Spaces.from_wire(carried)
        # Then the same spaces come back, bounds, dtype and shape, with the same digest
        assert same_space(back.observation, spaces.observation)
        assert same_space(back.action, spaces.action)
        assert back.digest == spaces.digest


@pytest.mark.parametrize("name", list(ACTIONS))
def test_every_supported_action_space_round_trips(name: str) -> None:
    spaces = Spaces(gym.spaces.Box(-1.0, 1.0, (3,), np.float32), ACTIONS[name])
    back = Spaces.from_wire(decode(encode(spaces.to_wire())))
    assert same_space(back.action, spaces.action)
    assert back.digest == spaces.digest


def test_uniform_bounds_travel_as_one_number_and_others_as_lists() -> None:
    # (an 84x84x3 image would otherwise carry 2 x 21,168 numbers in every task)
    image = encode_space(OBSERVATIONS["uint8 image"])
    assert image == {"kind": "Box", "shape": [84, 84, 3], "dtype": "uint8", "low": 0, "high": 255}
    cartpole = encode_space(OBSERVATIONS["flat float Box, per-element bounds, some infinite"])
    assert cartpole["low"][1] == "-inf" and cartpole["high"][1] == "inf" and len(cartpole["low"]) == 4
    assert encode_space(OBSERVATIONS["flat float Box, infinite bounds"])["low"] == "-inf"


def _pong(**observation: Any) -> dict[str, Any]:
    return {"observation": {**PONG["observation"], **observation}, "action": PONG["action"]}


def _cartpole(low: list[Any], high: list[Any]) -> dict[str, Any]:
    return {"observation": {**CARTPOLE["observation"], "low": low, "high": high}, "action": CARTPOLE["action"]}


#: Writings of one set of spaces that a worker accepts, each with its canonical form and that form's digest.
WRITINGS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "Pong, canonical": (PONG, PONG, PONG_DIGEST),
    "Pong, uint8 bounds as floats": (_pong(low=0.0, high=255.0), PONG, PONG_DIGEST),
    "Pong, Discrete without start": (
        {"observation": PONG["observation"], "action": {"kind": "Discrete", "n": 6}},
        PONG,
        PONG_DIGEST,
    ),
    "Pong, a uniform bound as a list": (_pong(high=[255] * (4 * 84 * 84)), PONG, PONG_DIGEST),
    "Pong, the high bound as +inf (the dtype's largest value)": (_pong(high="inf"), PONG, PONG_DIGEST),
    "Pong, keys in another order, and a key warren does not read": (
        {"action": {"start": 0, "n": 6, "kind": "Discrete"}, "observation": {**PONG["observation"], "note": "x"}},
        PONG,
        PONG_DIGEST,
    ),
    "CartPole, canonical": (CARTPOLE, CARTPOLE, CARTPOLE_DIGEST),
    "CartPole, float32 bounds as their shortest decimals": (
        _cartpole([-4.8, "-inf", -0.41887903, "-inf"], [4.8, "inf", 0.41887903, "inf"]),
        CARTPOLE,
        CARTPOLE_DIGEST,
    ),
    "CartPole, infinities as msgpack floats": (
        _cartpole([-4.800000190734863, -INF, -0.41887903213500977, -INF], [4.800000190734863, INF, 0.41887903, INF]),
        CARTPOLE,
        CARTPOLE_DIGEST,
    ),
    "a float Box, bounds as integers and a zero with a sign": (
        {"observation": {"kind": "Box", "shape": [2], "dtype": "float32", "low": [-0.0, -1], "high": 1},
         "action": {"kind": "MultiDiscrete", "nvec": [3, 4]}},
        {"observation": {"kind": "Box", "shape": [2], "dtype": "float32", "low": [0.0, -1.0], "high": 1.0},
         "action": {"kind": "MultiDiscrete", "nvec": [3, 4], "start": [0, 0]}},
        "",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(WRITINGS))
def test_every_accepted_writing_of_the_same_spaces_has_the_digest_of_their_canonical_form(name: str) -> None:
    writing, canonical, digest = WRITINGS[name]
    # Given spaces as a third party wrote them, carried over msgpack
    carried = decode(encode(writing))
    # When the worker decodes them
    spaces = Spaces.from_wire(carried)
    # Then it writes them in the one canonical form, and every digest is that form's
    assert spaces.to_wire() == canonical
    assert spaces_digest(carried) == spaces.digest == spaces_digest(canonical) == Spaces.from_wire(canonical).digest
    if digest:
        assert spaces.digest == digest
    # and the canonical form is its own canonical form, through JSON too (a job.json)
    assert Spaces.from_wire(json.loads(json.dumps(canonical))).to_wire() == canonical


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(0, 1, (3,), np.dtype(np.bool_)),  # type: ignore[arg-type]
        gym.spaces.Box(np.iinfo(np.int64).min, np.iinfo(np.int64).max, (2,), np.int64),
        gym.spaces.Box(np.array([-(2**62) - 1, 0]), np.array([2**62 + 1, 2**53 + 1]), dtype=np.int64),
        gym.spaces.Box(0, np.iinfo(np.uint32).max, (2,), np.uint32),
        gym.spaces.Box(np.float16(-65504.0), np.float16(0.1), (2,), np.float16),
        gym.spaces.Box(np.finfo(np.float32).min, np.finfo(np.float32).max, (2,), np.float32),
        gym.spaces.Box(np.array([-0.1, 1e-40]), np.array([0.1, 1e300]), dtype=np.float64),
    ],
    ids=["bool", "int64 extremes", "int64 past 2**53", "uint32", "float16", "float32 extremes", "float64"],
)
def test_bounds_of_every_box_dtype_come_back_exactly(space: gym.spaces.Box) -> None:
    # (bounds go through the dtype's own values, not through a double: an int64 bound past
    # 2**53 and a bool bound must come back as they were, or the digest is another one)
    wire = encode_space(space)
    for carried in (decode(encode(wire)), json.loads(json.dumps(wire))):
        back = decode_space(carried)
        assert same_space(back, space)
        assert encode_space(back) == wire


@pytest.mark.parametrize(
    ("bound", "dtype", "message"),
    [
        (0.5, "uint8", "must hold whole numbers"),
        (300, "uint8", r"out of the range of uint8 \(0\.\.255\)"),
        (-1, "uint8", "out of the range of uint8"),
        (2**63, "int64", "out of the range of int64"),
        (1e39, "float32", "out of the range of float32"),
        (float("nan"), "float32", "must not be NaN"),
        (2, "bool", "must hold booleans"),
        ("-inf", "bool", "must hold booleans"),
        ("1.0", "float32", "must hold numbers"),
    ],
)
def test_a_bound_that_is_no_value_of_the_boxs_dtype_is_refused_naming_the_key(
    bound: Any, dtype: str, message: str
) -> None:
    # (one clipped or rounded into the dtype would be another space that digests like a real one)
    wire = {"kind": "Box", "shape": [2], "dtype": dtype, "low": [0, 0], "high": bound}
    with pytest.raises(TaskError, match=f"space\\.high.*{message}"):
        decode_space(wire)


@pytest.mark.parametrize("kind", ["Text", "Tuple", "Sequence", "Graph", "OneOf"])
def test_a_wire_space_of_a_gymnasium_kind_warren_does_not_carry_is_an_unsupported_space(kind: str) -> None:
    # (a space that exists but that warren cannot carry: "unsupported env", not a malformed task)
    with pytest.raises(UnsupportedSpace, match=f"{kind} spaces are not supported"):
        Spaces.from_wire({"observation": {"kind": kind, "max_length": 3}, "action": PONG["action"]})


def test_the_digest_depends_on_every_part_of_the_spaces() -> None:
    base = Spaces(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2))
    variants = [
        Spaces(gym.spaces.Box(-1.0, 1.0, (5,), np.float32), gym.spaces.Discrete(2)),  # shape
        Spaces(gym.spaces.Box(-1.0, 1.0, (4,), np.float64), gym.spaces.Discrete(2)),  # dtype
        Spaces(gym.spaces.Box(-1.0, 2.0, (4,), np.float32), gym.spaces.Discrete(2)),  # bounds
        Spaces(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(3)),  # actions
        Spaces(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2, start=1)),  # start
        Spaces(gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32), gym.spaces.Discrete(2)),  # same size, other shape
    ]
    digests = {base.digest, *(v.digest for v in variants)}
    assert len(digests) == 1 + len(variants)
    assert all(len(d) == 16 and int(d, 16) >= 0 for d in digests)


def test_the_digest_does_not_depend_on_key_order_or_on_which_process_computes_it() -> None:
    # Given CartPole's spaces, here and in a fresh interpreter
    env = gym.make("CartPole-v1")
    here = Spaces(env.observation_space, env.action_space).digest
    env.close()
    code = (
        "import gymnasium as gym; from worker.plugins import Spaces; e = gym.make('CartPole-v1'); "
        "print(Spaces(e.observation_space, e.action_space).digest)"
    )
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    # Then both are the pinned value
    assert here == there.stdout.strip() == CARTPOLE_DIGEST
    # and a wire map whose keys come in another order digests the same
    wire = Spaces(OBSERVATIONS["Dict of every leaf kind"], gym.spaces.Discrete(2)).to_wire()
    shuffled = {
        "action": wire["action"],
        "observation": {"spaces": dict(reversed(list(wire["observation"]["spaces"].items()))), "kind": "Dict"},
    }
    assert Spaces.from_wire(shuffled).digest == Spaces.from_wire(wire).digest


def test_a_dict_space_keeps_one_key_order_wherever_it_is_decoded() -> None:
    # (the model concatenates keys in the space's order: learner and collectors must agree)
    ordered = gym.spaces.Dict(OrderedDict([("b", gym.spaces.Discrete(2)), ("a", gym.spaces.Discrete(3))]))
    back: Any = decode_space(encode_space(ordered))
    carried: Any = decode_space(decode(encode(encode_space(ordered))))
    assert list(back.spaces) == list(carried.spaces) == ["a", "b"]


@pytest.mark.parametrize(
    ("observation", "action", "message"),
    [
        (gym.spaces.Text(8), gym.spaces.Discrete(2), r"observation space Text\(.*\) is not supported; supported: Box"),
        (
            gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Discrete(2)]),
            gym.spaces.Discrete(2),
            "Tuple",
        ),
        (
            gym.spaces.Dict({"outer": gym.spaces.Dict({"inner": gym.spaces.Discrete(2)})}),
            gym.spaces.Discrete(2),
            "nested Dict observation spaces are not supported \\(key 'outer'\\)",
        ),
        (gym.spaces.Dict({"t": gym.spaces.Text(4)}), gym.spaces.Discrete(2), r"observation\['t'\] space Text"),
        (gym.spaces.Dict({}), gym.spaces.Discrete(2), "an empty Dict observation space carries nothing"),
        (gym.spaces.Dict({"not an id": gym.spaces.Discrete(2)}), gym.spaces.Discrete(2), "must be identifiers"),
        (
            gym.spaces.Box(0, 1, (4,), np.float32),
            gym.spaces.Box(-1, 1, (2, 2), np.float32),
            r"Box actions must be flat",
        ),
        (gym.spaces.Box(0, 1, (4,), np.float32), gym.spaces.MultiBinary([2, 2]), "MultiBinary actions must be flat"),
        (
            gym.spaces.Box(0, 1, (4,), np.float32),
            gym.spaces.Dict({"a": gym.spaces.Discrete(2)}),
            r"action space Dict\(.*\) is not supported",
        ),
        (gym.spaces.Box(0, 1, (4,), np.float32), gym.spaces.Text(3), "action space Text"),
        (gym.spaces.Box(0, 255, (MAX_ELEMENTS + 1,), np.uint8), gym.spaces.Discrete(2), "over the limit"),
    ],
)
def test_spaces_warren_cannot_carry_are_refused_saying_why(
    observation: gym.Space[Any], action: gym.Space[Any], message: str
) -> None:
    with pytest.raises(UnsupportedSpace, match=message):
        Spaces(observation, action)


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        ({"kind": "Banana", "max_length": 3}, r"space\.kind must be one of \['Dict', 'Box'"),
        ({"shape": [2]}, "space.kind must be one of"),
        ([1, 2], "space must be a map"),
        ({"kind": "Box", "shape": [2], "dtype": "complex64", "low": 0, "high": 1}, "space.dtype must be one of"),
        ({"kind": "Box", "shape": [2], "dtype": "object", "low": 0, "high": 1}, "space.dtype must be one of"),
        ({"kind": "Box", "shape": "2", "dtype": "float32", "low": 0, "high": 1}, "space.shape must be a list"),
        (
            {"kind": "Box", "shape": [0], "dtype": "float32", "low": 0, "high": 1},
            r"space\.shape must be an integer >= 1",
        ),
        ({"kind": "Box", "shape": [2], "dtype": "float32", "low": [0, 1, 2], "high": 1}, "space.low has 3 values"),
        ({"kind": "Box", "shape": [2], "dtype": "float32", "low": "zero", "high": 1}, "space.low must hold numbers"),
        ({"kind": "Box", "shape": [2], "dtype": "float32", "low": 0}, "space.high must hold numbers"),
        ({"kind": "Box", "shape": [10**4, 10**4], "dtype": "uint8", "low": 0, "high": 1}, "more than"),
        ({"kind": "Discrete", "n": 0}, r"space.n must be an integer >= 1"),
        ({"kind": "Discrete", "n": True}, "space.n must be an integer"),
        ({"kind": "Discrete", "n": 2.0}, "space.n must be an integer"),
        ({"kind": "MultiDiscrete", "nvec": [3, 0]}, "space.nvec must be an integer >= 1"),
        ({"kind": "MultiDiscrete", "nvec": [3, 3], "start": [0]}, "as many entries as nvec"),
        ({"kind": "MultiDiscrete", "nvec": list(range(1, 100))}, "at most 64 integers"),
        ({"kind": "MultiBinary"}, "space.shape must be a list"),
        ({"kind": "Dict", "spaces": {}}, "space.spaces must be a non-empty map"),
        ({"kind": "Dict", "spaces": {"a": {"kind": "Dict", "spaces": {"b": {"kind": "Discrete", "n": 2}}}}}, "nested"),
        ({"kind": "Dict", "spaces": {"a": {"kind": "Discrete", "n": -1}}}, r"space\.a\.n must be an integer"),
    ],
)
def test_malformed_wire_spaces_are_task_errors_naming_the_key(wire: Any, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        decode_space(wire)


@pytest.mark.parametrize(
    "wire",
    [None, [], {"observation": {"kind": "Discrete", "n": 2}}, {"observation": 1, "action": 2, "extra": 3}],
)
def test_spaces_from_the_wire_need_exactly_an_observation_and_an_action(wire: Any) -> None:
    with pytest.raises(TaskError, match="spaces must be a map with 'observation' and 'action'"):
        Spaces.from_wire(wire)


def test_decoded_spaces_are_checked_like_an_envs() -> None:
    # (a wire map may encode a space that exists but that warren does not carry: 2-D Box actions)
    wire = {
        "observation": {"kind": "Discrete", "n": 3},
        "action": {"kind": "Box", "shape": [2, 2], "dtype": "float32", "low": -1, "high": 1},
    }
    with pytest.raises(UnsupportedSpace, match="Box actions must be flat"):
        Spaces.from_wire(wire)


_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
_garbage = st.recursive(
    _scalars | st.sampled_from(["Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict", "inf", "-inf", "uint8"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["kind", "shape", "dtype", "low", "high", "n", "start", "nvec", "spaces", "a"]), inner
        )
    ),
    max_leaves=16,
)


@settings(max_examples=300, deadline=None)
@given(wire=_garbage)
def test_garbage_spaces_only_ever_raise_task_errors(wire: Any) -> None:
    try:
        space = decode_space(wire)
    except TaskError as exc:
        assert exc.message
    else:
        assert same_space(decode_space(encode_space(space)), space)


def test_chunks_store_each_leaf_in_the_documented_shape_and_dtype() -> None:
    assert leaf_layout(gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)) == ((84, 84, 3), np.dtype(np.uint8))
    assert leaf_layout(gym.spaces.Discrete(3, start=5)) == ((), np.dtype(np.int64))
    assert leaf_layout(gym.spaces.MultiDiscrete([2, 3])) == ((2,), np.dtype(np.int64))
    assert leaf_layout(gym.spaces.MultiBinary(4)) == ((4,), np.dtype(np.int8))


def test_descriptions_name_kind_shape_and_dtype() -> None:
    assert describe_space(OBSERVATIONS["uint8 image"]) == "Box(84, 84, 3) uint8"
    assert describe_space(gym.spaces.Discrete(6)) == "Discrete(6)"
    assert describe_space(gym.spaces.MultiDiscrete([3, 4])) == "MultiDiscrete([3, 4])"
    assert describe_space(gym.spaces.Dict({"a": gym.spaces.Discrete(2)})) == "Dict(a: Discrete(2))"
    spaces = Spaces(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2))
    assert spaces.describe() == "observations Box(4,) float32, actions Discrete(2)"
