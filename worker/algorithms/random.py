"""``random``: uniformly random actions and no learner; a baseline, and tasks that need no policy file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from worker.plugins.contract import Actor, Algorithm, Learner, Obs
from worker.plugins.spaces import Spaces


class RandomActions(Algorithm):
    """Acts uniformly at random in any supported action space; nothing to learn, no weights to load."""

    kind = "none"

    def make_actor(self, seed: int | None) -> Actor:
        return RandomActor(self.spaces, seed)

    def make_learner(self, seed: int) -> Learner:
        raise ValueError("the random algorithm has no learner: it only acts")


class RandomActor(Actor):
    """One vectorised draw per step for the whole batch (``Space.sample`` per env would cost N calls)."""

    def __init__(self, spaces: Spaces, seed: int | None) -> None:
        self.space = spaces.action
        self._rng = np.random.default_rng(seed)

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        n = len(next(iter(obs.values()))) if isinstance(obs, dict) else len(obs)
        return sample_actions(self.space, n, self._rng), {}

    def load_weights(self, weights: Mapping[str, Any]) -> None:
        """Nothing to load."""


def sample_actions(space: gym.Space[Any], n: int, rng: np.random.Generator) -> npt.NDArray[Any]:
    """``n`` uniform draws from an action space, as the chunk stores them."""
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(int(space.start), int(space.start) + int(space.n), size=n, dtype=np.int64)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (rng.random((n, *space.shape)) * space.nvec).astype(np.int64) + space.start
    if isinstance(space, gym.spaces.MultiBinary):
        return rng.integers(0, 2, size=(n, *space.shape), dtype=np.int8)
    assert isinstance(space, gym.spaces.Box)
    low = np.where(np.isfinite(space.low), space.low, -1.0)
    high = np.where(np.isfinite(space.high), space.high, 1.0)
    return rng.uniform(low, high, size=(n, *space.shape)).astype(space.dtype)
