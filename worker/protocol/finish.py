"""``finish_info``: DI-engine's summary of a finished collect or eval task (the close reply)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from worker.errors import TaskError, short_repr


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den else 0.0


@dataclass(frozen=True)
class FinishInfo:
    """Counters, timings and episode returns of one task, as DI-engine's collector reports them.

    Build one from measured values with :meth:`measured`; the averages and the return
    statistics are derived there, once.
    """

    eval_flag: bool
    env_num: int
    duration: float
    train_iter: int
    """Learner iteration of the policy the task ended with."""
    collector_done: bool
    predefined_episode_count: int
    real_episode_count: int
    step_count: int
    sample_count: int
    avg_time_per_episode: float
    avg_time_per_step: float
    avg_time_per_train_sample: float
    avg_step_per_episode: float
    avg_sample_per_episode: float
    reward_mean: float
    reward_std: float
    reward_raw: list[float]
    finish_time: float = field(default_factory=time.time)
    collect_setting: dict[str, Any] | None = None
    """Collect tasks only: the exploration settings they ran with."""
    error: str | None = None
    """Why the task failed, when it did."""
    task_id: str | None = None

    @classmethod
    def measured(
        cls,
        *,
        eval_flag: bool,
        env_num: int,
        duration: float,
        train_iter: int,
        collector_done: bool,
        predefined_episode_count: int,
        steps: int,
        samples: int,
        returns: Sequence[float],
        collect_setting: dict[str, Any] | None = None,
    ) -> FinishInfo:
        episodes = len(returns)
        mean = math.fsum(returns) / episodes if episodes else 0.0
        std = math.sqrt(math.fsum((r - mean) ** 2 for r in returns) / episodes) if episodes else 0.0
        return cls(
            eval_flag=eval_flag,
            env_num=env_num,
            duration=duration,
            train_iter=train_iter,
            collector_done=collector_done,
            predefined_episode_count=predefined_episode_count,
            real_episode_count=episodes,
            step_count=steps,
            sample_count=samples,
            avg_time_per_episode=_ratio(duration, episodes),
            avg_time_per_step=_ratio(duration, steps),
            avg_time_per_train_sample=_ratio(duration, samples),
            avg_step_per_episode=_ratio(steps, episodes),
            avg_sample_per_episode=_ratio(samples, episodes),
            reward_mean=mean,
            reward_std=std,
            reward_raw=[float(r) for r in returns],
            collect_setting=collect_setting,
        )

    def to_wire(self) -> dict[str, Any]:
        wire = asdict(self)
        for optional in ("collect_setting", "error", "task_id"):
            if wire[optional] is None:
                del wire[optional]
        return wire

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> FinishInfo:
        """Read a close reply; keys a DI-engine collector may leave out take neutral values.

        Raises:
            TaskError: a value has the wrong type.
        """
        try:
            raw = result.get("reward_raw") or []
            setting = result.get("collect_setting")
            error = result.get("error")
            task_id = result.get("task_id")
            return cls(
                eval_flag=bool(result.get("eval_flag", False)),
                env_num=int(result.get("env_num", 0)),
                duration=float(result.get("duration", 0.0)),
                train_iter=int(result.get("train_iter", 0)),
                collector_done=bool(result.get("collector_done", False)),
                predefined_episode_count=int(result.get("predefined_episode_count", 0)),
                real_episode_count=int(result.get("real_episode_count", 0)),
                step_count=int(result.get("step_count", 0)),
                sample_count=int(result.get("sample_count", 0)),
                avg_time_per_episode=float(result.get("avg_time_per_episode", 0.0)),
                avg_time_per_step=float(result.get("avg_time_per_step", 0.0)),
                avg_time_per_train_sample=float(result.get("avg_time_per_train_sample", 0.0)),
                avg_step_per_episode=float(result.get("avg_step_per_episode", 0.0)),
                avg_sample_per_episode=float(result.get("avg_sample_per_episode", 0.0)),
                reward_mean=float(result.get("reward_mean", 0.0)),
                reward_std=float(result.get("reward_std", 0.0)),
                reward_raw=[float(r) for r in raw],
                finish_time=float(result.get("finish_time", 0.0)),
                collect_setting=dict(setting) if isinstance(setting, Mapping) else None,
                error=None if error is None else str(error),
                task_id=None if task_id is None else str(task_id),
            )
        except (TypeError, ValueError, OverflowError) as exc:
            raise TaskError(f"unusable finish_info ({exc}): {short_repr(dict(result))}") from None
