"""docs/protocol.md says how a third-party client must declare every queue: do that, then let
warren declare its own, and the broker must find them equal (a mismatch is PRECONDITION_FAILED)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pika
import pytest

from messaging import BrokerLink, Names, Settings
from messaging.rpc_client import RpcClient

pytestmark = pytest.mark.rabbitmq

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def documented_declarations() -> list[tuple[str, str, set[str], dict[str, Any]]]:
    """``(kind, name, flags, arguments)`` of every line of the declarations block in the doc."""
    block = re.search(r"```text\nqueue +flags +arguments\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert block is not None, "docs/protocol.md lost its declarations block"
    rows = []
    for line in block.group(1).splitlines():
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


def test_every_queue_declared_as_documented_is_what_warren_declares(settings: Settings) -> None:
    declarations = documented_declarations()
    assert {name for _, name, _, _ in declarations} >= {
        "P.collector.tasks", "P.collector.control.<id>", "P.metadata.<task_id>", "P.learner.<buffer_id>",
        "P.reply.<client_id>", "P.dead-letter", "P.dlx",
    }  # fmt: skip
    names = Names(settings.prefix)
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
        # When warren declares the same queues (the exclusive one on the same connection:
        # it is the worker's own), nothing differs
        channel.queue_declare(names.collector_control("doc1"), passive=True)
        with BrokerLink(settings, "doc-check") as link:
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
