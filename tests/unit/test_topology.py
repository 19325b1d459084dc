"""Queue declarations under each queue type, and the failover order of several broker nodes."""

from __future__ import annotations

import pytest

from messaging import Names, QueueDecl, QueueTypeMismatch, Settings
from messaging.connection import broker_addresses, failover_order, node_address, translate
from messaging.topology import QUORUM_REFUSED_ARGS


def _durable_decls(names: Names) -> list[QueueDecl]:
    return [
        names.collector_tasks_decl(),
        names.learner_data_decl("main"),
        names.metadata_decl("t1", max_length=8, expires_s=60),
        names.dead_letter_queue_decl(),
    ]


def test_classic_declarations_carry_no_queue_type() -> None:
    for decl in _durable_decls(Names("p")):
        assert decl.durable and "x-queue-type" not in decl.arguments


def test_quorum_declares_every_durable_queue_as_quorum_and_keeps_bounds_and_dead_lettering() -> None:
    names = Names.of(Settings(prefix="p", queue_type="quorum"))
    for decl in _durable_decls(names):
        assert decl.arguments["x-queue-type"] == "quorum"
        assert decl.durable and not decl.exclusive and not decl.auto_delete
        assert not QUORUM_REFUSED_ARGS & set(decl.arguments)
    metadata = names.metadata_decl("t1", max_length=8, expires_s=60)
    assert metadata.arguments["x-max-length"] == 8
    assert metadata.arguments["x-overflow"] == "reject-publish"
    assert metadata.arguments["x-dead-letter-exchange"] == "p.dlx"
    # A refused argument given to a durable queue is dropped for quorum only
    assert "x-max-priority" not in names.durable_decl("q", {"x-max-priority": 5}).arguments
    assert Names("p").durable_decl("q", {"x-max-priority": 5}).arguments == {"x-max-priority": 5}


def test_control_and_reply_queues_stay_classic_under_quorum() -> None:
    names = Names("p", "quorum")
    control = names.collector_control_decl("w1")
    reply = names.reply_decl("c1", expires_s=300)
    assert "x-queue-type" not in control.arguments and control.auto_delete
    assert "x-queue-type" not in reply.arguments and not reply.durable


def test_redeclaring_a_classic_queue_as_quorum_is_a_configuration_error_naming_queue_and_setting() -> None:
    import pika.exceptions

    refusal = pika.exceptions.ChannelClosedByBroker(
        406,
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'p.collector.tasks' in vhost '/': "
        "received 'quorum' but current is 'classic'",
    )
    error = translate(refusal, "declaring queue p.collector.tasks")
    assert isinstance(error, QueueTypeMismatch)
    assert "p.collector.tasks" in error.message and "WARREN_QUEUE_TYPE" in error.message
    from messaging import ChannelError, ConfigurationError

    assert isinstance(error, ChannelError) and isinstance(error, ConfigurationError)


@pytest.mark.parametrize(
    ("lost", "order"),
    [(None, ["a", "b", "c"]), (0, ["b", "c", "a"]), (1, ["c", "a", "b"]), (2, ["a", "b", "c"])],
)
def test_after_losing_a_node_the_next_one_is_tried_first_and_the_lost_one_last(
    lost: int | None, order: list[str]
) -> None:
    assert failover_order(["a", "b", "c"], lost) == order


def test_every_node_of_the_url_list_gets_its_own_parameters_and_address() -> None:
    settings = Settings(amqp_url="amqp://u:p@10.0.0.1:5673/v,amqps://u:p@broker-b/v")
    addresses = broker_addresses(settings, "role")
    assert [a.node for a in addresses] == ["10.0.0.1:5673", "broker-b:5671"]
    assert [a.index for a in addresses] == [0, 1]
    assert addresses[0].params.ssl_options is None and addresses[1].params.ssl_options is not None
    assert node_address("amqp://localhost/%2F") == "localhost:5672"
