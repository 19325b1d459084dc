"""Where a running collector's output goes: step files on the volume, metadata to the broker."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from messaging import MetadataPublisher
from worker.protocol import DataItem, InfoItem
from worker.storage import StepStore
from worker.telemetry.collector import TaskMeter, installed

#: Longest wait for the broker to confirm a task's data before its done info, and then the
#: done info itself. A reader that stopped reading fails the publisher sooner (StreamStalled
#: after the collector's stall_timeout_s); a worker shutdown interrupts it (StreamStopped).
DONE_WAIT_S: Final = 600.0


class BrokerSink:
    """A :class:`worker.rl.rollout.SampleSink` writing files first, then confirmed metadata.

    The order is the guarantee: a ``data_id`` is published only after its file was
    atomically renamed into place, so every data metadata a reader sees names a complete
    file. Each message also carries ``task_id`` and ``buffer_id``, so a coordinator
    reading the stream straight from the broker needs nothing else.

    Metadata is published without waiting for the broker, except around the info that
    ends the task (``collector_done``): it goes out once every message before it is
    confirmed, since a message refused by a full queue can be overtaken, and the task
    ends once it is confirmed itself. ``done_wait_s`` bounds each of those two waits.

    ``meter`` counts what the sink writes and publishes for ``/metrics``; by default the
    process's (:func:`worker.telemetry.collector.installed`: no-op without metrics).
    """

    def __init__(
        self,
        store: StepStore,
        publisher: MetadataPublisher,
        *,
        task_id: str,
        buffer_id: str,
        done_wait_s: float = DONE_WAIT_S,
        meter: TaskMeter | None = None,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.task_id = task_id
        self.buffer_id = buffer_id
        self.done_wait_s = done_wait_s
        self.written: list[str] = []
        """The data ids of the step files written so far."""
        self.meter = meter if meter is not None else installed().task_meter()

    def add_chunk(self, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        # Random, not derived from the task: a task run twice (a redelivered start) must not
        # reuse names, or the learner would take the second run's chunks for duplicates.
        data_id = f"chunk_{uuid.uuid4().hex}"
        item = DataItem(data_id=data_id, task_id=self.task_id, buffer_id=self.buffer_id, **meta)
        path = self.store.write(data_id, samples)
        self.written.append(data_id)
        self.meter.chunk_written(path, meta)
        self.publisher.publish(item.to_wire(), headers={"kind": "data"})
        self.meter.chunk_published()

    def add_info(self, info: dict[str, Any]) -> None:
        item = InfoItem(task_id=self.task_id, buffer_id=self.buffer_id, **info)
        if item.collector_done:
            self.publisher.flush(self.done_wait_s)
            self.meter.confirmed()
        self.publisher.publish(item.to_wire(), headers={"kind": "info"})
        self.meter.info(info)
        if item.collector_done:
            self.publisher.flush(self.done_wait_s)
