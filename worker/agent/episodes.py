"""Whole episodes of a trained policy in its env: what ``warren eval`` measures and films.

The env is the one the policy's job trained on (its id, plug-in and keyword arguments),
or another one given instead (``--env-id``, ``--config``) with the same spaces; it is made
by its env plug-in as a collector makes it (:class:`~worker.rl.envs.VecEnvBatch`), and the
policy acts through the collectors' own actor (:class:`~worker.agent.policy.Policy`).

Episodes are shared out among the envs of a batch before they start, each env playing
its share (``episodes // envs``, one more for the first ``episodes % envs``), as the
run's eval tasks do: counting the first ``N`` episodes to end, whichever env played
them, would lean towards short ones. The first ``video_episodes`` are played apart, one at
a time in a one-env batch that is filmed (:class:`~worker.agent.video.FilmedEnvs`), the
rest in a batch of their own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from worker.agent.policy import Policy
from worker.agent.video import FilmedEnvs, Mp4Writer
from worker.errors import ConfigurationError, WarrenError
from worker.plugins.binding import env_plugin, make_env_context
from worker.plugins.registry import PluginRegistry, installed
from worker.rl.envs import VecEnvBatch

logger = logging.getLogger(__name__)

#: An episode longer than this is taken for one that never ends (an env without a time limit).
MAX_EPISODE_STEPS: Final = 100_000


@dataclass(frozen=True)
class EnvTarget:
    """The env episodes are played in: an id, the plug-in that makes it, its keyword arguments."""

    id: str
    plugin: str | None = None
    plugin_version: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_job(cls, env: dict[str, Any]) -> EnvTarget:
        """The ``[env]`` section of a job (as ``job.json`` holds it)."""
        if not isinstance(env.get("id"), str):
            raise ConfigurationError("the policy's job names no env id: give --env-id")
        kwargs = env.get("kwargs") or {}
        return cls(
            id=env["id"],
            plugin=env.get("plugin") or None,
            plugin_version=env.get("plugin_version") or None,
            kwargs=dict(kwargs) if isinstance(kwargs, dict) else {},
        )

    def batch(self, num_envs: int, seed: int | None, registry: PluginRegistry | None = None) -> VecEnvBatch:
        """``num_envs`` of these envs, the first reset seeded ``seed``, ``seed + 1``... (raises TaskError)."""
        plugin = env_plugin(registry or installed(), self.plugin, self.plugin_version)
        return VecEnvBatch(plugin, make_env_context(self.id, num_envs, kwargs=self.kwargs, seed=seed))

    def filmed(self, seed: int | None, registry: PluginRegistry | None = None) -> FilmedEnvs:
        """One of these envs, filmed (raises ConfigurationError where it can be filmed neither way)."""
        plugin = env_plugin(registry or installed(), self.plugin, self.plugin_version)
        return FilmedEnvs(plugin, make_env_context(self.id, 1, kwargs=self.kwargs, seed=seed))


@dataclass
class Episodes:
    """Returns and lengths (valid steps) of the episodes played, in the order they ended."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    seconds: float = 0.0
    """Wall time of playing them (making the envs included)."""
    videos: list[str] = field(default_factory=list)

    def add(self, other: Episodes) -> None:
        self.returns += other.returns
        self.lengths += other.lengths
        self.seconds += other.seconds
        self.videos += other.videos

    def summary(self) -> dict[str, Any]:
        """Mean and standard deviation (population) of the returns and lengths, with every episode's."""
        return {
            "episodes": len(self.returns),
            "return_mean": _mean(self.returns),
            "return_std": _std(self.returns),
            "length_mean": _mean(self.lengths),
            "length_std": _std(self.lengths),
            "returns": [round(r, 6) for r in self.returns],
            "lengths": list(self.lengths),
            "steps": int(sum(self.lengths)),
            "wall_time_s": round(self.seconds, 3),
            "steps_per_s": round(sum(self.lengths) / self.seconds, 1) if self.seconds > 0 else None,
            "videos": list(self.videos),
        }


def _mean(values: list[float] | list[int]) -> float | None:
    return float(np.mean(values)) if values else None


def _std(values: list[float] | list[int]) -> float | None:
    return float(np.std(values)) if values else None


def play(
    policy: Policy,
    envs: VecEnvBatch,
    episodes: int,
    *,
    deterministic: bool = True,
    max_episode_steps: int = MAX_EPISODE_STEPS,
    stop: Callable[[], bool] | None = None,
) -> Episodes:
    """Play ``episodes`` whole episodes over the batch's envs, each env its share (see the module docstring).

    Raises:
        WarrenError: an episode ran past ``max_episode_steps`` (an env that never ends).
    """
    started = time.monotonic()
    n = len(envs)
    quota = np.array([episodes // n + (1 if i < episodes % n else 0) for i in range(n)], dtype=np.int64)
    played = np.zeros(n, dtype=np.int64)
    lengths = np.zeros(n, dtype=np.int64)
    result = Episodes()
    envs.reset()
    policy.reset(n)
    while (played < quota).any():
        if stop is not None and stop():
            break
        step = envs.step(policy.act_batch(envs.obs, deterministic))
        policy.episodes_begin(~step.valid)  # after a reset step: a policy with memory starts afresh
        lengths += step.valid
        for i in np.flatnonzero(step.ended):
            if played[i] < quota[i]:
                result.returns.append(float(step.episode_returns[i]))
                result.lengths.append(int(lengths[i]))
            played[i] += 1
            lengths[i] = 0
        if int(lengths.max(initial=0)) > max_episode_steps:
            raise WarrenError(
                f"an episode of {envs.env_id} ran {max_episode_steps:,} steps without ending: an env without a time "
                "limit? (--max-episode-steps)"
            )
    result.seconds = time.monotonic() - started
    return result


def film(
    policy: Policy,
    filmed: FilmedEnvs,
    episodes: int,
    out_dir: Path,
    *,
    deterministic: bool = True,
    max_episode_steps: int = MAX_EPISODE_STEPS,
    name: str = "episode",
    stop: Callable[[], bool] | None = None,
) -> Episodes:
    """Play ``episodes`` episodes in the filmed env, one mp4 each (``<out_dir>/<name>-<k>.mp4``), one frame per step.

    Episode ``k`` starts from a reset seeded ``seed + k`` (the filmed env's seed), so the
    videos are the same whenever they are made again. (A one-env batch: where the env has a
    native vector env, CartPole's, its episodes are not those of a larger batch's envs.)

    Raises:
        WarrenError: an episode ran past ``max_episode_steps``.
    """
    started = time.monotonic()
    result = Episodes()
    envs = filmed.envs
    for k in range(episodes):
        if stop is not None and stop():
            break
        path = Path(out_dir) / f"{name}-{k:03d}.mp4"
        writer = Mp4Writer(path, filmed.fps)
        envs.reset(None if filmed.seed is None else filmed.seed + k)
        policy.reset(1)
        length = 0
        ended = False
        try:
            while not ended and not (stop is not None and stop()):
                writer.add(filmed.frame())
                step = envs.step(policy.act_batch(envs.obs, deterministic))
                length += int(step.valid[0])
                ended = bool(step.ended[0])
                if length > max_episode_steps:
                    raise WarrenError(
                        f"an episode of {envs.env_id} ran {max_episode_steps:,} steps without ending: an env without "
                        "a time limit? (--max-episode-steps)"
                    )
        finally:
            writer.close()
        if not ended:
            break  # stopped: the episode is not one of the results
        result.returns.append(float(step.episode_returns[0]))
        result.lengths.append(length)
        result.videos.append(str(path))
        logger.info("episode %d: return %.1f in %d steps: %s", k, result.returns[-1], length, path)
    result.seconds = time.monotonic() - started
    return result


def default_envs(episodes: int) -> int:
    """Envs stepped together when ``--envs`` is not given: up to 10, never more than the episodes."""
    return max(1, min(episodes, 10))
