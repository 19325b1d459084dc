"""The built-in DQN as an algorithm plug-in: its settings, the spaces it takes, its tasks' exploration schedule."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from tests.rl_builders import bound, flat_spaces
from worker.algorithms.dqn import DQN, DQNConfig, epsilon_at
from worker.errors import TaskError
from worker.plugins import Spaces, UnsupportedSpace, config_from_dict


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("lr", 0, r"algorithm\.lr must be a number in \(0\.0, 1\.0\], got 0"),
        ("lr", 2.0, r"algorithm\.lr"),
        ("discount", 1.5, r"algorithm\.discount"),
        ("batch_size", 0, r"algorithm\.batch_size must be an integer between 1 and 65536"),
        ("batch_size", 2.5, r"algorithm\.batch_size"),
        ("tau", 0.0, r"algorithm\.tau"),
        ("eps_end", -0.1, r"algorithm\.eps_end"),
        ("eps_decay_steps", 0, r"algorithm\.eps_decay_steps"),
        ("train_steps_per_sample", 0.0, r"algorithm\.train_steps_per_sample"),
        ("max_grad_norm", float("nan"), r"algorithm\.max_grad_norm"),
        ("double_dqn", 1, r"algorithm\.double_dqn must be a bool"),
        ("backend", "jax", r"algorithm\.backend must be one of \['auto', 'torch', 'numpy'\]"),
        ("hidden_sizes", [64], r"unknown keys \['hidden_sizes'\]"),  # the model's, not the algorithm's
    ],
)
def test_bad_hyperparameters_are_refused_naming_the_key(key: str, value: Any, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        config_from_dict(DQNConfig, {key: value}, "algorithm")


@pytest.mark.parametrize("algorithm", ["dqn", "sac"])
def test_a_warm_up_longer_than_the_replay_buffer_is_refused_naming_both_keys(algorithm: str) -> None:
    # A buffer of 500 never holds the 1,000 transitions training waits for: the run would only collect
    from worker.algorithms.sac import SACConfig

    config_class = DQNConfig if algorithm == "dqn" else SACConfig
    message = r"algorithm\.learning_starts \(1000\) must be at most algorithm\.replay_capacity \(500\)"
    with pytest.raises(TaskError, match=message):
        config_from_dict(config_class, {"learning_starts": 1000, "replay_capacity": 500}, "algorithm")
    fits = config_from_dict(config_class, {"learning_starts": 500, "replay_capacity": 500}, "algorithm")
    assert (fits.learning_starts, fits.replay_capacity) == (500, 500)


def test_hyperparameters_from_plain_data_become_the_frozen_config() -> None:
    config = config_from_dict(DQNConfig, {"lr": 1, "batch_size": 64, "double_dqn": False}, "algorithm")
    assert config == DQNConfig(lr=1.0, batch_size=64, double_dqn=False)
    assert isinstance(config.lr, float)  # an int where a float is due is taken as one


def test_epsilon_decays_linearly_then_stays_at_the_end_value() -> None:
    assert epsilon_at(0, 1.0, 0.1, 1000) == 1.0
    assert epsilon_at(500, 1.0, 0.1, 1000) == pytest.approx(0.55)
    assert epsilon_at(1000, 1.0, 0.1, 1000) == pytest.approx(0.1)
    assert epsilon_at(10**9, 1.0, 0.1, 1000) == pytest.approx(0.1)
    assert epsilon_at(-5, 1.0, 0.1, 1000) == 1.0
    assert DQNConfig().epsilon(10**9) == DQNConfig().eps_end


def test_collect_tasks_are_told_the_eps_of_the_schedule_and_bad_ones_are_refused() -> None:
    algo = bound("dqn", flat_spaces(), eps_start=0.8, eps_end=0.2, eps_decay_steps=100)
    assert algo.collect_settings(0) == {"eps": 0.8}
    assert algo.collect_settings(50) == {"eps": pytest.approx(0.5)}
    assert algo.collect_settings(100) == {"eps": 0.2}
    algo.check_collect_settings({"eps": 0.0})
    algo.check_collect_settings({})  # (no eps: greedy)
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(TaskError, match=r"collector_cfg\.collect_setting\.eps must be a number in \[0\.0, 1\.0\]"):
            algo.check_collect_settings({"eps": bad})


def test_dqn_says_its_replay_ratio_and_needs_no_extra_columns() -> None:
    algo = bound("dqn", flat_spaces(), train_steps_per_sample=0.25)
    assert algo.replay_ratio == 0.25
    assert algo.columns() == {} and algo.max_policy_lag is None and algo.kind == "off_policy"
    assert isinstance(algo, DQN) and algo.n_actions == 2


@pytest.mark.parametrize(
    ("action", "described"),
    [
        (gym.spaces.Box(-2.0, 2.0, (1,), np.float32), r"Box\(1,\) float32"),
        (gym.spaces.MultiDiscrete([3, 3]), r"MultiDiscrete\(\[3, 3\]\)"),
        (gym.spaces.MultiBinary(4), r"MultiBinary\(4,\)"),
    ],
)
def test_dqn_refuses_actions_that_are_not_discrete_naming_both(action: gym.Space[Any], described: str) -> None:
    # (before any process starts: the job, the coordinator and every collector bind the same way)
    spaces = Spaces(gym.spaces.Box(-1, 1, (3,), np.float32), action)
    with pytest.raises(
        UnsupportedSpace, match=rf"algorithm 'dqn' cannot run this env: dqn needs Discrete .*{described}"
    ):
        bound("dqn", spaces)


@pytest.mark.parametrize(
    "observation",
    [
        gym.spaces.Box(0, 255, (3, 8, 8), np.uint8),
        gym.spaces.Discrete(7),
        gym.spaces.MultiDiscrete([2, 5]),
        gym.spaces.MultiBinary(6),
        gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (4, 4), np.uint8), "flag": gym.spaces.MultiBinary(2)}),
    ],
)
def test_dqn_takes_any_observation_space_its_model_does(observation: gym.Space[Any]) -> None:
    algo = bound("dqn", Spaces(observation, gym.spaces.Discrete(2)), {"hidden_sizes": [8]})
    learner = algo.make_learner(seed=0)
    assert set(learner.actor_weights()) >= {"head.weight", "head.bias"}
