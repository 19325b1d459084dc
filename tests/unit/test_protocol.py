"""The wire contract (worker/protocol/): every type survives a trip over the wire, and the
refusal codes are the strings docs/protocol.md tells clients to expect."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging import decode, encode
from worker.errors import TaskError
from worker.plugins import Spaces
from worker.protocol import (
    CollectorSpec,
    DataItem,
    EnvSpec,
    FinishInfo,
    InfoItem,
    PolicySpec,
    Refusal,
    ResourceReply,
    StartReply,
    StartTask,
    TaskName,
    read_metadata,
    task_name,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
counts = st.integers(min_value=0, max_value=2**53)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)


def over_the_wire(value: Any) -> Any:
    """What the other side decodes: msgpack turns tuples into lists, and so on."""
    return decode(encode(value))


names = st.none() | st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True)
scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
leaves = scalars | st.text(max_size=8)
#: Plain data nested at most three levels deep (the wire allows four).
plain = (
    leaves | st.lists(leaves, max_size=3) | st.dictionaries(st.text(max_size=6), leaves | st.lists(leaves), max_size=3)
)
configs = st.dictionaries(st.text(min_size=1, max_size=10), plain, max_size=4)
SPACES = Spaces(gym.spaces.Box(0, 255, (2, 3), np.uint8), gym.spaces.Discrete(3))

specs = st.builds(
    CollectorSpec,
    env=st.builds(
        EnvSpec,
        id=st.sampled_from(["CartPole-v1", "Acrobot-v1", "grid"]),
        env_num=st.integers(1, 64),
        seed=st.none() | st.integers(0, 2**32 - 1),
        plugin=names,
        plugin_version=names,
        kwargs=configs,
    ),
    policy=st.builds(
        PolicySpec,
        type=st.sampled_from(["random", "dqn", "reinforce"]),
        version=names,
        config=configs,
        model=names,
        model_version=names,
        model_config=configs,
    ),
    spaces=st.none() | st.just(SPACES),
    n_sample=st.integers(1, 10**6),
    traj_len=st.integers(1, 4096),
    collect_setting=st.dictionaries(st.text(min_size=1, max_size=6), st.floats(-1e6, 1e6), max_size=3),
    max_env_steps=st.integers(1, 10**9),
)


@given(task_id=ids, buffer_id=ids, cfg=specs)
def test_a_start_task_round_trips(task_id: str, buffer_id: str, cfg: CollectorSpec) -> None:
    task = StartTask(task_id, buffer_id, cfg)
    wire = over_the_wire(task.to_wire())
    assert task_name(wire) is TaskName.START
    assert StartTask.from_wire(wire) == task


@given(worker_id=ids, task_id=ids)
def test_start_and_resource_replies_round_trip(worker_id: str, task_id: str) -> None:
    start = StartReply(worker_id, task_id, f"p.collector.control.{worker_id}", f"p.metadata.{task_id}")
    assert StartReply.from_wire(over_the_wire(start.to_wire())) == start
    resource = ResourceReply(0, 2, worker_id, start.control_queue, busy=True, task_id=task_id)
    assert ResourceReply.from_wire(over_the_wire(resource.to_wire())) == resource
    assert "plugins" not in resource.to_wire()  # (a DI-engine worker's reply, as before)
    listed = ResourceReply(0, 2, worker_id, start.control_queue, busy=False, task_id=None, plugins=PLUGINS)
    assert ResourceReply.from_wire(over_the_wire(listed.to_wire())) == listed


PLUGINS = {"envs": {"gymnasium": "1.0"}, "models": {"mlp": "1.0"}, "algorithms": {"dqn": "1.0", "random": "1.0"}}


def test_a_resource_reply_says_what_its_worker_lacks_of_a_plugin() -> None:
    reply = ResourceReply(0, 2, "w7", "p.collector.control.w7", busy=False, task_id=None, plugins=PLUGINS)
    assert reply.lacks("algorithm", "dqn", "1.0") is None and reply.lacks("algorithm", "dqn", None) is None
    assert reply.lacks("algorithm", "ppo", None) == "worker w7 has no algorithm plug-in 'ppo'"
    assert reply.lacks("model", "mlp", "2.0") == "worker w7 has model plug-in 'mlp' 1.0, the job needs 2.0"
    assert reply.lacks("env", "atari", None) == "worker w7 has no env plug-in 'atari'"
    # a worker that does not list its plug-ins is taken to have them (it refuses if it does not)
    silent = ResourceReply(0, 2, "di", "p.collector.control.di", busy=False, task_id=None)
    assert silent.lacks("algorithm", "anything", "9") is None


@pytest.mark.parametrize("plugins", [[1, 2], {"algorithms": [1]}, "dqn"])
def test_a_resource_reply_with_malformed_plugins_is_refused(plugins: Any) -> None:
    wire = ResourceReply(0, 2, "w", "q", busy=False, task_id=None).to_wire() | {"plugins": plugins}
    with pytest.raises(TaskError, match=r"malformed resource reply|plugins\.algorithms must be a map"):
        ResourceReply.from_wire(wire)


@given(
    data_id=ids,
    policy_iter=counts,
    unroll_len=counts,
    env_num=counts,
    sample_count=counts,
    counters=st.tuples(counts, counts, counts),
    when=times,
    task_id=st.none() | ids,
)
def test_data_items_round_trip(
    *,
    data_id: str,
    policy_iter: int,
    unroll_len: int,
    env_num: int,
    sample_count: int,
    counters: tuple[int, int, int],
    when: float,
    task_id: str | None,
) -> None:
    item = DataItem(
        data_id=data_id,
        policy_iter=policy_iter,
        unroll_len=unroll_len,
        env_num=env_num,
        sample_count=sample_count,
        cur_episode=counters[0],
        cur_sample=counters[1],
        cur_step=counters[2],
        task_id=task_id,
        get_data_time=when,
    )
    wire = over_the_wire(item.to_wire())
    assert None not in wire.values()
    assert read_metadata(wire) == item


@given(
    done=st.booleans(),
    counters=st.tuples(counts, counts, counts),
    error=st.none() | st.text(max_size=30),
    aborted=st.booleans(),
    when=times,
)
def test_collector_infos_round_trip(
    done: bool, counters: tuple[int, int, int], error: str | None, aborted: bool, when: float
) -> None:
    info = InfoItem(done, *counters, task_id="t1", buffer_id="main", get_info_time=when, error=error, aborted=aborted)
    assert read_metadata(over_the_wire(info.to_wire())) == info


@given(returns=st.lists(st.floats(min_value=-1e6, max_value=1e6), max_size=20), steps=counts)
def test_finish_info_round_trips_and_derives_its_averages(returns: list[float], steps: int) -> None:
    info = FinishInfo.measured(
        eval_flag=True,
        env_num=5,
        duration=2.0,
        train_iter=7,
        collector_done=True,
        predefined_episode_count=5,
        steps=steps,
        samples=0,
        returns=returns,
    )
    assert FinishInfo.from_wire(over_the_wire(info.to_wire())) == info
    assert info.real_episode_count == len(returns)
    if returns:
        assert info.reward_mean == pytest.approx(sum(returns) / len(returns), rel=1e-9, abs=1e-6)


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ({"hello": 1}, "metadata must hold"),
        ({"data_id": 7, "policy_iter": 1}, "data_id must be a string"),
        ({"data_id": "a", "policy_iter": -1}, "policy_iter must be an integer"),
        ({"data_id": "a", "policy_iter": 1, "sample_count": True}, "sample_count must be an integer"),
        ({"data_id": "a", "policy_iter": 1, "get_data_time": "now"}, "get_data_time must be a number"),
        ({"collector_done": True, "cur_episode": 1, "cur_sample": 2, "cur_step": 2**60}, "cur_step"),
        ({"collector_done": True, "cur_episode": 1, "cur_sample": 2, "cur_step": 3, "task_id": 5}, "task_id"),
        ({"collector_done": 1, "cur_episode": 1, "cur_sample": 2, "cur_step": 3}, "collector_done must be true"),
        ({"data_id": "a", "policy_iter": 1, "eval_flag": np.zeros(0)}, "eval_flag must be true or false"),
        ({"collector_done": False, "cur_episode": 1, "cur_sample": 2, "cur_step": 3, "aborted": "yes"}, "aborted"),
    ],
)
def test_malformed_metadata_is_refused_naming_the_key(message: dict[str, Any], match: str) -> None:
    with pytest.raises(TaskError, match=match):
        read_metadata(message)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ([1, 2], Refusal.BAD_TASK),
        ({"name": 3}, Refusal.TASK_NAME_ERROR),
        ({"name": "make_coffee"}, Refusal.TASK_NAME_ERROR),
    ],
)
def test_a_task_without_a_known_name_is_refused(body: Any, code: Refusal) -> None:
    with pytest.raises(TaskError) as refused:
        task_name(body)
    assert refused.value.result == {"message": code.value}


def _start_with_spaces(spaces: Any) -> dict[str, Any]:
    cfg = CollectorSpec(EnvSpec("CartPole-v1", 1), PolicySpec("random"), n_episode=1).to_wire()
    return {"name": "collector_start_task", "task_info": {"task_id": "t1", "buffer_id": "b1", "collector_cfg": {
        **cfg, "spaces": spaces}}}  # fmt: skip


DISCRETE = {"kind": "Discrete", "n": 2, "start": 0}


@pytest.mark.parametrize(
    ("spaces", "code", "match"),
    [
        ({"observation": {"kind": "Text", "max_length": 8}, "action": DISCRETE}, Refusal.UNSUPPORTED_ENV, "Text"),
        (
            {"observation": {"kind": "Dict", "spaces": {"a": {"kind": "Dict", "spaces": {"b": DISCRETE}}}},
             "action": DISCRETE},
            Refusal.UNSUPPORTED_ENV,
            "nested Dict",
        ),
        (
            {"observation": DISCRETE,
             "action": {"kind": "Box", "shape": [2, 2], "dtype": "float32", "low": -1, "high": 1}},
            Refusal.UNSUPPORTED_ENV,
            "Box actions must be flat",
        ),
        ({"observation": {"kind": "Banana"}, "action": DISCRETE}, Refusal.BAD_COLLECTOR_CFG, "kind must be one of"),
        ({"observation": {"kind": "Discrete", "n": 0}, "action": DISCRETE}, Refusal.BAD_COLLECTOR_CFG, "n must be"),
        ("Pong", Refusal.BAD_COLLECTOR_CFG, "spaces must be a map"),
    ],
    ids=["Text", "nested Dict", "2-D Box actions", "unknown kind", "Discrete(0)", "not a map"],
)  # fmt: skip
def test_spaces_warren_does_not_carry_are_an_unsupported_env_and_malformed_ones_a_bad_collector_cfg(
    spaces: Any, code: Refusal, match: str
) -> None:
    # (protocol.md sections 3 and 7: spaces of a kind warren does not carry are "unsupported env",
    # whether the env has them or the task names them)
    with pytest.raises(TaskError, match=match) as refused:
        StartTask.from_wire(over_the_wire(_start_with_spaces(spaces)))
    assert refused.value.result == {"message": code.value}


def test_a_start_reply_carries_the_envs_spaces_in_their_canonical_form() -> None:
    spaces = Spaces(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6))
    reply = StartReply("w1", "t1", "p.collector.control.w1", "p.metadata.t1", spaces.to_wire())
    back = StartReply.from_wire(over_the_wire(reply.to_wire()))
    assert back == reply and Spaces.from_wire(back.spaces).digest == spaces.digest
    # (a reply without them, such as a DI-engine worker's, still reads)
    assert StartReply.from_wire({**reply.to_wire(), "spaces": None}).spaces is None


def test_start_reply_without_its_queues_is_an_error() -> None:
    with pytest.raises(TaskError, match="control_queue"):
        StartReply.from_wire({"worker_id": "w", "task_id": "t", "metadata_queue": "q"})


def test_every_refusal_code_a_client_can_receive_is_documented() -> None:
    documented = set(re.findall(r'"([a-z_ ]+)"', DOC))
    missing = {r.value for r in Refusal} - documented
    assert not missing, f"docs/protocol.md does not mention {sorted(missing)}"
    # and the codes are the literal strings DI-engine clients compare against
    assert Refusal.WORKER_BUSY.value == "worker busy"
    assert Refusal.TASK_NAME_ERROR.value == "task name error"
