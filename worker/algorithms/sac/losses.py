"""SAC's losses and its squashed Gaussian, each in torch (the specification) and beside it in numpy with its gradient.

One train step (Haarnoja et al., 2018, with the temperature of their second paper):

* critics: ``y = r + discount * (1 - done) * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s'))``
  with ``a' ~ pi(s')`` and the target critics ``Q'`` (:func:`critic_target`); loss
  ``mean((Q1 - y)^2) + mean((Q2 - y)^2)`` (:func:`critic_loss`);
* policy: ``mean(alpha * log pi(a|s) - min(Q1, Q2)(s, a))`` with ``a ~ pi(s)``
  reparameterised (:func:`squashed_gaussian`, :func:`policy_loss`);
* temperature: ``-mean(log_alpha * (log pi(a|s) + target_entropy))``, whose gradient in
  ``log_alpha`` is ``-mean(log pi + target_entropy)``: alpha grows while the entropy
  (``-log pi``) is below the target (:func:`temperature_loss`).

The torch functions are what the torch step (:mod:`.torch_step`, any model) computes; each
``*_np`` function below its torch form is the same arithmetic in numpy with the gradient
the numpy step (:mod:`.numpy_step`) back-propagates. A change is made here, to both forms:
``tests/unit/test_sac_losses.py`` holds every numpy form to its torch form (values and
gradients on the same inputs), and the torch forms to ``torch.distributions`` and to
cases worked by hand.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812  (the universal torch alias)

from worker.algorithms.sac.numpy_actor import LOG_STD_MAX, LOG_STD_MIN

__all__ = [
    "critic_loss",
    "critic_loss_np",
    "critic_target",
    "critic_target_np",
    "policy_loss",
    "policy_loss_np",
    "squashed_gaussian",
    "squashed_gaussian_backward_np",
    "squashed_gaussian_np",
    "temperature_loss",
    "temperature_loss_np",
]

F32 = npt.NDArray[np.float32]
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
LOG_2 = math.log(2.0)


# -- the policy's sample -----------------------------------------------------------------------


def squashed_gaussian(
    mean: torch.Tensor, raw_log_std: torch.Tensor, noise: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reparameterised actions ``tanh(mean + std * noise)`` in [-1, 1] and their log-densities (``[B, d]``, ``[B]``).

    ``std = exp(clamp(raw_log_std, -20, 2))``. The density is the Gaussian's at ``u = mean + std
    * noise`` (``-noise^2 / 2 - log std - log sqrt(2 pi)``), minus ``log(1 - tanh(u)^2) = 2 (log 2
    - u - softplus(-2u))`` per dimension, which stays finite where ``tanh(u)`` rounds to 1.
    """
    log_std = raw_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    raw = mean + log_std.exp() * noise
    correction = 2.0 * (LOG_2 - raw - F.softplus(-2.0 * raw))
    logp = (-0.5 * noise * noise - log_std - HALF_LOG_2PI - correction).sum(dim=-1)
    return torch.tanh(raw), logp


def squashed_gaussian_np(mean: F32, raw_log_std: F32, noise: F32) -> tuple[F32, F32, dict[str, F32]]:
    """:func:`squashed_gaussian` in numpy; returns also what :func:`squashed_gaussian_backward_np` needs."""
    log_std = np.clip(raw_log_std, LOG_STD_MIN, LOG_STD_MAX)
    std = np.exp(log_std)
    raw = mean + std * noise
    action = np.tanh(raw)
    correction = 2.0 * (LOG_2 - raw - np.logaddexp(np.float32(0.0), np.float32(-2.0) * raw))
    logp = (np.float32(-0.5) * noise * noise - log_std - np.float32(HALF_LOG_2PI) - correction).sum(axis=1)
    saved = {"raw_log_std": raw_log_std.copy(), "std": std, "noise": noise, "action": action}
    return action, logp.astype(np.float32, copy=False), saved


def squashed_gaussian_backward_np(saved: dict[str, F32], grad_action: F32, grad_logp: F32) -> tuple[F32, F32]:
    """dLoss/dmean and dLoss/draw_log_std from dLoss/d(action) ``[B, d]`` and dLoss/d(logp) ``[B]``.

    With ``u = mean + std * noise``, ``action = tanh(u)``: dlogp/du = 2 tanh(u) (from the tanh
    correction; the Gaussian term, written in ``noise``, does not depend on ``u``), dlogp/dlog_std
    = -1 directly, du/dlog_std = std * noise, and the clamp passes the gradient inside its bounds.
    """
    action = saved["action"]
    g_logp = grad_logp[:, None]
    grad_raw = grad_action * (np.float32(1.0) - action * action) + g_logp * np.float32(2.0) * action
    grad_log_std = grad_raw * saved["std"] * saved["noise"] - g_logp
    raw_log_std = saved["raw_log_std"]
    grad_log_std *= (raw_log_std >= LOG_STD_MIN) & (raw_log_std <= LOG_STD_MAX)
    return grad_raw.astype(np.float32, copy=False), grad_log_std.astype(np.float32, copy=False)


# -- the critics ---------------------------------------------------------------------------------


def critic_target(
    reward: torch.Tensor,
    done: torch.Tensor,
    t1: torch.Tensor,
    t2: torch.Tensor,
    next_logp: torch.Tensor,
    *,
    alpha: torch.Tensor,
    discount: float,
) -> torch.Tensor:
    """``r + discount * (1 - done) * (min(Q1', Q2') - alpha * log pi(a'|s'))``."""
    return reward + discount * (1.0 - done.float()) * (torch.minimum(t1, t2) - alpha * next_logp)


def critic_target_np(
    reward: F32, done: npt.NDArray[Any], t1: F32, t2: F32, next_logp: F32, *, alpha: np.float32, discount: float
) -> F32:
    """:func:`critic_target` in numpy (float32)."""
    not_done = np.float32(1.0) - np.asarray(done, dtype=np.float32)
    out: F32 = reward + np.float32(discount) * not_done * (np.minimum(t1, t2) - alpha * next_logp)
    return out


def critic_loss(q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``mean((Q1 - y)^2) + mean((Q2 - y)^2)``."""
    return F.mse_loss(q1, target) + F.mse_loss(q2, target)


def critic_loss_np(q1: F32, q2: F32, target: F32) -> tuple[float, F32, F32]:
    """:func:`critic_loss` in numpy, and dLoss/dQ1, dLoss/dQ2."""
    n = len(q1)
    err1, err2 = q1 - target, q2 - target
    loss = float(np.dot(err1, err1) + np.dot(err2, err2)) / n
    return loss, err1 * np.float32(2.0 / n), err2 * np.float32(2.0 / n)


# -- the policy and the temperature ------------------------------------------------------------


def policy_loss(alpha: torch.Tensor, logp: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor) -> torch.Tensor:
    """``mean(alpha * log pi(a|s) - min(Q1, Q2)(s, a))``."""
    return (alpha * logp - torch.minimum(q1, q2)).mean()


def policy_loss_np(alpha: np.float32, logp: F32, q1: F32, q2: F32) -> tuple[float, F32, F32, F32]:
    """:func:`policy_loss` in numpy, and dLoss/dlogp, dLoss/dQ1, dLoss/dQ2.

    The minimum sends its gradient to the smaller side, half to each at a tie (torch's rule;
    a tie of two different critics is all but impossible in float32, and between equal ones
    the split does not change the sum).
    """
    n = len(logp)
    loss = float((alpha * logp - np.minimum(q1, q2)).mean())
    w1 = np.where(q1 < q2, 1.0, np.where(q1 > q2, 0.0, 0.5)).astype(np.float32)
    grad_min = np.float32(-1.0 / n)
    grad_logp = np.full(n, alpha / n, dtype=np.float32)
    return loss, grad_logp, grad_min * w1, grad_min * (np.float32(1.0) - w1)


def temperature_loss(log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """``-mean(log_alpha * (logp + target_entropy))``, ``logp`` taken as data."""
    return -(log_alpha * (logp.detach() + target_entropy)).mean()


def temperature_loss_np(log_alpha: float, logp: F32, target_entropy: float) -> tuple[float, float]:
    """:func:`temperature_loss` in numpy, and its derivative in ``log_alpha``: ``-mean(logp + target_entropy)``."""
    grad = -float((logp + np.float32(target_entropy)).mean())
    return log_alpha * grad, grad
