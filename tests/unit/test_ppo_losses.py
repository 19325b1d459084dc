"""PPO's losses: the torch forms (the specification) on cases worked by hand and against ``torch.distributions``,
and their numpy twins held to them, values and gradients."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import distributions as D  # noqa: N812  (torch's own alias)

from tests.rl_builders import torch_loss_and_grads
from worker.algorithms.ppo.losses import (
    categorical_backward_np,
    categorical_np,
    clipped_surrogate,
    clipped_surrogate_np,
    gaussian_backward_np,
    gaussian_np,
    log_prob_entropy,
    normalized,
    normalized_np,
    value_loss,
    value_loss_np,
)

F = np.float32


def test_the_clipped_surrogate_takes_the_pessimistic_side_of_the_clip() -> None:
    # Given ratios of 1.5 for one positive and one negative advantage, and a clip range of 0.2
    logp, old, advantages = np.full(2, math.log(1.5), F), np.zeros(2, F), np.array([2.0, -2.0], F)
    loss, fraction = clipped_surrogate(torch.from_numpy(logp), torch.from_numpy(old), torch.from_numpy(advantages), 0.2)
    # Then the positive one is clipped (1.2 * 2 = 2.4) and the negative one is not (1.5 * -2 = -3):
    # the loss is -mean(2.4, -3) = 0.3, and both ratios lie outside the clip range
    assert float(loss) == pytest.approx(0.3, rel=1e-6)
    assert float(fraction) == 1.0
    # and only the unclipped one has a gradient: d(-1.5 * -2 / 2)/dlogp = 1.5
    loss_np, fraction_np, grad = clipped_surrogate_np(logp, old, advantages, 0.2)
    assert loss_np == pytest.approx(0.3, rel=1e-6)
    assert fraction_np == 1.0
    np.testing.assert_allclose(grad, [0.0, 1.5], rtol=1e-6)


def test_the_clipped_value_loss_keeps_the_larger_error() -> None:
    values, old, returns = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([1.0])
    # Unclipped: (2 - 1)^2 = 1; clipped to 0 + 0.5: (0.5 - 1)^2 = 0.25; the larger one, halved
    assert float(value_loss(values, old, returns, 0.5)) == pytest.approx(0.5)
    assert float(value_loss(values, old, returns, 0.0)) == pytest.approx(0.5)
    assert value_loss_np(values.numpy(), old.numpy(), returns.numpy(), 0.5)[0] == pytest.approx(0.5)
    values = torch.tensor([0.25])  # unclipped error 0.5625, clipped (0.25) the same
    assert float(value_loss(values, old, returns, 0.5)) == pytest.approx(0.28125)
    assert value_loss_np(values.numpy(), old.numpy(), returns.numpy(), 0.5)[0] == pytest.approx(0.28125)


def minibatch(n: int = 48, seed: int = 0) -> dict[str, np.ndarray]:
    """Log-probabilities a little off the old ones (ratios on both sides of a 0.2 clip), values, returns, advantages."""
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.0, 0.3, n).astype(F)
    return {
        "logp": (old + rng.normal(0, 0.3, n)).astype(F),
        "old_logp": old,
        "advantages": rng.normal(size=n).astype(F),
        "values": rng.normal(size=n).astype(F),
        "old_values": rng.normal(size=n).astype(F),
        "returns": rng.normal(size=n).astype(F),
    }


def test_the_numpy_clipped_surrogate_and_its_gradient_are_the_torch_losss() -> None:
    mb = minibatch()
    ratio = np.exp(mb["logp"] - mb["old_logp"])
    assert (ratio > 1.2).any() and (ratio < 0.8).any() and ((ratio > 0.8) & (ratio < 1.2)).any()

    def loss(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        return clipped_surrogate(logp, old, adv, 0.2)[0]

    value, (grad,) = torch_loss_and_grads(loss, mb["logp"], mb["old_logp"], mb["advantages"])
    value_np, fraction_np, grad_np = clipped_surrogate_np(mb["logp"], mb["old_logp"], mb["advantages"], 0.2)
    assert value_np == pytest.approx(value, rel=1e-5)
    assert fraction_np == pytest.approx(float(np.mean(np.abs(ratio - 1) > 0.2)))
    np.testing.assert_allclose(grad_np, grad, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("clip_range_vf", [0.0, 0.5])
def test_the_numpy_value_loss_and_its_gradient_are_the_torch_losss(clip_range_vf: float) -> None:
    mb = minibatch(seed=1)

    def loss(values: torch.Tensor, old: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
        return value_loss(values, old, returns, clip_range_vf)

    value, (grad,) = torch_loss_and_grads(loss, mb["values"], mb["old_values"], mb["returns"])
    value_np, grad_np = value_loss_np(mb["values"], mb["old_values"], mb["returns"], clip_range_vf)
    assert value_np == pytest.approx(value, rel=1e-5)
    np.testing.assert_allclose(grad_np, grad, rtol=1e-5, atol=1e-8)


def test_normalized_advantages_are_the_same_in_both_forms() -> None:
    adv = minibatch()["advantages"]
    np.testing.assert_allclose(normalized_np(adv), normalized(torch.from_numpy(adv)).numpy(), rtol=1e-5, atol=1e-6)


def test_the_closed_forms_of_the_log_prob_and_entropy_are_torch_distributions() -> None:
    rng = np.random.default_rng(2)
    logits, actions = torch.from_numpy(rng.normal(size=(5, 3)).astype(F)), torch.tensor([-1, 0, 1, 1, -1])
    logp, entropy = log_prob_entropy(gym.spaces.Discrete(3, start=-1), logits, None, actions)
    categorical = D.Categorical(logits=logits)
    torch.testing.assert_close(logp, categorical.log_prob(actions + 1))  # type: ignore[no-untyped-call]
    torch.testing.assert_close(entropy, categorical.entropy())  # type: ignore[no-untyped-call]
    means, log_std = torch.from_numpy(rng.normal(size=(5, 2)).astype(F)), torch.tensor([-0.5, 0.3])
    sampled = torch.from_numpy(rng.normal(size=(5, 2)).astype(F))
    logp, entropy = log_prob_entropy(gym.spaces.Box(-1, 1, (2,)), means, log_std, sampled)
    normal = D.Independent(D.Normal(means, log_std.exp().expand_as(means)), 1)
    torch.testing.assert_close(logp, normal.log_prob(sampled))  # type: ignore[no-untyped-call]
    torch.testing.assert_close(entropy, normal.entropy())  # type: ignore[no-untyped-call]


def test_the_numpy_categorical_log_prob_entropy_and_their_gradient_are_the_torch_forms() -> None:
    rng = np.random.default_rng(3)
    logits, actions = rng.normal(size=(40, 4)).astype(F), rng.integers(0, 4, 40)
    weights = rng.normal(size=40).astype(F)  # dLoss/dlogp of some loss

    def loss(z: torch.Tensor) -> torch.Tensor:
        logp, entropy = log_prob_entropy(gym.spaces.Discrete(4), z, None, torch.from_numpy(actions))
        return (torch.from_numpy(weights) * logp).sum() - 0.1 * entropy.mean()

    value, (grad,) = torch_loss_and_grads(loss, logits)
    logp, entropy, saved = categorical_np(logits, actions)
    assert float((weights * logp).sum() - 0.1 * entropy.mean()) == pytest.approx(value, rel=1e-5)
    np.testing.assert_allclose(categorical_backward_np(saved, entropy, weights, 0.1), grad, rtol=1e-4, atol=1e-6)


def test_the_numpy_gaussian_log_prob_entropy_and_their_gradients_are_the_torch_forms() -> None:
    rng = np.random.default_rng(4)
    means, log_std = rng.normal(size=(40, 2)).astype(F), np.array([-0.5, 0.3], F)
    sampled, weights = rng.normal(size=(40, 2)).astype(F), rng.normal(size=40).astype(F)

    def loss(mu: torch.Tensor, ls: torch.Tensor) -> torch.Tensor:
        logp, entropy = log_prob_entropy(gym.spaces.Box(-1, 1, (2,)), mu, ls, torch.from_numpy(sampled))
        return (torch.from_numpy(weights) * logp).sum() - 0.1 * entropy.mean()

    value, (grad_means, grad_log_std) = torch_loss_and_grads(loss, means, log_std, wrt=(0, 1))
    logp, entropy, saved = gaussian_np(means, log_std, sampled)
    assert float((weights * logp).sum() - 0.1 * entropy.mean()) == pytest.approx(value, rel=1e-5)
    got_means, got_log_std = gaussian_backward_np(saved, weights, 0.1)
    np.testing.assert_allclose(got_means, grad_means, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got_log_std, grad_log_std, rtol=1e-4, atol=1e-6)
