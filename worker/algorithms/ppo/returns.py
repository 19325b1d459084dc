"""Advantage estimators on a chunk's ``[T, N]`` arrays: GAE, and V-trace for data from an older policy.

Both take the values of all ``T + 1`` observation rows (row ``t + 1`` follows step ``t``;
see :class:`~worker.plugins.Chunk`) and treat episode ends the same way:

* a *terminated* step has no future: its next value is 0;
* a *truncated* step (time limit) still bootstraps from the value of its next
  observation (the true final one), but the estimate does not flow back across it;
* an *invalid* row (an env's reset step, right after an episode ended) is no transition:
  its advantage is 0, and since the step before it ended an episode, nothing flows
  through it either;
* the chunk's last row bootstraps from the value of row ``T``: the estimate is cut there,
  as PPO's is at the end of each rollout.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
Bools = npt.NDArray[np.bool_]


def gae(
    reward: F32,
    values: F32,
    terminated: Bools,
    truncated: Bools,
    valid: Bools,
    *,
    discount: float,
    lam: float,
) -> tuple[F32, F32]:
    """Generalised advantage estimation (Schulman et al., 2016).

    ``delta_t = r_t + discount * V(s_{t+1}) * (1 - terminated_t) - V(s_t)`` and
    ``A_t = delta_t + discount * lam * (1 - ended_t) * A_{t+1}``, with ``A_T = 0``.

    Args:
        reward, terminated, truncated, valid: ``[T, N]``.
        values: ``[T + 1, N]``, the value of every observation row.

    Returns:
        ``(advantages, returns)``, ``[T, N]`` each; ``returns = advantages + values[:T]``
        (the value targets). Invalid rows are 0 in both.
    """
    steps = reward.shape[0]
    ended = terminated | truncated
    advantages = np.zeros_like(reward, dtype=np.float32)
    running = np.zeros(reward.shape[1], dtype=np.float32)
    for t in range(steps - 1, -1, -1):
        next_value = np.where(terminated[t], 0.0, values[t + 1])
        delta = reward[t] + discount * next_value - values[t]
        running = delta + discount * lam * np.where(ended[t], 0.0, running)
        running = np.where(valid[t], running, 0.0)
        advantages[t] = running
    returns = np.where(valid, advantages + values[:steps], 0.0).astype(np.float32)
    return advantages, returns


def vtrace(
    reward: F32,
    values: F32,
    terminated: Bools,
    truncated: Bools,
    valid: Bools,
    *,
    log_ratio: F32,
    discount: float,
    lam: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[F32, F32]:
    """V-trace targets and policy-gradient advantages (Espeholt et al., 2018, section 4.1).

    With ``rho_t = min(rho_bar, pi/mu)`` and ``c_t = lam * min(c_bar, pi/mu)`` (``pi`` the
    learner's policy, ``mu`` the one that acted), the recursion of the paper's remark 1:
    ``v_s - V(x_s) = delta_s + discount * c_s * (v_{s+1} - V(x_{s+1}))``, where
    ``delta_s = rho_s * (r_s + discount * V(x_{s+1}) - V(x_s))``; the policy gradient's
    advantage is ``rho_s * (r_s + discount * v_{s+1} - V(x_s))``. At the chunk's end
    ``v_T = V(x_T)``; episode ends cut the recursion as in :func:`gae`.

    Args:
        log_ratio: ``log pi(a_t|x_t) - log mu(a_t|x_t)``, ``[T, N]``.

    Returns:
        ``(advantages, targets)``: the policy gradient's advantages and the value targets
        ``v_s``, ``[T, N]`` each; invalid rows are 0.
    """
    steps = reward.shape[0]
    ratio = np.exp(log_ratio.astype(np.float64))
    rho = np.minimum(rho_bar, ratio).astype(np.float32)
    c = (lam * np.minimum(c_bar, ratio)).astype(np.float32)
    ended = terminated | truncated
    next_values = np.where(terminated, 0.0, values[1:]).astype(np.float32)
    deltas = rho * (reward + discount * next_values - values[:steps])
    targets = np.zeros((steps + 1, reward.shape[1]), dtype=np.float32)
    targets[steps] = values[steps]
    correction = np.zeros(reward.shape[1], dtype=np.float32)  # v_{s+1} - V(x_{s+1})
    for t in range(steps - 1, -1, -1):
        correction = deltas[t] + discount * c[t] * np.where(ended[t], 0.0, correction)
        correction = np.where(valid[t], correction, 0.0)
        targets[t] = values[t] + correction
    # The advantage bootstraps from v_{s+1}, except where the episode ended at s: then
    # from V of the final observation (truncated) or from nothing (terminated).
    next_targets = np.where(ended, next_values, targets[1:])
    advantages = np.where(valid, rho * (reward + discount * next_targets - values[:steps]), 0.0).astype(np.float32)
    return advantages, np.where(valid, targets[:steps], 0.0).astype(np.float32)
