"""PPO's advantage estimators against small hand-computed cases (the losses: ``test_ppo_losses.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from worker.algorithms.ppo.returns import gae, vtrace

F = np.float32


def column(*values: float) -> np.ndarray:
    return np.array(values, dtype=F).reshape(-1, 1)


def flags(*values: int) -> np.ndarray:
    return np.array(values, dtype=bool).reshape(-1, 1)


def test_gae_cuts_at_a_termination_skips_the_reset_step_and_bootstraps_a_truncation() -> None:
    # Given four steps of one env: a termination at t=1, the reset step t=2 (not a
    # transition), and a time-limit truncation at the last step t=3
    reward = column(1, 2, 3, 4)
    values = column(0.5, 1.0, 1.5, 2.0, 2.5)
    terminated, truncated = flags(0, 1, 0, 0), flags(0, 0, 0, 1)
    valid = flags(1, 1, 0, 1)
    # When GAE runs with discount 0.9 and lambda 0.5
    adv, ret = gae(reward, values, terminated, truncated, valid, discount=0.9, lam=0.5)
    # Then, by hand: t=3 bootstraps from V(final obs) = 2.5: 4 + 0.9 * 2.5 - 2 = 4.25;
    # t=2 is 0; t=1 has no future: 2 - 1 = 1; t=0: (1 + 0.9 * 1 - 0.5) + 0.9 * 0.5 * 1 = 1.85
    np.testing.assert_allclose(adv[:, 0], [1.85, 1.0, 0.0, 4.25], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], [2.35, 2.0, 0.0, 6.25], rtol=1e-6)


def test_gae_with_lambda_one_and_no_episode_end_is_the_discounted_return_bootstrapped_at_the_chunk_end() -> None:
    rng = np.random.default_rng(0)
    reward, values = rng.normal(size=(5, 3)).astype(F), rng.normal(size=(6, 3)).astype(F)
    none, every = np.zeros((5, 3), bool), np.ones((5, 3), bool)
    adv, ret = gae(reward, values, none, none, every, discount=0.8, lam=1.0)
    expected = np.array(
        [sum(0.8**k * reward[t + k] for k in range(5 - t)) + 0.8 ** (5 - t) * values[5] for t in range(5)]
    )
    np.testing.assert_allclose(ret, expected, rtol=1e-5)
    np.testing.assert_allclose(adv, expected - values[:5], rtol=1e-5, atol=1e-6)


def _vtrace_by_its_definition(
    reward: np.ndarray,
    values: np.ndarray,
    log_ratio: np.ndarray,
    *,
    discount: float,
    lam: float,
    rho_bar: float,
    c_bar: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Espeholt et al. (2018), eq. 1: v_s = V(x_s) + sum_t gamma^(t-s) (prod_{i<t} c_i) delta_t."""
    ratio = np.exp(log_ratio)
    rho, c = np.minimum(rho_bar, ratio), lam * np.minimum(c_bar, ratio)
    steps = len(reward)
    delta = rho * (reward + discount * values[1:] - values[:-1])
    targets = np.zeros(steps + 1)
    targets[steps] = values[steps]
    for s in range(steps):
        total, weight = 0.0, 1.0
        for t in range(s, steps):
            total += discount ** (t - s) * weight * delta[t]
            weight *= c[t]
        targets[s] = values[s] + total
    advantages = rho * (reward + discount * targets[1:] - values[:-1])
    return advantages, targets[:steps]


@pytest.mark.parametrize("rho_bar, c_bar, lam", [(1.0, 1.0, 1.0), (0.8, 0.6, 0.95), (2.0, 1.0, 0.9)])
def test_vtrace_matches_its_published_definition_on_off_policy_data(rho_bar: float, c_bar: float, lam: float) -> None:
    # Given a trajectory without episode ends, acted by a policy other than the learner's
    rng = np.random.default_rng(1)
    reward = rng.normal(size=7).astype(F)
    values = rng.normal(size=8).astype(F)
    log_ratio = rng.normal(scale=0.7, size=7).astype(F)
    none, every = np.zeros((7, 1), bool), np.ones((7, 1), bool)
    # When V-trace runs on it as a chunk of one env
    adv, targets = vtrace(
        reward[:, None], values[:, None], none, none, every,
        log_ratio=log_ratio[:, None], discount=0.9, lam=lam, rho_bar=rho_bar, c_bar=c_bar,
    )  # fmt: skip
    # Then it gives the paper's sum, computed directly
    want_adv, want_targets = _vtrace_by_its_definition(
        reward, values, log_ratio, discount=0.9, lam=lam, rho_bar=rho_bar, c_bar=c_bar
    )
    np.testing.assert_allclose(targets[:, 0], want_targets, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(adv[:, 0], want_adv, rtol=1e-4, atol=1e-5)


def test_vtrace_on_policy_with_lambda_one_equals_gae_with_lambda_one() -> None:
    rng = np.random.default_rng(2)
    reward, values = rng.normal(size=(6, 2)).astype(F), rng.normal(size=(7, 2)).astype(F)
    terminated = np.zeros((6, 2), bool)
    terminated[2, 0] = True
    valid = np.ones((6, 2), bool)
    valid[3, 0] = False  # the reset step after the termination
    truncated = np.zeros((6, 2), bool)
    a_g, r_g = gae(reward, values, terminated, truncated, valid, discount=0.95, lam=1.0)
    a_v, r_v = vtrace(
        reward, values, terminated, truncated, valid, log_ratio=np.zeros((6, 2), F), discount=0.95, lam=1.0
    )
    np.testing.assert_allclose(r_v, r_g, rtol=1e-5, atol=1e-6)
    # V-trace's advantage bootstraps from the next target, GAE's sums deltas: equal on-policy with lambda 1
    np.testing.assert_allclose(a_v, a_g, rtol=1e-5, atol=1e-5)
