"""Hypothesis strategies for the bad-input fuzzer (tests/integration/test_fuzz.py).

Three families:

* :func:`probes`: one request for a collector's task or control queue, as a body plus
  an envelope (reply_to, correlation_id, content_type, schema header). Each body knows
  what a worker must answer when the envelope is clean (``Body.messages`` /
  ``Body.text``); the envelope oracle lives in the test, next to the code that checks it.
* :func:`metadata_garbage`: what a hostile or broken writer could put into a metadata
  queue the coordinator reads, or into the learner's data queue.
* :func:`policy_files`: files a ``dqn`` task may find at its ``policy_update_path``:
  malicious pickles, torch checkpoints (warren's old format), truncated or junk
  safetensors, headers of another format, env or algorithm, NaN weights, another
  network's tensors, FIFOs, symlinks.

No strategy here ever builds a valid start task on purpose: every ``collector_start_task``
has exactly one thing wrong with it, so a worker that accepts one has a bug (except
where ``Body.valid`` says the body is valid by construction).
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from hypothesis import strategies as st

from messaging.codec import decode, encode
from messaging.errors import DecodeError
from worker.protocol import ID_PATTERN, MAX_ENV_NUM, Refusal, TaskName

TASK_NAMES = tuple(name.value for name in TaskName)
ID_RE = ID_PATTERN


def codes(*refusals: Refusal) -> frozenset[str]:
    """The ``result.message`` strings of these refusals."""
    return frozenset(r.value for r in refusals)


#: ``result.message`` values a refused start task may carry (docs/protocol.md section 4).
START_REFUSALS = codes(
    Refusal.BAD_COLLECTOR_CFG,
    Refusal.MISSING_TASK_INFO,
    Refusal.MISSING_COLLECTOR_CFG,
    Refusal.BAD_TASK_ID,
    Refusal.BAD_BUFFER_ID,
    Refusal.UNSAFE_PATH,
    Refusal.WORKER_BUSY,
    Refusal.MISSING_PLUGIN,
    Refusal.UNKNOWN_ENV,
    Refusal.UNSUPPORTED_ENV,
)
#: The body of a refused unknown or malformed task.
NAME_REFUSALS = codes(Refusal.TASK_NAME_ERROR, Refusal.BAD_TASK)
#: A start task whose env is unknown, or one the task's algorithm (DQN) cannot drive.
ENV_REFUSALS = codes(Refusal.UNKNOWN_ENV, Refusal.UNSUPPORTED_ENV)
#: What a data or close task gets when it cannot be served.
DATA_CLOSE_REFUSALS = codes(
    Refusal.WRONG_QUEUE, Refusal.NO_RUNNING_COLLECTOR, Refusal.NO_DATA_YET, Refusal.COLLECTOR_FAILED
)

Target = Literal["tasks", "control"]
Presence = Literal["yes", "none", "empty"]


@dataclass(frozen=True)
class Body:
    """A request body and what the worker must answer when its envelope is clean."""

    category: str
    raw: bytes
    messages: frozenset[str] | None = None
    """Allowed ``error.result.message`` values (None: any, as long as it is a clear refusal)."""
    text: str | None = None
    """A word the error message must contain (usually the offending key)."""
    may_succeed: bool = False
    """``ok: true`` is a right answer too (a data task while a collector happens to run)."""
    valid: bool = False
    """The body is valid (``resource``): ``ok: true`` is the only right answer."""


@dataclass(frozen=True)
class Probe:
    """One request to publish: a body on a queue, in an envelope."""

    body: Body
    target: Target = "tasks"
    reply_to: Presence = "yes"
    correlation: Presence = "yes"
    content_type: str | None = "application/msgpack"
    """Anything but application/msgpack is published with raw pika (BrokerLink always sets it)."""
    schema: int | str | None = None
    """A ``schema`` header replacing warren's 1 (None: keep 1)."""

    @property
    def raw_pika(self) -> bool:
        return self.content_type != "application/msgpack"

    def describe(self) -> str:
        envelope = f"reply_to={self.reply_to} correlation_id={self.correlation} content_type={self.content_type!r}"
        body = f"body[{len(self.body.raw)}]={preview(self.body.raw)}"
        return f"{self.body.category} -> {self.target}: {envelope} schema={self.schema!r} {body}"


def preview(raw: bytes, limit: int = 400) -> str:
    """The decoded body, shortened (or its first bytes if it does not decode)."""
    try:
        text = repr(decode(raw))
    except (DecodeError, RecursionError):
        return repr(raw[:120])
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- building blocks ------------------------------------------------------------------

#: Values of no use as any field: wrong types, extremes, nested junk, arrays (ext types).
JUNK: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([2**64 - 1, -(2**63), 2**63, 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, 5e-324]),
    st.text(max_size=30),
    st.binary(max_size=30),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=4),
    st.dictionaries(st.text(max_size=6), st.integers(min_value=-5, max_value=5), max_size=3),
    st.builds(lambda n: np.arange(n, dtype=np.int64), st.integers(min_value=0, max_value=4)),
    st.builds(lambda x: np.array([x], dtype=np.float32), st.floats(width=32, allow_nan=True)),
)
NON_STR = JUNK.filter(lambda v: not isinstance(v, str))
NON_INT = JUNK.filter(lambda v: isinstance(v, bool) or not isinstance(v, int))
NON_NUMBER = JUNK.filter(lambda v: isinstance(v, bool) or not isinstance(v, int | float))
NON_BOOL = JUNK.filter(lambda v: not isinstance(v, bool))
NON_MAP = JUNK.filter(lambda v: not isinstance(v, dict))


def huge_text(max_chars: int = 20_000) -> st.SearchStrategy[str]:
    """Long strings, cheaply: one character repeated (a few KB of entropy would be slow)."""
    return st.builds(
        lambda ch, n: ch * n, st.characters(codec="utf-8"), st.integers(min_value=201, max_value=max_chars)
    )


def bad_int(lo: int, hi: int) -> st.SearchStrategy[Any]:
    """Anything but an integer in [lo, hi]."""
    return st.one_of(
        NON_INT,
        st.integers(max_value=lo - 1, min_value=-(2**63)),
        st.integers(min_value=hi + 1, max_value=2**64 - 1),
    )


def bad_number(lo: float, hi: float, *, lo_open: bool = False) -> st.SearchStrategy[Any]:
    """Anything but a finite number in [lo, hi] (or (lo, hi])."""

    def valid(x: float) -> bool:
        return (lo < x if lo_open else lo <= x) and x <= hi

    outside = st.one_of(st.floats(max_value=lo), st.floats(min_value=hi)).filter(lambda x: not valid(x))
    return st.one_of(NON_NUMBER, outside, st.sampled_from([float("nan"), float("inf"), -float("inf")]))


def bad_id() -> st.SearchStrategy[Any]:
    """Anything that is not a task/buffer id."""
    return st.one_of(
        NON_STR,
        st.sampled_from(["", "../escape", "/etc/passwd", "a/b", "-x", ".hidden", "a b", "a" * 129, "é", "x\x00y"]),
        st.text(max_size=20).filter(lambda s: ID_RE.match(s) is None),
        huge_text(),
    )


UNSAFE_PATHS = (
    "..",
    "../policy",
    "../../etc/passwd",
    "/etc/passwd",
    "/tmp/policy",
    "a/../../b",
    "x/../../../etc/shadow",
    "sub/policy",
    "./sub/policy",
    "sub/../../policy",
)


def unsafe_path() -> st.SearchStrategy[str]:
    """Policy paths docs/protocol.md says are refused: ``..``, absolute, sub-directories."""
    parts = st.text(alphabet=st.characters(codec="ascii", exclude_characters="/\x00\\"), min_size=1, max_size=8)
    built = st.one_of(
        st.builds(lambda a: "/" + a, parts),
        st.builds(lambda a, b: f"{a}/../../{b}", parts, parts),
        st.builds(lambda a: "../" + a, parts),
        st.builds(lambda a, b: f"{a}/{b}", parts.filter(lambda s: s not in (".",)), parts),
    )
    return st.one_of(st.sampled_from(UNSAFE_PATHS), built)


#: Ids gymnasium does not know, or registered envs DQN cannot drive (continuous actions,
#: Tuple observations) or that need a package not installed here.
BAD_ENV_IDS = (
    "NoSuchEnv-v0",
    "CartPole-v999",
    "cartpole-v1",
    "os:system",
    "subprocess:Popen-v0",
    "gymnasium.envs.classic_control.cartpole:CartPoleEnv",
    "../CartPole-v1",
    "CartPole-v1\x00",
    "MountainCarContinuous-v0",
    "Pendulum-v1",
    "Blackjack-v1",
    "CarRacing-v3",
    "BipedalWalker-v3",
)


def unknown_env_id() -> st.SearchStrategy[str]:
    import gymnasium as gym

    text = st.text(min_size=1, max_size=60).filter(lambda s: s not in gym.registry)
    return st.one_of(st.sampled_from(BAD_ENV_IDS), text)


def task_id() -> st.SearchStrategy[str]:
    return st.uuids().map(lambda u: "fz-" + u.hex[:16])


def valid_start(tid: str, *, dqn: bool = False) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "env": {"id": "CartPole-v1", "env_num": 1, "seed": 0},
        "policy": {"type": "random"},
        "n_episode": 1,
    }
    if dqn:
        cfg.update(policy={"type": "dqn", "model_config": {"hidden_sizes": [64, 64]}}, collect_setting={"eps": 0.1})
        cfg["policy_update_path"] = "policy_ok"
    return {"name": "collector_start_task", "task_info": {"task_id": tid, "buffer_id": "fuzzbuf", "collector_cfg": cfg}}


# -- start tasks with exactly one thing wrong ---------------------------------------

_Mutate = Callable[[dict[str, Any], Any], None]


def _set(*path: str) -> _Mutate:
    def mutate(body: dict[str, Any], value: Any) -> None:
        node = body["task_info"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def _drop(*path: str) -> _Mutate:
    def mutate(body: dict[str, Any], _value: Any) -> None:
        node = body["task_info"]
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return mutate


def _replace_task_info(body: dict[str, Any], value: Any) -> None:
    body["task_info"] = value


def _drop_task_info(body: dict[str, Any], _value: Any) -> None:
    del body["task_info"]


_CFG = ("collector_cfg",)
_CFG_ERR = codes(Refusal.BAD_COLLECTOR_CFG)
_MISSING = codes(Refusal.MISSING_PLUGIN)


def _not_installed(kind: str) -> st.SearchStrategy[str]:
    """Plug-in names (1 to 100 characters) no worker of this test has."""
    from worker.plugins import installed

    have = set(installed().inventory()[f"{kind}s"])
    return st.text(min_size=1, max_size=100).filter(lambda name: name not in have)


#: Plain-data maps a config cannot hold: nested too deep, too big, with non-string keys or bytes.
BAD_PLAIN = st.sampled_from(
    [
        {"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}},
        {str(i): i for i in range(300)},
        {"k": b"bytes"},
        {"k": float("nan")},
        {"k": [float("inf")]},
        {1: 2},
    ]
)
#: (where, how, bad values, allowed result.message values, word the error must name, dqn base)
_MUTATIONS: list[tuple[str, _Mutate, st.SearchStrategy[Any], frozenset[str], str, bool]] = [
    ("task_info", _replace_task_info, NON_MAP, codes(Refusal.MISSING_TASK_INFO), "task_info", False),
    ("task_info", _drop_task_info, st.none(), codes(Refusal.MISSING_TASK_INFO), "task_info", False),
    ("task_id", _set("task_id"), bad_id(), codes(Refusal.BAD_TASK_ID), "task_id", False),
    ("task_id", _drop("task_id"), st.none(), codes(Refusal.BAD_TASK_ID), "task_id", False),
    ("buffer_id", _set("buffer_id"), bad_id(), codes(Refusal.BAD_BUFFER_ID), "buffer_id", False),
    ("collector_cfg", _set(*_CFG), NON_MAP, _CFG_ERR, "collector_cfg", False),
    ("collector_cfg", _drop(*_CFG), st.none(), codes(Refusal.MISSING_COLLECTOR_CFG), "collector_cfg", False),
    ("env", _set(*_CFG, "env"), NON_MAP, _CFG_ERR, "env", False),
    ("env", _drop(*_CFG, "env"), st.none(), _CFG_ERR, "env", False),
    ("env.id", _set(*_CFG, "env", "id"), st.one_of(NON_STR, st.just(""), huge_text()), _CFG_ERR, "env.id", False),
    ("env.env_num", _set(*_CFG, "env", "env_num"), bad_int(1, MAX_ENV_NUM), _CFG_ERR, "env_num", False),
    (
        "env.seed",
        _set(*_CFG, "env", "seed"),
        bad_int(0, 2**32 - 1).filter(lambda v: v is not None),
        _CFG_ERR,
        "seed",
        False,
    ),
    ("policy", _set(*_CFG, "policy"), NON_MAP, _CFG_ERR, "policy", False),
    (
        "policy.type",
        _set(*_CFG, "policy", "type"),
        st.one_of(NON_STR, st.just(""), huge_text().map(lambda s: s + "x" * 100)),
        _CFG_ERR,
        "policy.type",
        False,
    ),
    # a name no worker has: permanent for this worker, naming the plug-in
    ("policy.type", _set(*_CFG, "policy", "type"), _not_installed("algorithm"), _MISSING, "plug-in", False),
    ("policy.model", _set(*_CFG, "policy", "model"), _not_installed("model"), _MISSING, "plug-in", True),
    (
        "policy.version",
        _set(*_CFG, "policy", "version"),
        st.sampled_from(["0.0.0-x", "99", "é"]),
        _MISSING,
        "the task wants",
        False,
    ),
    ("env.plugin", _set(*_CFG, "env", "plugin"), _not_installed("env"), _MISSING, "plug-in", False),
    (
        "env.plugin",
        _set(*_CFG, "env", "plugin"),
        st.one_of(NON_STR.filter(lambda v: v is not None), st.just("")),
        _CFG_ERR,
        "env.plugin",
        False,
    ),
    ("env.kwargs", _set(*_CFG, "env", "kwargs"), st.one_of(NON_MAP, BAD_PLAIN), _CFG_ERR, "kwargs", False),
    (
        "env.kwargs",
        _set(*_CFG, "env", "kwargs"),
        st.just({"no_such_kwarg": 1}),
        codes(Refusal.UNKNOWN_ENV),
        "CartPole-v1",
        False,
    ),
    ("policy.config", _set(*_CFG, "policy", "config"), st.one_of(NON_MAP, BAD_PLAIN), _CFG_ERR, "config", True),
    (
        "policy.config",
        _set(*_CFG, "policy", "config"),
        st.sampled_from([{"gamma": 0.9}, {"lr": -1}, {"lr": "fast"}, {"batch_size": 0}]),
        _CFG_ERR,
        "algorithm",
        True,
    ),
    (
        "policy.model_config.hidden_sizes",
        _set(*_CFG, "policy", "model_config", "hidden_sizes"),
        st.one_of(
            NON_MAP.filter(lambda v: not isinstance(v, list)),
            st.just([]),
            st.lists(st.integers(min_value=1, max_value=8), min_size=5, max_size=8),
            st.lists(bad_int(1, 1024), min_size=1, max_size=4),
        ),
        _CFG_ERR,
        "hidden_sizes",
        True,
    ),
    (
        "policy.model_config",
        _set(*_CFG, "policy", "model_config"),
        st.one_of(NON_MAP, BAD_PLAIN),
        _CFG_ERR,
        "model_config",
        True,
    ),
    ("spaces", _set(*_CFG, "spaces"), NON_MAP.filter(lambda v: v is not None), _CFG_ERR, "spaces", False),
    (
        "spaces",
        _set(*_CFG, "spaces"),
        st.sampled_from(
            [
                {"observation": {"kind": "Discrete", "n": 3}, "action": {"kind": "Discrete", "n": 2}},
                {
                    "observation": {"kind": "Box", "shape": [4], "dtype": "float32", "low": -1, "high": 1},
                    "action": {"kind": "Discrete", "n": 3},
                },
            ]
        ),
        codes(Refusal.UNSUPPORTED_ENV),
        "another version of the env",
        False,
    ),
    (
        "n_episode",
        _set(*_CFG, "n_episode"),
        bad_int(1, 10**6).filter(lambda v: v is not None),
        _CFG_ERR,
        "n_episode",
        False,
    ),
    ("n_episode", _drop(*_CFG, "n_episode"), st.none(), _CFG_ERR, "n_sample", False),
    ("n_sample", _set(*_CFG, "n_sample"), st.integers(min_value=1, max_value=100), _CFG_ERR, "n_sample", False),
    ("traj_len", _set(*_CFG, "traj_len"), bad_int(1, 4096), _CFG_ERR, "traj_len", False),
    ("eps", _set(*_CFG, "collect_setting", "eps"), bad_number(0.0, 1.0), _CFG_ERR, "eps", True),
    ("collect_setting", _set(*_CFG, "collect_setting"), NON_MAP, _CFG_ERR, "collect_setting", True),
    (
        "policy_update_path",
        _set(*_CFG, "policy_update_path"),
        st.one_of(
            NON_STR.filter(lambda v: v is not None), st.just(""), huge_text(6000).filter(lambda s: len(s) > 4096)
        ),
        _CFG_ERR,
        "policy_update_path",
        True,
    ),
    ("policy_update_path", _drop(*_CFG, "policy_update_path"), st.none(), _CFG_ERR, "policy_update_path", True),
    (
        "update_policy_second",
        _set(*_CFG, "update_policy_second"),
        bad_number(0.0, 3600.0, lo_open=True),
        _CFG_ERR,
        "update_policy_second",
        False,
    ),
    ("eval_flag", _set(*_CFG, "eval_flag"), NON_BOOL, _CFG_ERR, "eval_flag", False),
    ("max_env_steps", _set(*_CFG, "max_env_steps"), bad_int(1, 10**9), _CFG_ERR, "max_env_steps", False),
]


@st.composite
def bad_start_task(draw: st.DrawFn) -> Body:
    """A start task with one wrong, missing or out-of-range value."""
    where, mutate, values, messages, text, dqn = draw(st.sampled_from(_MUTATIONS))
    body = valid_start(draw(task_id()), dqn=dqn)
    mutate(body, draw(values))
    if where == "n_sample":  # both n_sample and n_episode
        text = "n_sample"
    return Body(f"bad task_info ({where})", encode(body), messages, text)


@st.composite
def huge_values_task(draw: st.DrawFn) -> Body:
    """Huge numbers and long strings where a start task expects small ones."""
    where, path, value = draw(
        st.sampled_from(
            [
                ("env_num", ("env", "env_num"), 2**64 - 1),
                ("env_num", ("env", "env_num"), -(2**63)),
                ("seed", ("env", "seed"), 2**63),
                ("n_episode", ("n_episode",), 2**64 - 1),
                ("traj_len", ("traj_len",), 10**18),
                ("max_env_steps", ("max_env_steps",), 2**64 - 1),
                ("update_policy_second", ("update_policy_second",), 1e308),
                ("update_policy_second", ("update_policy_second",), float("inf")),
                ("hidden_sizes", ("policy", "model_config", "hidden_sizes"), [2**62, 2**62]),
            ]
        )
    )
    body = valid_start(draw(task_id()))
    node = body["task_info"]["collector_cfg"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return Body(f"huge number ({where})", encode(body), _CFG_ERR, where)


@st.composite
def huge_string_task(draw: st.DrawFn) -> Body:
    text = draw(huge_text(15_000))
    where = draw(st.sampled_from(["name", "task_id", "buffer_id", "env.id", "policy_update_path", "key"]))
    body: dict[str, Any] = valid_start(draw(task_id()), dqn=True)
    info = body["task_info"]
    if where == "name":
        body["name"] = text
        return Body("huge string (name)", encode(body), codes(Refusal.TASK_NAME_ERROR), "illegal")
    if where == "key":  # an unknown key is ignored: the task stays one mistake short of valid
        info["collector_cfg"][text] = text
        info["collector_cfg"]["env"]["env_num"] = 0
        return Body("huge string (unknown key)", encode(body), _CFG_ERR, "env_num")
    if where in ("task_id", "buffer_id"):
        info[where] = text
        return Body(f"huge string ({where})", encode(body), codes(Refusal(f"bad {where}")), where)
    if where == "env.id":
        info["collector_cfg"]["env"]["id"] = text
        return Body("huge string (env.id)", encode(body), _CFG_ERR, "env.id")
    info["collector_cfg"]["policy_update_path"] = text
    # Up to 4096 characters it is a name that will not resolve to a file; longer is refused.
    if len(text) > 4096:
        return Body("huge string (policy path)", encode(body), _CFG_ERR, "policy_update_path")
    info["collector_cfg"]["policy_update_path"] = "../" + text[:100]
    return Body("huge string (policy path)", encode(body), codes(Refusal.UNSAFE_PATH), "policy_update_path")


@st.composite
def unsafe_path_task(draw: st.DrawFn) -> Body:
    body = valid_start(draw(task_id()), dqn=True)
    path = draw(unsafe_path())
    body["task_info"]["collector_cfg"]["policy_update_path"] = path
    return Body("unsafe policy path", encode(body), codes(Refusal.UNSAFE_PATH), "policy_update_path")


@st.composite
def unknown_env_task(draw: st.DrawFn) -> Body:
    body = valid_start(draw(task_id()), dqn=True)
    env_id = draw(unknown_env_id())
    body["task_info"]["collector_cfg"]["env"]["id"] = env_id
    category = "unknown env id"
    if draw(st.booleans()):  # eval tasks build their own envs: the id must be checked all the same
        body["task_info"]["collector_cfg"]["eval_flag"] = True
        category += " (eval task)"
    return Body(category, encode(body), ENV_REFUSALS, "env")


@st.composite
def wrong_shape(draw: st.DrawFn) -> Body:
    """Valid msgpack that is not a task: scalars, lists, maps without a string name."""
    scalar = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**64 - 1),
        st.floats(),
        st.text(max_size=20),
    )
    nested = st.recursive(
        scalar | st.binary(max_size=10),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )
    value = draw(
        st.one_of(
            nested.filter(lambda v: not isinstance(v, dict)),
            st.dictionaries(st.text(max_size=8).filter(lambda k: k != "name"), nested, max_size=4),
            st.builds(
                lambda n, rest: {**rest, "name": n}, NON_STR, st.dictionaries(st.text(max_size=8), nested, max_size=3)
            ),
            st.dictionaries(st.integers(min_value=-(2**63), max_value=2**64 - 1), nested, max_size=3),
        )
    )
    return Body("valid msgpack, wrong shape", encode(value), NAME_REFUSALS)


@st.composite
def unknown_name(draw: st.DrawFn) -> Body:
    name = draw(
        st.one_of(
            st.text(max_size=40),
            st.sampled_from(["Resource", "resource ", "collector_start_task\x00", "learner_start_task", "__init__"]),
        ).filter(lambda n: n not in TASK_NAMES)
    )
    extra = draw(st.one_of(st.none(), st.just(valid_start("fz-x")["task_info"]), JUNK))
    body: dict[str, Any] = {"name": name}
    if extra is not None:
        body["task_info"] = extra
    return Body("unknown task name", encode(body), codes(Refusal.TASK_NAME_ERROR))


def data_or_close() -> st.SearchStrategy[Body]:
    """Data and close tasks where there is nothing to serve them (wrong queue, no collector)."""
    return st.builds(
        lambda name, info: Body(
            "data/close without a collector",
            encode({"name": name} if info is None else {"name": name, "task_info": info}),
            DATA_CLOSE_REFUSALS,
            may_succeed=True,
        ),
        st.sampled_from(["collector_data_task", "collector_close_task"]),
        st.one_of(st.none(), JUNK),
    )


def _ext(code: int, payload: bytes) -> bytes:
    """An ext32 frame (valid framing whatever the payload)."""
    return b"\xc9" + struct.pack(">I", len(payload)) + struct.pack(">b", code) + payload


def _array_payload(dtype: str, shape: tuple[int, ...], raw: bytes) -> bytes:
    name = dtype.encode("ascii", "replace")
    head = bytes([len(name)]) + name + bytes([len(shape)]) + b"".join(struct.pack("<Q", d) for d in shape)
    return head + raw


@st.composite
def crafted_msgpack(draw: st.DrawFn) -> Body:
    """Hand-made msgpack: deep nesting, lying lengths, broken strings, hostile extension types."""
    kind = draw(
        st.sampled_from(
            [
                "deep list",
                "deep map",
                "deep field",
                "lying length",
                "bad utf-8",
                "truncated",
                "trailing",
                "ext",
                "array",
                "task+ext",
            ]
        )
    )
    raw: bytes
    messages = NAME_REFUSALS
    if kind == "deep field":
        # Nested just below msgpack's depth limit (1024), inside a field the worker checks:
        # it decodes fine, so the worker must refuse it like any other wrong value.
        field = draw(st.sampled_from(["task_id", "buffer_id", "collector_cfg", "name"]))
        depth = draw(st.integers(min_value=990, max_value=1020))
        nested = b"\x91" * depth + b"\xc0"
        if field == "name":
            raw = b"\x81\xa4name" + nested
        else:
            start = valid_start("fz-deep")
            start["task_info"][field] = 0
            # Splice the nested value in place of the 0 the field was encoded with.
            key = encode(field)
            encoded = encode(start)
            at = encoded.index(key + b"\x00") + len(key)
            raw = encoded[:at] + nested + encoded[at + 1 :]
            messages = START_REFUSALS
        return Body(f"crafted msgpack ({kind} {field})", raw, messages)
    if kind == "deep list":
        raw = b"\x91" * draw(st.integers(min_value=500, max_value=5000)) + b"\xc0"
    elif kind == "deep map":
        raw = b"\x81\xa1k" * draw(st.integers(min_value=500, max_value=5000)) + b"\xc0"
    elif kind == "lying length":
        head = draw(st.sampled_from([b"\xdd", b"\xdf", b"\xdb", b"\xc6", b"\xdc", b"\xde", b"\xda"]))
        width = 4 if head in (b"\xdd", b"\xdf", b"\xdb", b"\xc6") else 2
        raw = head + b"\xff" * width + draw(st.binary(max_size=20))
    elif kind == "bad utf-8":
        raw = b"\x81\xa4name" + b"\xa2\xff\xfe"
    elif kind == "truncated":
        full = encode(valid_start(draw(task_id())))
        raw = full[: draw(st.integers(min_value=1, max_value=len(full) - 1))]
    elif kind == "trailing":
        raw = encode({"name": "resource"}) + draw(st.binary(min_size=1, max_size=10))
    elif kind == "ext":
        raw = _ext(draw(st.integers(min_value=-128, max_value=127)), draw(st.binary(max_size=64)))
    else:
        dtype = draw(
            st.sampled_from(["|O", "<U4", "V8", "<M8[ns]", "garbage", "<f4", "<i8", "float32", "bfloat16", "bool"])
        )
        shape = draw(
            st.one_of(
                st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=4).map(tuple),
                st.just((2**63, 2**63)),
                st.just((0, 2**64 - 1)),
                st.just(tuple([1] * 40)),
            )
        )
        code = draw(st.sampled_from([1, 2, 3]))
        payload = _array_payload(dtype, shape, draw(st.binary(max_size=32)))
        frame = _ext(code, payload)
        raw = frame if kind == "array" else b"\x82\xa4name" + frame + b"\xa9task_info" + frame
    return Body(f"crafted msgpack ({kind})", raw, NAME_REFUSALS)


def random_bytes() -> st.SearchStrategy[Body]:
    return st.binary(max_size=400).map(lambda b: Body("random bytes", b, NAME_REFUSALS))


def oversized(limit: int) -> st.SearchStrategy[Body]:
    """A ``resource`` task padded past the worker's size limit: only the size is wrong."""
    return st.integers(min_value=limit + 1, max_value=limit * 4).map(
        lambda n: Body("oversized", encode({"name": "resource", "pad": "x" * n}), codes(Refusal.BAD_REQUEST))
    )


def valid_resource() -> st.SearchStrategy[Body]:
    return st.just(Body("valid resource", encode({"name": "resource"}), may_succeed=True, valid=True))


def bodies(limit: int) -> st.SearchStrategy[Body]:
    return st.one_of(
        random_bytes(),
        crafted_msgpack(),
        wrong_shape(),
        unknown_name(),
        bad_start_task(),
        huge_values_task(),
        huge_string_task(),
        unsafe_path_task(),
        unknown_env_task(),
        data_or_close(),
        oversized(limit),
        valid_resource(),
    )


#: ``schema`` header values other than 1.
BAD_SCHEMAS: tuple[int | str, ...] = (0, 1, 3, 99, -1, "2", "x")
#: content types other than warren's; None is "no content_type property at all".
OTHER_CONTENT_TYPES = (
    "application/json",
    "text/plain",
    "application/x-python-pickle",
    "application/octet-stream",
    "application/msgpack; charset=binary",
    "APPLICATION/MSGPACK",
)


@st.composite
def probes(draw: st.DrawFn, limit: int) -> Probe:
    """A request: most envelopes are clean, the rest break one or more properties."""
    body = draw(bodies(limit))
    target: Target = draw(st.sampled_from(["tasks", "control"]))
    if draw(st.integers(min_value=0, max_value=9)) < 6:
        return Probe(body, target)
    return Probe(
        body,
        target,
        reply_to=draw(st.sampled_from(["yes", "yes", "none", "empty"])),
        correlation=draw(st.sampled_from(["yes", "none", "empty"])),
        content_type=draw(
            st.one_of(
                st.just("application/msgpack"),
                st.none(),
                st.sampled_from(OTHER_CONTENT_TYPES),
                st.text(alphabet=st.characters(codec="ascii", min_codepoint=32), max_size=30),
            )
        ),
        schema=draw(st.one_of(st.none(), st.sampled_from(BAD_SCHEMAS))),
    )


# -- garbage for the coordinator's and the learner's queues --------------------------


@dataclass(frozen=True)
class Garbage:
    """A message for a metadata or learner queue; ``token`` marks it in bodies, file names and logs."""

    category: str
    raw: bytes
    token: str


_META_KEYS = (
    "data_id",
    "policy_iter",
    "unroll_len",
    "env_num",
    "sample_count",
    "cur_step",
    "cur_episode",
    "cur_sample",
    "eval_flag",
    "priority",
    "get_data_time",
    "task_id",
    "buffer_id",
    "compressor",
)


def _data_id(token: str) -> st.SearchStrategy[Any]:
    """data_ids carrying the token: plain names of missing files, unsafe paths, junk types."""
    return st.one_of(
        st.sampled_from(
            [
                f"fz-{token}",
                f"../fz-{token}",
                f"/tmp/fz-{token}",
                f"fz-{token}/x",
                f".fz-{token}",
                f"fz-{token}\x00",
                f"fz-{token}\\..\\x",
                f"fz-{token}" + "y" * 300,
            ]
        ),
        NON_STR,
    )


@st.composite
def metadata_garbage(draw: st.DrawFn) -> Garbage:
    """Bytes and maps that are not the metadata a collector writes (and never a valid info)."""
    token = draw(st.uuids()).hex[:12]
    kind = draw(st.sampled_from(["random bytes", "crafted", "not a map", "data map", "info map", "junk map"]))
    if kind == "random bytes":
        return Garbage(kind, draw(st.binary(max_size=200)), token)
    if kind == "crafted":
        return Garbage(kind, draw(crafted_msgpack()).raw, token)
    if kind == "not a map":
        value = draw(
            st.one_of(
                st.lists(JUNK, max_size=3),
                st.text(max_size=20),
                st.integers(min_value=-(2**63), max_value=2**64 - 1),
                st.none(),
            )
        )
        return Garbage(kind, encode(value), token)
    message: dict[str, Any] = {"fuzz_id": token}
    if kind == "data map":
        message["data_id"] = draw(_data_id(token))
    keys = draw(st.lists(st.sampled_from(_META_KEYS[1:]), max_size=6, unique=True))
    for key in keys:
        message[key] = draw(JUNK)
    if kind == "info map":
        # The four info keys with at least one of them wrong: a broken, never a valid, info.
        for key in ("cur_episode", "cur_sample", "cur_step"):
            message.setdefault(key, draw(st.integers(min_value=0, max_value=10)))
        broken = draw(st.sampled_from(["cur_episode", "cur_sample", "cur_step"]))
        message[broken] = draw(st.one_of(NON_INT, st.just(-(2**63)), st.just(2**64 - 1)))
        message["collector_done"] = False
    elif kind == "junk map":
        message.update(draw(st.dictionaries(st.text(max_size=10), JUNK, max_size=4)))
        for key in ("collector_done", "error", "aborted", "data_id"):
            message.pop(key, None)
    return Garbage(kind, encode(message), token)


# -- policy files ---------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyFile:
    """A file to put at a dqn task's policy path; ``kind`` says what is wrong with it."""

    kind: str
    content: bytes | None
    """None: not a regular file (see ``kind``: fifo, directory, symlink)."""


class _Evil:
    """Pickles to a call of ``os.system``; unpickled anywhere, it creates the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.system, (f"touch {self.marker}",))


def _torch_bytes(obj: Any) -> bytes:
    """A ``torch.save`` checkpoint: warren's policy format before safetensors, never to be loaded now."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _good_weights() -> dict[str, Any]:
    """Weights of the fuzz tasks' DQN (64x64 mlp on CartPole), as its learner would publish them."""
    import gymnasium as gym

    from worker.plugins import Spaces, installed
    from worker.plugins.binding import build_algorithm

    env = gym.make("CartPole-v1")
    spaces = Spaces(env.observation_space, env.action_space)
    algorithm: Any = build_algorithm(installed(), spaces, algorithm="dqn", model_config={"hidden_sizes": [64, 64]})
    weights: dict[str, Any] = algorithm.q_network(seed=0).state_dict()
    return weights


def _header(**changes: str) -> dict[str, str]:
    import gymnasium as gym

    from worker.plugins import Spaces
    from worker.storage.policies import POLICY_FORMAT

    env = gym.make("CartPole-v1")
    digest = Spaces(env.observation_space, env.action_space).digest
    return {
        "warren.format": POLICY_FORMAT,
        "policy_version": "1",
        "algorithm": "dqn",
        "spaces_digest": digest,
        **changes,
    }


def _safetensors(weights: dict[str, Any] | None = None, /, **header: str) -> bytes:
    from safetensors.torch import save

    body: bytes = save(weights if weights is not None else _good_weights(), metadata=_header(**header))
    return body


def _nan_weights() -> bytes:
    weights = _good_weights()
    weights["head.bias"][0] = float("nan")
    return _safetensors(weights)


def _wrong_network() -> bytes:
    import torch

    return _safetensors({"weight": torch.zeros(3, 3)})


def _other_shapes() -> bytes:
    import torch

    return _safetensors({name: torch.zeros(3, *t.shape[1:]) for name, t in _good_weights().items()})


def _lying_header_length() -> bytes:
    body = _safetensors()
    return struct.pack("<Q", 2**40) + body[8:]


def _evil_inside_torch_zip(marker: str) -> bytes:
    """A genuine torch checkpoint whose data.pkl was swapped for a malicious pickle."""
    original = _torch_bytes({"model": {}, "iter": 1})
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(original)) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("data.pkl"):
                data = pickle.dumps({"model": _Evil(marker), "iter": 1}, protocol=2)
            dst.writestr(item, data)
    return out.getvalue()


def policy_files(marker: str) -> st.SearchStrategy[PolicyFile]:
    def evil(protocol: int) -> PolicyFile:
        return PolicyFile(f"malicious pickle (protocol {protocol})", pickle.dumps(_Evil(marker), protocol=protocol))

    def truncated(fraction: float) -> PolicyFile:
        full = _safetensors()
        return PolicyFile("truncated policy", full[: int(len(full) * fraction)])

    return st.one_of(
        st.integers(min_value=0, max_value=pickle.HIGHEST_PROTOCOL).map(evil),
        st.just(PolicyFile("malicious pickle inside a torch zip", _evil_inside_torch_zip(marker))),
        st.floats(min_value=0.0, max_value=0.999).map(truncated),
        st.binary(max_size=256).map(lambda b: PolicyFile("random bytes", b)),
        st.just(PolicyFile("empty file", b"")),
        st.builds(lambda: PolicyFile("torch checkpoint of the right network", _torch_bytes(_good_weights()))),
        st.sampled_from(
            [
                ("header of another format", {"warren.format": "0"}),
                ("header of another env", {"spaces_digest": "0123456789abcdef"}),
                ("header of another algorithm", {"algorithm": "sac"}),
                ("header with a version that is no count", {"policy_version": "-3"}),
            ]
        ).map(lambda kv: PolicyFile(kv[0], _safetensors(**kv[1]))),
        st.builds(lambda: PolicyFile("tensors of another network", _wrong_network())),
        st.builds(lambda: PolicyFile("tensors of other shapes", _other_shapes())),
        st.builds(lambda: PolicyFile("NaN weights", _nan_weights())),
        st.builds(lambda: PolicyFile("lying header length", _lying_header_length())),
        st.integers(min_value=2**64, max_value=2**100).map(
            lambda it: PolicyFile("huge version", _safetensors(policy_version=str(it)))
        ),
        st.sampled_from(["fifo", "directory", "symlink out"]).map(lambda k: PolicyFile(k, None)),
    )


def policy_file_examples(marker: str) -> list[PolicyFile]:
    """One file of every kind :func:`policy_files` draws from, for a deterministic first pass."""
    full = _safetensors()
    return [
        PolicyFile("malicious pickle (protocol 2)", pickle.dumps(_Evil(marker), protocol=2)),
        PolicyFile("malicious pickle inside a torch zip", _evil_inside_torch_zip(marker)),
        PolicyFile("truncated policy (last byte missing)", full[:-1]),
        PolicyFile("random bytes", bytes(range(256))),
        PolicyFile("empty file", b""),
        PolicyFile("torch checkpoint of the right network", _torch_bytes(_good_weights())),
        PolicyFile("header of another format", _safetensors(**{"warren.format": "0"})),
        PolicyFile("header of another env", _safetensors(spaces_digest="0123456789abcdef")),
        PolicyFile("header of another algorithm", _safetensors(algorithm="sac")),
        PolicyFile("header with a version that is no count", _safetensors(policy_version="7.5")),
        PolicyFile("tensors of another network", _wrong_network()),
        PolicyFile("tensors of other shapes", _other_shapes()),
        PolicyFile("NaN weights", _nan_weights()),
        PolicyFile("lying header length", _lying_header_length()),
        PolicyFile("huge version", _safetensors(policy_version=str(2**64))),
        PolicyFile("fifo", None),
        PolicyFile("directory", None),
        PolicyFile("symlink out", None),
    ]
