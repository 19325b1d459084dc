"""The collector worker: serves the task protocol on RabbitMQ and runs one collector at a time.

Two queues feed it:

* ``<prefix>.collector.tasks``, shared by every worker: ``resource`` and
  ``collector_start_task``. An idle worker consumes it; a busy one pauses its consumer,
  so start tasks go to the idle workers. Scaling out is starting more workers. A task
  started with ``free_when_done`` frees the worker as soon as it is over, before its
  close: a start request waiting in the queue then reaches the worker at once, and the
  close of the task before, which names its task, finds it among the ended ones.
* ``<prefix>.collector.control.<worker_id>``, the worker's own (auto-delete) queue:
  ``collector_data_task`` and ``collector_close_task`` about the collector it runs, and
  ``resource``. It disappears with the worker's connection, so a coordinator sending to
  a dead worker gets an immediate routing error instead of a long timeout.

This module is the request handlers and the worker's lifecycle. A start task is prepared
(or refused) in :mod:`~worker.collector.prepare`, runs as a
:class:`~worker.collector.run.CollectorRun`, in envs the worker keeps between collect
tasks (:mod:`~worker.collector.envs`); ``resource`` replies measure the machine with
:mod:`~worker.collector.resources`.

It is one piece, just over 400 lines: every handler reads or changes the same state (the
task running, the ended tasks waiting for their close, and the shared queue's consumer,
paused and resumed as tasks start and end); split apart, each part would reach back into
the other's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from messaging import BrokerLink, DecodeError, MessagingError, Names, Reply, Request, RpcServer, decode
from worker.collector.envs import WorkerEnvs
from worker.collector.prepare import prepare_task, task_plugins_of
from worker.collector.publishers import KeptPublisher
from worker.collector.resources import measured_resources
from worker.collector.run import CollectorRun
from worker.config import CollectorConfig
from worker.devices import visible_gpus
from worker.errors import StorageError, UnsafePath, WarrenError
from worker.plugins import PluginRegistry
from worker.plugins.registry import describe_inventory
from worker.protocol import (
    FinishInfo,
    Refusal,
    ResourceReply,
    StartReply,
    StartTask,
    TaskName,
    close_target,
    task_name,
)
from worker.storage import STALE_TEMP_S, PolicyStore, StepStore
from worker.telemetry.collector import CollectorMetrics, collector_metrics, install

logger = logging.getLogger(__name__)


class CollectorWorker:
    """One worker process's service; see the module docstring.

    Lifecycle: :meth:`start`, then :meth:`tick` now and then from the main thread, then
    :meth:`stop`. ``metrics`` counts its tasks (no-op by default).
    """

    def __init__(self, config: CollectorConfig, *, metrics: CollectorMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or CollectorMetrics()
        self.names = Names.of(config.transport)
        self.role = f"collector-{config.worker_id}"
        self.steps = StepStore(config.path_data, fsync=config.fsync, compression=config.step_compression)
        self.policies = PolicyStore(config.path_policy)
        self.server = RpcServer(config.transport, self.role, threads=config.handler_threads)
        self.control_queue = self.names.collector_control(config.worker_id)
        self.publishers = KeptPublisher(config.transport, f"{self.role}-task", stall_timeout_s=config.stall_timeout_s)
        self._lock = threading.Lock()
        self._run: CollectorRun | None = None
        """The task running now (or over, but not freed: a close frees it)."""
        self._ended: dict[str, CollectorRun] = {}
        """Tasks over and freed (``free_when_done``) whose close has not come yet, oldest first."""
        self.envs = WorkerEnvs(config.worker_id, config.vector_env_threads)
        # Counted once, `resource` only reads it; without torch (a numpy actor's collector never imports it).
        self._gpus = visible_gpus()
        # Every plug-in this worker may run is imported now, once: a task can only choose among them.
        self.registry = PluginRegistry.discover(config.plugins, config.env_packages)
        self._inventory = self.registry.inventory()
        self.tasks_started = 0

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Declare the queues and start serving.

        Raises:
            MessagingError: the broker could not be reached.
            StorageError: the step data directory cannot be listed.
        """
        swept = self.steps.sweep_temp(STALE_TEMP_S)
        if swept:
            logger.info("removed %d temp files that crashed writers left behind", swept)
        prefetch = self.config.transport.prefetch
        tasks, control = self.names.collector_tasks_decl(), self.names.collector_control_decl(self.config.worker_id)
        self.server.add_queue(tasks, self._on_shared_task, prefetch=prefetch, quick=self._quick_task)
        self.server.add_queue(control, self._on_control_task, prefetch=4, quick=self._quick_task)
        self.server.start(wait_s=self.config.transport.connect_timeout_s + 10)
        logger.info(
            "worker %s serving %s and %s", self.config.worker_id, self.names.collector_tasks, self.control_queue
        )
        logger.info("plug-ins: %s", "; ".join(describe_inventory(self._inventory)))

    def tick(self) -> None:
        """Housekeeping from the main thread: close the finished tasks nobody came to close."""
        with self._lock:
            runs = [*self._ended.values(), *([self._run] if self._run is not None else [])]
        for run in runs:
            self._close_unclosed(run)

    def _close_unclosed(self, run: CollectorRun) -> None:
        if run.finished_at is None:
            return
        if run.orphaned:
            logger.warning("task %s has no reader any more: freeing the worker", run.task_id)
            self._release(run)
        elif time.monotonic() - run.finished_at > self.config.close_wait_s:
            logger.warning(
                "task %s finished %.0f s ago and was never closed: closing it", run.task_id, self.config.close_wait_s
            )
            self._release(run)

    def stop(self) -> None:
        """Stop in order: no new tasks, the running collector ends and says so, replies settle, close."""
        grace = self.config.stop_grace_s
        self.server.pause(self.names.collector_tasks)
        with self._lock:
            run = self._run
            ended = list(self._ended.values())
        if run is not None:
            logger.info("stopping: aborting task %s", run.task_id)
            run.abort(grace)
        for over in ended:
            over.close(grace)  # over already: returns at once
        self.server.stop(grace)
        self.publishers.close()
        self.envs.close(run)
        logger.info("worker %s stopped", self.config.worker_id)

    # -- handlers -------------------------------------------------------------------

    def _on_shared_task(self, request: Request) -> dict[str, Any] | Reply:
        name = task_name(request.body)
        if name is TaskName.RESOURCE:
            return self._resource()
        if name is TaskName.START:
            return self._start(request)
        raise Refusal.WRONG_QUEUE.error(
            f"{name} must be sent to the control_queue named in the start reply, not the shared task queue"
        )

    def _on_control_task(self, request: Request) -> dict[str, Any] | Reply:
        name = task_name(request.body)
        if name is TaskName.RESOURCE:
            return self._resource()
        if name is TaskName.DATA:
            return self._data(request)
        if name is TaskName.CLOSE:
            return self._close(request)
        return self._start(request)

    def _quick_task(self, body: Any) -> dict[str, Any] | None:
        # On the RPC server's I/O thread: only `resource`, which reads memory and one syscall.
        return self._resource() if task_name(body) is TaskName.RESOURCE else None

    def _resource(self) -> dict[str, Any]:
        # No lock: _start holds it while it builds envs, and one attribute read is atomic.
        run = self._run
        return ResourceReply(
            **measured_resources(self._gpus),
            worker_id=self.config.worker_id,
            control_queue=self.control_queue,
            busy=run is not None,
            task_id=run.task_id if run is not None else None,
            plugins=self._inventory,
        ).to_wire()

    def _start(self, request: Request) -> Reply:
        start = StartTask.from_wire(request.body)
        self._check_policy_path(start)
        decl = self.names.metadata_decl(
            start.task_id,
            max_length=self.config.transport.metadata_queue_length,
            expires_s=self.config.transport.metadata_queue_expires_s,
        )
        with self._lock:
            earlier = self._ended.get(start.task_id)
            if earlier is None and self._run is not None and self._run.task_id == start.task_id:
                earlier = self._run
            if earlier is not None:
                return self._repeated_start(earlier, request, decl.name)
            if self._run is not None:
                raise Refusal.WORKER_BUSY.error(
                    f"worker {self.config.worker_id} is busy with task {self._run.task_id}", task_id=self._run.task_id
                )
            # May refuse the task (a missing plug-in, an unknown env, spaces that differ): before pausing.
            algorithm, envs = prepare_task(self.registry, self.envs, start.cfg, self.config.worker_id)
            # Declared before replying, so the coordinator can read the stream at once. Once:
            # the task's own publisher keeps it declared while the task runs.
            request.link.declare(decl, remember=False)
            # Pausing is ordered before this request's ack: no second start task slips in.
            self.server.pause(self.names.collector_tasks)
            run = CollectorRun(
                start,
                publishers=self.publishers,
                metadata=decl,
                steps=self.steps,
                policies=self.policies,
                policy_wait_s=self.config.policy_wait_s,
                algorithm=algorithm,
                envs=envs,
                owns_envs=start.cfg.eval_flag,
                plugins=task_plugins_of(self.registry, start.cfg),
                on_ended=self._free_when_done if start.free_when_done else None,
            )
            run.start()
            self._run = run
            self.tasks_started += 1
            self.metrics.task_started(start.cfg.eval_flag)
        logger.info(
            "started task %s (buffer %s, correlation_id %s%s)",
            start.task_id,
            start.buffer_id,
            request.envelope.correlation_id,
            ", redelivered" if request.envelope.redelivered else "",
        )
        reply = StartReply(
            self.config.worker_id,
            start.task_id,
            self.control_queue,
            decl.name,
            envs.spaces.to_wire(),
            free_when_done=start.free_when_done,
        )
        # Nobody heard that we started: do not keep a task that no coordinator will close.
        return Reply(reply.to_wire(), on_failed=lambda: self._abandon(run, request.link))

    def _repeated_start(self, run: CollectorRun, request: Request, metadata_queue: str) -> Reply:
        """The start of the task this worker runs, again: the same answer as the first time.

        The first request was redelivered (the connection it came on was lost before its
        ack, as when a broker node dies, and its reply may be lost with it). Refusing it as
        "worker busy" would make the caller start the task elsewhere while this worker runs
        it for nobody until its stall timeout; the caller reads it instead.
        """
        logger.info(
            "task %s: start request repeated (correlation_id %s%s); it runs already",
            run.task_id,
            request.envelope.correlation_id,
            ", redelivered" if request.envelope.redelivered else "",
        )
        reply = StartReply(
            self.config.worker_id,
            run.task_id,
            self.control_queue,
            metadata_queue,
            run.spaces.to_wire(),
            free_when_done=run.start_task.free_when_done,
        )
        # No abandon if this answer is lost: the first one may have been heard, and a run
        # nobody follows is closed by the coordinator (a stray) or by the close wait.
        return Reply(reply.to_wire())

    def _check_policy_path(self, start: StartTask) -> None:
        if start.cfg.policy_update_path is None:
            return
        try:
            PolicyStore.check_name(self.config.path_policy, start.cfg.policy_update_path)
        except UnsafePath as exc:
            raise Refusal.UNSAFE_PATH.error(f"refused policy_update_path: {exc.message}") from None

    def _current(self, name: TaskName, target: str | None = None) -> CollectorRun:
        """The task a data or close request is about.

        The one it names; else, for a close, the oldest task that is done and waits for its
        close (then the running one), and for a data task the running one (then the oldest
        done one): docs/protocol.md, ``free_when_done``.
        """
        with self._lock:
            oldest_ended = next(iter(self._ended.values()), None)
            if target is not None:
                run = self._ended.get(target) or self._run
            elif name is TaskName.CLOSE:
                run = oldest_ended or self._run
            else:
                run = self._run or oldest_ended
        if run is None:
            raise Refusal.NO_RUNNING_COLLECTOR.error(
                f"{name}: no collector task is running on worker {self.config.worker_id}"
            )
        return run

    def _data(self, request: Request) -> Reply:
        run = self._current(TaskName.DATA)
        delivery = request.link.get_one(run.metadata.name, self.config.data_wait_s)
        if delivery is None:
            if run.error is not None:
                raise Refusal.COLLECTOR_FAILED.error(f"collector task {run.task_id} failed: {run.error}")
            raise Refusal.NO_DATA_YET.error(f"no metadata from task {run.task_id} within {self.config.data_wait_s:g} s")
        try:
            message = decode(delivery.envelope.body, max_bytes=self.config.transport.max_message_bytes)
        except DecodeError as exc:
            delivery.nack(requeue=False)
            raise Refusal.BAD_METADATA.error(f"undecodable metadata dead-lettered: {exc.message}") from None
        if not isinstance(message, dict):
            delivery.nack(requeue=False)
            raise Refusal.BAD_METADATA.error("metadata that is not a map was dead-lettered")
        message.update(task_id=run.task_id, buffer_id=run.start_task.buffer_id)
        # The item leaves the queue only once the reply carrying it is confirmed.
        return Reply(message, on_sent=delivery.ack, on_failed=lambda: delivery.nack(requeue=True))

    def _close(self, request: Request) -> dict[str, Any]:
        target = close_target(request.body)
        run = self._current(TaskName.CLOSE, target)
        if target is not None and target != run.task_id:
            # A late close (its task ended at the close wait): the running one is not its to end.
            raise Refusal.NO_RUNNING_COLLECTOR.error(
                f"close of task {target}: worker {self.config.worker_id} runs task {run.task_id} now",
                task_id=run.task_id,
            )
        finish_info = self._release(run)
        logger.info("closed task %s", run.task_id)
        return finish_info.to_wire()

    def _abandon(self, run: CollectorRun, link: BrokerLink) -> None:
        """Nobody heard that the task started (its caller left): stop it and remove what it made."""
        logger.warning("the start reply of task %s was not delivered: stopping the task", run.task_id)
        self._release(run)
        written = run.written()
        for data_id in written:
            with contextlib.suppress(StorageError):
                self.steps.delete(data_id)
        with contextlib.suppress(MessagingError):
            link.delete_queue(run.metadata.name)
        logger.info("removed task %s's metadata queue and its %d step files", run.task_id, len(written))

    def _free_when_done(self, run: CollectorRun) -> None:
        """On the task's thread, its last act: the task is done, so the worker takes the next one now.

        It waits for its close among the ended tasks. A task that failed is not freed
        early: the worker takes no task until its close, so the pause a coordinator makes
        after a failure (docs/plugins.md) is not skipped by a start waiting in the queue.
        """
        with self._lock:
            if self._run is not run or run.error is not None:
                return  # closed already (a close that stopped it), or failed
            self.envs.after(run)
            self._run = None
            self._ended[run.task_id] = run
            self.server.resume(self.names.collector_tasks)
        logger.debug("task %s is over: taking the next task before its close", run.task_id)

    def _release(self, run: CollectorRun) -> FinishInfo:
        finish_info = run.close(self.config.stop_grace_s)
        with self._lock:
            freed = False
            if self._run is run:
                self.envs.after(run)
                self._run = None
                self.server.resume(self.names.collector_tasks)
                freed = True
            elif self._ended.get(run.task_id) is run:
                del self._ended[run.task_id]
                freed = True
            if freed:
                self.metrics.task_ended(finish_info)  # once per task: only the release that freed it
        return finish_info


def run_collector(config: CollectorConfig, stop: threading.Event) -> int:
    """Serve until ``stop`` is set; returns the process exit code."""
    try:
        # Before the worker connects: its links count for /metrics from their first message.
        metrics = collector_metrics(config)
    except WarrenError as exc:
        logger.critical("worker %s cannot start: %s", config.worker_id, exc.message)
        return 1
    install(metrics)  # the tasks' sinks count into it
    try:
        return _serve(CollectorWorker(config, metrics=metrics), stop)
    finally:
        metrics.close()
        install(CollectorMetrics())


def _serve(worker: CollectorWorker, stop: threading.Event) -> int:
    worker_id = worker.config.worker_id
    try:
        worker.start()
    except WarrenError as exc:
        # The RPC server has said why already, when it was the broker; say what it means.
        logger.critical("worker %s cannot start: %s", worker_id, exc.message)
        return 1
    while not stop.wait(1.0):
        if not worker.server.running:
            logger.critical("worker %s stops: it lost its task queues for good", worker_id)
            worker.stop()
            return 1
        worker.tick()
    worker.stop()
    return 0
