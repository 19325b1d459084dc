"""SAC's actor for ReLU MLP jobs in numpy, on collectors that never import torch.

The squashed Gaussian policy's forward pass (:class:`~worker.algorithms.sac.networks.SquashedGaussianPolicy`):
the body and one more ReLU layer, the mean and the log standard deviation (clamped to
[-20, 2]); explore samples ``tanh(mean + std * noise)``, evaluation takes ``tanh(mean)``;
both are scaled into the action box. Built from the layout (:meth:`SAC.numpy_layout`),
it takes policy files as numpy arrays and is held to the torch actor in
``tests/unit/test_sac_fast.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.algorithms.weights import check_fits
from worker.models.mlp_layout import Shapes
from worker.plugins.contract import Actor, Obs

__all__ = ["LOG_STD_MAX", "LOG_STD_MIN", "NumpySACActor", "policy_shapes"]

F32 = npt.NDArray[np.float32]
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def policy_shapes(body: Shapes, width: int, action_dim: int) -> Shapes:
    """The policy's tensors by name in ``state_dict`` order: ``low``, ``high``, the body, ``hidden``, the heads."""
    return {
        "low": (action_dim,),
        "high": (action_dim,),
        **{f"body.{name}": shape for name, shape in body.items()},
        "hidden.weight": (width, width),
        "hidden.bias": (width,),
        "mean.weight": (action_dim, width),
        "mean.bias": (action_dim,),
        "log_std.weight": (action_dim, width),
        "log_std.bias": (action_dim,),
    }


class NumpySACActor(Actor):
    """Samples squashed Gaussian actions for a batch of envs (the tanh of the mean when evaluating).

    Its arrays are zero until weights are loaded; a collector always loads the learner's first policy before acting.
    """

    def __init__(self, shapes: Shapes, seed: int | None) -> None:
        self.shapes = shapes
        self.rng = np.random.default_rng(seed)
        self._arrays: dict[str, F32] = {name: np.zeros(shape, dtype=np.float32) for name, shape in shapes.items()}
        self._trunk = [name[: -len(".weight")] for name in shapes if name.endswith(".weight")][:-2]

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        assert isinstance(obs, np.ndarray)
        a = self._arrays
        h = obs.reshape(len(obs), -1).astype(np.float32, copy=False)
        for name in self._trunk:  # the body's layers and ``hidden``, each ReLU
            h = np.maximum(h @ a[f"{name}.weight"].T + a[f"{name}.bias"], np.float32(0.0))
        raw = h @ a["mean.weight"].T + a["mean.bias"]
        if explore:
            log_std = np.clip(h @ a["log_std.weight"].T + a["log_std.bias"], LOG_STD_MIN, LOG_STD_MAX)
            raw = raw + np.exp(log_std) * self.rng.standard_normal(raw.shape, dtype=np.float32)
        squashed = np.tanh(raw)
        actions = a["low"] + (squashed + np.float32(1.0)) * np.float32(0.5) * (a["high"] - a["low"])
        return actions.astype(np.float32, copy=False), {}

    def load_weights(self, weights: Mapping[str, Any]) -> None:
        """Take a policy's arrays (numpy, or torch tensors), strictly: all of them fit, or none is taken."""
        check_fits(self.shapes, weights, "the weights", "the SAC policy")
        self._arrays = {name: np.asarray(weights[name], dtype=np.float32).copy() for name in self.shapes}
