"""The run's summary: what ``summary.json``, the run log's last record and ``warren run``'s output say of it.

The run log's record is made as the coordinator ends; ``warren run`` then stops the learner
and reads its counters and policy version again for ``summary.json`` and its output.
"""

from __future__ import annotations

from typing import Any

from worker.coordinator.stats import RunStats
from worker.coordinator.stop_rule import Passed
from worker.job import JobConfig


def run_summary(
    stats: RunStats,
    job: JobConfig,
    *,
    success: bool,
    reason: str,
    error: str | None,
    failure: dict[str, Any] | None,
    confirmed: tuple[Passed, float | None] | None,
    policy_left: int | None,
) -> dict[str, Any]:
    """The run's outcome and counters.

    ``policy_evaluated`` is the policy version whose eval (and confirmation) ended the run
    at the stop value (``None`` when none did), ``best_eval_policy`` the best eval's, and
    ``policy_left`` the version in the policy file's header as the run ended (``None``:
    not visible from here): after a success the evaluated one, kept; otherwise the
    learner's newest then. ``policy_iter`` is the newest version seen in the data.
    """
    return {
        "success": success,
        "reason": reason,
        "error": error,
        "failure": failure,
        "stop_value": job.env.stop_value,
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
        "policy_evaluated": None if confirmed is None else confirmed[0].policy,
        "confirm_eval": None if confirmed is None else confirmed[1],
        "best_eval_policy": stats.best_eval_policy,
        "policy_left": policy_left,
        "replay_ratio_configured": job.bound.replay_ratio,
        **learner_counts(stats),
        "workers_seen": sorted(stats.workers),
    }


def learner_counts(stats: RunStats) -> dict[str, Any]:
    """What the learner says it did: its train steps, the samples they learned from, and their ratio.

    ``None`` each while the learner's counters are unknown (not written since the run
    started, or not visible from here).
    """
    learner, ratio = stats.learner, stats.replay_ratio()
    return {
        "replay_ratio": None if ratio is None else round(ratio, 4),
        "learner_train_steps": None if learner is None else learner.train_steps,
        "learner_samples": None if learner is None else learner.samples,
    }
