"""Queue declarations under each queue type, and the failover order of several broker nodes."""

from __future__ import annotations

import pytest

from messaging import Names, QueueDecl, QueueTypeMismatch, Settings
from messaging.connection import broker_addresses, failover_order, first_node, node_address, translate
from messaging.topology import QUORUM_REFUSED_ARGS


def _durable_decls(names: Names) -> list[QueueDecl]:
    return [
        names.collector_tasks_decl(),
        names.learner_data_decl("main"),
        names.dead_letter_queue_decl(),
    ]


def test_classic_declarations_carry_no_queue_type() -> None:
    for decl in [*_durable_decls(Names("p")), Names("p").metadata_decl("t1", max_length=8, expires_s=60)]:
        assert decl.durable and "x-queue-type" not in decl.arguments


def test_quorum_declares_the_long_lived_durable_queues_as_quorum_with_balanced_leaders() -> None:
    names = Names.of(Settings(prefix="p", queue_type="quorum"))
    for decl in _durable_decls(names):
        assert decl.arguments["x-queue-type"] == "quorum"
        assert decl.arguments["x-queue-leader-locator"] == "balanced"
        assert decl.durable and not decl.exclusive and not decl.auto_delete
        assert not QUORUM_REFUSED_ARGS & set(decl.arguments)
    # A refused argument given to a durable queue is dropped for quorum only
    assert "x-max-priority" not in names.durable_decl("q", {"x-max-priority": 5}).arguments
    assert Names("p").durable_decl("q", {"x-max-priority": 5}).arguments == {"x-max-priority": 5}


def test_a_tasks_metadata_queue_stays_classic_under_quorum_and_keeps_its_bounds_and_dead_lettering() -> None:
    names = Names.of(Settings(prefix="p", queue_type="quorum"))
    metadata = names.metadata_decl("t1", max_length=8, expires_s=60)
    assert metadata == Names("p").metadata_decl("t1", max_length=8, expires_s=60)
    assert "x-queue-type" not in metadata.arguments and metadata.durable and not metadata.auto_delete
    assert metadata.arguments["x-max-length"] == 8
    assert metadata.arguments["x-overflow"] == "reject-publish"
    assert metadata.arguments["x-dead-letter-exchange"] == "p.dlx"
    assert metadata.arguments["x-expires"] == 60_000


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


def test_without_a_loss_connections_start_at_the_first_node_asked_for() -> None:
    assert failover_order(["a", "b", "c"], None, 1) == ["b", "c", "a"]
    assert failover_order(["a", "b", "c"], 0, 2) == ["b", "c", "a"]  # a loss wins over the first node


def test_given_node_order_starts_every_connection_at_the_first_url() -> None:
    settings = Settings(amqp_url="amqp://a/v,amqp://b/v,amqp://c/v", amqp_node_order="given")
    assert first_node(settings) == 0
    assert first_node(Settings(amqp_url="amqp://a/v")) == 0


def test_random_node_order_draws_one_node_per_process_and_spreads_processes_over_the_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import messaging.connection

    settings = Settings(amqp_url="amqp://a/v,amqp://b/v,amqp://c/v")
    # One draw per process: every connection of this process starts at the same node
    assert len({first_node(settings) for _ in range(20)}) == 1
    # and each new process (a fresh draw) may start anywhere: 60 draws miss a node once in 10**10
    draws = set()
    for _ in range(60):
        monkeypatch.setattr(messaging.connection, "_first_nodes", {})
        draws.add(first_node(settings))
    assert draws == {0, 1, 2}


def test_an_unknown_node_order_is_refused() -> None:
    from messaging import ConfigurationError

    with pytest.raises(ConfigurationError, match="amqp_node_order"):
        Settings(amqp_node_order="first")


def test_every_node_of_the_url_list_gets_its_own_parameters_and_address() -> None:
    settings = Settings(amqp_url="amqp://u:p@10.0.0.1:5673/v,amqps://u:p@broker-b/v")
    addresses = broker_addresses(settings, "role")
    assert [a.node for a in addresses] == ["10.0.0.1:5673", "broker-b:5671"]
    assert [a.index for a in addresses] == [0, 1]
    assert addresses[0].params.ssl_options is None and addresses[1].params.ssl_options is not None
    assert node_address("amqp://localhost/%2F") == "localhost:5672"


def test_a_quorum_queue_of_an_older_warren_without_leader_placement_is_a_configuration_error() -> None:
    import pika.exceptions

    from messaging import ConfigurationError

    refusal = pika.exceptions.ChannelClosedByBroker(
        406,
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-leader-locator' for queue 'p.collector.tasks' in vhost "
        "'/': received 'balanced' but current is 'none'",
    )
    error = translate(refusal, "declaring queue p.collector.tasks")
    assert isinstance(error, ConfigurationError)
    assert "p.collector.tasks" in error.message and "WARREN_PREFIX" in error.message
