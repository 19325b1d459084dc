"""``random``: uniformly random actions, nothing learned; a baseline, and a benchmark of collection alone.

Its actor needs no weights, so collectors never wait for a policy file. Its learner only
counts what it is handed (the learner process then deletes each step file and acks it,
as for any algorithm), so a ``warren run --algorithm random`` moves data through the
whole pipeline at the speed of collection, and ends on its budget or its stop value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from worker.plugins.contract import Actor, Algorithm, Chunk, Learner, Obs
from worker.plugins.spaces import Spaces

if TYPE_CHECKING:
    import torch


class RandomActions(Algorithm):
    """Acts uniformly at random in any supported action space; nothing to learn, no weights to load."""

    kind = "none"

    def make_actor(self, seed: int | None) -> Actor:
        return RandomActor(self.spaces, seed)

    def make_learner(self, seed: int) -> Learner:
        return CountingLearner()


class CountingLearner(Learner):
    """Takes every chunk, counts its transitions and keeps nothing; never updates, has no weights."""

    def add(self, chunk: Chunk) -> int:
        return int(chunk.valid.sum())

    def wants_data(self) -> bool:
        return True

    def can_update(self) -> bool:
        return False

    def update(self) -> dict[str, float]:
        raise RuntimeError("the random algorithm learns nothing: can_update() is always False")

    def actor_weights(self) -> dict[str, torch.Tensor]:
        return {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        if tensors:
            raise ValueError(f"the random algorithm has no state, the checkpoint has {len(tensors)} tensors")


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
