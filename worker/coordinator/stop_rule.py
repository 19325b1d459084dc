"""The stop rule: the run succeeds on an eval at the stop value of a policy that trained, confirmed.

An eval of a policy that trained (version 1 on) whose mean return reaches the stop value
gets a confirmation: the same policy version (each eval reads a copy of the policy file,
:mod:`~worker.coordinator.policy_files`) runs ``confirm_episodes`` more episodes at once,
and their mean must reach it too. A few lucky episodes of a policy that is not there yet
would otherwise end the run. The evaluated policy is then the one the run leaves: it is
kept as the policy file, which the learner no longer replaces.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker.coordinator.policy_files import RunPolicy
from worker.coordinator.stats import RunStats
from worker.coordinator.task import Kind, Task
from worker.job import JobConfig
from worker.protocol import CollectorSpec, FinishInfo

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Passed:
    """An eval that reached the stop value: its task, the policy version and file it read, its return."""

    task_id: str
    policy: int
    policy_file: str
    reward: float


class StopRule:
    """Counts the run's evals and judges them against the stop value (see the module docstring).

    Args:
        policy: the policy file, a fresh copy of which each eval reads.
        met: called once, with the reason, when a confirmed eval ends the run at the stop value.
        confirm: called when an eval at the stop value is to be confirmed (the next eval is its confirmation).
    """

    def __init__(
        self,
        job: JobConfig,
        stats: RunStats,
        policy: RunPolicy,
        *,
        met: Callable[[str], None],
        confirm: Callable[[], None],
    ) -> None:
        self.job = job
        self.stats = stats
        self.policy = policy
        self._met = met
        self._confirm = confirm
        self.confirming: Passed | None = None
        """An eval at the stop value whose confirmation is to run (or running, as ``confirm_task``)."""
        self.confirm_task: str | None = None
        self.confirmed: tuple[Passed, float | None] | None = None
        """The eval that ended the run at the stop value, and its confirmation's return (None: no confirmation)."""

    def eval_spec(self) -> CollectorSpec:
        """The next eval: the confirmation of one at the stop value, else an eval of a fresh copy of the policy."""
        if self.confirming is not None:
            return self.job.confirm_spec(self.confirming.policy_file)
        return self.job.eval_spec(self.policy.for_eval())

    def launched(self, task: Task) -> None:
        """A task started: an eval started while one at the stop value waits for its confirmation is that."""
        if task.kind is Kind.EVAL and self.confirming is not None:
            self.confirm_task = task.task_id

    def completed(self, task: Task, finish: FinishInfo | None, record: dict[str, Any], *, ending: bool) -> bool:
        """Count an eval task that ended and judge it; ``record`` gets what the run log says of it.

        Args:
            ending: the run is ending (an eval it cut short is expected, not a fault).

        Returns:
            False when it played no episodes (nothing to record).
        """
        if finish is None or finish.error or not finish.real_episode_count:
            why = (finish.error if finish is not None else None) or "no close reply"
            if ending and not (finish is not None and finish.error):
                # Closed by the run's end before its episodes were over: expected, not a fault.
                logger.info("eval task %s was cut short by the end of the run (%s)", task.task_id, why)
            else:
                logger.warning("eval task %s produced no episodes (%s)", task.task_id, why)
            return False
        confirms = self.confirming if task.task_id == self.confirm_task else None
        self.stats.record_eval(finish.reward_mean, finish.train_iter)
        self.stats.policy_iter = max(self.stats.policy_iter, finish.train_iter)
        record["steps_per_s"] = round(self.stats.steps_per_s(), 1)
        record["elapsed_s"] = round(self.stats.elapsed(), 2)
        if confirms is not None:
            record["confirms"] = confirms.task_id
        logger.info(
            "%s: return %.1f over %d episodes at %d env steps (policy %d)",
            f"eval {self.stats.evals}" if confirms is None else f"confirmation (eval {self.stats.evals})",
            finish.reward_mean,
            finish.real_episode_count,
            self.stats.env_steps,
            finish.train_iter,
        )
        if self.confirmed is None:
            if confirms is not None:
                self._judge_confirmation(confirms, finish)
            else:
                self._judge_eval(task, finish)
            if self.confirmed is not None:
                record["success"] = True  # the eval that ended the run at the stop value
        return True

    def _judge_eval(self, task: Task, finish: FinishInfo) -> None:
        """An eval at the stop value of a policy that trained gets its confirmation (or, with none, ends the run)."""
        stop_value = self.job.env.stop_value
        if finish.reward_mean < stop_value or self.confirming is not None:
            return
        if finish.train_iter < 1 and self.job.bound.kind != "none":
            logger.info(
                "eval %d reached %s with the untrained policy (version 0): a run ends only on a policy that trained",
                self.stats.evals,
                stop_value,
            )
            return
        policy_file = task.start.cfg.policy_update_path if task.start is not None else None
        passed = Passed(task.task_id, finish.train_iter, policy_file or self.policy.name, finish.reward_mean)
        if self.job.env.confirm_episodes == 0:
            self._succeed(passed, None)
            return
        logger.info(
            "eval %d reached %s: confirming policy %d over %d more episodes",
            self.stats.evals,
            stop_value,
            passed.policy,
            self.job.env.confirm_episodes,
        )
        self.confirming = passed
        self._confirm()  # the next fill starts it

    def _judge_confirmation(self, passed: Passed, finish: FinishInfo) -> None:
        """The confirmation of ``passed``: the run ends if it reaches the stop value too, else goes on."""
        self.confirming = self.confirm_task = None
        if finish.reward_mean >= self.job.env.stop_value:
            self._succeed(passed, finish.reward_mean)
            return
        logger.info(
            "policy %d not confirmed: %.1f over %d episodes < %s; the run goes on",
            passed.policy,
            finish.reward_mean,
            finish.real_episode_count,
            self.job.env.stop_value,
        )

    def _succeed(self, passed: Passed, confirmation: float | None) -> None:
        self.confirmed = (passed, confirmation)
        stop_value = self.job.env.stop_value
        self._met(
            f"eval return {passed.reward:.1f} >= {stop_value}"
            + (
                ""
                if confirmation is None
                else f", confirmed: {confirmation:.1f} over {self.job.env.confirm_episodes} more episodes"
            )
        )
