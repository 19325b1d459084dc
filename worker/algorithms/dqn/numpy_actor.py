"""DQN's epsilon-greedy acting, and its Q-network in numpy: the actor of ReLU MLP jobs (collectors without torch).

A collector step costs one forward pass for all envs. On a small MLP torch's per-call
dispatch dominates that pass (the numpy one costs about a third), and importing torch
costs a collector ~2.5 s of CPU at start. :class:`NumpyQActor` is built from the network's
layout (names and shapes, from :meth:`DQN.numpy_layout`) and takes policy files as numpy
arrays; :class:`~worker.algorithms.dqn.actor.TorchQActor` runs any other model and is the
reference it is tested against. The learner's numpy step (:mod:`.numpy_step`) runs the
same :class:`NumpyQNetwork`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.algorithms.numpy_twin.actors import NumpyActor
from worker.algorithms.numpy_twin.layers import F32
from worker.algorithms.numpy_twin.layout import Shapes
from worker.algorithms.numpy_twin.params import FlatParams
from worker.plugins.contract import Obs

__all__ = ["NumpyQActor", "NumpyQNetwork", "epsilon_greedy"]


def epsilon_greedy(q_values: F32, eps: float, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Greedy actions over ``q_values`` ``[B, n]``, each replaced by a uniformly random one with probability ``eps``."""
    actions: npt.NDArray[np.int64] = q_values.argmax(axis=1).astype(np.int64)
    if eps > 0.0:
        # One draw per env decides both: u < eps explores, and u / eps is then uniform
        # in [0, 1), which picks the random action.
        u = rng.random(len(actions))
        chosen = u < eps
        actions[chosen] = (u[chosen] / eps * q_values.shape[1]).astype(np.int64)
    return actions


class NumpyQNetwork:
    """A ReLU MLP Q-network's parameters (:class:`FlatParams`, zero until loaded) and its forward pass.

    Args:
        shapes: the network's tensors by name, linear layers in order (weight, then bias).
    """

    def __init__(self, shapes: Shapes) -> None:
        self.flat = FlatParams(shapes)
        layers = [name.removesuffix(".weight") for name in shapes if name.endswith(".weight")]
        self.layers = self.flat.dense(layers, "relu", activate_last=False)
        self.n_actions = int(shapes[f"{layers[-1]}.weight"][0])

    def forward(self, obs: F32) -> F32:
        """Q-values ``[B, n_actions]`` of flat float32 observations (the layers' array: see :meth:`Dense.forward`)."""
        return self.layers.forward(obs)


class NumpyQActor(NumpyActor):
    """Epsilon-greedy over a ReLU MLP Q-network held as numpy arrays (zero until weights are loaded).

    Args:
        shapes: the network's tensors by name, linear layers in order (weight, then bias).
        seed: the exploration draws' seed.
    """

    network = "the Q-network"

    def __init__(self, shapes: Shapes, seed: int | None) -> None:
        super().__init__(shapes, seed)
        self.net = NumpyQNetwork(shapes)

    def q_values(self, obs: Obs) -> F32:
        assert isinstance(obs, np.ndarray)
        h = obs.reshape(len(obs), -1)
        return self.net.forward(h if h.dtype == np.float32 else h.astype(np.float32))

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        """Greedy actions, each replaced by a uniformly random one with probability ``settings["eps"]``."""
        eps = float(settings.get("eps", 0.0)) if explore else 0.0
        return epsilon_greedy(self.q_values(obs), eps, self.rng), {}

    def take(self, weights: Mapping[str, Any]) -> None:
        self.net.flat.load(weights)
        self.net.layers.cache_transposed()
