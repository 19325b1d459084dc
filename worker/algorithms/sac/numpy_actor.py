"""SAC's squashed Gaussian policy in numpy, and the actor of ReLU MLP jobs (collectors that never import torch).

The forward pass of :class:`~worker.algorithms.sac.networks.SquashedGaussianPolicy`: the
body and one more ReLU layer, the mean and the log standard deviation (clamped to
[-20, 2]); explore samples ``tanh(mean + std * noise)``, evaluation takes ``tanh(mean)``;
both are scaled into the action box. The actor is built from the layout
(:meth:`SAC.numpy_layout`), takes policy files as numpy arrays and is held to the torch
actor in ``tests/unit/test_sac_numpy_step.py``; the learner's numpy step (:mod:`.numpy_step`)
runs the same :class:`NumpySACPolicy`.
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

__all__ = ["LOG_STD_MAX", "LOG_STD_MIN", "NumpySACActor", "NumpySACPolicy", "policy_shapes"]

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


class NumpySACPolicy:
    """The policy's parameters (:class:`FlatParams`, zero until loaded), its forward pass and its backward pass.

    Args:
        shapes: the parameters by name in ``named_parameters`` order (the body's layers,
            ``hidden``, ``mean``, ``log_std``; not the ``low``/``high`` buffers).
    """

    def __init__(self, shapes: Shapes) -> None:
        self.flat = FlatParams(shapes)
        layers = [name.removesuffix(".weight") for name in shapes if name.endswith(".weight")]
        self.trunk = self.flat.dense(layers[:-2], "relu", activate_last=True)  # the body's layers and ``hidden``
        self.mean = self.flat.dense(["mean"], "relu", activate_last=False)  # (one linear layer each:
        self.log_std = self.flat.dense(["log_std"], "relu", activate_last=False)  # no activation)

    def forward(self, obs: F32, *, log_std: bool = True) -> tuple[F32, F32 | None]:
        """The Gaussian's means and unclamped log standard deviations (``None`` without ``log_std``), ``[B, d]``.

        Both are the layers' arrays, which their next forward pass overwrites.
        """
        h = self.trunk.forward(obs)
        return self.mean.forward(h), self.log_std.forward(h) if log_std else None

    def backward(self, grad_mean: F32, grad_log_std: F32) -> None:
        """Write the parameters' gradients from dLoss/dmean and dLoss/d(unclamped log std) of the last forward pass."""
        grad_h = self.mean.backward(grad_mean)
        grad_h_std = self.log_std.backward(grad_log_std)
        assert grad_h is not None and grad_h_std is not None
        self.trunk.backward(grad_h + grad_h_std, inputs=False)


class NumpySACActor(NumpyActor):
    """Samples squashed Gaussian actions for a batch of envs (the tanh of the mean when evaluating).

    Its arrays are zero until weights are loaded.
    """

    network = "the SAC policy"

    def __init__(self, shapes: Shapes, seed: int | None) -> None:
        super().__init__(shapes, seed)
        self.policy = NumpySACPolicy({k: v for k, v in shapes.items() if k not in ("low", "high")})
        self.low = np.zeros(shapes["low"], dtype=np.float32)
        self.high = np.zeros(shapes["high"], dtype=np.float32)

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        assert isinstance(obs, np.ndarray)
        mean, raw_log_std = self.policy.forward(
            obs.reshape(len(obs), -1).astype(np.float32, copy=False), log_std=explore
        )
        raw: npt.NDArray[Any] = mean
        if raw_log_std is not None:
            log_std = np.clip(raw_log_std, LOG_STD_MIN, LOG_STD_MAX)
            raw = mean + np.exp(log_std) * self.rng.standard_normal(mean.shape, dtype=np.float32)
        squashed = np.tanh(raw)
        actions = self.low + (squashed + np.float32(1.0)) * np.float32(0.5) * (self.high - self.low)
        return actions.astype(np.float32, copy=False), {}

    def take(self, weights: Mapping[str, Any]) -> None:
        low, high = (np.asarray(weights[k], dtype=np.float32).copy() for k in ("low", "high"))
        self.policy.flat.load(weights)
        self.low, self.high = low, high
