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
    file. Each message also carries ``task_id`` and ``buffer_id``, so a coordinator
    reading the stream straight from the broker needs nothing else.
    """

    def __init__(self, store: StepStore, publisher: MetadataPublisher, *, task_id: str, buffer_id: str) -> None:
        self.store = store
        self.publisher = publisher
        self.task_id = task_id
        self.buffer_id = buffer_id
        self.files_written = 0

    def add_samples(self, env_id: int, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        data_id = f"env_{env_id}_{uuid.uuid1().hex}"
        item = DataItem(data_id=data_id, task_id=self.task_id, buffer_id=self.buffer_id, **meta)
        self.store.write(data_id, samples)
        self.files_written += 1
        self.publisher.publish(item.to_wire(), headers={"kind": "data"})

    def add_info(self, info: dict[str, Any]) -> None:
        item = InfoItem(task_id=self.task_id, buffer_id=self.buffer_id, **info)
        self.publisher.publish(item.to_wire(), headers={"kind": "info"})
