"""The ``mlp`` model's torch modules: :class:`Flatten` (every supported space to one row) and :class:`MLPEncoder`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch
from torch import nn


class Flatten(nn.Module):
    """One observation space's batch to ``[B, in_dim]`` float32 (see the module docstring)."""

    def __init__(self, space: gym.Space[Any]) -> None:
        super().__init__()
        self.space = space
        self.keys: list[str] | None = None
        leaves: list[gym.Space[Any]] = [space]
        if isinstance(space, gym.spaces.Dict):
            self.keys = list(space.spaces)
            leaves = [space.spaces[k] for k in self.keys]
        self.in_dim = sum(_flat_dim(leaf) for leaf in leaves)
        self._leaves = leaves
        scales = [_box_scale(leaf) for leaf in leaves]
        self._scales = scales

    def forward(self, obs: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        if self.keys is None:
            assert isinstance(obs, torch.Tensor)
            return _flatten_leaf(self._leaves[0], obs, self._scales[0])
        assert isinstance(obs, dict)
        parts = [
            _flatten_leaf(leaf, obs[key], scale)
            for key, leaf, scale in zip(self.keys, self._leaves, self._scales, strict=True)
        ]
        return torch.cat(parts, dim=1)


class MLPEncoder(nn.Module):
    """:class:`Flatten`, then ``Linear`` + activation per hidden layer; ``out_dim`` wide."""

    def __init__(self, space: gym.Space[Any], hidden_sizes: Sequence[int], activation_name: str) -> None:
        super().__init__()
        self.flatten = Flatten(space)
        activation: type[nn.Module] = nn.ReLU if activation_name == "relu" else nn.Tanh
        layers: list[nn.Module] = []
        width = self.flatten.in_dim
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), activation()]
            width = hidden
        self.net = nn.Sequential(*layers)
        self.out_dim = width
        self.activation = activation_name

    def forward(self, obs: Any) -> torch.Tensor:
        out: torch.Tensor = self.net(self.flatten(obs))
        return out

    @property
    def flat_float_input(self) -> bool:
        """The input is one float ``Box`` taken as it is (what a numpy fast path can do without torch)."""
        space = self.flatten.space
        return isinstance(space, gym.spaces.Box) and space.dtype.kind == "f"


def _flat_dim(space: gym.Space[Any]) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    return math.prod(space.shape) if space.shape else 1


def _box_scale(space: gym.Space[Any]) -> float | None:
    # uint8 images (0..255) go in as [0, 1]: an unscaled 255 saturates the first layer.
    if isinstance(space, gym.spaces.Box) and space.dtype == "uint8":
        return 1.0 / 255.0
    return None


def _flatten_leaf(space: gym.Space[Any], x: torch.Tensor, scale: float | None) -> torch.Tensor:
    batch = x.shape[0]
    if isinstance(space, gym.spaces.Discrete):
        return nn.functional.one_hot((x.long() - int(space.start)).reshape(batch), int(space.n)).float()
    if isinstance(space, gym.spaces.MultiDiscrete):
        x = x.long().reshape(batch, -1) - torch.as_tensor(space.start.reshape(-1), dtype=torch.long)
        parts = [nn.functional.one_hot(x[:, i], int(n)) for i, n in enumerate(space.nvec.reshape(-1))]
        return torch.cat(parts, dim=1).float()
    # A batch of flat float32 rows is taken as it is: two fewer ops a forward pass, on networks
    # where the per-op cost is most of a train step's.
    flat = x if x.dim() == 2 and x.dtype == torch.float32 else x.reshape(batch, -1).float()
    return flat * scale if scale is not None else flat
