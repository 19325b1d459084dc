"""The relay of data metadata from the task streams to the learner's queue.

Each data item read from a task's stream is published on to the learner's queue without
waiting, and the stream's copy is acked only once the broker confirmed the learner's:
one confirm wait per coordinator turn for everything forwarded in it. Nothing is lost if
the coordinator dies in between (the learner may then see an item twice and recognises
it by its ``data_id``); if the confirm fails, the items go back to their streams and are
forwarded again.
"""

from __future__ import annotations

from messaging import MessagingError, MetadataItem
from worker.coordinator.bus import CoordinatorBus

#: How long the broker may take to confirm a turn's forwarded data.
CONFIRM_S = 30.0


class DataRelay:
    """Forwards data items to the learner's queue; acks them once the copies are confirmed."""

    def __init__(self, bus: CoordinatorBus, learner_queue: str) -> None:
        self.bus = bus
        self.learner_queue = learner_queue
        self._unconfirmed: list[MetadataItem] = []

    def forward(self, item: MetadataItem) -> None:
        """Publish the item's body to the learner's queue; it is acked by :meth:`settle`."""
        self.bus.forward(self.learner_queue, item.delivery.envelope.body)
        self._unconfirmed.append(item)

    def settle(self) -> None:
        """Wait for the confirms of everything forwarded so far, then ack the stream items.

        Raises:
            MessagingError: not confirmed in time, or the relay failed (the items were requeued).
        """
        if not self._unconfirmed:
            return
        items, self._unconfirmed = self._unconfirmed, []
        try:
            self.bus.confirm_forwarded(CONFIRM_S)
        except MessagingError:
            for item in items:
                item.requeue()
            raise
        for item in items:
            item.ack()
