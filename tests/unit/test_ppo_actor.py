"""PPO's actors on collectors: the numpy copy held to torch, sampling from the policy, strict weight loading."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.rl_builders import bound, flat_spaces
from worker.algorithms.ppo.actor import PPOActor
from worker.algorithms.ppo.numpy_actor import NumpyPPOActor
from worker.plugins import Spaces

GAUSSIAN = Spaces(gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
SHIFTED = Spaces(gym.spaces.Box(-np.inf, np.inf, (5,), np.float32), gym.spaces.Discrete(4, start=-1))
MLP = {"hidden_sizes": [16, 16], "activation": "tanh"}


def actors(spaces: Spaces, **config: Any) -> tuple[Any, Any]:
    """A numpy and a torch actor holding the same seeded weights (and, with normalize_obs, statistics)."""
    algo = bound("ppo", spaces, model=MLP, **config)
    net = algo.network(seed=3)  # type: ignore[attr-defined]
    if net.obs_norm is not None:
        net.obs_norm.update(torch.randn(50, *obs_shape(spaces)) * 3 + 1)
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    fast, reference = algo.make_actor(seed=0), bound("ppo", spaces, model=MLP, backend="torch", **config).make_actor(0)
    fast.load_weights(weights)
    reference.load_weights(weights)
    return fast, reference


def obs_batch(spaces: Spaces, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, *obs_shape(spaces))).astype(np.float32)


def obs_shape(spaces: Spaces) -> tuple[int, ...]:
    shape = spaces.observation.shape
    assert shape is not None
    return tuple(shape)


def test_an_mlp_job_gets_the_numpy_actor_and_backend_torch_or_a_cnn_the_torch_one() -> None:
    assert type(bound("ppo", flat_spaces(), model=MLP).make_actor(0)) is NumpyPPOActor
    assert type(bound("ppo", flat_spaces(), model=MLP, backend="torch").make_actor(0)) is PPOActor
    pong = Spaces(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6))
    assert type(bound("ppo", pong, model_name="nature_cnn", model={"features": 32}).make_actor(0)) is PPOActor


@pytest.mark.parametrize(
    "spaces, config", [(flat_spaces(), {}), (SHIFTED, {"normalize_obs": True}), (GAUSSIAN, {"log_std_init": -0.7})]
)
def test_greedy_actions_log_probs_and_values_are_torchs(spaces: Spaces, config: dict[str, Any]) -> None:
    fast, reference = actors(spaces, **config)
    obs = obs_batch(spaces, 64)
    got, got_extras = fast.act(obs, explore=False, settings={})
    want, want_extras = reference.act(obs, explore=False, settings={})
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for key in ("logp", "value"):
        assert got_extras[key].dtype == np.float32
        np.testing.assert_allclose(got_extras[key], want_extras[key], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spaces", [SHIFTED, GAUSSIAN])
def test_sampled_actions_follow_the_policy_and_carry_its_log_probs(spaces: Spaces) -> None:
    fast, reference = actors(spaces)
    obs = np.repeat(obs_batch(spaces, 1), 20_000, axis=0)  # one state, many draws
    actions, extras = fast.act(obs, explore=True, settings={})
    net = reference.net
    with torch.no_grad():
        # the log-probs written are the policy's own for the actions drawn
        drawn = net.policy(net.inputs(obs)).log_prob(torch.as_tensor(actions)).numpy()
        np.testing.assert_allclose(extras["logp"], drawn, rtol=1e-4, atol=1e-5)
        policy = net.policy(net.inputs(obs[:1]))
        if isinstance(spaces.action, gym.spaces.Discrete):
            probs = policy.dist.probs.numpy()[0]
            counts = np.bincount(actions - spaces.action.start, minlength=len(probs)) / len(actions)
            np.testing.assert_allclose(counts, probs, atol=0.015)  # 4 sigma of 20,000 draws
        else:
            mean, std = policy.dist.base_dist.loc.numpy()[0], policy.dist.base_dist.scale.numpy()[0]
            np.testing.assert_allclose(actions.mean(axis=0), mean, atol=4 * std.max() / np.sqrt(len(actions)))
            np.testing.assert_allclose(actions.std(axis=0), std, rtol=0.03)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_weights_with_one_tensor_of_the_wrong_shape_are_refused_and_the_actor_keeps_all_of_its_own(
    backend: str,
) -> None:
    algo = bound("ppo", flat_spaces(), model=MLP, backend=backend)
    actor = algo.make_actor(seed=0)
    actor.load_weights(algo.network(seed=4).state_dict())  # type: ignore[attr-defined]
    obs = obs_batch(flat_spaces(), 8)
    before = actor.act(obs, explore=False, settings={})[1]["value"]
    bad = {k: v.clone() + 1.0 for k, v in algo.network(seed=5).state_dict().items()}  # type: ignore[attr-defined]
    bad["vf_head.weight"] = torch.zeros(1, 17)
    with pytest.raises(ValueError, match=r"'vf_head.weight' is \(1, 17\), needs \(1, 16\)"):
        actor.load_weights(bad)
    np.testing.assert_array_equal(actor.act(obs, explore=False, settings={})[1]["value"], before)
