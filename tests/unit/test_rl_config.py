"""Validation of collector and learner task configs taken from untrusted messages."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.errors import TaskError
from worker.protocol import CollectorSpec, EnvSpec, PolicySpec
from worker.rl.config import LearnerSpec, epsilon_at


def good_cfg() -> dict[str, Any]:
    return {
        "env": {"id": "CartPole-v1", "env_num": 4, "seed": 7},
        "policy": {"type": "dqn", "hidden_sizes": [32, 16]},
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

    spec = CollectorSpec.from_wire(cfg)

    assert spec.to_wire() == cfg
    assert CollectorSpec.from_wire(spec.to_wire()) == spec
    assert spec.env == EnvSpec("CartPole-v1", 4, seed=7)
    assert spec.policy == PolicySpec("dqn", (32, 16))
    assert spec.eps == 0.25


def test_minimal_dict_gets_documented_defaults() -> None:
    cfg = {"env": {"id": "CartPole-v1", "env_num": 2}, "policy": {"type": "random"}, "n_episode": 3}

    spec = CollectorSpec.from_wire(cfg)

    assert (spec.traj_len, spec.update_policy_second, spec.max_env_steps) == (64, 3.0, 1_000_000)
    assert spec.eval_flag is False and spec.env.seed is None and spec.n_sample is None
    assert CollectorSpec.from_wire(spec.to_wire()) == spec


def test_eval_tasks_ignore_collect_setting() -> None:
    cfg = good_cfg()
    del cfg["n_sample"]
    cfg.update(eval_flag=True, n_episode=1, collect_setting="garbage is ignored")

    spec = CollectorSpec.from_wire(cfg)

    assert spec.eps is None and spec.collect_setting is None
    assert "collect_setting" not in spec.to_wire()


def test_unknown_keys_from_di_engine_are_ignored() -> None:
    cfg = good_cfg() | {"type": "zergling", "import_names": [], "exp_name": "x"}

    assert CollectorSpec.from_wire(cfg) == CollectorSpec.from_wire(good_cfg())


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
        ("policy.type", "ppo", "collector_cfg.policy.type"),
        ("policy.type", _DELETE, "collector_cfg.policy.type is missing"),
        ("policy.hidden_sizes", [], "collector_cfg.policy.hidden_sizes"),
        ("policy.hidden_sizes", [64, "a"], "collector_cfg.policy.hidden_sizes[1]"),
        ("policy.hidden_sizes", [10**6], "collector_cfg.policy.hidden_sizes[0]"),
        ("n_sample", _DELETE, "exactly one of collector_cfg.n_sample and collector_cfg.n_episode"),
        ("n_sample", 0, "collector_cfg.n_sample"),
        ("n_sample", float("inf"), "collector_cfg.n_sample"),
        ("n_episode", 5, "exactly one of"),
        ("traj_len", 0, "collector_cfg.traj_len"),
        ("traj_len", 10**9, "collector_cfg.traj_len"),
        ("collect_setting", _DELETE, "collector_cfg.collect_setting.eps is missing"),
        ("collect_setting", 0.1, "collector_cfg.collect_setting must be a map"),
        ("collect_setting.eps", 1.5, "collector_cfg.collect_setting.eps"),
        ("collect_setting.eps", float("nan"), "collector_cfg.collect_setting.eps"),
        ("collect_setting.eps", "0.1", "collector_cfg.collect_setting.eps"),
        ("policy_update_path", "", "collector_cfg.policy_update_path"),
        ("policy_update_path", _DELETE, "collector_cfg.policy_update_path is missing"),
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
    ["env", "policy", "n_sample", "n_episode", "traj_len", "collect_setting", "policy_update_path",
     "update_policy_second", "eval_flag", "max_env_steps", "id", "env_num", "seed", "type", "hidden_sizes", "eps"]
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
        env_level = nested and key in ("id", "env_num", "seed") and isinstance(cfg["env"], dict)
        target = cfg["env"] if env_level else cfg
        target[key] = value
    try:
        spec = CollectorSpec.from_wire(cfg)
    except TaskError as exc:
        assert exc.message.startswith("collector_cfg") or "collector_cfg" in exc.message
    else:
        assert CollectorSpec.from_wire(spec.to_wire()) == spec


def test_learner_spec_refuses_bad_values_naming_the_key() -> None:
    with pytest.raises(TaskError, match=r"learner_cfg\.lr"):
        LearnerSpec(lr=0)
    with pytest.raises(TaskError, match=r"learner_cfg\.double_dqn"):
        LearnerSpec(double_dqn=1)  # type: ignore[arg-type]
    with pytest.raises(TaskError, match=r"learner_cfg\.hidden_sizes"):
        LearnerSpec(hidden_sizes=())


def test_default_hidden_sizes_agree_between_collector_and_learner() -> None:
    # Otherwise the learner's policy file cannot be loaded by collectors.
    assert PolicySpec("dqn").hidden_sizes == LearnerSpec().hidden_sizes


def test_epsilon_decays_linearly_then_stays_at_the_end_value() -> None:
    assert epsilon_at(0, 1.0, 0.1, 1000) == 1.0
    assert epsilon_at(500, 1.0, 0.1, 1000) == pytest.approx(0.55)
    assert epsilon_at(1000, 1.0, 0.1, 1000) == pytest.approx(0.1)
    assert epsilon_at(10**9, 1.0, 0.1, 1000) == pytest.approx(0.1)
    assert epsilon_at(-5, 1.0, 0.1, 1000) == 1.0
    assert LearnerSpec().epsilon(10**9) == LearnerSpec().eps_end
