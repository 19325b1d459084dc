"""DQN's losses: the torch forms (the specification) on cases worked by hand, and their numpy twins held to them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.rl_builders import torch_loss_and_grads
from worker.algorithms.dqn.losses import huber_loss, huber_loss_np, td_target, td_target_np

F = np.float32


def test_the_huber_loss_is_half_the_square_inside_one_and_the_distance_less_a_half_outside() -> None:
    # Given Q-values 0.5, 3 and -2 against targets of 0
    q, target = np.array([0.5, 3.0, -2.0], F), np.zeros(3, F)
    # Then each sample's loss is 0.5 * 0.5^2 = 0.125, 3 - 0.5 = 2.5 and 2 - 0.5 = 1.5 (mean 4.125 / 3),
    # and its gradient the error clipped to [-1, 1] over the batch size: 0.5, 1, -1, over 3
    loss, (grad,) = torch_loss_and_grads(huber_loss, q, target)
    assert loss == pytest.approx(4.125 / 3)
    np.testing.assert_allclose(grad, np.array([0.5, 1.0, -1.0]) / 3, rtol=1e-6)
    loss_np, grad_np = huber_loss_np(q, target)
    assert loss_np == pytest.approx(4.125 / 3)
    np.testing.assert_allclose(grad_np, grad, rtol=1e-6)


def test_the_td_target_bootstraps_only_where_the_episode_went_on() -> None:
    reward, done, next_q = np.array([1.0, 2.0], F), np.array([False, True]), np.array([10.0, 10.0], F)
    # 1 + 0.9 * 10 = 10; the terminal step has no future: 2
    want = [10.0, 2.0]
    got = td_target(torch.from_numpy(reward), torch.from_numpy(done), torch.from_numpy(next_q), 0.9)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(td_target_np(reward, done, next_q, 0.9), want, rtol=1e-6)


def test_the_numpy_huber_loss_and_its_gradient_are_the_torch_losss_on_errors_of_both_regions() -> None:
    rng = np.random.default_rng(0)
    q, target = rng.normal(0, 2, 64).astype(F), rng.normal(0, 2, 64).astype(F)
    assert (np.abs(q - target) < 1).any() and (np.abs(q - target) > 1).any()
    loss, (grad,) = torch_loss_and_grads(huber_loss, q, target)
    loss_np, grad_np = huber_loss_np(q, target)
    assert loss_np == pytest.approx(loss, rel=1e-6)
    np.testing.assert_allclose(grad_np, grad, rtol=1e-6, atol=1e-9)
