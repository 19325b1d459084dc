"""The collector worker: serves the task protocol on RabbitMQ and runs one collector at a time.

Two queues feed it:

* ``<prefix>.collector.tasks``, shared by every worker: ``resource`` and
  ``collector_start_task``. An idle worker consumes it; a busy one pauses its consumer,
  so start tasks go to the idle workers. Scaling out is starting more workers.
* ``<prefix>.collector.control.<worker_id>``, the worker's own (auto-delete) queue:
  ``collector_data_task`` and ``collector_close_task`` about the collector it runs, and
  ``resource``. It disappears with the worker's connection, so a coordinator sending to
  a dead worker gets an immediate routing error instead of a long timeout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from messaging import BrokerLink, DecodeError, MessagingError, Names, Reply, Request, RpcServer, decode
from worker.collector.run import CollectorRun
from worker.config import CollectorConfig
from worker.errors import StorageError, TaskError, UnsafePath, WarrenError
from worker.lifecycle import limit_torch_threads
from worker.plugins import Algorithm, EnvPlugin, MissingPlugin, PluginRegistry, Spaces, UnsupportedSpace
from worker.plugins.binding import build_algorithm, env_plugin, make_env_context
from worker.plugins.registry import describe_inventory
from worker.protocol import (
    CollectorSpec,
    FinishInfo,
    Refusal,
    ResourceReply,
    StartReply,
    StartTask,
    TaskName,
    close_target,
    task_name,
)
from worker.rl.envs import VecEnvBatch, worker_seed
from worker.storage import STALE_TEMP_S, PolicyStore, StepStore
from worker.telemetry.collector import CollectorMetrics, collector_metrics, install

logger = logging.getLogger(__name__)


def visible_gpus(dev: Path = Path("/dev")) -> int:
    """NVIDIA GPUs this process may use, counted without importing torch.

    The ``/dev/nvidia<N>`` devices, narrowed by ``CUDA_VISIBLE_DEVICES`` as CUDA reads it
    (the entries up to the first that is not a device: ``-1``, an empty one). A count, not
    a promise that CUDA works: the workers only report it (``resource``).
    """
    devices = sum(1 for path in dev.glob("nvidia*") if path.name[len("nvidia") :].isdigit())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return devices
    listed = 0
    for part in visible.split(","):
        entry = part.strip()
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        listed += 1
    return min(devices, listed)


def measured_resources(gpus: int) -> dict[str, int]:
    """What this process can use: the GPUs it sees (:func:`visible_gpus`) and the CPUs it may run on.

    Args:
        gpus: the GPU count measured at start (:func:`visible_gpus`; it cannot change while
            a process runs).
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return {"gpu": gpus, "cpu": cpus}


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
        self._lock = threading.Lock()
        self._run: CollectorRun | None = None
        self._envs: VecEnvBatch | None = None
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
        """Housekeeping from the main thread: close a finished task nobody came to close."""
        with self._lock:
            run = self._run
        if run is None or run.finished_at is None:
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
        if run is not None:
            logger.info("stopping: aborting task %s", run.task_id)
            run.abort(grace)
        self.server.stop(grace)
        if self._envs is not None:
            self._envs.close()
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
            if self._run is not None and self._run.task_id == start.task_id:
                return self._repeated_start(self._run, request, decl.name)
            if self._run is not None:
                raise Refusal.WORKER_BUSY.error(
                    f"worker {self.config.worker_id} is busy with task {self._run.task_id}", task_id=self._run.task_id
                )
            # May refuse the task (a missing plug-in, an unknown env, spaces that differ): before pausing.
            algorithm, envs = self._prepare(start)
            # Declared before replying, so the coordinator can read the stream at once. Once:
            # the task's own publisher keeps it declared while the task runs.
            request.link.declare(decl, remember=False)
            # Pausing is ordered before this request's ack: no second start task slips in.
            self.server.pause(self.names.collector_tasks)
            run = CollectorRun(
                start,
                transport=self.config.transport,
                role=f"{self.role}-task",
                metadata=decl,
                steps=self.steps,
                policies=self.policies,
                policy_wait_s=self.config.policy_wait_s,
                stall_timeout_s=self.config.stall_timeout_s,
                algorithm=algorithm,
                envs=envs,
                owns_envs=start.cfg.eval_flag,
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
        reply = StartReply(self.config.worker_id, start.task_id, self.control_queue, decl.name)
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
        reply = StartReply(self.config.worker_id, run.task_id, self.control_queue, metadata_queue)
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

    def _prepare(self, start: StartTask) -> tuple[Algorithm, VecEnvBatch]:
        """The task's algorithm and env batch, or the refusal that says why this worker cannot run it.

        Collect tasks reuse the worker's env batch while the env stays the same (episodes
        continue across tasks); eval tasks get a fresh one, closed when they end.
        """
        spec = start.cfg
        worker = self.config.worker_id
        try:
            plugin = env_plugin(self.registry, spec.env.plugin, spec.env.plugin_version)
            envs = self._envs_for(spec, plugin)
            try:
                algorithm = self._bind(spec, envs.spaces)
            except BaseException:
                if spec.eval_flag:
                    envs.close()
                raise
        except MissingPlugin as exc:
            message = f"worker {worker}: {exc.message}"
            raise Refusal.MISSING_PLUGIN.error(message, worker_id=worker, **exc.result) from None
        except UnsupportedSpace as exc:
            raise Refusal.UNSUPPORTED_ENV.error(exc.message) from None
        if algorithm.kind != "none" and algorithm.weights_format == "torch":
            # Its actor runs torch: capped before it is built, so that it leaves the learner the cores.
            limit_torch_threads(1)
        return algorithm, envs

    def _bind(self, spec: CollectorSpec, env_spaces: Spaces) -> Algorithm:
        if spec.spaces is not None and spec.spaces.digest != env_spaces.digest:
            raise Refusal.UNSUPPORTED_ENV.error(
                f"env {spec.env.id!r} on worker {self.config.worker_id} has {env_spaces.describe()}; the task's "
                f"spaces are {spec.spaces.describe()} (another version of the env?)"
            )
        policy = spec.policy
        try:
            algorithm = build_algorithm(
                self.registry,
                spec.spaces or env_spaces,
                algorithm=policy.type,
                algorithm_version=policy.version,
                config=policy.config,
                model=policy.model,
                model_version=policy.model_version,
                model_config=policy.model_config,
            )
            algorithm.check_collect_settings(spec.collect_setting)
        except (MissingPlugin, UnsupportedSpace):
            raise
        except TaskError as exc:
            raise Refusal.BAD_COLLECTOR_CFG.error(exc.message) from None
        if algorithm.kind != "none" and spec.policy_update_path is None:
            raise Refusal.BAD_COLLECTOR_CFG.error(
                f"collector_cfg.policy_update_path is missing (algorithm {policy.type!r} acts with learned weights)"
            )
        return algorithm

    def _envs_for(self, spec: CollectorSpec, plugin: EnvPlugin) -> VecEnvBatch:
        env = spec.env
        threads = self.config.vector_env_threads
        if spec.eval_flag:  # every eval starts from the same episodes, so evals compare
            ctx = make_env_context(env.id, env.env_num, kwargs=env.kwargs, seed=env.seed, threads=threads)
            return VecEnvBatch(plugin, ctx)
        seed = None if env.seed is None else worker_seed(env.seed, self.config.worker_id)
        ctx = make_env_context(env.id, env.env_num, kwargs=env.kwargs, seed=seed, threads=threads)
        envs = self._envs
        if envs is not None and (envs.ctx != ctx or envs.plugin is not plugin):
            envs.close()
            envs = self._envs = None
        if envs is None:
            envs = VecEnvBatch(plugin, ctx)
        self._envs = envs
        return envs

    def _current(self, name: TaskName) -> CollectorRun:
        with self._lock:
            run = self._run
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
        run = self._current(TaskName.CLOSE)
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

    def _release(self, run: CollectorRun) -> FinishInfo:
        finish_info = run.close(self.config.stop_grace_s)
        with self._lock:
            if run.stuck and self._envs is not None:
                # Its thread still steps these envs: the next task must not share them. They
                # are left to that thread (closing them under it could crash the process).
                logger.warning("task %s is stuck: the next task gets new envs", run.task_id)
                self._envs = None
            if self._run is run:
                self._run = None
                self.server.resume(self.names.collector_tasks)
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
