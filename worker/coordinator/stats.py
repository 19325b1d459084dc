"""The run's counters, and their one serialised form (checkpoints and the summary share it)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from worker.storage.counters import LearnerCounters

#: The counters a checkpoint carries; everything else in :class:`RunStats` is derived or local.
_SAVED = ("env_steps", "samples", "episodes", "data_items", "tasks_done", "tasks_rerun", "evals")
_SAVED_OPTIONAL = ("best_eval", "last_eval")
#: Saved when known, as integers.
_SAVED_OPTIONAL_COUNTS = ("best_eval_policy",)


@dataclass
class RunStats:
    """Counters of a run, updated as metadata and finish infos arrive."""

    started_at: float = field(default_factory=time.monotonic)
    env_steps: int = 0
    samples: int = 0
    episodes: int = 0
    data_items: int = 0
    tasks_done: int = 0
    tasks_rerun: int = 0
    evals: int = 0
    last_eval: float | None = None
    best_eval: float | None = None
    best_eval_policy: int | None = None
    """The policy version the best eval ran."""
    policy_iter: int = 0
    """Newest learner iteration seen (in data metadata and eval results)."""
    first_data_at: float | None = None
    """When the first data item arrived (monotonic): collection time is counted from there."""
    held_back: bool = False
    """Collect tasks are being held back: the learner is behind (see the coordinator's rate limit)."""
    no_workers: bool = False
    """No collector has listened on the task queue or run a task for a while (the coordinator said so)."""
    workers: set[str] = field(default_factory=set)
    rate_window: list[tuple[float, int]] = field(default_factory=list)
    learner: LearnerCounters | None = None
    """The learner's own counters, as last read from the shared volume (``None``: not seen)."""

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def steps_per_s(self) -> float:
        """Env steps per second over the last ~10 s."""
        now = time.monotonic()
        self.rate_window.append((now, self.env_steps))
        while len(self.rate_window) > 2 and now - self.rate_window[0][0] > 10.0:
            self.rate_window.pop(0)
        (t0, s0), (t1, s1) = self.rate_window[0], self.rate_window[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def collection_s(self) -> float:
        """Seconds since the first data item arrived (0 before)."""
        return time.monotonic() - self.first_data_at if self.first_data_at is not None else 0.0

    def replay_ratio(self) -> float | None:
        """Train steps per sample, as the learner counted both; ``None`` while its counters are unknown.

        Not the newest policy iteration over the samples collected: the iteration seen in
        the data lags the learner, and samples still queued for it are not learned from yet
        (that read 10-25% low).
        """
        return self.learner.replay_ratio if self.learner is not None else None

    def count_data(self, samples: int, policy_iter: int) -> None:
        """A data item of ``samples`` samples, collected with the learner's policy ``policy_iter``."""
        if self.first_data_at is None:
            self.first_data_at = time.monotonic()
        self.samples += samples
        self.data_items += 1
        self.policy_iter = max(self.policy_iter, policy_iter)

    def record_eval(self, reward: float, policy: int | None = None) -> None:
        """An eval of policy version ``policy`` returned ``reward`` (its mean)."""
        self.evals += 1
        self.last_eval = reward
        if self.best_eval is None or reward > self.best_eval:
            self.best_eval, self.best_eval_policy = reward, policy

    def to_record(self) -> dict[str, Any]:
        """The counters as a JSON-ready map (:meth:`restore` reads it back)."""
        saved = (*_SAVED, *_SAVED_OPTIONAL, *_SAVED_OPTIONAL_COUNTS, "policy_iter")
        record: dict[str, Any] = {name: getattr(self, name) for name in saved}
        record["elapsed_s"] = round(self.elapsed(), 3)
        return record

    def restore(self, record: dict[str, Any]) -> None:
        """Continue counting from a :meth:`to_record` map (missing keys keep their value)."""
        self.started_at = time.monotonic() - float(record.get("elapsed_s", 0.0))
        for name in (*_SAVED, "policy_iter"):
            setattr(self, name, int(record.get(name, getattr(self, name))))
        for name in _SAVED_OPTIONAL:
            value = record.get(name, getattr(self, name))
            setattr(self, name, None if value is None else float(value))
        for name in _SAVED_OPTIONAL_COUNTS:
            value = record.get(name, getattr(self, name))
            setattr(self, name, None if value is None else int(value))
