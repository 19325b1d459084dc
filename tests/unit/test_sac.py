"""SAC's pieces against hand-computed cases."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.rl_builders import bound
from worker.algorithms.sac.learner import SACLearner
from worker.errors import TaskError
from worker.job import JobConfig
from worker.plugins import Spaces


def test_sac_refuses_discrete_actions_before_anything_starts() -> None:
    from messaging import ConfigurationError

    with pytest.raises(ConfigurationError, match="sac needs continuous"):
        JobConfig.from_dict({"env": {"id": "CartPole-v1"}, "algorithm": {"name": "sac"}})


def test_joint_critic_input_on_image_observations_is_refused_before_anything_starts_naming_both() -> None:
    from messaging import ConfigurationError

    job = {"env": {"id": "CarRacing-v3"}, "algorithm": {"name": "sac", "critic_input": "joint"}}
    with pytest.raises(
        ConfigurationError, match=r"critic_input = 'joint' needs one flat float Box.*Box\(96, 96, 3\) uint8"
    ):
        JobConfig.from_dict(job)


@pytest.mark.parametrize(
    "critic_input, first_layer_inputs, hidden_inputs",
    [("auto", 3 + 2, 8), ("joint", 3 + 2, 8), ("features", 3, 8 + 2)],
)
def test_a_critic_takes_the_action_at_its_first_layer_or_beside_the_bodys_output(
    critic_input: str, first_layer_inputs: int, hidden_inputs: int
) -> None:
    spaces = Spaces(gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    learner = bound("sac", spaces, model={"hidden_sizes": [8]}, critic_input=critic_input).make_learner(seed=0)
    assert isinstance(learner, SACLearner)
    for q in (learner.nets.critics.q1, learner.nets.critics.q2, learner.nets.targets.q1):
        first = q.body.net[0]  # type: ignore[index]
        assert isinstance(first, torch.nn.Linear)
        assert first.in_features == first_layer_inputs
        assert q.hidden.in_features == hidden_inputs
    # Either way Q depends on the action
    obs, actions = torch.zeros(1, 3), torch.tensor([[0.5, -0.5], [-0.5, 0.5]])
    with torch.no_grad():
        q1 = learner.nets.critics.q1(obs.expand(2, 3), actions)
    assert float(q1[0]) != float(q1[1])


def test_joint_critic_input_on_integer_observations_is_refused_naming_them() -> None:
    spaces = Spaces(gym.spaces.Box(0, 9, (3,), np.int64), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    with pytest.raises(TaskError, match=r"critic_input = 'joint' needs one flat float Box.*int64"):
        bound("sac", spaces, critic_input="joint")
    assert bound("sac", spaces).joint_critic_input is False  # type: ignore[attr-defined]


def test_auto_joins_the_action_to_the_observation_for_the_built_in_mlp_only() -> None:
    from worker.algorithms.sac import SAC, SACConfig
    from worker.models.mlp import MLP, MLPConfig
    from worker.plugins.contract import Model

    class OtherModel(MLP):
        """Another plug-in, which may read meaning into its observation's layout."""

    spaces = Spaces(gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    config = MLPConfig(hidden_sizes=(8,))
    assert SAC(SACConfig(), spaces, Model(MLP(), config)).joint_critic_input is True
    assert SAC(SACConfig(), spaces, Model(OtherModel(), config, "other")).joint_critic_input is False
    assert SAC(SACConfig(critic_input="joint"), spaces, Model(OtherModel(), config, "other")).joint_critic_input


def test_a_checkpoint_of_critics_with_the_action_beside_the_features_is_refused_saying_how_to_load_it() -> None:
    spaces = Spaces(gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    old = bound("sac", spaces, model={"hidden_sizes": [8]}, critic_input="features").make_learner(seed=0)
    new = bound("sac", spaces, model={"hidden_sizes": [8]}).make_learner(seed=0)
    with pytest.raises(ValueError, match="load with critic_input = 'features'"):
        new.load_state_dict(old.state_dict(), version=1)
    same = bound("sac", spaces, model={"hidden_sizes": [8]}, critic_input="features").make_learner(seed=1)
    same.load_state_dict(old.state_dict(), version=1)  # the setting it was saved with loads it


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_weights_with_one_tensor_of_the_wrong_shape_are_refused_and_the_sac_actor_keeps_all_of_its_own(
    backend: str,
) -> None:
    spaces = Spaces(gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
    algo = bound("sac", spaces, model={"hidden_sizes": [8, 8]}, backend=backend)
    actor = algo.make_actor(seed=0)
    actor.load_weights(algo.policy_network(seed=1).state_dict())  # type: ignore[attr-defined]
    obs = np.random.default_rng(0).uniform(-1, 1, size=(5, 3)).astype(np.float32)
    before = actor.act(obs, explore=False, settings={})[0]
    weights = {k: v.clone() + 1.0 for k, v in algo.policy_network(seed=2).state_dict().items()}  # type: ignore[attr-defined]
    first = next(iter(weights))
    last = list(weights)[-1]
    weights[last] = torch.zeros(*weights[last].shape, 2)  # the last tensor does not fit; the first would
    with pytest.raises(ValueError, match=f"{last!r} is"):
        actor.load_weights(weights)
    np.testing.assert_array_equal(actor.act(obs, explore=False, settings={})[0], before)
    assert first != last
