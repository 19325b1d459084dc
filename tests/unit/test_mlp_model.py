"""The built-in ``mlp`` model: every supported observation space flattened the documented way, then linear layers."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from worker.models.mlp import MLP, MLPConfig
from worker.models.mlp_encoder import Flatten
from worker.plugins import config_from_dict


def flatten(space: gym.Space[Any], obs: Any) -> torch.Tensor:
    x = {k: torch.as_tensor(v) for k, v in obs.items()} if isinstance(obs, dict) else torch.as_tensor(obs)
    out: torch.Tensor = Flatten(space)(x)
    return out


def test_a_float_box_is_its_values_in_one_row() -> None:
    out = flatten(gym.spaces.Box(-1, 1, (2, 3), np.float32), np.arange(12, dtype=np.float32).reshape(2, 2, 3))
    assert out.shape == (2, 6) and out.dtype == torch.float32
    assert out[1].tolist() == [6, 7, 8, 9, 10, 11]


def test_uint8_images_are_scaled_to_zero_one() -> None:
    obs = np.array([[[0, 255], [51, 102]]], dtype=np.uint8)
    out = flatten(gym.spaces.Box(0, 255, (2, 2), np.uint8), obs)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[0.0, 1.0, 0.2, 0.4]]))


def test_discrete_values_become_one_hot_counting_from_the_start() -> None:
    out = flatten(gym.spaces.Discrete(3, start=-1), np.array([-1, 1, 0]))
    assert out.tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 0]]


def test_multi_discrete_values_become_one_one_hot_per_component() -> None:
    out = flatten(gym.spaces.MultiDiscrete([2, 3], start=[0, 1]), np.array([[1, 3], [0, 1]]))
    assert out.tolist() == [[0, 1, 0, 0, 1], [1, 0, 1, 0, 0]]


def test_multi_binary_bits_are_taken_as_floats() -> None:
    out = flatten(gym.spaces.MultiBinary(3), np.array([[1, 0, 1]], dtype=np.int8))
    assert out.dtype == torch.float32 and out.tolist() == [[1.0, 0.0, 1.0]]


def test_a_dict_concatenates_its_keys_in_the_spaces_order() -> None:
    space = gym.spaces.Dict({"b": gym.spaces.Discrete(2), "a": gym.spaces.Box(0, 1, (2,), np.float32)})
    assert list(space.spaces) == ["a", "b"]
    out = flatten(space, {"b": np.array([1]), "a": np.array([[0.25, 0.5]], np.float32)})
    assert out.tolist() == [[0.25, 0.5, 0.0, 1.0]]
    assert Flatten(space).in_dim == 4


@pytest.mark.parametrize(("activation", "kind"), [("relu", torch.nn.ReLU), ("tanh", torch.nn.Tanh)])
def test_the_encoder_has_the_configured_layers_and_out_dim(activation: str, kind: type) -> None:
    config = config_from_dict(MLPConfig, {"hidden_sizes": [16, 8], "activation": activation}, "model")
    encoder = MLP().make_encoder(gym.spaces.Box(-1, 1, (5,), np.float32), config)
    linears = [m for m in encoder.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(5, 16), (16, 8)]
    assert sum(isinstance(m, kind) for m in encoder.modules()) == 2
    assert encoder.out_dim == 8
    assert encoder(torch.zeros(3, 5)).shape == (3, 8)


def test_only_a_float_box_counts_as_flat_float_input() -> None:
    config = MLPConfig()
    flat: Any = MLP().make_encoder(gym.spaces.Box(-1, 1, (5,), np.float32), config)
    image: Any = MLP().make_encoder(gym.spaces.Box(0, 255, (5,), np.uint8), config)
    one_hot: Any = MLP().make_encoder(gym.spaces.Discrete(4), config)
    assert (flat.flat_float_input, image.flat_float_input, one_hot.flat_float_input) == (True, False, False)
