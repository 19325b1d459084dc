"""docs/protocol.md says how a third-party client must declare every queue: do that, then let
warren declare its own, and the broker must find them equal (a mismatch is PRECONDITION_FAILED)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pika
import pytest

from messaging import BrokerLink, ConfigurationError, Names, QueueTypeMismatch, Settings
from messaging.rpc_client import RpcClient

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
