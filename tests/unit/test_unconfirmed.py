"""The publisher's bookkeeping without a broker: the window and the outbox's publish order."""

from __future__ import annotations

import threading
import time

import pika
import pytest

from messaging import ConnectionClosed, PublishTimeout, QueueNotFound, StreamStopped
from messaging.unconfirmed import (
    NACKS_BEFORE_REOPEN,
    SENDING_DECREASE,
    NackStreak,
    Outbox,
    Outgoing,
    SendingWindow,
    UnconfirmedWindow,
)


def _messages(*seqs: int) -> list[Outgoing]:
    return [Outgoing(seq, "q", str(seq).encode(), pika.BasicProperties()) for seq in seqs]


def _send_all(outbox: Outbox) -> list[int]:
    sent: list[int] = []
    outbox.send(lambda message: sent.append(message.seq))
    return sent


def test_the_outbox_sends_in_order_and_numbers_deliveries_from_one_per_channel() -> None:
    outbox = Outbox()
    outbox.add(_messages(0, 1, 2))
    assert _send_all(outbox) == [0, 1, 2]
    assert [m.seq for m in outbox.confirmed(2, multiple=True)] == [0, 1]  # tags 1 and 2
    assert [m.seq for m in outbox.confirmed(3, multiple=False)] == [2]
    assert len(outbox) == 0


def test_refused_messages_hold_newer_ones_back_and_go_first_when_retried() -> None:
    # Given five sent messages of which the broker refused 1 and 3
    outbox = Outbox()
    outbox.add(_messages(0, 1, 2, 3, 4))
    _send_all(outbox)
    outbox.confirmed(1, multiple=False)
    outbox.refused.extend(outbox.confirmed(2, multiple=False))
    outbox.confirmed(3, multiple=False)
    outbox.refused.extend(outbox.confirmed(4, multiple=False))
    # When newer ones arrive, they wait while refused ones do
    outbox.add(_messages(5, 6))
    assert _send_all(outbox) == []
    # Then a retry sends the refused ones first, in publish order, then the newer ones
    outbox.retry_refused()
    assert _send_all(outbox) == [1, 3, 5, 6]


def test_after_a_lost_channel_everything_unconfirmed_is_sent_again_in_publish_order() -> None:
    outbox = Outbox()
    outbox.add(_messages(0, 1, 2, 3))
    _send_all(outbox)
    outbox.refused.extend(outbox.confirmed(1, multiple=False))  # 0 refused, 1..3 in flight
    outbox.confirmed(3, multiple=False)  # 2 confirmed
    outbox.add(_messages(4))
    outbox.resend_all()
    outbox.new_channel()
    assert _send_all(outbox) == [0, 1, 3, 4]
    assert [m.seq for m in outbox.confirmed(4, multiple=True)] == [0, 1, 3, 4]


def test_a_publish_that_raises_leaves_the_message_first_in_line() -> None:
    outbox = Outbox()
    outbox.add(_messages(0, 1))

    def closing_channel(message: Outgoing) -> None:
        if message.seq == 1:
            raise RuntimeError("channel closing")

    with pytest.raises(RuntimeError):
        outbox.send(closing_channel)
    assert outbox.waiting == 1
    assert _send_all(outbox) == [1]
    assert [m.seq for m in outbox.confirmed(2, multiple=False)] == [1]  # numbering went on from 2


def _put(window: UnconfirmedWindow, stop: threading.Event | None = None) -> bool:
    return window.put("q", b"x", pika.BasicProperties(), stop=stop)


def test_the_window_asks_for_one_wake_up_per_burst_and_numbers_messages() -> None:
    window = UnconfirmedWindow(10, "test", id_prefix="p-")
    assert _put(window) is True
    assert _put(window) is False  # the I/O thread has not taken the first one yet
    taken = window.take_new()
    assert [m.properties.message_id for m in taken] == ["p-0", "p-1"]
    assert _put(window) is True
    assert window.unconfirmed == 3


def test_a_full_window_blocks_until_a_confirm_or_the_stop_event() -> None:
    window = UnconfirmedWindow(1, "test", id_prefix="p-")
    _put(window)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(StreamStopped):
        _put(window, stop)
    assert 0.15 < time.monotonic() - started < 2
    threading.Timer(0.1, window.confirmed, args=(1,)).start()
    _put(window)  # room after the confirm, no stop event needed
    assert window.unconfirmed == 1


def test_waiting_for_confirms_times_out_and_failures_are_raised_to_every_waiter() -> None:
    window = UnconfirmedWindow(4, "test", id_prefix="p-")
    _put(window)
    with pytest.raises(PublishTimeout):
        window.wait_confirmed(0.05, stop=None)
    assert window.fail(QueueNotFound("publishing to q: gone")) is True
    assert window.fail(QueueNotFound("second")) is False  # the first failure wins
    for _ in range(2):
        with pytest.raises(QueueNotFound, match="gone"):
            window.wait_confirmed(1.0, stop=None)
    with pytest.raises(QueueNotFound):
        _put(window)


def test_a_closed_window_refuses_messages_and_counts_the_dropped_ones() -> None:
    window = UnconfirmedWindow(4, "test", id_prefix="p-")
    _put(window)
    _put(window)
    assert window.close() == 2
    with pytest.raises(ConnectionClosed):
        _put(window)


def test_the_outbox_counts_what_awaits_a_confirm_on_the_current_channel() -> None:
    outbox = Outbox()
    outbox.add(_messages(0, 1, 2))
    _send_all(outbox)
    outbox.refused.extend(outbox.confirmed(1, multiple=False))
    assert outbox.awaiting_confirm == 2  # 1 and 2: a new channel now would send them twice
    outbox.confirmed(3, multiple=True)
    assert outbox.awaiting_confirm == 0


def test_a_nack_streak_asks_for_a_new_channel_after_the_limit_and_an_ack_resets_it() -> None:
    # Given a streak with the shipped limit (3 nacks in a row)
    streak = NackStreak()
    assert streak.limit == NACKS_BEFORE_REOPEN == 3
    # When nacks come with an ack in between, no reopen is due
    assert not streak.nacked() and not streak.nacked()
    streak.acked()
    assert not streak.nacked() and not streak.nacked()
    # When the third nack in a row comes (a multiple nack counts each message), then it is due
    assert streak.nacked()
    assert streak.due
    streak.reopened()
    # and a new channel starts a new streak
    assert (streak.count, streak.reopens, streak.due) == (0, 1, False)
    assert streak.nacked(messages=5) and streak.due


def test_a_nack_streak_needs_a_positive_limit() -> None:
    with pytest.raises(ValueError):
        NackStreak(0)


def test_the_outbox_sends_no_more_than_the_messages_allowed_in_flight() -> None:
    outbox = Outbox()
    outbox.add(_messages(0, 1, 2, 3, 4))
    sent: list[int] = []
    outbox.send(lambda message: sent.append(message.seq), in_flight=2)
    assert sent == [0, 1] and outbox.waiting == 3
    outbox.confirmed(1, multiple=False)  # one confirm: room for one more
    outbox.send(lambda message: sent.append(message.seq), in_flight=2)
    assert sent == [0, 1, 2] and outbox.next_tag == 4


def test_a_refused_burst_cuts_the_messages_in_flight_once_and_acks_grow_them_back() -> None:
    window = SendingWindow(128)
    assert window.limit == 128  # a queue that never refuses keeps the whole window
    # Given a burst of 128 sent (tags 1..128) into a full queue, nacked one by one
    for tag in range(9, 129):
        window.nacked(tag, next_tag=129)
    # Then it was one cut, not one per refused message
    cut = window.limit
    assert cut == int(128 * SENDING_DECREASE)
    # And a refusal of a message sent after the cut cuts again
    window.nacked(129, next_tag=140)
    assert window.limit == int(cut * SENDING_DECREASE)
    # While acks let the limit grow back by about one per limit's worth, never above the window
    before = window.limit
    window.acked(before)
    assert window.limit == before + 1
    for _ in range(10_000):
        window.acked(64)
    assert window.limit == 128


def test_the_sending_window_never_closes() -> None:
    window = SendingWindow(4)
    for tag in range(1, 200):
        window.nacked(tag, next_tag=tag + 1)
    assert window.limit == 1
