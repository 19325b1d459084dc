"""Start tasks run a second time, where nobody follows them, and closing them.

A start request redelivered after a broker restart or a node loss (the worker replied,
the broker went away before the ack) can start its task a second time: on the same
worker after it closed the first run, or on another one. That start's reply finds no
request waiting; left alone, the task would run for nobody until its worker's close
wait ran out, holding the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from messaging import MessagingError
from worker.coordinator.bus import CoordinatorBus
from worker.coordinator.task import Task
from worker.errors import TaskError
from worker.protocol import STARTED, StartReply, close_task

logger = logging.getLogger(__name__)


def close_strays(bus: CoordinatorBus, tasks: Mapping[str, Task], close_timeout_s: float) -> None:
    """Close every task that started where the coordinator does not follow it.

    The same task answered twice by the worker that runs it (it says "started" again) is
    not a stray. The close is sent without waiting for its reply.
    """
    for result in bus.stray_replies():
        if result.get("message") != STARTED:
            continue
        try:
            reply = StartReply.from_wire(result)
        except TaskError:
            continue
        tracked = tasks.get(reply.task_id)
        if tracked is not None and tracked.worker_id == reply.worker_id:
            continue
        logger.warning(
            "task %s also started on worker %s, where nobody follows it (its start request was delivered "
            "twice, as after a broker restart): closing it there",
            reply.task_id,
            reply.worker_id,
        )
        try:
            correlation_id = bus.send(reply.control_queue, close_task(reply.task_id), timeout_s=close_timeout_s)
            bus.abandon(correlation_id)
        except MessagingError as exc:
            logger.info("could not close the stray task %s: %s", reply.task_id, exc.message)
