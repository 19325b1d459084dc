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
from collections.abc import Mapping
from typing import Any

from messaging import BrokerConnectionError, MessagingError, Names
from worker.config import CoordinatorConfig
from worker.coordinator.bus import BrokerBus, CoordinatorBus
from worker.coordinator.checkpoint import checkpoint_record, last_checkpoint, restore
from worker.coordinator.driver import TaskDriver
from worker.coordinator.progress import Progress, RunLog
from worker.coordinator.roster import Requirement, Roster
from worker.coordinator.stats import RunStats
from worker.coordinator.task import Kind, State, Task, Timeouts
from worker.coordinator.telemetry import RunTelemetry
from worker.protocol import FinishInfo, Refusal
from worker.storage.counters import counters_path, read_counters

logger = logging.getLogger(__name__)

#: How often the coordinator checks workers, counts the idle ones and checkpoints.
LIVENESS_CHECK_S = 2.0
#: How long the broker connection works per loop turn (replies and stream items arrive meanwhile).
TURN_S = 0.05
#: Shortest time between two checkpoints written because tasks started.
CHECKPOINT_MIN_S = 0.5
#: How long running tasks get to close when the run ends.
SHUTDOWN_S = 15.0
#: How long a start request not answered yet may still be taken when the run ends. A worker
#: that listens takes one within milliseconds; longer, nobody will, and waiting the whole
#: SHUTDOWN_S for it overran the run's budget by 15 s when no collector listened.
START_CANCEL_S = 1.0
#: No collector listening and none running a task for this long: say so (once per absence).
NO_WORKER_NOTICE_S = 5.0
#: Learner counters written this long before the coordinator started still count as this
#: run's (the clocks of the learner's and the coordinator's machines may differ a little).
COUNTERS_CLOCK_SLACK_S = 5.0
#: Pause before the next start after a transient refusal, doubling up to the maximum.
REFUSAL_BACKOFF_S = 0.2
REFUSAL_BACKOFF_MAX_S = 5.0


class Coordinator:
    """Drives collector workers through the task protocol until the run ends.

    Args:
        config: broker settings, the job, run log path, progress mode.
        stop: set it (e.g. from a signal handler) to end the run early.
        bus: the broker operations; a :class:`~worker.coordinator.bus.BrokerBus` by default.
        continue_ended: go on counting from the run log's last checkpoint even if that run
            ended (``warren run --resume``); otherwise only an unfinished run is resumed.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        stop: threading.Event | None = None,
        *,
        bus: CoordinatorBus | None = None,
        continue_ended: bool = False,
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
        self.roster = Roster(self.bus, job_requirements(self.job))
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
        self._nobody_since: float | None = None
        self.continue_ended = continue_ended
        self.shutdown_s = SHUTDOWN_S
        """How long running tasks get to close when the run ends."""
        self._ending = False
        self._no_worker_since: float | None = time.monotonic()  # none seen yet
        self._counters_path = counters_path(config.path_policy, coord.policy_name)
        self._started_at = time.time()

    # -- the run --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run until the stop value, a budget, or ``stop``; returns the summary."""
        coord = self.job.coordinator
        self.telemetry.serve(self.config.metrics_addr, self.config.metrics_port)
        self.bus.open(self.names.collector_tasks_decl(), self.names.learner_data_decl(coord.buffer_id))
        self._idle_workers = self.bus.consumers(self.names.collector_tasks)
        checkpoint = last_checkpoint(self.config.run_log, after_end=self.continue_ended)
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
            self.roster.refresh()
            self._fill()
            self.bus.wait(TURN_S)
            self.driver.advance_all()
            if time.monotonic() >= self._next_check:
                self._idle_workers = self.bus.consumers(self.names.collector_tasks)
                self._notice_missing_workers()
                self._read_learner_counters()
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

    def _read_learner_counters(self) -> None:
        """The learner's own counters, when it wrote them since this coordinator started.

        An older file is an earlier run's (a learner that resumes rewrites it within a
        policy write interval); a coordinator that cannot see the learner's policy
        directory keeps the replay ratio unknown rather than guessing it.
        """
        counted = read_counters(self._counters_path)
        if counted is not None and counted.written_at >= self._started_at - COUNTERS_CLOCK_SLACK_S:
            self.stats.learner = counted

    def _notice_missing_workers(self) -> None:
        """Say once, after NO_WORKER_NOTICE_S, that no collector listens and none runs a task.

        Otherwise a coordinator started with the wrong prefix or broker, or before any
        collector, shows only zeros for its whole run.
        """
        working = any(t.worker_id is not None for t in self.driver.tasks.values())
        now = time.monotonic()
        if self._idle_workers > 0 or working:
            if self.stats.no_workers:
                logger.info("a collector is listening on %s now", self.names.collector_tasks)
            self._no_worker_since = None
            self.stats.no_workers = False
            return
        if self._no_worker_since is None:
            self._no_worker_since = now
        elif not self.stats.no_workers and now - self._no_worker_since >= NO_WORKER_NOTICE_S:
            self.stats.no_workers = True
            logger.warning(
                "no collector is listening on %s (none for %.0f s): start one with the same broker and prefix"
                " (warren collector --prefix %s), or check WARREN_AMQP_URL and WARREN_PREFIX",
                self.names.collector_tasks,
                now - self._no_worker_since,
                self.names.prefix,
            )

    def abort(self, reason: str) -> None:
        """End the run as failed (from any thread): the job cannot succeed, say why and stop."""
        if self.error is None:
            self.error = reason
        self.stop.set()

    def _finished(self) -> bool:
        coord = self.job.coordinator
        if self.success:
            return True
        self._check_someone_can()
        if self.stop.is_set():
            self.reason = self.error or "stopped by signal"
        elif self.stats.env_steps >= coord.max_env_steps:
            self.reason = f"env step budget of {coord.max_env_steps:,} used"
        elif self.stats.elapsed() >= coord.max_time_s:
            self.reason = f"time budget of {coord.max_time_s:.0f} s used"
        else:
            return False
        return True

    def _check_someone_can(self) -> None:
        """End the run when, for ``start_timeout_s``, every worker heard of lacks a plug-in the job needs."""
        nobody = self.roster.nobody_can()
        if nobody is None:
            self._nobody_since = None
            return
        if self._nobody_since is None:
            self._nobody_since = time.monotonic()
        elif time.monotonic() - self._nobody_since > self.job.coordinator.start_timeout_s:
            self.abort(f"no worker listening can run this job: {nobody}")

    def summary(self) -> dict[str, Any]:
        """The run's outcome and counters (printed, written to ``summary.json`` and the run log)."""
        stats = self.stats
        self._read_learner_counters()
        learner, ratio = stats.learner, stats.replay_ratio()
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
            "replay_ratio": None if ratio is None else round(ratio, 4),
            "replay_ratio_configured": self.job.bound.replay_ratio,
            "learner_train_steps": None if learner is None else learner.train_steps,
            "learner_samples": None if learner is None else learner.samples,
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
            if not self._launch(Kind.COLLECT):
                break
            self._idle_workers = max(0, self._idle_workers - 1)  # claimed until the next count
            run_ahead += n_sample
            collecting += 1
        self.stats.held_back = held
        now = time.monotonic()
        due = now >= self._next_eval and not any(t.kind is Kind.EVAL for t in self.driver.tasks.values())
        if due and self._launch(Kind.EVAL):
            self._next_eval = now + self.job.coordinator.eval_interval_s

    def _launch(self, kind: Kind) -> bool:
        """Start one task: on the shared queue, or, where some worker cannot run the job, on one that can.

        Returns:
            False when no worker that can run the job is free (nothing was sent).
        """
        worker = None
        if self.roster.mixed:
            taken = {t.worker_id or t.target_worker for t in self.driver.tasks.values()}
            worker = self.roster.pick({w for w in taken if w is not None})
            if worker is None:
                return False
        cfg = self.job.collect_spec(self.stats.env_steps) if kind is Kind.COLLECT else self.job.eval_spec()
        task = self.driver.launch(kind, cfg, target=worker.control_queue if worker is not None else None)
        task.target_worker = worker.worker_id if worker is not None else None
        self.telemetry.task_launched(task)
        return True

    def _collect_slots(self, collecting: int) -> int:
        """How many more collect tasks could run: up to the configured number, or (auto) one per worker.

        In auto mode the idle workers are the consumers of the shared task queue (a busy
        worker pauses its consumer), counted at every liveness check.
        """
        fixed = self.job.coordinator.collect_tasks
        if fixed > 0:
            return max(0, fixed - collecting)
        if self.roster.mixed:
            # Workers that cannot run the job consume the shared queue too: count the ones that can.
            return max(0, len(self.roster.capable()) - len(self.driver.tasks) + self._evals_running())
        starting = sum(1 for t in self.driver.tasks.values() if t.state is State.STARTING)
        spare = max(0, self._idle_workers - starting)
        return max(1, collecting + spare) - collecting

    def _evals_running(self) -> int:
        return sum(1 for t in self.driver.tasks.values() if t.kind is Kind.EVAL)

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

    def _refused(self, task: Task, refusal: Refusal | None, message: str, detail: Mapping[str, Any]) -> None:
        """A worker refused a start: the end of the run if no worker can ever accept it, else a pause."""
        if refusal is not None and refusal.worker_specific:
            # That worker lacks a plug-in: it gets none of the job's tasks from now on.
            worker_id = detail.get("worker_id")
            self.roster.mark(str(worker_id), message)
            self.roster.soon()
            return
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
            if self._ending and not (finish is not None and finish.error):
                # Closed by the run's end before its episodes were over: expected, not a fault.
                logger.info("eval task %s was cut short by the end of the run (%s)", task.task_id, why)
            else:
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
        now = time.monotonic()
        deadline, starts_deadline = now + self.shutdown_s, now + min(START_CANCEL_S, self.shutdown_s)
        self._ending = True
        self.driver.close_all()
        while self.driver.tasks and time.monotonic() < deadline:
            if time.monotonic() >= starts_deadline and all(
                t.state is State.STARTING for t in self.driver.tasks.values()
            ):
                break  # only start requests nobody took: nobody will now
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
        # The counters as they end, for a run that is resumed later (warren run --resume).
        self._checkpoint()
        summary = self.summary()
        self.progress.finish(summary)
        self.run_log.write("summary", summary)
        self.run_log.close()
        self.telemetry.tick((), 0, final=True)
        self.telemetry.close()
        self.bus.close()


def job_requirements(job: Any) -> tuple[Requirement, ...]:
    """The plug-ins every task of ``job`` names (a worker lacking one cannot run it)."""
    needs = [
        Requirement("algorithm", job.algorithm.name, job.algorithm.version),
        Requirement("model", job.model.name, job.model.version),
    ]
    if job.env.plugin is not None:
        needs.append(Requirement("env", job.env.plugin, job.env.plugin_version))
    return tuple(needs)
