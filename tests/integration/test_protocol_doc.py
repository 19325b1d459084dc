"""docs/protocol.md as a third-party client reads it, checked against warren.

How to declare every queue: do that, then let warren declare its own, and the broker must
find them equal (a mismatch is PRECONDITION_FAILED). How to write spaces and compute their
digest: the doc's worked examples, hashed the way the doc says, and a task whose spaces
are written another way still gets policy files named by the doc's digest accepted."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import msgpack
import pika
import pytest

from messaging import BrokerLink, ConfigurationError, Names, QueueTypeMismatch, Settings
from messaging.rpc_client import RpcClient
from tests.procs import Proc, role_env, wait_for_queue
from tests.rl_builders import bound
from tests.tasks import drain_data_tasks, start_task
from worker.plugins import Spaces
from worker.storage import PolicyStore

pytestmark = pytest.mark.rabbitmq

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


#: The declarations blocks of the doc, in order: one per queue type.
QUEUE_TYPES = ("classic", "quorum")


def documented_declarations(queue_type: str) -> list[tuple[str, str, set[str], dict[str, Any]]]:
    """``(kind, name, flags, arguments)`` of every line of the doc's declarations block for ``queue_type``."""
    blocks = re.findall(
        r"`WARREN_QUEUE_TYPE=(\w+)`[^\n]*(?:\n[^\n`]+)*\n\n```text\nqueue +flags +arguments\n(.*?)```",
        DOC.read_text(),
        re.DOTALL,
    )
    found = dict(blocks)
    assert sorted(found) == sorted(QUEUE_TYPES), f"docs/protocol.md declarations blocks: {sorted(found)}"
    rows = []
    for line in found[queue_type].splitlines():
        kind = "exchange" if line.startswith("exchange ") else "queue"
        name, flags, arguments = re.split(r"\s{2,}", line.removeprefix("exchange ").strip())
        args: dict[str, Any] = {}
        for pair in arguments.split() if arguments != "-" else []:
            key, value = pair.split("=", 1)
            args[key] = int(value) if value.isdigit() else value
        rows.append((kind, name, set(flags.split()) - {"-"}, args))
    return rows


def _concrete(text: str, prefix: str) -> str:
    return re.sub(r"<[a-z_]+>", "doc1", text.replace("P.", f"{prefix}."))


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_every_queue_declared_as_documented_is_what_warren_declares(settings: Settings, queue_type: str) -> None:
    settings = settings.replace(queue_type=queue_type)
    declarations = documented_declarations(queue_type)
    assert {name for _, name, _, _ in declarations} >= {
        "P.collector.tasks", "P.collector.control.<id>", "P.metadata.<task_id>", "P.learner.<buffer_id>",
        "P.reply.<client_id>", "P.dead-letter", "P.dlx", "P.collector.roster",
    }  # fmt: skip
    # (the doc says where each control queue is bound: to the roster every resource broadcast goes to)
    assert re.search(r"control queue is bound to `P\.collector\.roster`", DOC.read_text())
    names = Names.of(settings)
    # Given a client that declares everything exactly as the doc says, on its own connection
    connection = pika.BlockingConnection(pika.URLParameters(settings.amqp_url))
    try:
        channel = connection.channel()
        for kind, name, flags, args in declarations:
            concrete = _concrete(name, settings.prefix)
            arguments = {k: _concrete(v, settings.prefix) if isinstance(v, str) else v for k, v in args.items()}
            if kind == "exchange":
                channel.exchange_declare(concrete, exchange_type="fanout", durable="durable" in flags)
            else:
                channel.queue_declare(
                    concrete,
                    durable="durable" in flags,
                    exclusive="exclusive" in flags,
                    auto_delete="auto-delete" in flags,
                    arguments=arguments,
                )
        control = names.collector_control("doc1")
        channel.queue_bind(control, names.collector_roster)
        # When warren declares the same queues (the control queue, its exchange and binding
        # included), nothing differs
        channel.queue_declare(control, passive=True)
        with BrokerLink(settings, "doc-check") as link:
            link.declare(names.collector_control_decl("doc1"), remember=False)
            link.declare(names.collector_tasks_decl())
            link.declare(names.learner_data_decl("doc1"))
            link.declare(
                names.metadata_decl(
                    "doc1",
                    max_length=Settings().metadata_queue_length,
                    expires_s=Settings().metadata_queue_expires_s,
                )
            )
            link.declare(names.reply_decl("doc1", expires_s=Settings().reply_queue_expires_s))
            link.declare(names.dead_letter_queue_decl())
            # and a request published to the roster reaches the control queue the doc's client declared
            link.publish("", b"\x80", exchange=names.collector_roster, mandatory=False)
        method, _, body = channel.basic_get(control, auto_ack=True)
        assert method is not None and body == b"\x80", "a roster broadcast did not reach the control queue"
        decl = names.collector_control_decl("doc1")
        channel.queue_declare(
            decl.name,
            durable=decl.durable,
            exclusive=decl.exclusive,
            auto_delete=decl.auto_delete,
            arguments=decl.arguments,
        )
    finally:
        connection.close()
    # and a client's reply queue is declared the same way by warren's own RPC client
    with RpcClient(settings, "doc1") as client:
        assert client.reply_queue.startswith(f"{settings.prefix}.reply.doc1-")
    # and the long-lived durable queues are of the documented type, the others (a task's
    # metadata queue too) classic
    durable = {name for kind, name, flags, _ in declarations if kind == "queue" and "durable" in flags}
    durable.discard("P.metadata.<task_id>")
    for kind, name, _, args in declarations:
        if kind == "queue":
            wanted = queue_type if name in durable else "classic"
            assert args.get("x-queue-type", "classic") == wanted, name


def test_a_queue_of_the_other_type_is_refused_with_a_message_naming_queue_and_setting(settings: Settings) -> None:
    # Given the task queue declared classic (a deployment started without WARREN_QUEUE_TYPE)
    with BrokerLink(settings, "doc-classic") as link:
        link.declare(Names.of(settings).collector_tasks_decl())
        # When a process of the same deployment declares it as quorum
        quorum = settings.replace(queue_type="quorum")
        with pytest.raises(QueueTypeMismatch) as refused:
            link.declare(Names.of(quorum).collector_tasks_decl())
        link.delete_queue(Names.of(settings).collector_tasks)
    # Then the error says which queue, and which setting to make agree
    assert Names.of(settings).collector_tasks in refused.value.message
    assert "WARREN_QUEUE_TYPE" in refused.value.message
    assert isinstance(refused.value, ConfigurationError)


# -- section 7: spaces and their digest ---------------------------------------------------


def spaces_section() -> str:
    text = DOC.read_text()
    return text[text.index("## 7. Spaces") :]


def documented_examples() -> dict[str, tuple[dict[str, Any], str]]:
    """``{env id: (canonical spaces, digest)}`` of the section's worked examples."""
    section = spaces_section()
    examples = {}
    for env_id in ("ALE/Pong-v5", "CartPole-v1"):
        after = section[section.index(f"`{env_id}`") :]
        block = re.search(r"```json\n(.*?)```", after, re.DOTALL)
        digest = re.search(r"digest `([0-9a-f]{16})`", after)
        assert block is not None and digest is not None, env_id
        examples[env_id] = (json.loads(block.group(1)), digest.group(1))
    return examples


def digest_as_the_doc_says(canonical: dict[str, Any]) -> tuple[bytes, str]:
    """The bytes and the digest of canonical spaces, computed from the doc's recipe alone (not warren's code)."""

    def sorted_keys(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: sorted_keys(value[key]) for key in sorted(value)}
        if isinstance(value, list):
            return [sorted_keys(item) for item in value]
        return value

    body = msgpack.packb(sorted_keys(canonical), use_bin_type=True)
    return body, hashlib.sha256(body).hexdigest()[:16]


def test_the_worked_examples_of_spaces_hash_to_the_documented_digests_as_warren_computes_them() -> None:
    examples = documented_examples()
    for env_id, (canonical, digest) in examples.items():
        # Given a third party that writes the canonical form and hashes it as the doc says
        _, computed = digest_as_the_doc_says(canonical)
        # Then it gets the doc's digest, and so does warren, for the doc's form and the env's own spaces
        assert computed == digest, env_id
        assert Spaces.from_wire(canonical).digest == digest and Spaces.from_wire(canonical).to_wire() == canonical
    cartpole = gym.make("CartPole-v1")
    assert Spaces(cartpole.observation_space, cartpole.action_space).to_wire() == examples["CartPole-v1"][0]
    # and the bytes the doc lists are the bytes hashed, byte for byte
    pong, _ = examples["ALE/Pong-v5"]
    dump = re.search(r"The 89 bytes hashed.*?```text\n(.*?)```", spaces_section(), re.DOTALL)
    assert dump is not None
    assert bytes.fromhex(dump.group(1)) == digest_as_the_doc_says(pong)[0]


def pong_as_written_elsewhere(pong: dict[str, Any]) -> list[dict[str, Any]]:
    """The other writings of Pong's spaces the doc names: float bounds, an infinite high bound, no start."""
    observation, action = pong["observation"], pong["action"]
    return [
        {"observation": {**observation, "low": 0.0, "high": 255.0}, "action": action},
        {"observation": {**observation, "high": "inf"}, "action": action},
        {"observation": observation, "action": {"kind": "Discrete", "n": action["n"]}},
    ]


def test_every_writing_of_pongs_spaces_the_doc_names_has_the_documented_digest() -> None:
    pong, digest = documented_examples()["ALE/Pong-v5"]
    for writing in pong_as_written_elsewhere(pong):
        # (its own bytes hash to something else: the digest is of the canonical form only)
        assert digest_as_the_doc_says(writing)[1] != digest
        assert Spaces.from_wire(writing).digest == digest
        assert Spaces.from_wire(writing).to_wire() == pong


@pytest.fixture
def pong_worker(settings: Settings, link: BrokerLink, tmp_path: Path) -> Iterator[Path]:
    pytest.importorskip("ale_py")
    for folder in ("data", "policy"):
        (tmp_path / folder).mkdir()
    worker = Proc(
        ["collector", "--worker-id", "doc1", "--policy-wait-s", "20", "--data-wait-s", "20"],
        env=role_env(settings, WARREN_PATH_DATA=str(tmp_path / "data"), WARREN_PATH_POLICY=str(tmp_path / "policy")),
        log=tmp_path / "worker.log",
    )
    try:
        wait_for_queue(link, Names(settings.prefix).collector_control("doc1"))
        yield tmp_path
    finally:
        worker.kill()


def test_a_pong_task_with_float_bounds_accepts_a_policy_file_named_by_the_documented_digest(
    pong_worker: Path, settings: Settings
) -> None:
    pong, digest = documented_examples()["ALE/Pong-v5"]
    float_bounds = pong_as_written_elsewhere(pong)[0]
    model = {"features": 8}
    # Given a third party's policy file for Pong, named by the digest the doc gives
    spaces = Spaces.from_wire(pong)
    net = bound("dqn", spaces, model, model_name="nature_cnn").q_network(0)  # type: ignore[attr-defined]
    PolicyStore(pong_worker / "policy").write(
        "pong", net.state_dict(), 7, {"algorithm": "dqn", "spaces_digest": digest}
    )
    # When it starts a task whose spaces carry float bounds
    cfg = {
        "env": {"id": "ALE/Pong-v5", "env_num": 1, "seed": 0},
        "policy": {"type": "dqn", "model": "nature_cnn", "model_config": model},
        "spaces": float_bounds,
        "n_sample": 24,
        "traj_len": 8,
        "collect_setting": {"eps": 0.5},
        "policy_update_path": "pong",
    }
    with RpcClient(settings, "doc-pong") as client:
        started = client.call(Names(settings.prefix).collector_tasks, start_task("pong-1", cfg), timeout_s=60)
        items = drain_data_tasks(client, started["control_queue"])
        client.call(started["control_queue"], {"name": "collector_close_task", "task_id": "pong-1"})
    # Then the worker acted with that policy file: every chunk names its version, and no error
    assert started["spaces"] == pong  # (the start reply carries the env's spaces in their canonical form)
    data = [item for item in items if "data_id" in item]
    assert data and {item["policy_iter"] for item in data} == {7}
    assert "error" not in items[-1] and sum(item["sample_count"] for item in data) >= 24
