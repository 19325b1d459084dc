"""The coordinator: keeps collect and eval tasks running on whatever workers exist.

One thread that never blocks for long. Each turn it fills free task slots
(:class:`~worker.coordinator.schedule.Schedule`: by default one collect task per idle
collector listening on the task queue, plus an eval task every ``eval_interval_s``), lets
the broker connection work for a moment, and moves every task on
(:class:`~worker.coordinator.driver.TaskDriver`). Every few seconds it checks that the
workers of running tasks are still there and writes a checkpoint. The run ends at the
stop value (an eval at it, confirmed: the stop rule, :mod:`~worker.coordinator.stop_rule`),
a budget, or a signal, or when its plug-ins keep failing (the give-up rule,
:mod:`~worker.coordinator.giveup`).

This module is the loop and the run's bookkeeping: what each task's outcome means for
the run, how it ends, its checkpoints and its shutdown. They are one piece: each reads
and changes the run's state (its counters, its tasks, whether it succeeded, failed or is
ending) on the loop's one thread, and apart they would only hand that state back and forth.
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
from worker.coordinator.best_policy import BestPolicy
from worker.coordinator.bus import BrokerBus, CoordinatorBus
from worker.coordinator.checkpoint import checkpoint_record, last_checkpoint, restore
from worker.coordinator.driver import TaskDriver
from worker.coordinator.eval_videos import EvalVideos
from worker.coordinator.giveup import GiveUp, TaskFailures
from worker.coordinator.policy_files import RunPolicy
from worker.coordinator.progress import Progress, RunLog
from worker.coordinator.roster import Roster, job_requirements
from worker.coordinator.schedule import Schedule
from worker.coordinator.stats import RunStats
from worker.coordinator.stop_rule import StopRule
from worker.coordinator.summary import learner_counts, run_summary
from worker.coordinator.task import Kind, State, Task, Timeouts
from worker.coordinator.telemetry import RunTelemetry
from worker.job import job_plugins
from worker.plugins.faults import TaskPlugins
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
            on_completed=self._completed,
            on_dropped=self._dropped,
            on_refused=self._refused,
            plugins=describe_plugins(job_plugins(self.job)),
        )
        self.roster = Roster(self.bus, job_requirements(self.job))
        self.reason = "running"
        self.success = False
        self.error: str | None = None
        """Why the run cannot go on (a refused job, a dead learner); set through :meth:`abort`."""
        self.failure: dict[str, Any] | None = None
        """The plug-in failure the run gave up on (:meth:`give_up`): what ``summary.json`` says of it."""
        self.failures = TaskFailures(coord.max_consecutive_failures)
        """Failed tasks in a row: when the run gives up on its plug-ins (:mod:`worker.coordinator.giveup`)."""
        self._next_check = time.monotonic() + LIVENESS_CHECK_S
        self._last_checkpoint = 0.0
        self._checkpoint_due = False
        self._nobody_since: float | None = None
        self.continue_ended = continue_ended
        self.shutdown_s = SHUTDOWN_S
        """How long running tasks get to close when the run ends."""
        self._no_worker_since: float | None = time.monotonic()  # none seen yet
        self._counters_path = counters_path(config.path_policy, coord.policy_name)
        self._started_at = time.time()
        self.policy = RunPolicy(config.path_policy, coord.policy_name)
        """The policy file: the copy each eval reads, and the policy the run leaves."""
        self.best = BestPolicy(self.policy)
        """``<policy name>.best``: the policy of the best eval so far (:mod:`~worker.coordinator.best_policy`)."""
        self.videos = EvalVideos(
            coord.video_every_evals, self.policy, config.path_policy.parent / "videos", config.tensorboard_dir
        )
        """Every ``video_every_evals``-th eval's policy, filmed (:mod:`~worker.coordinator.eval_videos`)."""
        self.stop_rule = StopRule(self.job, self.stats, self.policy, met=self._succeed, confirm=self._eval_now)
        self.schedule = Schedule(
            self.job,
            bus=self.bus,
            names=self.names,
            driver=self.driver,
            roster=self.roster,
            stats=self.stats,
            eval_spec=self.stop_rule.eval_spec,
            launched=self._launched,
        )
        self._policy_left: int | None = None

    # -- the run --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run until the stop value, a budget, or ``stop``; returns the summary."""
        coord = self.job.coordinator
        self.telemetry.serve(self.config.metrics_addr, self.config.metrics_port)
        self.bus.open(self.names.collector_tasks_decl(), self.names.learner_data_decl(coord.buffer_id))
        self.schedule.count_idle_workers()
        checkpoint = last_checkpoint(self.config.run_log, after_end=self.continue_ended)
        if checkpoint is not None:
            self._resume(checkpoint)
        self.policy.release()  # an earlier run's kept policy file: this run's learner writes it
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
        """One loop turn: let the broker work, move every task on, fill slots, check workers.

        Slots are filled right after the tasks moved on: a task whose stream said it is done
        has freed its worker (see :mod:`~worker.coordinator.schedule`), and the next start
        goes out in the same turn.
        """
        try:
            self.roster.refresh()
            self.bus.wait(TURN_S)
            self.driver.advance_all()
            if self.error is None and not self.success:
                self.schedule.fill()
            if time.monotonic() >= self._next_check:
                self.schedule.count_idle_workers()
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
        if self.schedule.idle_workers > 0 or working:
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

    def policy_left(self) -> int | None:
        """The version in the policy file's header now (``None``: not visible from here); read again once the
        learner stopped, it is the policy the run leaves."""
        version = self.policy.version()
        if version is not None:
            self._policy_left = version
        return self._policy_left

    def learner_left(self) -> dict[str, Any]:
        """The summary's learner counters, read again: once the learner stopped, its last.

        The learner writes them with each policy write and as it stops; the summary made as
        the run ended may be up to a policy write interval behind (zero updates, for a short
        run whose learner started late), so ``warren run`` reads them again after stopping it.
        """
        self._read_learner_counters()
        return learner_counts(self.stats)

    def abort(self, reason: str) -> None:
        """End the run as failed (from any thread): the job cannot succeed, say why and stop."""
        if self.error is None:
            self.error = reason
        self.stop.set()

    def give_up(self, reason: str, failure: Mapping[str, Any]) -> None:
        """End the run because the job's plug-ins keep failing (from any thread): ``failure`` says which, as data.

        ``warren run`` and ``warren coordinator`` then exit with code 4 (``ExitCode.PLUGIN_FAILING``).
        """
        if self.error is None:
            logger.critical("%s", reason)
            self.failure = dict(failure)
        self.abort(reason)

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
        """The run's outcome and counters (printed, written to ``summary.json`` and the run log; see
        :func:`~worker.coordinator.summary.run_summary`)."""
        self._read_learner_counters()
        summary = run_summary(
            self.stats,
            self.job,
            success=self.success,
            reason=self.reason,
            error=self.error,
            failure=self.failure,
            confirmed=self.stop_rule.confirmed,
            policy_left=self._policy_left,
        )
        summary["policy_best"] = self.best.version  # of <policy name>.best (None: none kept)
        return summary

    # -- outcomes -------------------------------------------------------------------

    def _launched(self, task: Task) -> None:
        self.stop_rule.launched(task)
        self.telemetry.task_launched(task)

    def _eval_now(self) -> None:
        self.schedule.eval_now()

    def _dropped(self, task: Task, rerun: bool) -> None:
        self.telemetry.task_dropped(task, rerun)
        if rerun and task.kind is Kind.EVAL:
            self.schedule.eval_now()  # the next fill starts a new one

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
        delay = self.schedule.back_off()
        logger.warning("start of %s refused (%s); next start in %.1f s", task.task_id, refusal or message, delay)

    def _completed(self, task: Task, finish: FinishInfo | None) -> None:
        self._count_outcome(task, finish)
        self._record(task, finish)

    def _count_outcome(self, task: Task, finish: FinishInfo | None) -> None:
        """Count a task's success or failure: pause the starts after a failure, give up after too many in a row."""
        if self.driver.closing:
            return  # closed by the end of the run: says nothing about the plug-ins
        counted = self.failures.count(task, finish)
        if isinstance(counted, GiveUp):
            self.give_up(counted.message(), counted.to_record())
        elif counted is not None:
            self.schedule.pause(counted)

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
        if self.stop_rule.completed(task, finish, record, ending=self.driver.closing):
            if finish is not None and self.best.evaluated(task, finish, self.stats.env_steps):
                record["best"] = True  # its policy is kept as <policy name>.best
            if finish is not None and self.videos.evaluated(self.stats.evals, task, finish, self.stats.env_steps):
                record["filmed"] = True
            self.run_log.write("eval", record)

    def _succeed(self, reason: str) -> None:
        """The stop rule is met: the run ends as a success."""
        self.success = True
        self.reason = reason

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
        self.best.resumed()
        logger.info(
            "resumed the run at %d env steps, %d tasks done, re-attached to %d running tasks",
            self.stats.env_steps,
            self.stats.tasks_done,
            len(self.driver.tasks),
        )

    # -- shutdown -------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Close running tasks (bounded), forward what they already sent, then leave."""
        # First the policy the run leaves, so that the learner stops replacing it at once: after
        # a success the one its eval passed, kept; otherwise whatever the learner wrote last.
        confirmed = self.stop_rule.confirmed
        self._policy_left = self.policy.finish(confirmed[0].policy_file if confirmed is not None else None)
        now = time.monotonic()
        deadline, starts_deadline = now + self.shutdown_s, now + min(START_CANCEL_S, self.shutdown_s)
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
        self.videos.close()  # a video being made gets a bounded time to finish
        summary = self.summary()
        self.progress.finish(summary)
        self.run_log.write("summary", summary)
        self.run_log.close()
        self.telemetry.tick((), 0, final=True)
        self.telemetry.close()
        self.bus.close()


def describe_plugins(plugins: TaskPlugins) -> str:
    """The job's plug-ins in words: env, algorithm, model, each with its version and package."""
    refs = [plugins.env, plugins.algorithm, *([plugins.model] if plugins.model is not None else [])]
    return ", ".join(ref.describe() for ref in refs)
