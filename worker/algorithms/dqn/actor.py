"""DQN's actor in torch: epsilon-greedy over any Q-network, for a batch of envs at once.

ReLU MLP jobs get the numpy actor instead (:mod:`.numpy_actor`), which is tested against this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from worker.algorithms.dqn.network import QNetwork
from worker.algorithms.dqn.numpy_actor import epsilon_greedy
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Actor, Obs


class TorchQActor(Actor):
    """Epsilon-greedy over any Q-network, in torch (the reference)."""

    def __init__(self, net: QNetwork, seed: int | None) -> None:
        self.rng = np.random.default_rng(seed)
        self.net = net
        self.net.eval()

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        """Greedy actions, each replaced by a uniformly random one with probability ``settings["eps"]``."""
        eps = float(settings.get("eps", 0.0)) if explore else 0.0
        return epsilon_greedy(self.q_values(obs), eps, self.rng), {}

    def q_values(self, obs: Obs) -> npt.NDArray[np.float32]:
        with torch.no_grad():
            x = {k: torch.from_numpy(v) for k, v in obs.items()} if isinstance(obs, dict) else torch.from_numpy(obs)
            out: npt.NDArray[np.float32] = self.net(x).numpy()
        return out

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        # All or nothing: the actor keeps its own weights when any tensor does not fit.
        check_fits(self.net.state_dict(), weights, "the weights", "the Q-network")
        try:
            self.net.load_state_dict(dict(weights), strict=True)
        except (RuntimeError, TypeError, KeyError) as exc:
            raise ValueError(f"the weights do not fit the Q-network: {exc}") from None
