"""SAC's losses and squashed Gaussian: the torch forms (the specification) on cases worked by hand and against
``torch.distributions``, and their numpy twins held to them, values and gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.rl_builders import torch_loss_and_grads
from worker.algorithms.sac.losses import (
    critic_loss,
    critic_loss_np,
    critic_target,
    critic_target_np,
    policy_loss,
    policy_loss_np,
    squashed_gaussian,
    squashed_gaussian_backward_np,
    squashed_gaussian_np,
    temperature_loss,
    temperature_loss_np,
)

F = np.float32


def test_the_temperature_gradient_is_minus_the_mean_of_logp_plus_the_target_entropy() -> None:
    # Given log alpha 0.3, two actions with log-probabilities -1 and -2, and a target entropy of -1
    logp = np.array([-1.0, -2.0], F)
    loss, (grad,) = torch_loss_and_grads(lambda a, lp: temperature_loss(a, lp, -1.0), np.array(0.3, F), logp)
    # Then loss = -mean(0.3 * (-2, -3)) = 0.75, and d loss / d log_alpha = -mean(-2, -3) = 2.5:
    # the entropy (1.5) is above its target, so a gradient step lowers the temperature
    assert loss == pytest.approx(0.75)
    assert float(grad) == pytest.approx(2.5)
    loss_np, grad_np = temperature_loss_np(0.3, logp, -1.0)
    assert (loss_np, grad_np) == pytest.approx((0.75, 2.5))


def test_the_squashed_log_prob_is_the_gaussians_less_the_log_derivative_of_tanh() -> None:
    mean, log_std, noise = (
        torch.tensor([[0.2, -1.0]]),
        torch.tensor([[math.log(0.5), math.log(2.0)]]),
        torch.zeros(1, 2),
    )
    noise[0] = torch.tensor([1.0, -1.0])  # raw = mean + std * noise = (0.7, -3.0)
    action, logp = squashed_gaussian(mean, log_std, noise)
    raw = torch.tensor([[0.7, -3.0]])
    gaussian = torch.distributions.Normal(mean, log_std.exp()).log_prob(raw)  # type: ignore[no-untyped-call]
    direct = sum(float(gaussian[0, i]) - math.log(1 - math.tanh(float(raw[0, i])) ** 2) for i in range(2))
    assert float(logp[0]) == pytest.approx(direct, rel=1e-5)
    torch.testing.assert_close(action, torch.tanh(raw))
    # and it stays finite where tanh rounds to 1 in float32
    assert math.isfinite(float(squashed_gaussian(mean, log_std, torch.tensor([[60.0, -60.0]]))[1][0]))


def test_the_numpy_squashed_gaussian_and_its_gradients_are_the_torch_forms_inside_and_outside_the_clamp() -> None:
    rng = np.random.default_rng(0)
    mean, raw_log_std = rng.normal(size=(32, 2)).astype(F), rng.normal(0, 1.5, (32, 2)).astype(F)
    raw_log_std[:4] = 2.5  # above the clamp: no gradient there
    noise, w_action, w_logp = (rng.normal(size=s).astype(F) for s in ((32, 2), (32, 2), 32))

    def loss(mu: torch.Tensor, ls: torch.Tensor) -> torch.Tensor:
        action, logp = squashed_gaussian(mu, ls, torch.from_numpy(noise))
        return (torch.from_numpy(w_action) * action).sum() + (torch.from_numpy(w_logp) * logp).sum()

    value, (grad_mean, grad_log_std) = torch_loss_and_grads(loss, mean, raw_log_std, wrt=(0, 1))
    action, logp, saved = squashed_gaussian_np(mean, raw_log_std, noise)
    assert float((w_action * action).sum() + (w_logp * logp).sum()) == pytest.approx(value, rel=1e-5)
    got_mean, got_log_std = squashed_gaussian_backward_np(saved, w_action, w_logp)
    np.testing.assert_allclose(got_mean, grad_mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got_log_std, grad_log_std, rtol=1e-4, atol=1e-6)
    assert (got_log_std[:4] == 0).all()


def test_the_critic_target_bootstraps_from_the_smaller_target_less_the_entropy_term() -> None:
    reward, done = np.array([1.0, 1.0], F), np.array([False, True])
    t1, t2, next_logp = np.array([5.0, 5.0], F), np.array([4.0, 9.0], F), np.array([-1.0, -1.0], F)
    # 1 + 0.9 * (min(5, 4) - 0.5 * -1) = 5.05; the terminal step: 1
    want = [5.05, 1.0]
    got = critic_target(
        *map(torch.from_numpy, (reward, done, t1, t2, next_logp)), alpha=torch.tensor(0.5), discount=0.9
    )
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(
        critic_target_np(reward, done, t1, t2, next_logp, alpha=F(0.5), discount=0.9), want, rtol=1e-6
    )


def test_the_numpy_critic_and_policy_losses_and_their_gradients_are_the_torch_losses() -> None:
    rng = np.random.default_rng(1)
    q1, q2, target, logp = (rng.normal(size=48).astype(F) for _ in range(4))
    value, grads = torch_loss_and_grads(critic_loss, q1, q2, target, wrt=(0, 1))
    value_np, *grads_np = critic_loss_np(q1, q2, target)
    assert value_np == pytest.approx(value, rel=1e-5)
    for got, want in zip(grads_np, grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8)

    alpha = np.array(0.2, F)
    value, grads = torch_loss_and_grads(policy_loss, alpha, logp, q1, q2, wrt=(1, 2, 3))
    value_np, *grads_np = policy_loss_np(F(alpha), logp, q1, q2)
    assert value_np == pytest.approx(value, rel=1e-5)
    for got, want in zip(grads_np, grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8)
