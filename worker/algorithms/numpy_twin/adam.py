"""torch's Adam and gradient-norm clip on one flat float32 vector of parameters (every numpy train step's).

The numpy steps of DQN, PPO and SAC keep each network's parameters as views of one
contiguous vector (:class:`~worker.algorithms.numpy_twin.params.FlatParams`), so the
optimizer is a handful of whole-vector ufuncs instead of a kernel per tensor. The
arithmetic and its order are ``torch.optim.Adam``'s (no weight decay, no amsgrad), and the
clip is ``torch.nn.utils.clip_grad_norm_``'s, so a numpy step and its torch reference agree
to float32 rounding.
"""

from __future__ import annotations

import math

import numpy as np

from worker.algorithms.numpy_twin.layers import F32

__all__ = ["FlatAdam", "clip_global_norm"]

#: torch's defaults for beta1 and beta2.
BETA1, BETA2 = 0.9, 0.999


class FlatAdam:
    """Adam's moments for a flat parameter vector of ``size`` floats.

    Args:
        size: number of parameters.
        eps: the denominator's epsilon (torch's default is 1e-8; PPO uses 1e-5).
    """

    def __init__(self, size: int, eps: float = 1e-8) -> None:
        self.eps = eps
        self.m = np.zeros(size, dtype=np.float32)
        """First moment (torch's ``exp_avg``)."""
        self.v = np.zeros(size, dtype=np.float32)
        """Second moment (torch's ``exp_avg_sq``)."""
        self.steps = 0
        """Steps taken (torch's ``step``): the bias corrections depend on it."""
        self._tmp = np.zeros(size, dtype=np.float32)

    def step(self, params: F32, grad: F32, lr: float) -> None:
        """``params -= lr * m_hat / (sqrt(v_hat) + eps)``, in place, in torch's order of operations."""
        self.steps += 1
        step_size = lr / (1.0 - BETA1**self.steps)
        bias_correction2_sqrt = math.sqrt(1.0 - BETA2**self.steps)
        m, v, tmp = self.m, self.v, self._tmp
        m *= np.float32(BETA1)
        np.multiply(grad, np.float32(1.0 - BETA1), out=tmp)
        m += tmp
        v *= np.float32(BETA2)
        np.multiply(grad, grad, out=tmp)
        tmp *= np.float32(1.0 - BETA2)
        v += tmp
        np.sqrt(v, out=tmp)  # denominator: sqrt(v) / sqrt(1 - beta2^t) + eps
        tmp /= np.float32(bias_correction2_sqrt)
        tmp += np.float32(self.eps)
        np.divide(m, tmp, out=tmp)
        tmp *= np.float32(step_size)
        params -= tmp


def clip_global_norm(grad: F32, max_norm: float) -> float:
    """Scale ``grad`` in place to a global L2 norm of at most ``max_norm``, as ``torch.nn.utils.clip_grad_norm_``.

    Returns:
        The norm before clipping.
    """
    norm = math.sqrt(float(np.dot(grad, grad)))
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        grad *= np.float32(coef)
    return norm
