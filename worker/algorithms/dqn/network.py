"""The Q-network (the model's encoder, then one linear head with a Q-value per action), and the learner's networks."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from worker.plugins.contract import Model, Placement
from worker.plugins.spaces import Spaces


class QNetwork(nn.Module):
    """``encoder`` (from the model plug-in) then ``head``: observations to ``[B, n_actions]`` Q-values.

    Its ``state_dict`` (``encoder.*``, ``head.*``) is the policy file's layout.
    """

    def __init__(self, encoder: nn.Module, n_actions: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(int(encoder.out_dim), n_actions)  # type: ignore[arg-type]

    @classmethod
    def build(cls, model: Model, spaces: Spaces, seed: int | None = None) -> QNetwork:
        """A fresh network; with ``seed`` its weights depend on the seed only.

        Torch's global RNG is forked, so seeding neither depends on nor disturbs it: every
        implementation of the train step starts from these weights, so seeded runs start alike.
        """
        n_actions = int(spaces.action.n)  # type: ignore[attr-defined]
        if seed is None:
            return cls(model.encoder(spaces.observation), n_actions)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(model.encoder(spaces.observation), n_actions)

    def forward(self, obs: Any) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(obs))
        return out

    def linear_layers(self) -> list[nn.Linear]:
        """Every linear layer in order."""
        return [m for m in self.modules() if isinstance(m, nn.Linear)]


@dataclass
class DQNNets:
    """The learner's torch side: the online Q-network, its target, and the online net's Adam.

    Both train steps work on these (:mod:`worker.algorithms.numpy_twin.step`): the torch
    step directly, the numpy step on a twin it writes back before they are read.
    """

    online: QNetwork
    target: QNetwork
    optimizer: torch.optim.Adam
    placement: Placement = field(default_factory=Placement)
    """Where the networks and Adam's state live (the CPU unless the learner runs on a GPU)."""

    @classmethod
    def build(cls, model: Model, spaces: Spaces, seed: int, lr: float, placement: Placement | None = None) -> DQNNets:
        """Seeded networks, the target a copy of the online net; Adam with torch's defaults.

        The weights are drawn on the CPU and then moved, so a seed gives the same ones on any device.
        """
        placement = placement or Placement()
        online = QNetwork.build(model, spaces, seed).to(placement.device)
        target = copy.deepcopy(online).requires_grad_(False)
        # fused: one kernel for all parameters; the train step is dispatch-bound, not FLOP-bound.
        return cls(online, target, torch.optim.Adam(online.parameters(), lr=lr, fused=True), placement)
