"""The ``tiny`` model: the cue one-hot and the noise, concatenated, through one tanh layer.

This module stays light (torch is imported where the encoder is made, :mod:`.tiny`):
warren's coordinator loads every installed plug-in to check a job, and needs no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from warren.plugins import ModelPlugin, UnsupportedSpace

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class TinyConfig:
    width: int = 16
    """Units of the one hidden layer."""

    def __post_init__(self) -> None:
        if not 1 <= self.width <= 1024:
            raise ValueError(f"model.width must be in 1..1024, got {self.width}")


class TinyModel(ModelPlugin):
    Config = TinyConfig

    def check_space(self, observation_space: gym.Space[Any], config: Any) -> None:
        ok = isinstance(observation_space, gym.spaces.Dict) and set(observation_space.spaces) == {"cue", "noise"}
        if not ok:
            raise UnsupportedSpace("the tiny model takes the cue env's Dict(cue, noise) observations only")

    def make_encoder(self, observation_space: gym.Space[Any], config: Any) -> nn.Module:
        from warren_example.tiny import TinyEncoder

        assert isinstance(observation_space, gym.spaces.Dict)
        return TinyEncoder(observation_space, config.width)
