"""The Q-network: the model's encoder, then one linear head with a Q-value per action."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from worker.models.mlp_encoder import MLPEncoder
from worker.plugins.contract import Model
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

    @property
    def relu_mlp(self) -> bool:
        """Linear layers with ReLU between them, on flat float observations: what numpy can run."""
        enc = self.encoder
        return isinstance(enc, MLPEncoder) and enc.activation == "relu" and enc.flat_float_input

    def linear_layers(self) -> list[nn.Linear]:
        """Every linear layer in order (for the numpy fast paths; :attr:`relu_mlp` networks only)."""
        return [m for m in self.modules() if isinstance(m, nn.Linear)]


def split_state(tensors: Mapping[str, torch.Tensor], names: list[str]) -> tuple[dict[str, torch.Tensor], ...]:
    """A checkpoint's online weights, target weights, Adam moments and step, checked against ``names``.

    Checkpoint layout (both train steps): ``online.<name>``, ``target.<name>``,
    ``adam.exp_avg.<name>``, ``adam.exp_avg_sq.<name>`` and ``adam.step`` (a scalar).

    Raises:
        ValueError: a tensor is missing or extra.
    """
    parts = ("online", "target", "adam.exp_avg", "adam.exp_avg_sq")
    want = {f"{p}.{n}" for p in parts for n in names} | {"adam.step"}
    if set(tensors) != want:
        missing, extra = sorted(want - set(tensors))[:3], sorted(set(tensors) - want)[:3]
        raise ValueError(f"the checkpoint does not fit this network: missing {missing}, unexpected {extra}")
    return (*({n: tensors[f"{p}.{n}"] for n in names} for p in parts), {"step": tensors["adam.step"]})
