"""A stack of linear layers in numpy over views of a flat parameter vector, with its backward pass.

Each network of a numpy train step keeps its parameters and gradients as views of one
flat float32 vector (:class:`~worker.algorithms.numpy_twin.params.FlatParams`); a
:class:`Dense` holds the views of one stack of layers (torch's ``[out, in]`` weights),
runs it forward into arrays it keeps per batch size (a step allocates almost nothing),
and writes the weights' gradients on the way back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["F32", "Dense"]

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
        last = len(self.weights) - 1
        self._activated = [activate_last or i < last for i in range(last + 1)]
        self.input: F32 | None = None
        """The input of the last forward pass (what backward needs, with :attr:`outputs`)."""
        self.outputs: list[F32] = []
        """Each layer's output (activated) in the last forward pass."""
        self._buffers: dict[int, tuple[list[F32], list[F32]]] = {}
        self._transposed: list[F32] | None = None

    def cache_transposed(self) -> None:
        """Keep a contiguous ``[in, out]`` copy of every weight for the forward pass, until called again.

        For an actor's network, whose weights change only when a policy is loaded (call it then):
        numpy multiplies by a contiguous matrix ~10-15% faster than by a transposed view on
        a collector's small batches. A train step, whose weights change every step, does not.
        (The last bits of a product can differ between the two: DQN's actor has always
        multiplied by the copies, PPO's and SAC's by the views, and each keeps to its own so
        that a seeded run stays the run it was.)
        """
        self._transposed = [np.ascontiguousarray(weight.T) for weight, _ in self.weights]

    def _outputs(self, rows: int) -> tuple[list[F32], list[F32]]:
        """Each layer's output array for ``rows`` rows, and zeros of that shape for ReLU, made once."""
        shapes = [(rows, weight.shape[0]) for weight, _ in self.weights]
        outs = [np.empty(shape, dtype=np.float32) for shape in shapes]
        # ReLU as np.maximum(h, zeros): ~5x faster than against a scalar 0 (numpy 2.x).
        zeros = [np.zeros(shape, dtype=np.float32) for shape in shapes] if not self.tanh else []
        found = self._buffers[rows] = (outs, zeros)
        return found

    def forward(self, x: F32) -> F32:
        """The stack's output for ``x`` ``[B, in]``.

        The result (and :attr:`outputs`) are this stack's own arrays, which its next forward
        pass of as many rows overwrites: copy what must outlive it.
        """
        found = self._buffers.get(len(x))
        outs, zeros = found if found is not None else self._outputs(len(x))
        self.input, self.outputs = x, outs
        transposed, tanh, activated = self._transposed, self.tanh, self._activated
        h = x
        for i, (weight, bias) in enumerate(self.weights):
            out = outs[i]
            np.matmul(h, weight.T if transposed is None else transposed[i], out=out)
            out += bias
            if activated[i]:
                if tanh:
                    np.tanh(out, out=out)
                else:
                    np.maximum(out, zeros[i], out=out)
            h = out
        return h

    def backward(self, grad_out: F32, *, params: bool = True, inputs: bool = True) -> F32 | None:
        """dLoss/d(input) from dLoss/d(output) (``None`` without ``inputs``); with ``params``, the weights' too.

        The weights' gradients are *written*, not added: in every step here each parameter
        gets its gradient from one backward pass. ``grad_out`` may cover the first rows of
        the last forward pass only (DQN runs its online net on ``[obs; next_obs]`` and
        learns from the ``obs`` half).
        """
        assert self.input is not None
        rows = len(grad_out)
        for i in range(len(self.weights) - 1, -1, -1):
            if self._activated[i]:
                out = self.outputs[i][:rows]
                # tanh' = 1 - tanh^2; ReLU passes the gradient where the unit was active
                grad_out = grad_out * (np.float32(1.0) - out * out) if self.tanh else grad_out * (out > 0.0)
            if params:
                grad_w, grad_b = self.grads[i]
                layer_input = self.input if i == 0 else self.outputs[i - 1]
                np.matmul(grad_out.T, layer_input[:rows], out=grad_w)
                np.add.reduce(grad_out, axis=0, out=grad_b)
            if i == 0 and not inputs:
                return None
            grad_out = grad_out @ self.weights[i][0]
        return grad_out
