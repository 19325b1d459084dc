"""From names and plain data to working objects (worker/plugins/binding.py, the configs): one set of refusals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import pytest
from torch import nn

from tests.rl_builders import flat_spaces
from worker.errors import PluginFailed, TaskError
from worker.plugins import (
    LoadedPlugin,
    MissingPlugin,
    ModelPlugin,
    PluginKind,
    PluginRegistry,
    Spaces,
    UnsupportedSpace,
    config_from_dict,
    config_to_dict,
    installed,
)
from worker.plugins.binding import build_algorithm, env_plugin


@dataclass(frozen=True)
class Settings:
    width: int = 4
    rate: float = 0.5
    sizes: tuple[int, ...] = (1, 2)
    mode: Literal["a", "b"] = "a"
    on: bool = True

    def __post_init__(self) -> None:
        if self.width > 100:
            raise ValueError("width must be at most 100")


def test_configs_come_from_plain_data_and_go_back_to_it() -> None:
    config = config_from_dict(Settings, {"width": 7, "rate": 1, "sizes": [3, 4], "mode": "b"}, "model")
    assert config == Settings(width=7, rate=1.0, sizes=(3, 4), mode="b")
    assert config_to_dict(config) == {"width": 7, "rate": 1.0, "sizes": [3, 4], "mode": "b", "on": True}
    assert config_from_dict(Settings, None, "model") == Settings()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"widht": 3}, r"model: unknown keys \['widht'\]; known: \['mode', 'on', 'rate', 'sizes', 'width'\]"),
        ({"width": "3"}, r"model\.width must be a int, got '3'"),
        ({"width": True}, r"model\.width must be a int"),
        ({"on": 1}, r"model\.on must be a bool"),
        ({"rate": "fast"}, r"model\.rate must be a float"),
        ({"sizes": 3}, r"model\.sizes must be a list"),
        ({"sizes": [1, "x"]}, r"model\.sizes must be a int"),
        ({"mode": "c"}, r"model\.mode must be one of \['a', 'b'\]"),
        ({"width": 1000}, "model: width must be at most 100"),
    ],
)
def test_config_mistakes_are_task_errors_naming_the_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(TaskError, match=message):
        config_from_dict(Settings, data, "model")


class PickyModel(ModelPlugin):
    """Takes flat Box observations only, and says so."""

    def check_space(self, observation_space: gym.Space[Any], config: Any) -> None:
        if not isinstance(observation_space, gym.spaces.Box):
            raise UnsupportedSpace("picky takes Box observations only")

    def make_encoder(self, observation_space: gym.Space[Any], config: Any) -> nn.Module:
        return nn.Flatten()  # no out_dim: a broken plug-in


def registry_with(name: str, plugin: ModelPlugin) -> PluginRegistry:
    have = installed()
    models = {**have.plugins[PluginKind.MODEL], name: LoadedPlugin(PluginKind.MODEL, name, "2.0", "picky-dist", plugin)}
    return PluginRegistry(plugins={**have.plugins, PluginKind.MODEL: models})


def test_a_model_that_refuses_the_observations_is_refused_naming_model_and_space() -> None:
    spaces = Spaces(gym.spaces.Discrete(3), gym.spaces.Discrete(2))
    with pytest.raises(
        UnsupportedSpace, match=r"model 'picky' cannot take observations Discrete\(3\): picky takes Box"
    ):
        build_algorithm(registry_with("picky", PickyModel()), spaces, algorithm="dqn", model="picky")


def test_an_encoder_without_an_integer_out_dim_is_a_plugin_bug_said_plainly() -> None:
    algo = build_algorithm(registry_with("picky", PickyModel()), flat_spaces(), algorithm="dqn", model="picky")
    with pytest.raises(
        PluginFailed,
        match=r"model plug-in 'picky' 2\.0 \(from picky-dist\): make_encoder: its encoder has no integer out_dim",
    ):
        algo.make_learner(seed=0)


class WideModel(ModelPlugin):
    """Its encoder returns one column more than its out_dim says."""

    def make_encoder(self, observation_space: gym.Space[Any], config: Any) -> nn.Module:
        module = nn.Linear(4, 9)
        module.out_dim = 8  # type: ignore[assignment]
        return module


def test_an_encoder_wider_than_its_out_dim_fails_where_it_is_built_naming_the_model() -> None:
    # Given a model whose forward returns 9 columns while its out_dim says 8
    algo = build_algorithm(registry_with("wide", WideModel()), flat_spaces(), algorithm="dqn", model="wide")
    # When the algorithm builds its network, then the error names the model, not torch's matrix shapes
    with pytest.raises(
        PluginFailed,
        match=r"model plug-in 'wide' 2\.0 \(from picky-dist\): forward: returned \[2, 9\] for 2 observations; "
        r"its out_dim says \[2, 8\]",
    ):
        algo.make_learner(seed=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"algorithm": "a3c"}, MissingPlugin, r"algorithm plug-in 'a3c' is not installed here"),
        ({"algorithm": "dqn", "algorithm_version": "0.0.1"}, MissingPlugin, r"the task wants 0\.0\.1"),
        ({"algorithm": "dqn", "model": "cnn"}, MissingPlugin, r"model plug-in 'cnn' is not installed here"),
        ({"algorithm": "dqn", "model_version": "9"}, MissingPlugin, r"model plug-in 'mlp' is .* the task wants 9"),
        ({"algorithm": "dqn", "config": {"gamma": 0.9}}, TaskError, r"algorithm: unknown keys \['gamma'\]"),
        ({"algorithm": "dqn", "model_config": {"hidden_sizes": [0]}}, TaskError, r"model\.hidden_sizes\[0\]"),
        ({"algorithm": "dqn", "model_config": {"activation": "gelu"}}, TaskError, r"model\.activation must be one"),
    ],
)
def test_what_a_task_names_is_looked_up_and_checked(kwargs: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        build_algorithm(installed(), flat_spaces(), **kwargs)


def test_the_env_plugin_of_a_job_that_names_none_is_gymnasiums_registry() -> None:
    registry = installed()
    assert env_plugin(registry, None) is env_plugin(registry, "gymnasium")
    with pytest.raises(MissingPlugin, match="env plug-in 'atari' is not installed here"):
        env_plugin(registry, "atari")


def test_a_random_algorithm_runs_any_supported_action_space() -> None:
    for action in (
        gym.spaces.Box(-1, 1, (2,), np.float32),
        gym.spaces.MultiDiscrete([2, 3]),
        gym.spaces.MultiBinary(3),
        gym.spaces.Discrete(4),
    ):
        algo = build_algorithm(installed(), Spaces(gym.spaces.Discrete(3), action), algorithm="random")
        assert algo.kind == "none"
        # and its learner takes every chunk, never trains, and has no weights to publish
        learner = algo.make_learner(seed=0)
        assert learner.wants_data() and not learner.can_update()
        assert learner.actor_weights() == {} and learner.state_dict() == {}
