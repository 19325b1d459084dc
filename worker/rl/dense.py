"""A stack of linear layers in numpy over views of a flat parameter vector, with its backward pass.

The numpy train steps (PPO's, SAC's) keep each network's parameters and gradients as
views of one flat float32 vector (:func:`~worker.rl.flat_adam.flat_views`); a
:class:`Dense` holds the views of one stack of layers (torch's ``[out, in]`` weights),
runs it forward keeping what backward needs, and accumulates the weights' gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["Dense"]

F32 = npt.NDArray[np.float32]


class Dense:
    """Linear layers with ``activation`` after each (after the last only with ``activate_last``).

    Args:
        weights: ``(weight [out, in], bias [out])`` per layer, views into the parameters.
        grads: the same for the gradient vector.
        activation: ``tanh`` or ``relu``.
        activate_last: the last layer is activated too (a body); else it is linear (a head).
    """

    def __init__(
        self,
        weights: Sequence[tuple[F32, F32]],
        grads: Sequence[tuple[F32, F32]],
        activation: Literal["tanh", "relu"],
        *,
        activate_last: bool,
    ) -> None:
        self.weights, self.grads = list(weights), list(grads)
        self.tanh = activation == "tanh"
        self.activate_last = activate_last
        self.inputs: list[F32] = []
        self.outputs: list[F32] = []

    def _activated(self, i: int) -> bool:
        return self.activate_last or i < len(self.weights) - 1

    def forward(self, x: F32) -> F32:
        self.inputs, self.outputs = [], []
        h = x
        for i, (weight, bias) in enumerate(self.weights):
            self.inputs.append(h)
            h = h @ weight.T
            h += bias
            if self._activated(i):
                if self.tanh:
                    np.tanh(h, out=h)
                else:
                    np.maximum(h, np.float32(0.0), out=h)
            self.outputs.append(h)
        return h

    def backward(self, grad_out: F32, *, params: bool = True, inputs: bool = True) -> F32 | None:
        """dLoss/d(input) from dLoss/d(output) (``None`` without ``inputs``); with ``params``, the weights' too."""
        for i in range(len(self.weights) - 1, -1, -1):
            if self._activated(i):
                out = self.outputs[i]
                # tanh' = 1 - tanh^2; ReLU passes the gradient where the unit was active
                grad_out = grad_out * (np.float32(1.0) - out * out) if self.tanh else grad_out * (out > 0.0)
            if params:
                grad_w, grad_b = self.grads[i]
                grad_w += grad_out.T @ self.inputs[i]
                grad_b += grad_out.sum(axis=0)
            if i == 0 and not inputs:
                return None
            grad_out = grad_out @ self.weights[i][0]
        return grad_out
