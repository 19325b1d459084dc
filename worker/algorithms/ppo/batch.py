"""One PPO update's data: its valid steps as numpy arrays, and the minibatches both steps take from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Batch"]


@dataclass
class Batch:
    """Valid steps, flat: the observations as the bodies take them (normalised where configured; a dict of
    arrays for ``Dict`` spaces), the actions, and the columns the losses need (float32, ``[B]``)."""

    obs: Any
    actions: npt.NDArray[Any]
    old_logp: npt.NDArray[np.float32]
    old_values: npt.NDArray[np.float32]
    advantages: npt.NDArray[np.float32]
    returns: npt.NDArray[np.float32]

    def __len__(self) -> int:
        return len(self.actions)

    def take(self, idx: npt.NDArray[np.int64]) -> Batch:
        """The rows ``idx`` of every array (a minibatch)."""
        obs = {k: v[idx] for k, v in self.obs.items()} if isinstance(self.obs, dict) else self.obs[idx]
        return Batch(
            obs,
            self.actions[idx],
            self.old_logp[idx],
            self.old_values[idx],
            self.advantages[idx],
            self.returns[idx],
        )
