"""DQN's actor: epsilon-greedy over the Q-network, for a batch of envs at once.

A collector step costs one forward pass for all envs. On a small MLP torch's per-call
dispatch dominates that pass, so where the network is a ReLU MLP on flat float
observations the actor runs a numpy copy of its weights (:class:`NumpyQActor`, about a
third of torch's cost); :class:`TorchQActor` runs any other model, and is the reference
the numpy one is tested against. Both load weights through the torch network, strictly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from worker.algorithms.dqn.network import QNetwork
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Actor, Obs

if TYPE_CHECKING:
    from worker.algorithms.dqn import DQN


def make_actor(algorithm: DQN, seed: int | None) -> Actor:
    """The fastest actor that runs this algorithm's network exactly."""
    net = algorithm.q_network()
    if algorithm.config.backend != "torch" and net.relu_mlp:
        return NumpyQActor(net, seed)
    return TorchQActor(net, seed)


class _EpsilonGreedy(Actor):
    def __init__(self, net: QNetwork, seed: int | None) -> None:
        self.net = net
        self.net.eval()
        self.n_actions = int(net.head.out_features)
        self._rng = np.random.default_rng(seed)

    def q_values(self, obs: Obs) -> npt.NDArray[np.float32]:
        raise NotImplementedError

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        """Greedy actions, each replaced by a uniformly random one with probability ``settings["eps"]``."""
        actions: npt.NDArray[np.int64] = self.q_values(obs).argmax(axis=1).astype(np.int64)
        eps = float(settings.get("eps", 0.0)) if explore else 0.0
        if eps > 0.0:
            # One draw per env decides both: u < eps explores, and u / eps is then uniform
            # in [0, 1), which picks the random action.
            u = self._rng.random(len(actions))
            chosen = u < eps
            actions[chosen] = (u[chosen] / eps * self.n_actions).astype(np.int64)
        return actions, {}

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        # All or nothing: the actor keeps its own weights when any tensor does not fit.
        check_fits(self.net.state_dict(), weights, "the weights", "the Q-network")
        try:
            self.net.load_state_dict(dict(weights), strict=True)
        except (RuntimeError, TypeError, KeyError) as exc:
            raise ValueError(f"the weights do not fit the Q-network: {exc}") from None


class TorchQActor(_EpsilonGreedy):
    """Epsilon-greedy over any Q-network, in torch (the reference)."""

    def q_values(self, obs: Obs) -> npt.NDArray[np.float32]:
        with torch.no_grad():
            x = {k: torch.from_numpy(v) for k, v in obs.items()} if isinstance(obs, dict) else torch.from_numpy(obs)
            out: npt.NDArray[np.float32] = self.net(x).numpy()
        return out


class NumpyQActor(_EpsilonGreedy):
    """Epsilon-greedy over a ReLU MLP Q-network, with a numpy copy of its weights."""

    def __init__(self, net: QNetwork, seed: int | None) -> None:
        super().__init__(net, seed)
        self._layers = self._numpy_layers()
        self._zero_cache: dict[tuple[int, ...], npt.NDArray[np.float32]] = {}

    def q_values(self, obs: Obs) -> npt.NDArray[np.float32]:
        assert isinstance(obs, np.ndarray)
        h = obs.reshape(len(obs), -1)
        if h.dtype != np.float32:
            h = h.astype(np.float32)
        last = len(self._layers) - 1
        for i, (weight_t, bias) in enumerate(self._layers):
            h = h @ weight_t + bias
            if i < last:
                # Against an array of zeros, not the scalar 0.0: numpy's scalar path is ~5x slower here.
                np.maximum(h, self._zeros(h.shape), out=h)
        return h

    def _zeros(self, shape: tuple[int, ...]) -> npt.NDArray[np.float32]:
        zeros = self._zero_cache.get(shape)
        if zeros is None:
            zeros = self._zero_cache[shape] = np.zeros(shape, dtype=np.float32)
        return zeros

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        super().load_weights(weights)
        self._layers = self._numpy_layers()

    def _numpy_layers(self) -> list[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]:
        return [
            (
                np.ascontiguousarray(m.weight.detach().numpy().T, dtype=np.float32),
                m.bias.detach().numpy().astype(np.float32),
            )
            for m in self.net.linear_layers()
        ]
