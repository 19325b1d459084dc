"""The give-up rule: a run whose tasks keep failing the same way stops, naming the plug-in.

A plug-in that always fails (a ``step`` that raises, observations of the wrong shape, a
model whose output does not fit its head) fails every task the coordinator starts. Started
again at once, such tasks made a busy loop: thousands of failed tasks and log lines until
the time budget, and a run that then looked like an honest budget miss.

So the coordinator counts task outcomes in the order they come in, those of collect tasks
and those of eval tasks apart (an eval's few short episodes may pass where collect tasks
fail, and must not hide that they do). Failures of the same
kind (the same first line of the error once numbers and ids are taken out: the same
plug-in, call and error, :func:`~worker.plugins.faults.failure_key`) in a row end the run
after ``coordinator.max_consecutive_failures`` of them, and so do three times as many
failures in a row of any kinds. A task that succeeds in between starts the count again,
so a failure that comes and goes (one bad seed, one flaky env) never stops a run. Until
then each failure in a row doubles a pause before the next task starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from worker.coordinator.task import Kind, Task
from worker.plugins.faults import failure_key, first_line, parse
from worker.protocol import FinishInfo

logger = logging.getLogger(__name__)

#: Pause before the next start after a failed task, doubling with each failure in a row up to the maximum.
FAILURE_BACKOFF_S = 0.2
FAILURE_BACKOFF_MAX_S = 5.0
#: Failures in a row, of whatever kinds, that end the run too, as a multiple of the limit:
#: failures that take turns between two kinds would otherwise never stop it.
ANY_KIND_FACTOR = 3


@dataclass(frozen=True)
class GiveUp:
    """Why the run gives up: the last failure, and how many tasks in a row failed."""

    error: str
    """The last failed task's error (its first line)."""
    tasks: int
    """Failed tasks in a row (of this kind, unless the any-kind limit ended the run)."""
    same_kind: bool
    limit: int
    task_id: str
    worker_id: str | None

    def message(self) -> str:
        """One line: the plug-in, the call and the error first, then how many in a row and the setting that decided.

        ``env plug-in 'grid' 0.1.0 (from my-envs, env 'grid-v1') kept failing: step: RuntimeError: ...;
        5 tasks in a row failed the same way, so the run gives up (...)``.
        """
        how = "the same way" if self.same_kind else "(of different kinds; the last shown)"
        why = (
            f"{self.tasks} tasks in a row failed {how}, so the run gives up (coordinator.max_consecutive_failures"
            f" = {self.limit}; the last, {self.task_id}, on worker {self.worker_id or '?'})"
        )
        if parse(self.error)["plugin"] is not None:
            culprit, _, rest = self.error.partition(": ")
            return f"{culprit} kept failing: {rest}; {why}"
        return f"{self.error}; {why}"

    def to_record(self) -> dict[str, Any]:
        """The failure as data, for ``summary.json``: plug-in, call, error, and how many tasks in a row."""
        return {**parse(self.error), "tasks_in_a_row": self.tasks, "task_id": self.task_id, "worker_id": self.worker_id}


class FailureStreak:
    """Task outcomes in a row: when to give up, and how long to pause before the next start.

    Args:
        limit: failures of one kind in a row that end the run (``coordinator.max_consecutive_failures``).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_a_row = 0
        """Failed tasks in a row, of any kind."""
        self.same = 0
        """Failed tasks in a row of the last failure's kind."""
        self._key: str | None = None

    def succeeded(self) -> None:
        """A task did its work: the count starts again."""
        self.in_a_row = self.same = 0
        self._key = None

    def failed(self, error: str, task_id: str, worker_id: str | None) -> GiveUp | None:
        """A task failed with ``error``; returns why the run gives up, once the limit is reached."""
        key = failure_key(error)
        self.same = self.same + 1 if key == self._key else 1
        self._key = key
        self.in_a_row += 1
        line = first_line(error)
        if self.same >= self.limit:
            return GiveUp(line, self.same, True, self.limit, task_id, worker_id)
        if self.in_a_row >= ANY_KIND_FACTOR * self.limit:
            return GiveUp(line, self.in_a_row, False, self.limit, task_id, worker_id)
        return None

    @property
    def backoff_s(self) -> float:
        """The pause before the next start: 0 after a success, then doubling with each failure in a row."""
        if self.in_a_row == 0:
            return 0.0
        return float(min(FAILURE_BACKOFF_MAX_S, FAILURE_BACKOFF_S * 2 ** (self.in_a_row - 1)))


class TaskFailures:
    """The run's failed tasks in a row, collect and eval apart (see the module docstring).

    Args:
        limit: failures of one kind in a row that end the run (``coordinator.max_consecutive_failures``).
    """

    def __init__(self, limit: int) -> None:
        self.streaks = {kind: FailureStreak(limit) for kind in Kind}

    def count(self, task: Task, finish: FinishInfo | None) -> GiveUp | float | None:
        """Count a task that ended, from its close reply (``finish``) or its last info item.

        Returns:
            Why the run gives up; or, after a failure short of that, the pause before the next
            start; or ``None`` when it did not fail.
        """
        said = task.last_info.error if task.last_info is not None else None
        error = (finish.error if finish is not None else None) or said
        streak = self.streaks[task.kind]
        if error is None:
            if finish is not None:
                streak.succeeded()
            return None
        if error != said:  # only in the close reply (a task stuck in a call publishes nothing more)
            logger.error("task %s failed on %s: %s", task.task_id, task.worker_id, error)
        gave_up = streak.failed(error, task.task_id, task.worker_id)
        if gave_up is not None:
            return gave_up
        delay = streak.backoff_s
        logger.warning(
            "%d %s tasks in a row failed (%d the same way; the run gives up at %d); next start in %.1f s",
            streak.in_a_row,
            task.kind,
            streak.same,
            streak.limit,
            delay,
        )
        return delay
