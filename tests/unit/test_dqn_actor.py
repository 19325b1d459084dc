"""DQN's actor on collectors: epsilon-greedy over the Q-network, the numpy copy held to torch, strict weight loading."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.rl_builders import bound, flat_spaces
from worker.algorithms.dqn import DQN
from worker.algorithms.dqn.actor import TorchQActor
from worker.algorithms.dqn.numpy_actor import NumpyQActor
from worker.plugins import Spaces

SPACES = flat_spaces(4, 3)


def dqn(spaces: Spaces = SPACES, hidden: tuple[int, ...] = (16, 16), **config: Any) -> DQN:
    algo = bound("dqn", spaces, {"hidden_sizes": list(hidden)}, **config)
    assert isinstance(algo, DQN)
    return algo


def trained_weights(algo: DQN, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights standing in for a learner's policy file."""
    return {k: v.clone() for k, v in algo.q_network(seed).state_dict().items()}


def build(actor_type: type, algo: DQN) -> Any:
    """An actor of ``actor_type`` for ``algo``'s network (the numpy one from its layout, without torch)."""
    if actor_type is NumpyQActor:
        return NumpyQActor(algo.numpy_layout() or {}, 0)
    return TorchQActor(algo.q_network(), 0)


def obs_batch(n: int, dim: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)


def greedy(algo: DQN, weights: dict[str, torch.Tensor], obs: np.ndarray) -> np.ndarray:
    net = algo.q_network()
    net.load_state_dict(weights)
    with torch.no_grad():
        out: np.ndarray = net(torch.from_numpy(obs)).argmax(dim=1).numpy()
    return out


@pytest.mark.parametrize(
    ("obs_space", "model", "config", "expected"),
    [
        (None, {}, {}, NumpyQActor),
        (None, {}, {"backend": "torch"}, TorchQActor),
        (None, {"activation": "tanh"}, {}, TorchQActor),
        (gym.spaces.Box(0, 255, (2, 2), np.uint8), {}, {}, TorchQActor),
        (gym.spaces.Discrete(5), {}, {}, TorchQActor),
        (gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,))}), {}, {}, TorchQActor),
    ],
)
def test_the_numpy_actor_runs_relu_mlps_on_flat_float_observations_and_torch_the_rest(
    obs_space: gym.Space[Any] | None, model: dict[str, Any], config: dict[str, Any], expected: type
) -> None:
    spaces = SPACES if obs_space is None else Spaces(obs_space, gym.spaces.Discrete(3))
    algo = bound("dqn", spaces, {"hidden_sizes": [8], **model}, **config)
    assert type(algo.make_actor(seed=0)) is expected


def test_the_numpy_forward_pass_computes_the_torch_networks_q_values() -> None:
    # Given the same weights in both actors
    algo = dqn()
    weights = trained_weights(algo, seed=1)
    numpy_actor, torch_actor = build(NumpyQActor, algo), build(TorchQActor, algo)
    numpy_actor.load_weights(weights)
    torch_actor.load_weights(weights)
    obs = obs_batch(64, seed=1)
    # Then the numpy Q-values are torch's, and so are the greedy actions
    np.testing.assert_allclose(numpy_actor.q_values(obs), torch_actor.q_values(obs), rtol=1e-5, atol=1e-6)
    a, _ = numpy_actor.act(obs, explore=False, settings={})
    b, _ = torch_actor.act(obs, explore=False, settings={})
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, greedy(algo, weights, obs))


@pytest.mark.parametrize("actor_type", [NumpyQActor, TorchQActor])
def test_eps_zero_is_greedy_eps_one_random_and_eval_ignores_eps(actor_type: type) -> None:
    algo = dqn(flat_spaces(4, 2), hidden=(8,))
    weights = trained_weights(algo, seed=0)
    actor = build(actor_type, algo)
    actor.load_weights(weights)
    obs = obs_batch(400)
    best = greedy(algo, weights, obs)

    actions, extras = actor.act(obs, explore=True, settings={"eps": 0.0})
    explored, _ = actor.act(obs, explore=True, settings={"eps": 1.0})
    evaluated, _ = actor.act(obs, explore=False, settings={"eps": 1.0})
    unset, _ = actor.act(obs, explore=True, settings={})

    assert actions.dtype == np.int64 and actions.shape == (400,) and extras == {}
    np.testing.assert_array_equal(actions, best)
    assert 0.4 < float(np.mean(explored == best)) < 0.6  # coin flips agree half the time
    np.testing.assert_array_equal(evaluated, best)  # eval tasks act greedily whatever the setting
    np.testing.assert_array_equal(unset, best)  # a task that sets no eps explores not at all


def test_exploration_picks_every_action_at_the_configured_rate() -> None:
    algo = dqn()
    actor = algo.make_actor(seed=0)
    obs = np.zeros((30_000, 4), np.float32)
    best, _ = actor.act(obs, explore=False, settings={})
    actions, _ = actor.act(obs, explore=True, settings={"eps": 0.3})
    changed = float(np.mean(actions != best))
    assert 0.18 < changed < 0.22  # 0.3 explore, of which 2/3 pick another action
    assert set(actions.tolist()) == {0, 1, 2}


def test_seeded_actors_explore_alike_and_other_seeds_do_not() -> None:
    algo = dqn()
    weights = trained_weights(algo, seed=0)
    obs = np.zeros((500, 4), np.float32)
    runs = []
    for seed in (3, 3, 4):
        actor = algo.make_actor(seed=seed)
        actor.load_weights(weights)
        runs.append(actor.act(obs, explore=True, settings={"eps": 0.5})[0])
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])


@pytest.mark.parametrize("actor_type", [NumpyQActor, TorchQActor])
@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (lambda algo: dqn(hidden=(16, 8)).q_network(0).state_dict(), r"'encoder.net.2.weight' is \(8, 16\)"),
        (lambda algo: {**algo.q_network(0).state_dict(), "head.bias": torch.zeros(5)}, r"'head.bias' is \(5,\)"),
        (lambda algo: {"encoder.net.0.weight": torch.zeros(16, 4)}, "missing"),
        (lambda algo: {**algo.q_network(0).state_dict(), "extra": torch.zeros(1)}, r"unexpected \['extra'\]"),
        (lambda algo: {**algo.q_network(0).state_dict(), "head.weight": [[0.0]]}, "'head.weight' is list"),
    ],
)
def test_weights_that_do_not_fit_are_refused_and_the_actor_keeps_its_own(
    actor_type: type, weights: Any, message: str
) -> None:
    # Given an actor acting on good weights
    algo = dqn()
    good = trained_weights(algo, seed=1)
    actor = build(actor_type, algo)
    actor.load_weights(good)
    obs = obs_batch(32)
    before = actor.q_values(obs).copy()
    # When a policy file that does not fit the network is loaded
    with pytest.raises(ValueError, match=message):
        actor.load_weights(weights(algo))
    # Then it acts exactly as before: nothing of the refused file was taken in
    np.testing.assert_array_equal(actor.q_values(obs), before)
    if isinstance(actor, TorchQActor):
        for name, tensor in good.items():
            assert torch.equal(actor.net.state_dict()[name], tensor), name


def test_new_weights_change_what_the_numpy_actor_computes() -> None:
    algo = dqn()
    actor = algo.make_actor(seed=0)
    assert isinstance(actor, NumpyQActor)
    obs = obs_batch(16)
    actor.load_weights(trained_weights(algo, seed=1))
    first = actor.q_values(obs).copy()
    actor.load_weights(trained_weights(algo, seed=2))
    assert not np.allclose(actor.q_values(obs), first)
    np.testing.assert_allclose(actor.q_values(obs), TorchQActor(algo.q_network(2), 0).q_values(obs), atol=1e-5)


def test_the_torch_actor_takes_image_and_dict_observations_in_their_own_dtypes() -> None:
    # Given a DQN on uint8 images and one on a Dict of an image and a direction
    image = gym.spaces.Box(0, 255, (3, 4, 4), np.uint8)
    for obs_space in (image, gym.spaces.Dict({"image": image, "direction": gym.spaces.Discrete(4)})):
        algo = dqn(Spaces(obs_space, gym.spaces.Discrete(3)), hidden=(8,))
        actor = algo.make_actor(seed=0)
        obs_space.seed(0)
        samples: list[Any] = [obs_space.sample() for _ in range(5)]
        if isinstance(obs_space, gym.spaces.Dict):
            obs: Any = {k: np.stack([np.asarray(s[k]) for s in samples]) for k in obs_space.spaces}
        else:
            obs = np.stack(samples)
        # Then it acts for every env, one valid action each
        actions, _ = actor.act(obs, explore=True, settings={"eps": 0.1})
        assert actions.shape == (5,) and actions.dtype == np.int64 and set(actions.tolist()) <= {0, 1, 2}
