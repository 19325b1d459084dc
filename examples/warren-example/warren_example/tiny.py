"""The ``tiny`` model's torch module."""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn


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
