"""The ``cue`` env: each step shows a cue, and the action that matches it pays 1.

Deliberately small, but with the spaces real envs have: a ``Dict`` observation mixing a
``Discrete`` cue with a ``Box`` of distracting noise. A policy that ignores the cue
scores ``episode_len / n_cues`` on average; one that follows it scores ``episode_len``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from warren.plugins import EnvContext, EnvPlugin


class CueEnv(gym.Env[dict[str, Any], int]):
    """``n_cues`` cues, an episode of ``episode_len`` steps (a time limit: truncated, not terminated)."""

    def __init__(self, n_cues: int = 3, episode_len: int = 8, noise_dim: int = 2) -> None:
        self.n_cues, self.episode_len, self.noise_dim = n_cues, episode_len, noise_dim
        self.observation_space = gym.spaces.Dict(
            {
                "cue": gym.spaces.Discrete(n_cues),
                "noise": gym.spaces.Box(-1.0, 1.0, shape=(noise_dim,), dtype=np.float32),
            }
        )
        self.action_space = gym.spaces.Discrete(n_cues)  # type: ignore[assignment]  # gymnasium's generic Space
        self._t = 0
        self._cue = 0

    def _observe(self) -> dict[str, Any]:
        self._cue = int(self.np_random.integers(self.n_cues))
        noise = self.np_random.uniform(-1.0, 1.0, size=self.noise_dim).astype(np.float32)
        return {"cue": self._cue, "noise": noise}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._observe(), {}

    def step(self, action: int) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        reward = 1.0 if int(action) == self._cue else 0.0
        self._t += 1
        return self._observe(), reward, False, self._t >= self.episode_len, {}


class CueEnvs(EnvPlugin):
    """The env plug-in: ``env.id = "cue"``; ``[env.kwargs]`` go to :class:`CueEnv`."""

    def make_env(self, ctx: EnvContext) -> gym.Env[Any, Any]:
        if ctx.env_id != "cue":
            raise ValueError(f"the cue plug-in makes only 'cue', not {ctx.env_id!r}")
        return CueEnv(**dict(ctx.kwargs))

    def reward_threshold(self, env_id: str) -> float | None:
        return None
