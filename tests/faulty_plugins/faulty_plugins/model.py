"""The ``gridnet`` model plug-ins: one that works, and three that break the model contract.

Light on purpose (torch is imported where an encoder is made, :mod:`.net`), as warren asks
of plug-in modules. ``gridnet`` reads a NaN position as 0 (a model that cleans its
inputs), so an env's NaN observations reach the chunks rather than the actor's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from warren.plugins import ModelPlugin, UnsupportedSpace

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class GridNetConfig:
    width: int = 16
    """Units of the one hidden layer."""

    def __post_init__(self) -> None:
        if not 1 <= self.width <= 256:
            raise ValueError(f"model.width must be in 1..256, got {self.width}")


class GridNet(ModelPlugin):
    """Works: ``[B, width]`` features of the grid's ``Dict(pos, goal_side)`` observations."""

    Config = GridNetConfig
    #: What the encoder gets wrong (see :class:`faulty_plugins.net.GridEncoder`).
    fault = ""

    def check_space(self, observation_space: gym.Space[Any], config: Any) -> None:
        ok = isinstance(observation_space, gym.spaces.Dict) and set(observation_space.spaces) == {"pos", "goal_side"}
        if not ok:
            raise UnsupportedSpace("gridnet takes the grid env's Dict(pos, goal_side) observations only")

    def make_encoder(self, observation_space: gym.Space[Any], config: Any) -> nn.Module:
        from .net import GridEncoder

        return GridEncoder(config.width, self.fault)


class WideGridNet(GridNet):
    """Its ``forward`` returns ``width + 1`` columns; its ``out_dim`` says ``width``."""

    fault = "wide"


class NanGridNet(GridNet):
    """Its ``forward`` returns NaN."""

    fault = "nan"


class TrainingNanGridNet(GridNet):
    """Its ``forward`` returns NaN in training mode only: it acts fine, it does not learn."""

    fault = "nan-training"
