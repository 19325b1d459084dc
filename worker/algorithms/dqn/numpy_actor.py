"""DQN's epsilon-greedy acting, and the actor for ReLU MLP Q-networks in numpy (collectors without torch).

A collector step costs one forward pass for all envs. On a small MLP torch's per-call
dispatch dominates that pass (the numpy one costs about a third), and importing torch
costs a collector ~2.5 s of CPU at start. :class:`NumpyQActor` is built from the network's
layout (names and shapes, from :meth:`DQN.numpy_layout`) and takes policy files as numpy
arrays; :class:`~worker.algorithms.dqn.actor.TorchQActor` runs any other model and is the
reference it is tested against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.algorithms.weights import check_fits
from worker.models.mlp_layout import Shapes
from worker.plugins.contract import Actor, Obs

__all__ = ["EpsilonGreedy", "NumpyQActor"]

F32 = npt.NDArray[np.float32]


class EpsilonGreedy(Actor):
    """Greedy over :meth:`q_values`, each action replaced by a uniformly random one with probability ``eps``."""

    def __init__(self, n_actions: int, seed: int | None) -> None:
        self.n_actions = n_actions
        self._rng = np.random.default_rng(seed)

    def q_values(self, obs: Obs) -> F32:
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


class NumpyQActor(EpsilonGreedy):
    """Epsilon-greedy over a ReLU MLP Q-network held as numpy arrays (zero until weights are loaded).

    Args:
        shapes: the network's tensors by name, linear layers in order (weight, then bias).
        seed: the exploration draws' seed.
    """

    def __init__(self, shapes: Shapes, seed: int | None) -> None:
        self.shapes = shapes
        names = list(shapes)
        self._names = list(zip(names[::2], names[1::2], strict=True))
        super().__init__(int(shapes[self._names[-1][1]][0]), seed)
        self._layers = [
            (np.zeros(shapes[w][::-1], dtype=np.float32), np.zeros(shapes[b], dtype=np.float32)) for w, b in self._names
        ]
        self._zero_cache: dict[tuple[int, ...], F32] = {}

    def q_values(self, obs: Obs) -> F32:
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

    def _zeros(self, shape: tuple[int, ...]) -> F32:
        zeros = self._zero_cache.get(shape)
        if zeros is None:
            zeros = self._zero_cache[shape] = np.zeros(shape, dtype=np.float32)
        return zeros

    def load_weights(self, weights: Mapping[str, Any]) -> None:
        """Take a policy's arrays (numpy, or torch tensors), strictly: all of them fit, or none is taken."""
        check_fits(self.shapes, weights, "the weights", "the Q-network")
        self._layers = [
            (
                np.ascontiguousarray(np.asarray(weights[w], dtype=np.float32).T),
                np.asarray(weights[b], dtype=np.float32).copy(),
            )
            for w, b in self._names
        ]
