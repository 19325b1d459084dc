"""Validation of collect and eval task configs (``collector_cfg``) taken from untrusted messages."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messaging import decode, encode
from worker.errors import TaskError
from worker.plugins import Spaces
from worker.protocol import CollectorSpec, EnvSpec, PolicySpec

SPACES = Spaces(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2))


def good_cfg() -> dict[str, Any]:
    return {
        "env": {"id": "CartPole-v1", "env_num": 4, "seed": 7, "plugin": "gymnasium", "kwargs": {"render_mode": None}},
        "policy": {
            "type": "dqn",
            "version": "0.1.0",
            "config": {"lr": 0.001, "double_dqn": True},
            "model": "mlp",
            "model_version": "0.1.0",
            "model_config": {"hidden_sizes": [32, 16]},
        },
        "spaces": SPACES.to_wire(),
        "n_sample": 64,
        "traj_len": 16,
        "collect_setting": {"eps": 0.25},
        "policy_update_path": "policy_abc",
        "update_policy_second": 1.5,
        "eval_flag": False,
        "max_env_steps": 5000,
    }


def test_full_wire_dict_round_trips_unchanged() -> None:
    cfg = good_cfg()

    spec = CollectorSpec.from_wire(decode(encode(cfg)))

    assert spec.to_wire() == cfg
    assert CollectorSpec.from_wire(spec.to_wire()) == spec
    assert spec.env == EnvSpec("CartPole-v1", 4, seed=7, plugin="gymnasium", kwargs={"render_mode": None})
    assert spec.policy == PolicySpec(
        "dqn",
        version="0.1.0",
        config={"lr": 0.001, "double_dqn": True},
        model="mlp",
        model_version="0.1.0",
        model_config={"hidden_sizes": [32, 16]},
    )
    assert spec.spaces is not None and spec.spaces.digest == SPACES.digest
    assert spec.collect_setting == {"eps": 0.25}


def test_minimal_dict_gets_documented_defaults() -> None:
    cfg = {"env": {"id": "CartPole-v1", "env_num": 2}, "policy": {"type": "random"}, "n_episode": 3}

    spec = CollectorSpec.from_wire(cfg)

    assert (spec.traj_len, spec.update_policy_second, spec.max_env_steps) == (64, 3.0, 1_000_000)
    assert spec.eval_flag is False and spec.env.seed is None and spec.n_sample is None
    assert spec.spaces is None and spec.collect_setting == {} and spec.policy_update_path is None
    assert (spec.env.plugin, spec.env.kwargs, spec.policy.model, spec.policy.config) == (None, {}, None, {})
    assert CollectorSpec.from_wire(spec.to_wire()) == spec
    assert spec.to_wire()["policy"] == {"type": "random"}  # what is not said is not sent


def test_eval_tasks_ignore_collect_setting() -> None:
    cfg = good_cfg()
    del cfg["n_sample"]
    cfg.update(eval_flag=True, n_episode=1, collect_setting="garbage is ignored")

    spec = CollectorSpec.from_wire(cfg)

    assert spec.collect_setting == {}
    assert "collect_setting" not in spec.to_wire()


def test_unknown_keys_from_di_engine_are_ignored() -> None:
    cfg = good_cfg() | {"type": "zergling", "import_names": ["os"], "exp_name": "x"}

    assert CollectorSpec.from_wire(cfg) == CollectorSpec.from_wire(good_cfg())


def test_the_wire_names_plugins_it_never_imports_them() -> None:
    # (whether a worker has them is its own check: "missing plugin"; the spec only carries names)
    cfg = good_cfg()
    cfg["policy"]["type"] = "os:system"
    cfg["env"]["plugin"] = "subprocess"
    spec = CollectorSpec.from_wire(cfg)
    assert (spec.policy.type, spec.env.plugin) == ("os:system", "subprocess")


def _set(path: str, value: Any) -> dict[str, Any]:
    cfg = good_cfg()
    *parents, leaf = path.split(".")
    node = cfg
    for part in parents:
        node = node[part]
    if value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return cfg


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("env", _DELETE, "collector_cfg.env is missing"),
        ("env", [1, 2], "collector_cfg.env must be a map"),
        ("env.id", _DELETE, "collector_cfg.env.id is missing"),
        ("env.id", "", "collector_cfg.env.id"),
        ("env.id", 3, "collector_cfg.env.id"),
        ("env.env_num", "x", "collector_cfg.env.env_num must be an integer between 1 and 256, got 'x'"),
        ("env.env_num", 0, "collector_cfg.env.env_num"),
        ("env.env_num", 10**30, "collector_cfg.env.env_num"),
        ("env.env_num", True, "collector_cfg.env.env_num"),
        ("env.env_num", 2.0, "collector_cfg.env.env_num"),
        ("env.seed", -1, "collector_cfg.env.seed"),
        ("env.plugin", "", "collector_cfg.env.plugin"),
        ("env.plugin", "x" * 101, "collector_cfg.env.plugin"),
        ("env.plugin_version", 3, "collector_cfg.env.plugin_version"),
        ("env.kwargs", [1], "collector_cfg.env.kwargs must be a map"),
        ("env.kwargs", {"x": float("nan")}, "collector_cfg.env.kwargs.x must be finite"),
        ("env.kwargs", {"x": b"bytes"}, "collector_cfg.env.kwargs.x must be plain data, got bytes"),
        ("env.kwargs", {"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}}, "nested more than 4 levels deep"),
        ("env.kwargs", {str(i): i for i in range(300)}, "collector_cfg.env.kwargs has more than 256 keys"),
        ("policy.type", "", "collector_cfg.policy.type"),
        ("policy.type", 3, "collector_cfg.policy.type"),
        ("policy.type", _DELETE, "collector_cfg.policy.type is missing"),
        ("policy.version", "", "collector_cfg.policy.version"),
        ("policy.model", ["mlp"], "collector_cfg.policy.model"),
        ("policy.config", [1, 2], "collector_cfg.policy.config must be a map"),
        ("policy.config", {"lr": float("inf")}, "collector_cfg.policy.config.lr must be finite"),
        ("policy.model_config", "big", "collector_cfg.policy.model_config must be a map"),
        ("policy.model_config", {"hidden_sizes": [64, b"x"]}, "collector_cfg.policy.model_config.hidden_sizes[1]"),
        ("policy.model_config", {"hidden_sizes": list(range(300))}, "has more than 256 items"),
        ("spaces", [1], "spaces must be a map with 'observation' and 'action'"),
        (
            "spaces",
            {"observation": {"kind": "Text"}, "action": {"kind": "Discrete", "n": 2}},
            "spaces.observation.kind",
        ),
        ("n_sample", _DELETE, "exactly one of collector_cfg.n_sample and collector_cfg.n_episode"),
        ("n_sample", 0, "collector_cfg.n_sample"),
        ("n_sample", float("inf"), "collector_cfg.n_sample"),
        ("n_episode", 5, "exactly one of"),
        ("traj_len", 0, "collector_cfg.traj_len"),
        ("traj_len", 10**9, "collector_cfg.traj_len"),
        ("collect_setting", 0.1, "collector_cfg.collect_setting must be a map"),
        ("collect_setting.eps", float("nan"), "collector_cfg.collect_setting.eps"),
        ("collect_setting.eps", "0.1", "collector_cfg.collect_setting.eps"),
        ("collect_setting.eps", 1e13, "collector_cfg.collect_setting.eps"),
        ("collect_setting", {str(i): 0.0 for i in range(65)}, "collector_cfg.collect_setting has more than 64"),
        ("policy_update_path", "", "collector_cfg.policy_update_path"),
        ("update_policy_second", 0, "collector_cfg.update_policy_second"),
        ("update_policy_second", -3.0, "collector_cfg.update_policy_second"),
        ("eval_flag", "yes", "collector_cfg.eval_flag must be a boolean"),
        ("max_env_steps", 0, "collector_cfg.max_env_steps"),
    ],
)
def test_bad_input_raises_task_error_naming_the_key(path: str, value: Any, named: str) -> None:
    with pytest.raises(TaskError) as info:
        CollectorSpec.from_wire(_set(path, value))

    assert named in info.value.message


def test_eval_task_with_n_sample_is_refused() -> None:
    with pytest.raises(TaskError, match=r"collector_cfg\.n_sample cannot be used by eval tasks"):
        CollectorSpec.from_wire(_set("eval_flag", True))


def test_non_mapping_config_is_refused() -> None:
    with pytest.raises(TaskError, match="collector_cfg must be a map"):
        CollectorSpec.from_wire(["not", "a", "dict"])


def test_specs_built_in_code_are_validated_too() -> None:
    with pytest.raises(TaskError, match="env_num"):
        EnvSpec("CartPole-v1", 257)


_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=8)
_garbage = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
_keys = st.sampled_from(
    ["env", "policy", "spaces", "n_sample", "n_episode", "traj_len", "collect_setting", "policy_update_path",
     "update_policy_second", "eval_flag", "max_env_steps", "id", "env_num", "seed", "plugin", "kwargs", "type",
     "config", "model", "model_config", "version", "eps"]
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(cfg=_garbage)
def test_random_garbage_only_ever_raises_task_error(cfg: Any) -> None:
    try:
        spec = CollectorSpec.from_wire(cfg)
    except TaskError as exc:
        assert exc.message
    else:
        assert CollectorSpec.from_wire(spec.to_wire()) == spec


@settings(max_examples=200, deadline=None)
@given(edits=st.lists(st.tuples(st.booleans(), _keys, _garbage), min_size=1, max_size=4))
def test_garbage_planted_in_a_good_config_only_raises_task_error(edits: list[tuple[bool, str, Any]]) -> None:
    cfg = copy.deepcopy(good_cfg())
    for nested, key, value in edits:
        env_level = nested and key in ("id", "env_num", "seed", "plugin", "kwargs") and isinstance(cfg["env"], dict)
        policy_level = nested and key in ("type", "config", "model", "model_config", "version")
        target = cfg["env"] if env_level else cfg["policy"] if policy_level and isinstance(cfg["policy"], dict) else cfg
        target[key] = value
    try:
        spec = CollectorSpec.from_wire(cfg)
    except TaskError as exc:
        assert exc.message.startswith(("collector_cfg", "spaces")) or "collector_cfg" in exc.message
    else:
        assert CollectorSpec.from_wire(spec.to_wire()) == spec


def test_settings_the_algorithm_checks_are_carried_as_given() -> None:
    # (an eps of 1.5 is DQN's to refuse, "bad collector_cfg", when the worker binds it; a
    # task without policy_update_path is refused there too for algorithms that learn)
    cfg = good_cfg()
    cfg["collect_setting"] = {"eps": 1.5, "temperature": -2}
    del cfg["policy_update_path"]
    spec = CollectorSpec.from_wire(cfg)
    assert spec.collect_setting == {"eps": 1.5, "temperature": -2.0} and spec.policy_update_path is None
