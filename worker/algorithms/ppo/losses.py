"""PPO's losses, each in torch (the specification) and beside it in numpy with its gradient.

The torch functions are what the torch step (:mod:`.torch_step`, any model) computes; each
``*_np`` function below its torch form is the same arithmetic in numpy, returning the
gradient the numpy step (:mod:`.numpy_step`) back-propagates. A change to a loss is made
here, to both forms: ``tests/unit/test_ppo_losses.py`` holds every numpy form to its torch
form (values and gradients on the same inputs) and the torch forms to cases worked by hand
and to ``torch.distributions``.

The log-probability and entropy of the taken actions are written in closed form for the
two action spaces numpy runs (``Discrete``, ``Box``): on a small network a distribution
object's validation and bookkeeping cost more than the arithmetic.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812  (the universal torch alias)

from worker.algorithms.ppo.distributions import Policy
from worker.algorithms.ppo.numpy_actor import gaussian_logp, log_softmax

__all__ = [
    "categorical_backward_np",
    "categorical_np",
    "clipped_surrogate",
    "clipped_surrogate_np",
    "gaussian_backward_np",
    "gaussian_np",
    "log_prob_entropy",
    "normalized",
    "normalized_np",
    "value_loss",
    "value_loss_np",
]

F32 = npt.NDArray[np.float32]
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


# -- advantages ------------------------------------------------------------------------------


def normalized(advantages: torch.Tensor) -> torch.Tensor:
    """Advantages scaled to mean 0 and (sample) standard deviation 1, per minibatch."""
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def normalized_np(advantages: F32) -> F32:
    """:func:`normalized` in numpy (taken as data: no gradient flows through it)."""
    out: F32 = (advantages - advantages.mean()) / (np.float32(advantages.std(ddof=1)) + np.float32(1e-8))
    return out


# -- the policy's loss ---------------------------------------------------------------------


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped policy loss, ``-mean(min(r A, clip(r, 1 - eps, 1 + eps) A))``, and the clipped fraction."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range) * advantages
    loss = -torch.minimum(unclipped, clipped).mean()
    fraction = ((ratio - 1.0).abs() > clip_range).float().mean()
    return loss, fraction


def clipped_surrogate_np(logp: F32, old_logp: F32, advantages: F32, clip_range: float) -> tuple[float, float, F32]:
    """:func:`clipped_surrogate` in numpy, and dLoss/dlogp.

    Where the minimum's two sides tie, torch sends half the gradient to each; the clamp
    passes it inside ``[1 - eps, 1 + eps]`` only.
    """
    n = len(logp)
    ratio = np.exp(logp - old_logp)
    low, high = 1.0 - clip_range, 1.0 + clip_range
    unclipped, clipped = ratio * advantages, np.clip(ratio, low, high) * advantages
    loss = -float(np.minimum(unclipped, clipped).mean())
    inside = (ratio >= low) & (ratio <= high)
    weight = np.where(unclipped < clipped, 1.0, np.where(unclipped > clipped, inside, 0.5 + 0.5 * inside))
    grad: F32 = (-(advantages * ratio) * weight / n).astype(np.float32)
    return loss, float((np.abs(ratio - 1.0) > clip_range).mean()), grad


def log_prob_entropy(
    space: gym.Space[Any], head: torch.Tensor, log_std: torch.Tensor | None, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probabilities of ``actions`` under the policy head's output, and each row's entropy (``[B]`` each).

    ``Discrete``: a categorical over the logits ``head``, actions counted from the space's
    start. ``Box``: a diagonal Gaussian of means ``head`` and standard deviations
    ``exp(log_std)``, summed over the action's components. Other spaces go through
    :class:`~worker.algorithms.ppo.distributions.Policy`.
    """
    if isinstance(space, gym.spaces.Discrete):
        log_probs = F.log_softmax(head, dim=1)
        index = actions.long() - int(space.start) if space.start else actions.long()
        logp = log_probs.gather(1, index.unsqueeze(1)).squeeze(1)
        return logp, -(log_probs.exp() * log_probs).sum(dim=1)
    if isinstance(space, gym.spaces.Box):
        assert log_std is not None
        diff = actions.float() - head
        logp = (-0.5 * diff * diff * torch.exp(-2.0 * log_std) - log_std - HALF_LOG_2PI).sum(dim=1)
        return logp, (0.5 + HALF_LOG_2PI + log_std).sum().expand(len(head))
    policy = Policy(space, head, log_std)
    return policy.log_prob(actions), policy.entropy()


def categorical_np(logits: F32, actions: npt.NDArray[np.int64]) -> tuple[F32, F32, tuple[F32, F32, Any]]:
    """:func:`log_prob_entropy` of a ``Discrete`` space in numpy (``actions`` counted from 0).

    Returns the log-probabilities, each row's entropy, and what :func:`categorical_backward_np` needs.
    """
    n = len(logits)
    log_probs = log_softmax(logits)
    probs = np.exp(log_probs)
    logp: F32 = log_probs[np.arange(n), actions]
    entropy: F32 = -(probs * log_probs).sum(axis=1)
    return logp, entropy, (log_probs, probs, actions)


def categorical_backward_np(saved: tuple[F32, F32, Any], entropy: F32, grad_logp: F32, ent_coef: float) -> F32:
    """dLoss/dlogits of ``loss(logp) - ent_coef * mean(entropy)`` from dLoss/dlogp.

    dlogp/dz = onehot - p; d(-ent_coef * mean H)/dz = ent_coef / n * p * (log p + H).
    """
    log_probs, probs, actions = saved
    n = len(probs)
    grad = -probs * grad_logp[:, None]
    grad[np.arange(n), actions] += grad_logp
    grad += np.float32(ent_coef / n) * probs * (log_probs + entropy[:, None])
    out: F32 = grad.astype(np.float32, copy=False)
    return out


def gaussian_np(means: F32, log_std: F32, actions: F32) -> tuple[F32, F32, tuple[F32, F32]]:
    """:func:`log_prob_entropy` of a ``Box`` space in numpy; returns also what :func:`gaussian_backward_np` needs."""
    inv_var = np.exp(np.float32(-2.0) * log_std)
    diff = actions - means
    logp = gaussian_logp(actions, means, log_std)
    entropy = np.full(len(means), float((0.5 + HALF_LOG_2PI + log_std).sum()), dtype=np.float32)
    return logp, entropy, (diff, inv_var)


def gaussian_backward_np(saved: tuple[F32, F32], grad_logp: F32, ent_coef: float) -> tuple[F32, F32]:
    """dLoss/dmeans and dLoss/dlog_std of ``loss(logp) - ent_coef * mean(entropy)`` from dLoss/dlogp."""
    diff, inv_var = saved
    grad_means = (grad_logp[:, None] * diff * inv_var).astype(np.float32, copy=False)
    grad_log_std = (grad_logp[:, None] * (diff * diff * inv_var - 1.0)).sum(axis=0)
    grad_log_std -= np.float32(ent_coef)
    return grad_means, grad_log_std


# -- the value loss ---------------------------------------------------------------------------


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_range_vf: float
) -> torch.Tensor:
    """``0.5 * mean((V - R)^2)``; with ``clip_range_vf`` the worse of the clipped and unclipped errors."""
    if clip_range_vf <= 0.0:
        return 0.5 * ((values - returns) ** 2).mean()
    clipped = old_values + torch.clamp(values - old_values, -clip_range_vf, clip_range_vf)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2).mean()


def value_loss_np(
    values: F32, old_values: F32, returns: F32, clip_range_vf: float
) -> tuple[float, npt.NDArray[np.floating[Any]]]:
    """:func:`value_loss` in numpy, and dLoss/dvalues (a tie of the maximum's sides splits it, as torch does)."""
    n = len(values)
    err = values - returns
    if clip_range_vf <= 0.0:
        grad: npt.NDArray[np.floating[Any]] = err / n
        return 0.5 * float((err * err).mean()), grad
    delta = values - old_values
    c = clip_range_vf
    err_c = old_values + np.clip(delta, -c, c) - returns
    sq, sq_c = err * err, err_c * err_c
    inside = (delta >= -c) & (delta <= c)
    w_plain = np.where(sq > sq_c, 1.0, np.where(sq < sq_c, 0.0, 0.5))
    grad = (w_plain * err + (1.0 - w_plain) * inside * err_c) / n
    return 0.5 * float(np.maximum(sq, sq_c).mean()), grad
