"""The torch modules :mod:`worker.agent.onnx_export` exports: a built-in network, then its deterministic action.

Each computes what the algorithm's actor computes with ``explore=False``, in tensors, so
torch's exporter traces it into one graph.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn


class GreedyQ(nn.Module):
    """DQN: ``argmax`` of the Q-values, plus the ``Discrete`` space's ``start``."""

    def __init__(self, q_network: nn.Module, action_space: gym.Space[Any]) -> None:
        super().__init__()
        self.q_network = q_network
        self.start = int(getattr(action_space, "start", 0))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        q_values: torch.Tensor = self.q_network(obs)
        return q_values.argmax(dim=1) + self.start


class PPOMode(nn.Module):
    """PPO: the most likely action of the policy head (a ``Box``'s mean), after the observation normalisation."""

    offset: torch.Tensor

    def __init__(self, network: Any, action_space: gym.Space[Any]) -> None:
        super().__init__()
        self.network = network
        self.space = action_space
        if isinstance(action_space, gym.spaces.MultiDiscrete):
            self.nvec = [int(n) for n in action_space.nvec.reshape(-1)]
            self.register_buffer("offset", torch.as_tensor(action_space.start.reshape(1, -1), dtype=torch.long))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        network = self.network
        x = network.obs_norm(obs) if network.obs_norm is not None else obs
        head: torch.Tensor = network.pi_head(network.pi_body(x))
        space = self.space
        if isinstance(space, gym.spaces.Discrete):
            return head.argmax(dim=1) + int(space.start)
        if isinstance(space, gym.spaces.MultiDiscrete):
            parts = [part.argmax(dim=1) for part in torch.split(head, self.nvec, dim=1)]
            return torch.stack(parts, dim=1) + self.offset
        if isinstance(space, gym.spaces.MultiBinary):
            return (torch.sigmoid(head) > 0.5).to(torch.int8)
        return head


class SACMean(nn.Module):
    """SAC: ``tanh`` of the Gaussian's mean, scaled into the action box."""

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.policy.to_env(self.policy.mode(obs))
        return out
