"""Deleting queues off the caller's thread, on the real broker (``messaging.QueueDeleter``)."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pytest

from messaging import BrokerLink, Names, QueueDeleter, Settings
from tests.broker_admin import wait_until

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def holder(settings: Settings) -> Iterator[pika.BlockingConnection]:
    """A raw connection of another client, to own an exclusive queue nobody else may delete."""
    conn = pika.BlockingConnection(pika.URLParameters(settings.amqp_urls[0]))
    yield conn
    if conn.is_open:
        conn.close()


def test_queues_asked_for_are_deleted_on_the_deleters_own_connection_and_counted(
    settings: Settings, link: BrokerLink
) -> None:
    names = Names.of(settings)
    queues = [names.metadata(f"t{i}") for i in range(5)]
    for queue in queues:
        link.declare(names.metadata_decl(queue.rsplit(".", 1)[1], max_length=8, expires_s=60), remember=False)
    deleter = QueueDeleter(settings, "test-deleter").start()
    # When five queues (and one asked twice, and one that does not exist) are handed over
    for queue in [*queues, queues[0], names.metadata("never-declared")]:
        deleter.request(queue)
    # Then all are deleted, each once, and nothing is left at the close
    wait_until(lambda: not any(link.queue_exists(q) for q in queues), 30, "the queues deleted")
    assert deleter.close(10.0) == []
    counts = deleter.counts
    assert (counts.requested, counts.deleted, counts.given_up, counts.pending) == (6, 6, 0, 0)


def test_a_queue_that_cannot_be_deleted_yet_is_retried_until_it_can(
    settings: Settings, link: BrokerLink, holder: pika.BlockingConnection
) -> None:
    queue = Names.of(settings).metadata("held")
    # Given a queue another connection holds exclusively (a delete from anyone else is refused)
    holder.channel().queue_declare(queue, exclusive=True)
    deleter = QueueDeleter(settings, "test-deleter").start()
    deleter.request(queue)
    wait_until(lambda: deleter.counts.retried >= 1, 30, "a refused attempt")
    assert deleter.pending() == [queue]
    # When the holder lets go (its exclusive queue goes with its connection)
    holder.close()
    # Then a retry finds it gone: done, nothing left
    wait_until(lambda: deleter.pending() == [], 30, "the retry")
    assert deleter.close(5.0) == []
    assert deleter.counts.deleted == 1 and deleter.counts.given_up == 0


def test_what_cannot_be_deleted_in_time_is_given_up_or_reported_at_the_close(
    settings: Settings, holder: pika.BlockingConnection
) -> None:
    names = Names.of(settings)
    channel = holder.channel()
    for name in ("held-1", "held-2"):
        channel.queue_declare(names.metadata(name), exclusive=True)
    # A queue refused for longer than give_up_s is given up (logged, counted)
    deleter = QueueDeleter(settings, "test-deleter", give_up_s=1.0).start()
    deleter.request(names.metadata("held-1"))
    wait_until(lambda: deleter.counts.given_up == 1, 30, "the give-up")
    assert deleter.pending() == []
    # and one still refused when the deleter closes is named as left, within the close's bound
    deleter.give_up_s = 600.0
    deleter.request(names.metadata("held-2"))
    assert deleter.close(1.5) == [names.metadata("held-2")]
    # A deleter that closed takes no more work
    deleter.request(names.metadata("late"))
    assert deleter.pending() == [names.metadata("held-2")]
