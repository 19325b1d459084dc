"""Each task's life: start request, metadata stream, close, and re-runs when a worker is lost.

:class:`TaskDriver` never blocks for long: requests are sent without waiting and their
replies polled, streams are read with a zero timeout, and every request has a deadline.
A worker that dies mid-task is noticed by its control queue vanishing (auto-delete, and
consumed only by the worker's connection) or by its silence; what it had already published is kept,
and the task's slot is filled again by the coordinator's scheduling.

It is one piece, over 400 lines: the steps of a task's life (start, stream, close, re-run)
hand the same task on to each other in one table, on the loop's thread, and each step
decides what the next one is; apart, they would share that table and its states anyway.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from messaging import BrokerConnectionError, MessagingError, MetadataItem, PublishRejected, QueueNotFound, RemoteError
from worker.coordinator.bus import CoordinatorBus
from worker.coordinator.relay import DataRelay
from worker.coordinator.stats import RunStats
from worker.coordinator.strays import close_strays
from worker.coordinator.task import Kind, State, Task, Timeouts
from worker.errors import TaskError
from worker.protocol import (
    CollectorSpec,
    DataItem,
    FinishInfo,
    Refusal,
    StartReply,
    StartTask,
    close_task,
    read_metadata,
)

logger = logging.getLogger(__name__)

#: How long the metadata left by a lost worker may take to read.
DRAIN_S = 5.0
#: Pause before a start request the broker nacked is sent again.
REJECTED_START_RETRY_S = 2.0
#: A close unanswered this long is sent again (then after twice as long...), until its deadline.
#: A close is answered within milliseconds; one lost in a node's loss (the worker's or the
#: coordinator's queue went with the node) would otherwise hold its slot for the whole deadline.
CLOSE_RESEND_S = 3.0


Completed = Callable[[Task, FinishInfo | None], None]
"""Called once per finished task with its close reply (``None`` when the worker never gave one)."""
Refused = Callable[[Task, Refusal | None, str, Mapping[str, Any]], None]
"""Called when a worker refuses a start request: the refusal's code (if known), its message and detail."""


class TaskDriver:
    """Moves tasks from start to close through the bus, counting what they report into ``stats``.

    Args:
        bus: the coordinator's broker operations.
        stats: counters the metadata updates.
        task_queue: the shared queue start requests go to.
        learner_queue: where data metadata is forwarded.
        buffer_id: the replay buffer named in every start request.
        timeouts: request deadlines and the silence limit.
        on_running: called when a task's start reply arrived (the coordinator checkpoints then).
        on_completed: called once per finished task.
        on_dropped: called once per task given up, with whether it is to be run again.
        on_refused: called when a worker refuses a start request.
        plugins: the job's plug-ins in words, for the messages about tasks that hang.
    """

    def __init__(
        self,
        bus: CoordinatorBus,
        stats: RunStats,
        *,
        task_queue: str,
        learner_queue: str,
        buffer_id: str,
        timeouts: Timeouts,
        on_running: Callable[[Task], None],
        on_completed: Completed,
        on_dropped: Callable[[Task, bool], None],
        on_refused: Refused,
        plugins: str = "",
    ) -> None:
        self.bus = bus
        self.stats = stats
        self.task_queue = task_queue
        self.learner_queue = learner_queue
        self.buffer_id = buffer_id
        self.timeouts = timeouts
        self.on_running = on_running
        self.on_completed = on_completed
        self.on_dropped = on_dropped
        self.on_refused = on_refused
        self.plugins = plugins
        self.tasks: dict[str, Task] = {}
        self.seq = 0
        self.closing = False
        """The run is ending: :meth:`close_all` asked every task to close."""
        self.relay = DataRelay(bus, learner_queue)

    # -- starting -------------------------------------------------------------------

    def launch(self, kind: Kind, cfg: CollectorSpec, *, target: str | None = None) -> Task:
        """Send a start request for a new task: to the shared task queue, or to one worker's control queue."""
        self.seq += 1
        task_id = f"{kind.value}-{self.seq:06d}-{int(time.time()) % 100000:05d}"
        # free_when_done: this coordinator reads the stream and closes each task by its id.
        task = Task(task_id, kind, StartTask(task_id, self.buffer_id, cfg, free_when_done=True), target=target)
        self.tasks[task_id] = task
        self._send_start(task)
        return task

    def _send_start(self, task: Task) -> None:
        assert task.start is not None
        timeout = self.timeouts.start_s
        task.state = State.STARTING
        queue = task.target or self.task_queue
        try:
            # Durable: a start request waiting in the task queue survives a broker restart.
            task.correlation_id = self.bus.send(queue, task.start.to_wire(), timeout_s=timeout, durable=True)
        except QueueNotFound:
            # The chosen worker is gone: forget the task, its slot is filled again elsewhere.
            logger.warning("task %s: worker queue %s is gone; starting it elsewhere", task.task_id, queue)
            task.correlation_id = None
            self.drop(task, rerun=True)
            return
        except PublishRejected as exc:
            # Nacked even after the link's own resends (a quorum task queue between leaders,
            # RabbitMQ 3.10's stuck channels): the task keeps its slot and is sent again later.
            task.correlation_id = None
            task.deadline = time.monotonic() + REJECTED_START_RETRY_S
            logger.warning("task %s: %s; sending it again in %.0f s", task.task_id, exc.message, REJECTED_START_RETRY_S)
            return
        # The request expires in the queue after ``timeout``; a worker that took it just in
        # time still gets to answer during the grace period.
        task.deadline = time.monotonic() + timeout + self.timeouts.start_grace_s

    def adopt(self, task: Task) -> None:
        """Keep reading a task an earlier coordinator started (from its checkpoint)."""
        if task.metadata_queue is None:
            return
        try:
            task.stream = self.bus.stream(task.metadata_queue)
        except QueueNotFound:
            logger.warning("task %s of the earlier coordinator left no metadata queue; dropping it", task.task_id)
            return
        self.tasks[task.task_id] = task
        if task.worker_id is not None:
            self.stats.workers.add(task.worker_id)

    # -- following ------------------------------------------------------------------

    def advance_all(self) -> None:
        """One turn for every task; a task whose request fails is logged and retried next turn."""
        try:
            close_strays(self.bus, self.tasks, self.timeouts.close_s)
            for task in list(self.tasks.values()):
                try:
                    self.advance(task)
                except BrokerConnectionError:
                    raise
                except MessagingError as exc:
                    logger.warning("task %s: %s", task.task_id, exc.message)
        finally:
            self.settle_forwarded()

    def settle_forwarded(self) -> None:
        """Ack the stream items whose copies the learner's queue confirmed (see :class:`DataRelay`)."""
        self.relay.settle()

    def advance(self, task: Task) -> None:
        """One step of ``task``'s life: poll its start, read its stream, close it when done."""
        if task.task_id not in self.tasks:
            return
        if task.state is State.STARTING:
            self._poll_start(task)
            return
        self.read(task)
        if task.task_id not in self.tasks:
            return
        if task.state is State.RUNNING and task.done:
            self.send_close(task)
        elif task.state is State.CLOSING:
            self._poll_close(task)

    def _poll_start(self, task: Task) -> None:
        if task.correlation_id is None:  # the broker refused the request: send it again in time
            if time.monotonic() > task.deadline:
                self._send_start(task)
            return
        try:
            result = self.bus.poll(task.correlation_id)
        except RemoteError as exc:
            refusal = Refusal.of(exc.result)
            self.drop(task, rerun=refusal is Refusal.WORKER_BUSY)
            self.on_refused(task, refusal, exc.message, exc.result)
            return
        if result is None:
            if time.monotonic() > task.deadline:
                logger.info("no worker took task %s in time; sending it again", task.task_id)
                self.bus.abandon(task.correlation_id)
                self._send_start(task)
            return
        try:
            reply = StartReply.from_wire(result)
        except TaskError as exc:
            logger.error("task %s: %s", task.task_id, exc.message)
            self.drop(task, rerun=True)
            return
        task.worker_id, task.control_queue, task.metadata_queue = (
            reply.worker_id,
            reply.control_queue,
            reply.metadata_queue,
        )
        task.frees_worker = reply.free_when_done
        try:
            task.stream = self.bus.stream(reply.metadata_queue)
        except QueueNotFound as exc:
            # Its node died between the worker's declaration and this read: left as it is,
            # the task would wait in STARTING for a reply already taken, holding its slot.
            self._stream_lost(task, exc)
            return
        task.state = State.RUNNING
        task.last_heard = time.monotonic()
        self.stats.workers.add(reply.worker_id)
        logger.debug("task %s running on %s", task.task_id, task.worker_id)
        self.on_running(task)
        if task.cancelled:
            self.send_close(task)

    def read(self, task: Task) -> None:
        """Handle every metadata item that has arrived for ``task``."""
        try:
            while task.stream is not None and (item := task.stream.get(0.0)) is not None:
                task.last_heard = time.monotonic()
                self._handle(task, item)
        except QueueNotFound as exc:
            self._stream_lost(task, exc)

    def _stream_lost(self, task: Task, error: QueueNotFound) -> None:
        """The task's metadata queue is gone under its reader, or before its first read: it died with its node.

        A metadata queue is a classic queue on one node. Once the task's last info was read
        nothing is missing, and the close goes on; before that, what the queue still held
        cannot be read, and the task runs again elsewhere (its worker, told to close it,
        is free at once).
        """
        stream, task.stream = task.stream, None
        if stream is not None:
            with contextlib.suppress(MessagingError):
                stream.close()
        if task.task_id not in self.tasks or task.done:
            logger.info("task %s: its metadata queue is gone after its last item (%s)", task.task_id, error.message)
            return
        logger.warning(
            "task %s lost its metadata queue on %s (%s); running it again elsewhere",
            task.task_id,
            task.worker_id,
            error.message,
        )
        if task.control_queue is not None:
            with contextlib.suppress(MessagingError):
                self.bus.abandon(
                    self.bus.send(task.control_queue, close_task(task.task_id), timeout_s=self.timeouts.close_s)
                )
        self.drop(task, rerun=True)

    def _handle(self, task: Task, item: MetadataItem) -> None:
        try:
            metadata = read_metadata(item.message)
        except TaskError as exc:
            # Not something a collector sends: park it in the dead-letter queue, say so, go on.
            logger.warning("dead-lettering malformed metadata of task %s: %s", task.task_id, exc.message)
            item.delivery.nack(requeue=False)
            return
        if isinstance(metadata, DataItem):
            self.relay.forward(item)  # acked once its copy is confirmed
            task.samples += metadata.sample_count
            self.stats.count_data(metadata.sample_count, metadata.policy_iter)
        else:
            task.last_info = metadata
            if metadata.error:
                logger.error("task %s failed on %s: %s", task.task_id, task.worker_id, metadata.error)
            if metadata.aborted:
                logger.warning("worker %s is stopping; task %s will run elsewhere", task.worker_id, task.task_id)
                item.ack()
                self.abandon_worker(task)
                return
            task.done = metadata.collector_done
        if task.kind is Kind.COLLECT:
            steps, episodes = task.count(metadata.cur_step, metadata.cur_episode)
            self.stats.env_steps += steps
            self.stats.episodes += episodes
        if not isinstance(metadata, DataItem):
            item.ack()

    # -- closing --------------------------------------------------------------------

    def send_close(self, task: Task) -> None:
        """Ask the task's worker to close it (a worker already gone completes it at once)."""
        assert task.control_queue is not None
        try:
            task.correlation_id = self.bus.send(
                task.control_queue, close_task(task.task_id), timeout_s=self.timeouts.close_s
            )
        except QueueNotFound:
            logger.warning("worker %s left before task %s was closed", task.worker_id, task.task_id)
            self._ended_unanswered(task)
            return
        if task.state is not State.CLOSING:
            task.state = State.CLOSING
            task.deadline = time.monotonic() + self.timeouts.close_s
            task.close_resend_s = CLOSE_RESEND_S
        task.resend_at = time.monotonic() + task.close_resend_s

    def _poll_close(self, task: Task) -> None:
        assert task.correlation_id is not None
        try:
            result = self.bus.poll(task.correlation_id)
        except QueueNotFound:
            logger.warning("worker %s left before task %s was closed", task.worker_id, task.task_id)
            self._ended_unanswered(task)
            return
        except RemoteError as exc:
            logger.warning("closing task %s: %s", task.task_id, exc.message)
            self._ended_unanswered(task)
            return
        if result is None:
            now = time.monotonic()
            if now > task.deadline:
                logger.warning("task %s: no close reply from %s", task.task_id, task.worker_id)
                self.bus.abandon(task.correlation_id)
                self._ended_unanswered(task)
            elif now > task.resend_at:
                logger.info("task %s: no close reply from %s yet; asking again", task.task_id, task.worker_id)
                self.bus.abandon(task.correlation_id)
                task.close_resend_s *= 2
                self.send_close(task)
            return
        try:
            finish = FinishInfo.from_wire(result)
        except TaskError as exc:
            logger.warning("task %s: %s", task.task_id, exc.message)
            finish = None
        self.complete(task, finish)

    def _ended_unanswered(self, task: Task) -> None:
        """The task is over without its close reply (its worker left, refused or never answered).

        A collect task is complete: its data came through its stream. An eval's result
        is its close reply (the episodes it played), so without one it runs again, at once,
        unless the run is closing its tasks anyway, or the eval said it failed (completed,
        that failure counts towards giving up, so a failing plug-in cannot make evals spin).
        """
        failed = task.last_info is not None and task.last_info.error is not None
        if task.kind is Kind.EVAL and not self.closing and not failed:
            logger.warning("eval task %s ended without its result; running an eval again", task.task_id)
            self.drop(task, rerun=True)
        else:
            self.complete(task, None)

    def complete(self, task: Task, finish: FinishInfo | None) -> None:
        """The task is over: read what is left of its stream, free its queue, report it."""
        if self.tasks.pop(task.task_id, None) is None:
            return  # already completed or dropped (e.g. its worker aborted meanwhile)
        self.read(task)
        self.settle_forwarded()  # before its queue goes: what was read must be safe with the learner
        self._release(task)
        if task.silenced:
            self.stats.tasks_rerun += 1  # closed for its silence: its slot is filled again, elsewhere
        else:
            self.stats.tasks_done += 1
        self.on_completed(task, finish)

    # -- failures -------------------------------------------------------------------

    def check_liveness(self) -> None:
        """Re-run tasks whose worker is gone; close tasks that went silent."""
        now = time.monotonic()
        for task in list(self.tasks.values()):
            if task.state is State.STARTING or task.control_queue is None:
                continue
            if not self.bus.exists(task.control_queue):
                # A worker reconnecting after a network blip redeclares its queue within a
                # second: only a queue missing on two checks in a row means a dead worker.
                task.misses += 1
                if task.misses >= 2:
                    logger.warning("worker %s is gone (task %s)", task.worker_id, task.task_id)
                    self.abandon_worker(task)
                continue
            task.misses = 0
            if task.state is State.RUNNING and now - task.last_heard > self.timeouts.silence_s:
                logger.warning(
                    "task %s (%s) silent for %.0f s on %s; closing it and running it elsewhere",
                    task.task_id,
                    self.plugins or "the job's plug-ins",
                    self.timeouts.silence_s,
                    task.worker_id,
                )
                task.silenced = True
                self.send_close(task)
                task.done = True

    def abandon_worker(self, task: Task) -> None:
        """The task's worker died or is leaving: keep what it published, run the task again."""
        if task.task_id not in self.tasks:
            return
        self._drain(task)
        if task.done:
            self._ended_unanswered(task)
            return
        self.drop(task, rerun=True)

    def _drain(self, task: Task) -> None:
        """Read everything left in the task's metadata queue (all of it was confirmed to its worker)."""
        deadline = time.monotonic() + DRAIN_S
        while task.stream is not None and time.monotonic() < deadline:
            self.read(task)
            if task.metadata_queue is None or not self.bus.depth(task.metadata_queue):
                self.read(task)
                return
            self.bus.wait(0.05)

    def drop(self, task: Task, *, rerun: bool) -> None:
        """Forget a task that will not complete; ``rerun`` counts it as one to run again."""
        if self.tasks.pop(task.task_id, None) is None:
            return  # already dropped or completed
        self.settle_forwarded()
        self._release(task)
        if rerun:
            self.stats.tasks_rerun += 1
        # Tasks are not restarted as such: the coordinator's scheduling fills the free slot.
        self.on_dropped(task, rerun)

    def _release(self, task: Task) -> None:
        if task.stream is not None:
            task.stream.close()
            task.stream = None
        if task.metadata_queue is not None:
            # Never waited for: a deletion can take seconds on a degraded cluster.
            self.bus.delete(task.metadata_queue)

    # -- shutdown -------------------------------------------------------------------

    def close_all(self) -> None:
        """Ask every running task to close, and every starting one to close once it started."""
        self.closing = True
        for task in list(self.tasks.values()):
            if task.state is State.RUNNING:
                try:
                    self.send_close(task)
                except MessagingError as exc:
                    logger.warning("cannot close task %s (%s); leaving it", task.task_id, exc.message)
                    self.drop(task, rerun=False)
            elif task.state is State.STARTING and task.correlation_id is None:
                self.drop(task, rerun=False)  # its request never reached the queue
            elif task.state is State.STARTING:
                # A worker may take the request yet: close the task once it says it started.
                task.cancelled = True

    def workers_alive(self) -> int:
        return len({t.worker_id for t in self.tasks.values() if t.worker_id is not None})
