"""torch's Adam over one flat float32 vector of parameters, for the numpy train steps (and that vector's views).

The numpy train steps (DQN's and PPO's, on small MLPs) keep every parameter as a view of
one contiguous vector, so the optimizer is a handful of whole-vector ufuncs instead of a
kernel per tensor. The arithmetic and its order are ``torch.optim.Adam``'s (no weight
decay, no amsgrad), so a numpy step and its torch reference agree to float32 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["FlatAdam", "clip_global_norm", "flat_views"]

F32 = npt.NDArray[np.float32]

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


def flat_views(flat: F32, names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> dict[str, F32]:
    """Views of ``flat``, one per name, shaped as ``shapes`` and laid end to end in that order."""
    views: dict[str, F32] = {}
    offset = 0
    for name, shape in zip(names, shapes, strict=True):
        size = math.prod(shape)
        views[name] = flat[offset : offset + size].reshape(shape)
        offset += size
    return views
