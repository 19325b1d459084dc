"""The coordinator: keeps collect and eval tasks running on whatever workers exist.

One thread that never blocks for long. Each turn it fills free task slots (by default
one collect task per idle collector listening on the task queue, so scaling out needs
no flag, plus an eval task every ``eval_interval_s``), lets the broker connection work
for a moment, and moves every task on (:class:`~worker.coordinator.driver.TaskDriver`).
Every few seconds it checks that the workers of running tasks are still there and
writes a checkpoint. The run ends at the stop value, a budget, or a signal.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from messaging import BrokerConnectionError, MessagingError, Names
from worker.config import CoordinatorConfig
from worker.coordinator.bus import BrokerBus, CoordinatorBus
from worker.coordinator.checkpoint import checkpoint_record, last_checkpoint, restore
from worker.coordinator.driver import TaskDriver
from worker.coordinator.progress import Progress, RunLog
from worker.coordinator.stats import RunStats
from worker.coordinator.task import Kind, State, Task, Timeouts
from worker.protocol import FinishInfo, Refusal
from worker.telemetry.coordinator import RunTelemetry

logger = logging.getLogger(__name__)

#: How often the coordinator checks workers, counts the idle ones and checkpoints.
LIVENESS_CHECK_S = 2.0
#: How long the broker connection works per loop turn (replies and stream items arrive meanwhile).
TURN_S = 0.05
#: Shortest time between two checkpoints written because tasks started.
CHECKPOINT_MIN_S = 0.5
#: How long running tasks get to close when the run ends.
SHUTDOWN_S = 15.0
#: Pause before the next start after a transient refusal, doubling up to the maximum.
REFUSAL_BACKOFF_S = 0.2
REFUSAL_BACKOFF_MAX_S = 5.0


class Coordinator:
    """Drives collector workers through the task protocol until the run ends.

    Args:
        config: broker settings, the job, run log path, progress mode.
        stop: set it (e.g. from a signal handler) to end the run early.
        bus: the broker operations; a :class:`~worker.coordinator.bus.BrokerBus` by default.
    """

    def __init__(
        self, config: CoordinatorConfig, stop: threading.Event | None = None, *, bus: CoordinatorBus | None = None
    ) -> None:
        self.config = config
        self.job = config.job
        self.stop = stop or threading.Event()
        self.names = Names.of(config.transport)
        self.bus = bus if bus is not None else BrokerBus(config.transport)
        self.stats = RunStats()
        self.progress = Progress(config.progress)
        self.run_log = RunLog(config.run_log)
        self.telemetry = RunTelemetry.from_config(config, self.stats)
        """Prometheus metrics and TensorBoard scalars of the run (each off unless configured)."""
        coord = self.job.coordinator
        self.driver = TaskDriver(
            self.bus,
            self.stats,
            task_queue=self.names.collector_tasks,
            learner_queue=self.names.learner_data(coord.buffer_id),
            buffer_id=coord.buffer_id,
            timeouts=Timeouts(coord.start_timeout_s, config.transport.rpc_timeout_s, coord.task_silence_s),
            on_running=lambda _task: self._checkpoint(soon=True),
            on_completed=self._record,
            on_dropped=self._dropped,
            on_refused=self._refused,
        )
        self.reason = "running"
        self.success = False
        self.error: str | None = None
        """Why the run cannot go on (a refused job, a dead learner); set through :meth:`abort`."""
        self._next_eval = time.monotonic() + coord.eval_interval_s
        self._next_check = time.monotonic() + LIVENESS_CHECK_S
        self._idle_workers = 0
        self._fill_after = 0.0
        self._refusals = 0
        self._last_checkpoint = 0.0
        self._checkpoint_due = False
        self.shutdown_s = SHUTDOWN_S
        """How long running tasks get to close when the run ends."""

    # -- the run --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run until the stop value, a budget, or ``stop``; returns the summary."""
        coord = self.job.coordinator
        self.telemetry.serve(self.config.metrics_addr, self.config.metrics_port)
        self.bus.open(self.names.collector_tasks_decl(), self.names.learner_data_decl(coord.buffer_id))
        self._idle_workers = self.bus.consumers(self.names.collector_tasks)
        checkpoint = last_checkpoint(self.config.run_log)
        if checkpoint is not None:
            self._resume(checkpoint)
        logger.info(
            "coordinating %s: %s, stop value %s",
            self.job.env.id,
            f"{coord.collect_tasks} collect tasks at a time" if coord.collect_tasks else "one collect task per worker",
            self.job.env.stop_value,
        )
        try:
            while not self._finished():
                self.turn()
        finally:
            self._shutdown()
        return self.summary()

    def turn(self) -> None:
        """One loop turn: fill slots, let the broker work, move every task on, check workers."""
        try:
            self._fill()
            self.bus.wait(TURN_S)
            self.driver.advance_all()
            if time.monotonic() >= self._next_check:
                self._idle_workers = self.bus.consumers(self.names.collector_tasks)
                self.driver.check_liveness()
                self._next_check = time.monotonic() + LIVENESS_CHECK_S
                self._checkpoint()
                self.telemetry.tick(self.driver.tasks.values(), self.driver.workers_alive())
            elif self._checkpoint_due:
                self._checkpoint(soon=True)
        except BrokerConnectionError as exc:
            # The link reconnects on its next use; until the broker is back there is nothing to do.
            logger.error("broker unavailable: %s", exc.message)
            self.stop.wait(1.0)
        self.progress.update(self.stats, self.driver.workers_alive())

    def abort(self, reason: str) -> None:
        """End the run as failed (from any thread): the job cannot succeed, say why and stop."""
        if self.error is None:
            self.error = reason
        self.stop.set()

    def _finished(self) -> bool:
        coord = self.job.coordinator
        if self.success:
            return True
        if self.stop.is_set():
            self.reason = self.error or "stopped by signal"
        elif self.stats.env_steps >= coord.max_env_steps:
            self.reason = f"env step budget of {coord.max_env_steps:,} used"
        elif self.stats.elapsed() >= coord.max_time_s:
            self.reason = f"time budget of {coord.max_time_s:.0f} s used"
        else:
            return False
        return True

    def summary(self) -> dict[str, Any]:
        """The run's outcome and counters (printed, written to ``summary.json`` and the run log)."""
        stats = self.stats
        return {
            "success": self.success,
            "reason": self.reason,
            "error": self.error,
            "stop_value": self.job.env.stop_value,
            "best_eval": stats.best_eval,
            "last_eval": stats.last_eval,
            "env_steps": stats.env_steps,
            "samples": stats.samples,
            "episodes": stats.episodes,
            "wall_time_s": round(stats.elapsed(), 2),
            "collection_s": round(stats.collection_s(), 2),
            "tasks_done": stats.tasks_done,
            "tasks_rerun": stats.tasks_rerun,
            "evals": stats.evals,
            "policy_iter": stats.policy_iter,
            "replay_ratio": round(stats.replay_ratio(), 4),
            "replay_ratio_configured": self.job.learner.train_steps_per_sample,
            "workers_seen": sorted(stats.workers),
        }

    # -- scheduling -----------------------------------------------------------------

    def _fill(self) -> None:
        if time.monotonic() < self._fill_after:
            return
        collecting = sum(1 for t in self.driver.tasks.values() if t.kind is Kind.COLLECT)
        slots = self._collect_slots(collecting)
        run_ahead = self._run_ahead() if slots > 0 else 0
        n_sample = self.job.collector.n_sample
        held = False
        for _ in range(slots):
            if run_ahead + n_sample > self.job.coordinator.max_run_ahead_samples:
                held = True  # the rate limit: the learner is behind
                break
            eps = self.job.learner.epsilon(self.stats.env_steps)
            self.telemetry.task_launched(self.driver.launch(Kind.COLLECT, self.job.collect_spec(eps)))
            self._idle_workers = max(0, self._idle_workers - 1)  # claimed until the next count
            run_ahead += n_sample
            collecting += 1
        self.stats.held_back = held
        now = time.monotonic()
        if now >= self._next_eval and not any(t.kind is Kind.EVAL for t in self.driver.tasks.values()):
            self.telemetry.task_launched(self.driver.launch(Kind.EVAL, self.job.eval_spec()))
            self._next_eval = now + self.job.coordinator.eval_interval_s

    def _collect_slots(self, collecting: int) -> int:
        """How many more collect tasks could run: up to the configured number, or (auto) one per worker.

        In auto mode the idle workers are the consumers of the shared task queue (a busy
        worker pauses its consumer), counted at every liveness check.
        """
        fixed = self.job.coordinator.collect_tasks
        if fixed > 0:
            return max(0, fixed - collecting)
        starting = sum(1 for t in self.driver.tasks.values() if t.state is State.STARTING)
        spare = max(0, self._idle_workers - starting)
        return max(1, collecting + spare) - collecting

    def _run_ahead(self) -> int:
        """Samples collected or promised that the learner has not taken in: the rate limiter's measure.

        The learner takes data only as fast as it trains at its replay ratio, so what waits
        in its queue, plus what the running collect tasks will still deliver, is how far
        collection runs ahead of training.
        """
        items = self.bus.depth(self.names.learner_data(self.job.coordinator.buffer_id))
        per_item = self.stats.samples / self.stats.data_items if self.stats.data_items else 0.0
        n_sample = self.job.collector.n_sample
        promised = sum(max(0, n_sample - t.samples) for t in self.driver.tasks.values() if t.kind is Kind.COLLECT)
        return round(items * per_item) + promised

    # -- outcomes -------------------------------------------------------------------

    def _dropped(self, task: Task, rerun: bool) -> None:
        self.telemetry.task_dropped(task, rerun)
        if rerun and task.kind is Kind.EVAL:
            self._next_eval = time.monotonic()  # the next fill starts a new one

    def _refused(self, task: Task, refusal: Refusal | None, message: str) -> None:
        """A worker refused a start: the end of the run if no worker can ever accept it, else a pause."""
        if refusal is not None and refusal.permanent:
            logger.error("the job's %s tasks are refused (%s): %s", task.kind, refusal, message)
            self.abort(f"{task.kind} tasks refused by the workers ({refusal}): {message}")
            return
        # Busy or broken workers: wait a little before the next start, longer each time,
        # instead of sending the same request again every loop turn.
        self._refusals += 1
        delay = min(REFUSAL_BACKOFF_MAX_S, REFUSAL_BACKOFF_S * 2 ** (self._refusals - 1))
        self._fill_after = time.monotonic() + delay
        logger.warning("start of %s refused (%s); next start in %.1f s", task.task_id, refusal or message, delay)

    def _record(self, task: Task, finish: FinishInfo | None) -> None:
        self.telemetry.task_completed(task, finish)
        record: dict[str, Any] = {
            "task_id": task.task_id,
            "worker_id": task.worker_id,
            "env_steps": self.stats.env_steps,
        }
        if finish is not None:
            record.update({k: v for k, v in finish.to_wire().items() if k != "reward_raw"})
        elif task.last_info is not None:
            record.update(task.last_info.to_wire())
        if task.kind is Kind.COLLECT:
            self.run_log.write("task", record)
            return
        if finish is None or finish.error or not finish.real_episode_count:
            why = (finish.error if finish is not None else None) or "no close reply"
            logger.warning("eval task %s produced no episodes (%s)", task.task_id, why)
            return
        self.stats.record_eval(finish.reward_mean)
        self.stats.policy_iter = max(self.stats.policy_iter, finish.train_iter)
        record["steps_per_s"] = round(self.stats.steps_per_s(), 1)
        record["elapsed_s"] = round(self.stats.elapsed(), 2)
        self.run_log.write("eval", record)
        logger.info(
            "eval %d: return %.1f at %d env steps (policy iter %d)",
            self.stats.evals,
            finish.reward_mean,
            self.stats.env_steps,
            finish.train_iter,
        )
        if finish.reward_mean >= self.job.env.stop_value:
            self.success = True
            self.reason = f"eval return {finish.reward_mean:.1f} >= {self.job.env.stop_value}"

    # -- checkpoint and resume ------------------------------------------------------

    def _checkpoint(self, *, soon: bool = False) -> None:
        """Write a checkpoint; ``soon``: unless one was written less than CHECKPOINT_MIN_S ago (then next turn).

        Tasks start many times a second when they are short: one checkpoint per start
        would make the run log mostly checkpoints, while a restarted coordinator only
        needs the newest.
        """
        now = time.monotonic()
        if soon and now - self._last_checkpoint < CHECKPOINT_MIN_S:
            self._checkpoint_due = True
            return
        self._checkpoint_due = False
        self._last_checkpoint = now
        self.run_log.write("checkpoint", checkpoint_record(self.stats, self.driver.tasks.values(), self.driver.seq))

    def _resume(self, checkpoint: dict[str, Any]) -> None:
        self.driver.seq, tasks = restore(checkpoint, self.stats)
        for task in tasks:
            self.driver.adopt(task)
        logger.info(
            "resumed the run at %d env steps, %d tasks done, re-attached to %d running tasks",
            self.stats.env_steps,
            self.stats.tasks_done,
            len(self.driver.tasks),
        )

    # -- shutdown -------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Close running tasks (bounded), forward what they already sent, then leave."""
        deadline = time.monotonic() + self.shutdown_s
        self.driver.close_all()
        while self.driver.tasks and time.monotonic() < deadline:
            try:
                self.bus.wait(0.1)
                self.driver.advance_all()
            except MessagingError as exc:
                logger.warning("shutdown: %s", exc.message)
                break
        for task in list(self.driver.tasks.values()):
            # No close reply in time: free the task's queue all the same (a start request not
            # answered yet may still create it; a later start reply finds no reply queue, and
            # the worker then drops the task).
            if task.metadata_queue is None:
                task.metadata_queue = self.names.metadata(task.task_id)
            if task.correlation_id is not None:
                self.bus.abandon(task.correlation_id)
            with contextlib.suppress(MessagingError):
                self.driver.drop(task, rerun=False)
        summary = self.summary()
        self.progress.finish(summary)
        self.run_log.write("summary", summary)
        self.run_log.close()
        self.telemetry.tick((), 0, final=True)
        self.telemetry.close()
        self.bus.close()
