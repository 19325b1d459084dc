"""The gridnet models' torch module."""

from __future__ import annotations

import torch
from torch import nn


class GridEncoder(nn.Module):
    def __init__(self, width: int, fault: str) -> None:
        super().__init__()
        self.fault = fault
        self.layer = nn.Linear(4, width + 1 if fault == "wide" else width)
        self.out_dim = width

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        pos = torch.nan_to_num(obs["pos"].float(), nan=0.0)
        side = nn.functional.one_hot(obs["goal_side"].long(), 2).float()
        out: torch.Tensor = torch.tanh(self.layer(torch.cat([pos, side], dim=1)))
        if self.fault == "nan" or (self.fault == "nan-training" and self.training):
            out = out * torch.nan
        return out
