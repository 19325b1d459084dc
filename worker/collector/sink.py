"""Where a running collector's output goes: step files on the volume, metadata to the broker."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from messaging import MetadataPublisher
from worker.protocol import DataItem, InfoItem
from worker.storage import StepStore


class BrokerSink:
    """A :class:`worker.rl.rollout.SampleSink` writing files first, then confirmed metadata.

    The order is the guarantee: a ``data_id`` is published only after its file was
    atomically renamed into place, so every data metadata a reader sees names a complete
    file. Publishing does not wait for the broker (confirms arrive in the background,
    see :class:`messaging.ConfirmedPublisher`), except before the info that ends the
    task: everything before it is confirmed first, so a reader that sees
    ``collector_done`` has been sent all of the task's data. Each message also carries
    ``task_id`` and ``buffer_id``, so a coordinator reading the stream straight from the
    broker needs nothing else.
    """

    def __init__(self, store: StepStore, publisher: MetadataPublisher, *, task_id: str, buffer_id: str) -> None:
        self.store = store
        self.publisher = publisher
        self.task_id = task_id
        self.buffer_id = buffer_id
        self.files_written = 0

    def add_chunk(self, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        # Random, not derived from the task: a task run twice (a redelivered start) must not
        # reuse names, or the learner would take the second run's chunks for duplicates.
        data_id = f"chunk_{uuid.uuid4().hex}"
        item = DataItem(data_id=data_id, task_id=self.task_id, buffer_id=self.buffer_id, **meta)
        self.store.write(data_id, samples)
        self.files_written += 1
        self.publisher.publish(item.to_wire(), headers={"kind": "data"})

    def add_info(self, info: dict[str, Any]) -> None:
        item = InfoItem(task_id=self.task_id, buffer_id=self.buffer_id, **info)
        if item.collector_done:
            self.publisher.flush()
        self.publisher.publish(item.to_wire(), headers={"kind": "info"})
