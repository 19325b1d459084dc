"""The ``tiny`` model: the cue one-hot and the noise, concatenated, through one tanh layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from worker.plugins import ModelPlugin, UnsupportedSpace


@dataclass(frozen=True)
class TinyConfig:
    width: int = 16
    """Units of the one hidden layer."""

    def __post_init__(self) -> None:
        if not 1 <= self.width <= 1024:
            raise ValueError(f"model.width must be in 1..1024, got {self.width}")


class TinyEncoder(nn.Module):
    def __init__(self, space: gym.spaces.Dict, width: int) -> None:
        super().__init__()
        cue, noise_space = space["cue"], space["noise"]
        assert isinstance(cue, gym.spaces.Discrete) and isinstance(noise_space, gym.spaces.Box)
        self.n_cues = int(cue.n)
        noise = int(noise_space.shape[0])
        self.layer = nn.Linear(self.n_cues + noise, width)
        self.out_dim = width

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        cue = nn.functional.one_hot(obs["cue"].long(), self.n_cues).float()
        out: torch.Tensor = torch.tanh(self.layer(torch.cat([cue, obs["noise"].float()], dim=1)))
        return out


class TinyModel(ModelPlugin):
    Config = TinyConfig

    def check_space(self, observation_space: gym.Space[Any], config: Any) -> None:
        ok = isinstance(observation_space, gym.spaces.Dict) and set(observation_space.spaces) == {"cue", "noise"}
        if not ok:
            raise UnsupportedSpace("the tiny model takes the cue env's Dict(cue, noise) observations only")

    def make_encoder(self, observation_space: gym.Space[Any], config: Any) -> nn.Module:
        assert isinstance(observation_space, gym.spaces.Dict)
        return TinyEncoder(observation_space, config.width)
