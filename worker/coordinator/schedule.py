"""When the coordinator starts tasks, and on which worker: the slots it fills each loop turn.

Collect tasks: a fixed number at a time (``coordinator.collect_tasks``), or (auto) one per
collector listening on the task queue, so scaling out needs no flag, plus
``coordinator.start_ahead`` start requests waiting in the queue for the next collector to
be free. A task that is done no longer holds its collector (its start asked
``free_when_done``, and the worker said it would): the next start goes out before the
close, and the waiting one is taken at once. They are held back
while collection runs more than ``max_run_ahead_samples`` ahead of the learner (the rate
limit). An eval task every ``eval_interval_s``, one at a time. Where some workers cannot
run the job (:class:`~worker.coordinator.roster.Roster`), each start goes to one that can.
After a refused start or a failed task the starts pause a while.

What happens to a task once it is started is :class:`~worker.coordinator.driver.TaskDriver`'s
business; what its outcome means for the run is the loop's (:mod:`worker.coordinator.loop`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from messaging import Names
from worker.coordinator.bus import CoordinatorBus
from worker.coordinator.driver import TaskDriver
from worker.coordinator.roster import Roster
from worker.coordinator.stats import RunStats
from worker.coordinator.task import Kind, State, Task
from worker.job import JobConfig
from worker.protocol import CollectorSpec

#: Pause before the next start after a transient refusal, doubling up to the maximum.
REFUSAL_BACKOFF_S = 0.2
REFUSAL_BACKOFF_MAX_S = 5.0


class Schedule:
    """Fills the run's free task slots (see the module docstring).

    Args:
        eval_spec: the ``collector_cfg`` of the next eval task (an eval, or the confirmation of one).
        launched: called with each task it started.
    """

    def __init__(
        self,
        job: JobConfig,
        *,
        bus: CoordinatorBus,
        names: Names,
        driver: TaskDriver,
        roster: Roster,
        stats: RunStats,
        eval_spec: Callable[[], CollectorSpec],
        launched: Callable[[Task], None],
    ) -> None:
        self.job = job
        self.bus = bus
        self.names = names
        self.driver = driver
        self.roster = roster
        self.stats = stats
        self._eval_spec = eval_spec
        self._launched = launched
        self.next_eval = time.monotonic() + job.coordinator.eval_interval_s
        """When the next eval task starts (the one running first ends)."""
        self.fill_after = 0.0
        """No start before this (a pause after a refused start or a failed task)."""
        self.idle_workers = 0
        """Collectors listening on the shared task queue, as last counted (minus the starts sent
        since, plus the workers freed since: their tasks are done)."""
        self.workers_counted = 0
        """Collectors (busy or idle) at the last count: what ``start_ahead`` -1 scales with."""
        self._freed: set[str] = set()
        """Done tasks whose freed worker was added to ``idle_workers`` once (kept until the task
        is closed: a count after that sees the worker itself)."""
        self._refusals = 0

    def count_idle_workers(self) -> None:
        """Count the collectors listening on the shared task queue (a busy worker pauses its consumer)."""
        self.idle_workers = self.bus.consumers(self.names.collector_tasks)
        busy = sum(1 for t in self.driver.tasks.values() if t.state is not State.STARTING and t.holds_worker)
        self.workers_counted = self.idle_workers + busy
        self._freed = {task_id for task_id in self._freed if task_id in self.driver.tasks}

    def eval_now(self) -> None:
        """Start an eval at the next fill (a confirmation, or the rerun of one that was dropped)."""
        self.next_eval = time.monotonic()

    def pause(self, delay: float) -> None:
        """No start for ``delay`` seconds (or longer, if a pause already lasts longer)."""
        self.fill_after = max(self.fill_after, time.monotonic() + delay)

    def back_off(self) -> float:
        """Pause the starts after a transient refusal, longer each time; returns the pause.

        Busy or broken workers: the same request is not sent again every loop turn.
        """
        self._refusals += 1
        delay = float(min(REFUSAL_BACKOFF_MAX_S, REFUSAL_BACKOFF_S * 2 ** (self._refusals - 1)))
        self.fill_after = time.monotonic() + delay
        return delay

    def fill(self) -> None:
        self._credit_freed_workers()
        if time.monotonic() < self.fill_after:
            return
        collecting = sum(1 for t in self.driver.tasks.values() if t.kind is Kind.COLLECT and t.holds_worker)
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
            self.idle_workers = max(0, self.idle_workers - 1)  # claimed until the next count
            run_ahead += n_sample
            collecting += 1
        self.stats.held_back = held
        now = time.monotonic()
        due = now >= self.next_eval and not any(t.kind is Kind.EVAL for t in self.driver.tasks.values())
        if due and self._launch(Kind.EVAL):
            self.next_eval = now + self.job.coordinator.eval_interval_s

    def _launch(self, kind: Kind) -> bool:
        """Start one task: on the shared queue, or, where some worker cannot run the job, on one that can.

        Returns:
            False when no worker that can run the job is free (nothing was sent).
        """
        worker = None
        if self.roster.mixed:
            taken = {t.worker_id or t.target_worker for t in self.driver.tasks.values() if t.holds_worker}
            worker = self.roster.pick({w for w in taken if w is not None})
            if worker is None:
                return False
        cfg = self.job.collect_spec(self.stats.env_steps) if kind is Kind.COLLECT else self._eval_spec()
        task = self.driver.launch(kind, cfg, target=worker.control_queue if worker is not None else None)
        task.target_worker = worker.worker_id if worker is not None else None
        self._launched(task)
        return True

    def _credit_freed_workers(self) -> None:
        """A task done on a worker that frees itself then: that worker is idle now (until the next count)."""
        for task in self.driver.tasks.values():
            if not task.holds_worker and task.task_id not in self._freed:
                self._freed.add(task.task_id)
                self.idle_workers += 1

    def _collect_slots(self, collecting: int) -> int:
        """How many more collect tasks could start: the configured number, or (auto) one per worker, and some ahead.

        ``collecting``: the collect tasks that hold a worker or wait for one. In auto mode
        the idle workers are the consumers of the shared task queue (a busy worker pauses
        its consumer), counted at every liveness check, and ``start_ahead`` more wait in
        the queue for the next worker to be free.
        """
        fixed = self.job.coordinator.collect_tasks
        if fixed > 0:
            return max(0, fixed - collecting)
        if self.roster.mixed:
            # Workers that cannot run the job consume the shared queue too: count the ones that can.
            held = sum(1 for t in self.driver.tasks.values() if t.holds_worker)
            return max(0, len(self.roster.capable()) - held + self._evals_running())
        starting = {kind: 0 for kind in Kind}
        for task in self.driver.tasks.values():
            if task.state is State.STARTING:
                starting[task.kind] += 1
        running = collecting - starting[Kind.COLLECT]
        idle = max(0, self.idle_workers - starting[Kind.EVAL])
        return max(0, max(1, running + idle) + self.start_ahead() - collecting)

    def start_ahead(self) -> int:
        """Start requests to keep waiting for the next free worker (auto mode; see the module docstring)."""
        ahead = self.job.coordinator.start_ahead
        return max(1, (self.workers_counted + 7) // 8) if ahead < 0 else ahead

    def _evals_running(self) -> int:
        return sum(1 for t in self.driver.tasks.values() if t.kind is Kind.EVAL and t.holds_worker)

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
