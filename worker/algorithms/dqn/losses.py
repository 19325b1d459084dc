"""DQN's TD target and Huber loss, each in torch (the specification) and beside it in numpy with its gradient.

A change to a loss is made here, to both forms; ``tests/unit/test_dqn_losses.py`` holds
each numpy form to its torch form (values and gradients, on the same inputs), and the
torch form to a case worked by hand.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812  (the universal torch alias)

__all__ = ["huber_loss", "huber_loss_np", "td_target", "td_target_np"]

F32 = npt.NDArray[np.float32]


def td_target(reward: torch.Tensor, done: torch.Tensor, next_q: torch.Tensor, discount: float) -> torch.Tensor:
    """``reward + discount * next_q``, without the bootstrap where the episode ended (``done``)."""
    return reward + discount * (1.0 - done.float()) * next_q


def td_target_np(reward: F32, done: npt.NDArray[np.bool_], next_q: F32, discount: float) -> F32:
    """:func:`td_target` in numpy (float32, in torch's order of operations)."""
    not_done = np.subtract(1.0, done, dtype=np.float32)
    out: F32 = reward + np.float32(discount) * not_done * next_q
    return out


def huber_loss(q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean Huber (smooth L1, beta 1) loss of the taken actions' Q-values against their targets."""
    return F.smooth_l1_loss(q, target)


def huber_loss_np(q: F32, target: F32) -> tuple[float, F32]:
    """:func:`huber_loss` in numpy, and its gradient with respect to ``q``.

    With ``d = q - target`` and ``c = clip(d, -1, 1)``, a sample's loss is ``c * (d - c / 2)``
    (``d^2 / 2`` inside the clip, ``|d| - 1/2`` outside) and its derivative is ``c``; the
    mean divides both by the batch size. (``np.clip`` and ``ndarray.mean`` carry ~5-10 us of
    Python each, hence the plainer calls.)
    """
    n = len(q)
    diff = q - target
    clipped = np.minimum(np.maximum(diff, np.float32(-1.0)), np.float32(1.0))
    loss = float(np.dot(clipped, diff - np.float32(0.5) * clipped)) / n
    grad: F32 = clipped / np.float32(n)
    return loss, grad
