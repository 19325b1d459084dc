"""The coordinator: keeps collect and eval tasks running on whatever workers exist.

It is a single thread that never blocks for long: start and close tasks are sent
without waiting (:meth:`RpcClient.send` / :meth:`RpcClient.poll`), each running task's
metadata is read as a stream from the broker, data metadata is forwarded to the
learner's queue, and every wait has a deadline. A worker that dies mid-task is noticed
by its control queue vanishing (it is exclusive to the worker's connection) or by its
silence; what it had already published is kept, and the task is run again elsewhere.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from messaging import (
    BrokerConnectionError,
    BrokerLink,
    MessagingError,
    MetadataConsumer,
    MetadataItem,
    Names,
    QueueNotFound,
    RemoteError,
    RpcClient,
    Settings,
)
from worker.collector.protocol import check_metadata, checked_count
from worker.coordinator.progress import Progress, RunLog, RunStats
from worker.coordinator.resume import last_checkpoint
from worker.errors import TaskError, short_repr
from worker.run_config import RunConfig

logger = logging.getLogger(__name__)

#: How often the coordinator checks that the workers of running tasks are still there.
LIVENESS_CHECK_S = 2.0
#: Grace after a start request's expiration before it is sent again.
START_GRACE_S = 5.0
#: How long a close task may take before the worker is considered gone.
CLOSE_TIMEOUT_S = 30.0


class State(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"


@dataclass(frozen=True)
class CoordinatorConfig:
    """What the coordinator process needs: the broker, the job, and where to log."""

    transport: Settings = field(default_factory=Settings)
    run: RunConfig = field(default_factory=RunConfig)
    run_log: Path | None = None
    progress: str = "auto"


@dataclass
class Task:
    """One collect or eval task, from its start request to its close reply."""

    task_id: str
    kind: str
    body: dict[str, Any]
    state: State = State.STARTING
    correlation_id: str | None = None
    deadline: float = 0.0
    worker_id: str | None = None
    control_queue: str | None = None
    consumer: MetadataConsumer | None = None
    metadata_queue: str | None = None
    last_heard: float = field(default_factory=time.monotonic)
    last_info: dict[str, Any] = field(default_factory=dict)
    counted: dict[str, int] = field(default_factory=lambda: {"cur_step": 0, "cur_episode": 0})
    done: bool = False
    misses: int = 0


class Coordinator:
    """Drives collector workers through the task protocol until the run ends.

    Args:
        config: broker settings, job configuration, run log path, progress mode.
        stop: set it (e.g. from a signal handler) to end the run early.
    """

    def __init__(self, config: CoordinatorConfig, stop: threading.Event | None = None) -> None:
        self.config = config
        self.run_cfg = config.run
        self.stop = stop or threading.Event()
        self.names = Names(config.transport.prefix)
        self.link = BrokerLink(config.transport, "coordinator")
        self.client = RpcClient(config.transport, "coordinator", link=self.link)
        self.tasks: dict[str, Task] = {}
        self.stats = RunStats()
        self.progress = Progress(config.progress)
        self.run_log = RunLog(config.run_log)
        self.learner_queue = self.names.learner_data(self.run_cfg.coordinator.buffer_id)
        self.reason = "running"
        self.success = False
        self._seq = 0
        self._next_eval = time.monotonic() + self.run_cfg.coordinator.eval_interval_s
        self._next_liveness = time.monotonic() + LIVENESS_CHECK_S
        self._idle_workers = 0

    # -- the run --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run until the stop value, a budget, or ``stop``; returns the summary."""
        self.link.open()
        self.link.declare(self.names.collector_tasks_decl())
        self.link.declare(self.names.learner_data_decl(self.run_cfg.coordinator.buffer_id))
        self._idle_workers = self.link.queue_consumers(self.names.collector_tasks) or 0
        checkpoint = last_checkpoint(self.config.run_log)
        if checkpoint is not None:
            self._resume(checkpoint)
        tasks = self.run_cfg.coordinator.collect_tasks
        logger.info(
            "coordinating %s: %s collect tasks at a time, stop value %s",
            self.run_cfg.env.id,
            tasks or "one per collector worker",
            self.run_cfg.env.stop_value,
        )
        try:
            while not self._finished():
                self._step()
        finally:
            self._shutdown()
        return self.summary()

    def _step(self) -> None:
        try:
            self._fill()
            self.link.process_events(0.05)
            for task in list(self.tasks.values()):
                try:
                    self._advance(task)
                except MessagingError as exc:
                    if isinstance(exc, BrokerConnectionError):
                        raise
                    logger.warning("task %s: %s", task.task_id, exc.message)
            if time.monotonic() >= self._next_liveness:
                self._check_liveness()
                self._next_liveness = time.monotonic() + LIVENESS_CHECK_S
                self._checkpoint()
        except BrokerConnectionError as exc:
            # The link reconnects on its next use; until the broker is back there is nothing to do.
            logger.error("broker unavailable: %s", exc.message)
            self.stop.wait(1.0)
        self.progress.update(self.stats, self._workers_alive())

    def _finished(self) -> bool:
        cfg = self.run_cfg
        if self.success:
            return True
        if self.stop.is_set():
            self.reason = "stopped by signal"
        elif self.stats.env_steps >= cfg.coordinator.max_env_steps:
            self.reason = f"env step budget of {cfg.coordinator.max_env_steps:,} used"
        elif self.stats.elapsed() >= cfg.coordinator.max_time_s:
            self.reason = f"time budget of {cfg.coordinator.max_time_s:.0f} s used"
        else:
            return False
        return True

    def summary(self) -> dict[str, Any]:
        stats = self.stats
        return {
            "success": self.success,
            "reason": self.reason,
            "stop_value": self.run_cfg.env.stop_value,
            "best_eval": stats.best_eval,
            "last_eval": stats.last_eval,
            "env_steps": stats.env_steps,
            "samples": stats.samples,
            "episodes": stats.episodes,
            "wall_time_s": round(stats.elapsed(), 2),
            "tasks_done": stats.tasks_done,
            "tasks_rerun": stats.tasks_rerun,
            "evals": stats.evals,
            "policy_iter": stats.policy_iter,
            "workers_seen": sorted(stats.workers),
        }

    # -- starting tasks -----------------------------------------------------------

    def _fill(self) -> None:
        cfg = self.run_cfg
        collecting = sum(1 for t in self.tasks.values() if t.kind == "collect")
        for _ in range(self._collect_target(collecting) - collecting):
            eps = cfg.learner.epsilon(self.stats.env_steps)
            self._launch("collect", cfg.collect_cfg(eps))
        now = time.monotonic()
        if now >= self._next_eval and not any(t.kind == "eval" for t in self.tasks.values()):
            self._launch("eval", cfg.eval_cfg())
            self._next_eval = now + cfg.coordinator.eval_interval_s

    def _collect_target(self, collecting: int) -> int:
        """How many collect tasks should run: the configured number, or (auto) one per worker.

        In auto mode the idle workers are the consumers of the shared task queue (a busy
        worker pauses its consumer), counted at every liveness check.
        """
        fixed = self.run_cfg.coordinator.collect_tasks
        if fixed > 0:
            return fixed
        starting = sum(1 for t in self.tasks.values() if t.state is State.STARTING)
        spare = max(0, self._idle_workers - starting)
        self._idle_workers -= min(self._idle_workers, spare)  # claimed until the next count
        return max(1, collecting + spare)

    def _launch(self, kind: str, collector_cfg: dict[str, Any]) -> None:
        self._seq += 1
        task_id = f"{kind}-{self._seq:06d}-{int(time.time()) % 100000:05d}"
        body = {
            "name": "collector_start_task",
            "task_info": {
                "task_id": task_id,
                "buffer_id": self.run_cfg.coordinator.buffer_id,
                "collector_cfg": collector_cfg,
            },
        }
        task = Task(task_id, kind, body)
        self.tasks[task_id] = task
        self._send_start(task)

    def _send_start(self, task: Task) -> None:
        timeout = self.run_cfg.coordinator.start_timeout_s
        task.state = State.STARTING
        task.correlation_id = self.client.send(self.names.collector_tasks, task.body, timeout_s=timeout)
        # The request expires in the queue after ``timeout``; a worker that took it just in
        # time still gets to answer during the grace period.
        task.deadline = time.monotonic() + timeout + START_GRACE_S

    # -- following tasks ----------------------------------------------------------

    def _advance(self, task: Task) -> None:
        if task.task_id not in self.tasks:
            return
        if task.state is State.STARTING:
            self._poll_start(task)
        elif task.state is State.RUNNING:
            self._read_stream(task)
            if task.done and task.state is State.RUNNING and task.task_id in self.tasks:
                self._send_close(task)
        else:
            self._read_stream(task)
            if task.task_id in self.tasks:
                self._poll_close(task)

    def _poll_start(self, task: Task) -> None:
        assert task.correlation_id is not None
        try:
            reply = self.client.poll(task.correlation_id)
        except RemoteError as exc:
            logger.error("task %s refused: %s %s", task.task_id, exc.message, exc.result)
            self._drop(task, rerun=exc.result.get("message") == "worker busy")
            return
        if reply is None:
            if time.monotonic() > task.deadline:
                logger.info("no worker took task %s in time; sending it again", task.task_id)
                self.client.abandon(task.correlation_id)
                self._send_start(task)
            return
        try:
            task.worker_id = str(reply["worker_id"])
            task.control_queue = str(reply["control_queue"])
            task.metadata_queue = str(reply["metadata_queue"])
        except (KeyError, TypeError):
            logger.error(
                "task %s: start reply without worker_id/control_queue/metadata_queue: %s",
                task.task_id,
                short_repr(reply),
            )
            self._drop(task, rerun=True)
            return
        task.consumer = MetadataConsumer(self.link, task.metadata_queue, prefetch=64)
        task.state = State.RUNNING
        task.last_heard = time.monotonic()
        self.stats.workers.add(task.worker_id)
        logger.debug("task %s running on %s", task.task_id, task.worker_id)
        self._checkpoint()

    def _read_stream(self, task: Task) -> None:
        consumer = task.consumer
        if consumer is None:
            return
        while (item := consumer.get(0.0)) is not None:
            task.last_heard = time.monotonic()
            self._handle_item(task, item)

    def _handle_item(self, task: Task, item: MetadataItem) -> None:
        message = item.message
        try:
            _check_item(message)
        except TaskError as exc:
            # Not something a collector sends: park it in the dead-letter queue, say so, go on.
            logger.warning("dead-lettering malformed metadata of task %s: %s", task.task_id, exc.message)
            item.delivery.nack(requeue=False)
            return
        if "data_id" in message:
            # The learner's copy is confirmed before the stream's is acked: nothing is lost
            # if we die in between (the learner may see it twice, and skips a vanished file).
            self.link.publish(self.learner_queue, item.delivery.envelope.body, persistent=True)
            self.stats.samples += message.get("unroll_len", 0)
            self.stats.data_items += 1
            self.stats.policy_iter = max(self.stats.policy_iter, message["policy_iter"])
        else:
            task.last_info = message
            if message.get("error"):
                logger.error("task %s failed on %s: %s", task.task_id, task.worker_id, message["error"])
            if message.get("aborted"):
                logger.warning("worker %s is stopping; task %s will run elsewhere", task.worker_id, task.task_id)
                item.ack()
                self._abandon_worker(task)
                return
            task.done = bool(message.get("collector_done"))
        if task.kind == "collect":
            self._count(task, message)
        item.ack()

    def _count(self, task: Task, message: dict[str, Any]) -> None:
        steps = int(message.get("cur_step", 0))  # checked by _check_item
        episodes = int(message.get("cur_episode", 0))
        self.stats.env_steps += max(0, steps - task.counted["cur_step"])
        self.stats.episodes += max(0, episodes - task.counted["cur_episode"])
        task.counted["cur_step"] = max(steps, task.counted["cur_step"])
        task.counted["cur_episode"] = max(episodes, task.counted["cur_episode"])

    # -- closing tasks ------------------------------------------------------------

    def _send_close(self, task: Task) -> None:
        assert task.control_queue is not None
        try:
            task.correlation_id = self.client.send(
                task.control_queue, {"name": "collector_close_task"}, timeout_s=CLOSE_TIMEOUT_S
            )
        except QueueNotFound:
            logger.warning("worker %s left before task %s was closed", task.worker_id, task.task_id)
            self._complete(task, dict(task.last_info))
            return
        task.state = State.CLOSING
        task.deadline = time.monotonic() + CLOSE_TIMEOUT_S

    def _poll_close(self, task: Task) -> None:
        assert task.correlation_id is not None
        try:
            reply = self.client.poll(task.correlation_id)
        except RemoteError as exc:
            logger.warning("closing task %s: %s", task.task_id, exc.message)
            reply = dict(task.last_info)
        if reply is None:
            if time.monotonic() > task.deadline:
                logger.warning("task %s: no close reply from %s", task.task_id, task.worker_id)
                self.client.abandon(task.correlation_id)
                self._complete(task, dict(task.last_info))
            return
        self._complete(task, reply)

    def _complete(self, task: Task, finish_info: dict[str, Any]) -> None:
        if self.tasks.pop(task.task_id, None) is None:
            return  # already completed or dropped (e.g. its worker aborted meanwhile)
        self._read_stream(task)
        self._release_stream(task)
        self.stats.tasks_done += 1
        record = {"task_id": task.task_id, "worker_id": task.worker_id, "env_steps": self.stats.env_steps}
        record.update({k: v for k, v in finish_info.items() if k != "reward_raw"})
        if task.kind == "eval":
            self._record_eval(task, finish_info, record)
        else:
            self.run_log.write("task", record)

    def _record_eval(self, task: Task, finish_info: dict[str, Any], record: dict[str, Any]) -> None:
        if finish_info.get("error") or not finish_info.get("real_episode_count"):
            logger.warning("eval task %s produced no episodes (%s)", task.task_id, finish_info.get("error"))
            return
        try:
            reward = float(finish_info.get("reward_mean", 0.0))
            train_iter = int(finish_info.get("train_iter", 0))
        except (TypeError, ValueError):
            logger.warning("eval task %s: unusable finish_info %s", task.task_id, short_repr(finish_info))
            return
        stats = self.stats
        stats.evals += 1
        stats.last_eval = reward
        stats.best_eval = reward if stats.best_eval is None else max(stats.best_eval, reward)
        record["steps_per_s"] = round(stats.steps_per_s(), 1)
        record["elapsed_s"] = round(stats.elapsed(), 2)
        self.run_log.write("eval", record)
        logger.info(
            "eval %d: return %.1f at %d env steps (policy iter %d)",
            stats.evals,
            reward,
            stats.env_steps,
            train_iter,
        )
        if reward >= self.run_cfg.env.stop_value:
            self.success = True
            self.reason = f"eval return {reward:.1f} >= {self.run_cfg.env.stop_value}"

    # -- failures -------------------------------------------------------------------

    def _check_liveness(self) -> None:
        self._idle_workers = self.link.queue_consumers(self.names.collector_tasks) or 0
        silence = self.run_cfg.coordinator.task_silence_s
        now = time.monotonic()
        for task in list(self.tasks.values()):
            if task.state is State.STARTING or task.control_queue is None:
                continue
            if not self.link.queue_exists(task.control_queue):
                # A worker reconnecting after a network blip redeclares its queue within a
                # second: only a queue missing on two checks in a row means a dead worker.
                task.misses += 1
                if task.misses >= 2:
                    logger.warning("worker %s is gone (task %s)", task.worker_id, task.task_id)
                    self._abandon_worker(task)
                continue
            task.misses = 0
            if now - task.last_heard > silence and task.state is State.RUNNING:
                logger.warning("task %s silent for %.0f s; closing it and running it elsewhere", task.task_id, silence)
                self._send_close(task)
                task.done = True

    def _abandon_worker(self, task: Task) -> None:
        """The task's worker died or is leaving: keep what it published, run the task again."""
        if task.task_id not in self.tasks:
            return
        self._drain(task)
        if task.done:
            self._complete(task, dict(task.last_info))
            return
        self._drop(task, rerun=True)

    def _drain(self, task: Task) -> None:
        """Read everything left in the task's metadata queue (all of it was confirmed to its worker)."""
        deadline = time.monotonic() + 5.0
        while task.consumer is not None and time.monotonic() < deadline:
            self._read_stream(task)
            if task.metadata_queue is None or not self.link.queue_depth(task.metadata_queue):
                self._read_stream(task)
                return
            self.link.process_events(0.05)

    def _drop(self, task: Task, *, rerun: bool) -> None:
        if self.tasks.pop(task.task_id, None) is None:
            return  # already dropped or completed
        self._release_stream(task)
        if rerun:
            self.stats.tasks_rerun += 1
            if task.kind == "eval":
                self._next_eval = time.monotonic()  # the next _fill starts a new one
        # Collect tasks are not restarted as such: _fill launches a fresh one for the free slot.

    def _release_stream(self, task: Task) -> None:
        if task.consumer is not None:
            task.consumer.close()
            task.consumer = None
        if task.metadata_queue is not None:
            try:
                self.link.delete_queue(task.metadata_queue)
            except MessagingError as exc:
                logger.debug("could not delete %s: %s", task.metadata_queue, exc.message)

    def _checkpoint(self) -> None:
        stats = self.stats
        running = {
            t.task_id: {
                "kind": t.kind,
                "worker_id": t.worker_id,
                "control_queue": t.control_queue,
                "metadata_queue": t.metadata_queue,
                "counted": t.counted,
                "last_info": t.last_info,
            }
            for t in self.tasks.values()
            if t.state is not State.STARTING
        }
        self.run_log.write(
            "checkpoint",
            {
                "elapsed_s": round(stats.elapsed(), 3),
                "env_steps": stats.env_steps,
                "samples": stats.samples,
                "episodes": stats.episodes,
                "data_items": stats.data_items,
                "tasks_done": stats.tasks_done,
                "tasks_rerun": stats.tasks_rerun,
                "evals": stats.evals,
                "best_eval": stats.best_eval,
                "last_eval": stats.last_eval,
                "policy_iter": stats.policy_iter,
                "seq": self._seq,
                "running": running,
            },
        )

    def _resume(self, checkpoint: dict[str, Any]) -> None:
        stats = self.stats
        stats.started_at = time.monotonic() - float(checkpoint.get("elapsed_s", 0.0))
        for key in (
            "env_steps",
            "samples",
            "episodes",
            "data_items",
            "tasks_done",
            "tasks_rerun",
            "evals",
            "best_eval",
            "last_eval",
            "policy_iter",
        ):
            setattr(stats, key, checkpoint.get(key, getattr(stats, key)))
        self._seq = int(checkpoint.get("seq", 0)) + 1000  # never reuse a task id of the earlier run
        for task_id, saved in dict(checkpoint.get("running", {})).items():
            self._adopt(task_id, saved)
        logger.info(
            "resumed the run at %d env steps, %d tasks done, re-attached to %d running tasks",
            stats.env_steps,
            stats.tasks_done,
            len(self.tasks),
        )

    def _adopt(self, task_id: str, saved: dict[str, Any]) -> None:
        task = Task(task_id, str(saved["kind"]), {}, state=State.RUNNING)
        task.worker_id = saved.get("worker_id")
        task.control_queue = saved.get("control_queue")
        task.metadata_queue = saved.get("metadata_queue")
        task.counted = dict(saved.get("counted") or task.counted)
        task.last_info = dict(saved.get("last_info") or {})
        task.done = bool(task.last_info.get("collector_done"))
        if task.metadata_queue is None:
            return
        try:
            task.consumer = MetadataConsumer(self.link, task.metadata_queue, prefetch=64)
        except QueueNotFound:
            logger.warning("task %s of the earlier coordinator left no metadata queue; dropping it", task_id)
            return
        self.tasks[task_id] = task
        if task.worker_id is not None:
            self.stats.workers.add(task.worker_id)

    def _workers_alive(self) -> int:
        return len({t.worker_id for t in self.tasks.values() if t.worker_id is not None})

    # -- shutdown -------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Close running tasks (bounded), forward what they already sent, then leave."""
        deadline = time.monotonic() + 15.0
        for task in list(self.tasks.values()):
            if task.state is State.RUNNING:
                try:
                    self._send_close(task)
                except MessagingError:
                    self._drop(task, rerun=False)
            elif task.state is State.STARTING and task.correlation_id is not None:
                self.client.abandon(task.correlation_id)
                self.tasks.pop(task.task_id, None)
        while self.tasks and time.monotonic() < deadline:
            try:
                self.link.process_events(0.1)
                for task in list(self.tasks.values()):
                    self._read_stream(task)
                    if task.state is State.CLOSING and task.task_id in self.tasks:
                        self._poll_close(task)
            except MessagingError as exc:
                logger.warning("shutdown: %s", exc.message)
                break
        summary = self.summary()
        self.progress.update(self.stats, self._workers_alive(), force=True)
        self.progress.finish(summary)
        self.run_log.write("summary", summary)
        self.run_log.close()
        self.client.close()
        self.link.close()


def _check_item(message: dict[str, Any]) -> None:
    """What the coordinator relies on in a metadata item; raises TaskError otherwise."""
    check_metadata(message)
    for key in ("unroll_len", "policy_iter", "cur_step", "cur_episode", "cur_sample"):
        checked_count(message, key)
    if "data_id" in message and not isinstance(message["data_id"], str):
        raise TaskError(f"data_id must be a string, got {short_repr(message['data_id'])}")
