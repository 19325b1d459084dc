"""The metadata stream on the real broker: order, acks, redelivery, back-pressure."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from messaging import (
    BrokerLink,
    ConfirmedPublisher,
    MetadataConsumer,
    MetadataPublisher,
    Names,
    PublishTimeout,
    Settings,
    StreamStalled,
    StreamStopped,
    decode,
)
from tests import broker_admin

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def confirmed(settings: Settings) -> Iterator[ConfirmedPublisher]:
    with ConfirmedPublisher(settings, "test-stream") as publisher:
        yield publisher


def _publisher(confirmed: ConfirmedPublisher, task_id: str, length: int = 1000) -> MetadataPublisher:
    decl = Names(confirmed.settings.prefix).metadata_decl(task_id, max_length=length, expires_s=60)
    return MetadataPublisher(confirmed, decl)


def test_messages_arrive_in_publish_order(settings: Settings, confirmed: ConfirmedPublisher) -> None:
    publisher = _publisher(confirmed, "order")
    for i in range(200):
        publisher.publish({"data_id": f"d{i}", "policy_iter": i})
    publisher.flush(10)
    publisher.publish({"collector_done": True, "cur_episode": 1, "cur_sample": 200, "cur_step": 200})
    publisher.flush(10)
    with BrokerLink(settings, "reader") as reader_link:
        consumer = MetadataConsumer(reader_link, publisher.queue, prefetch=32)
        seen = []
        while (item := consumer.get(2.0)) is not None:
            seen.append(item.message)
            item.ack()
    assert [m["policy_iter"] for m in seen[:-1]] == list(range(200))
    assert seen[-1]["collector_done"] is True


def test_unacked_messages_are_redelivered_after_the_consumers_connection_closes(
    settings: Settings, confirmed: ConfirmedPublisher
) -> None:
    publisher = _publisher(confirmed, "redeliver")
    for i in range(5):
        publisher.publish({"i": i})
    publisher.flush(10)
    # Given a consumer that took three messages, acked the first only, and died
    first = BrokerLink(settings, "reader-1")
    consumer = MetadataConsumer(first, publisher.queue, prefetch=3)
    items = [consumer.get(2.0) for _ in range(3)]
    assert [it.message["i"] for it in items if it] == [0, 1, 2]
    assert items[0] is not None
    items[0].ack()
    first.process_events(0.2)  # flush the ack before the "crash"
    first.close()
    # When another consumer reads, then it gets the unacked ones again, flagged, in order
    with BrokerLink(settings, "reader-2") as second:
        again = MetadataConsumer(second, publisher.queue, prefetch=10)
        rest = []
        while (item := again.get(2.0)) is not None:
            rest.append((item.message["i"], item.redelivered))
            item.ack()
    # 0 was acked and never comes back; 1 and 2 come back flagged as redelivered, in order.
    # (3 may have been prefetched by the first consumer after the ack, so its flag can be either.)
    assert [i for i, _ in rest] == [1, 2, 3, 4]
    assert rest[0][1] and rest[1][1]
    assert rest[3] == (4, False)


def test_full_queue_holds_the_message_back_until_someone_reads(
    settings: Settings, confirmed: ConfirmedPublisher
) -> None:
    # Given a full queue of 3
    publisher = _publisher(confirmed, "full", length=3)
    for i in range(3):
        publisher.publish({"i": i})
    publisher.flush(10)
    # When a fourth is published, it is held back: refused by the queue, not confirmed
    publisher.publish({"i": 3})
    with pytest.raises(PublishTimeout):
        publisher.flush(1.0)
    assert confirmed.unconfirmed == 1 and confirmed.nacks >= 1
    # Then it goes through once a reader makes room, after the ones before it
    with BrokerLink(settings, "reader") as reader_link:
        consumer = MetadataConsumer(reader_link, publisher.queue, prefetch=1)
        item = consumer.get(2.0)
        assert item is not None and item.message == {"i": 0}
        item.ack()
        publisher.flush(10)
        got = []
        while (nxt := consumer.get(1.0)) is not None:
            got.append(nxt.message["i"])
            nxt.ack()
    assert got == [1, 2, 3]


def test_a_blocked_publisher_gives_up_when_stopped(settings: Settings, link: BrokerLink) -> None:
    # Given a full queue of 1 and a publisher whose window (2) fills with refused messages
    decl = Names(settings.prefix).metadata_decl("stop", max_length=1, expires_s=60)
    stop = threading.Event()
    confirmed = ConfirmedPublisher(settings, "test-stop", window=2).open()
    try:
        publisher = MetadataPublisher(confirmed, decl, stop=stop)
        publisher.publish({"i": 0})
        publisher.flush(10)
        publisher.publish({"i": 1})
        publisher.publish({"i": 2})
        # When the stop event is set while the next publish waits for room
        threading.Timer(0.5, stop.set).start()
        started = time.monotonic()
        with pytest.raises(StreamStopped):
            publisher.publish({"i": 3})
        # Then it gives up promptly, and flush() does too
        assert 0.4 < time.monotonic() - started < 5
        with pytest.raises(StreamStopped):
            publisher.flush(10)
    finally:
        confirmed.close(timeout_s=0.1)  # the two refused messages are dropped
    assert link.queue_depth(decl.name) == 1


def test_a_queue_nobody_reads_stalls_the_stream(settings: Settings) -> None:
    decl = Names(settings.prefix).metadata_decl("stall", max_length=2, expires_s=60)
    with ConfirmedPublisher(settings, "test-stall", window=4, stall_timeout_s=1.0) as confirmed:
        publisher = MetadataPublisher(confirmed, decl)
        started = time.monotonic()
        with pytest.raises(StreamStalled, match=decl.name):
            for i in range(100):
                publisher.publish({"i": i})
        assert time.monotonic() - started < 5


def test_malformed_metadata_is_dead_lettered_not_returned(
    settings: Settings, link: BrokerLink, confirmed: ConfirmedPublisher
) -> None:
    publisher = _publisher(confirmed, "bad")
    link.publish(publisher.queue, b"\xc1 not msgpack", persistent=True)
    link.publish(publisher.queue, b"\x93\x01\x02\x03", persistent=True)  # valid msgpack, not a map
    publisher.publish({"i": "good"})
    publisher.flush(10)
    with BrokerLink(settings, "reader") as reader_link:
        consumer = MetadataConsumer(reader_link, publisher.queue)
        item = consumer.get(2.0)
        assert item is not None and item.message == {"i": "good"}
        item.ack()
        assert consumer.dead_lettered == 2
    dead_letters = Names(settings.prefix).dead_letter_queue
    # Dead-lettering happens inside the broker after the nack: wait for it to land.
    broker_admin.wait_until(lambda: link.queue_depth(dead_letters) == 2, 5, "two dead letters")


def test_get_one_reuses_one_channel_however_often_it_is_called(
    settings: Settings, link: BrokerLink, confirmed: ConfirmedPublisher
) -> None:
    # Given a few hundred messages
    publisher = _publisher(confirmed, "one-by-one", length=5000)
    count = 300
    for i in range(count):
        publisher.publish({"i": i})
    publisher.flush(10)
    # When a reader takes them one get_one at a time, acking each
    seen = []
    with BrokerLink(settings, "one-by-one-reader") as reader:
        for _ in range(count):
            delivery = reader.get_one(publisher.queue, 5.0)
            assert delivery is not None
            seen.append(decode(delivery.envelope.body)["i"])
            delivery.ack()
        # Then every one arrives, in order; and the connection outlives more calls than it
        # has channels (2047): a channel per call would make the broker refuse the next one
        for _ in range(2100 - count):
            assert reader.get_one(publisher.queue, 0.0) is None
    assert seen == list(range(count))
    assert link.queue_depth(publisher.queue) == 0
