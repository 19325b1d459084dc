"""The ``lstm`` model's torch module: a per-step encoder, then one LSTM layer reset where episodes begin."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class LSTMEncoder(nn.Module):
    """``forward(obs [T, B, ...], {"h", "c"} [B, H], first [T, B]) -> ([T, B, H], {"h", "c"})``.

    The LSTM runs over stretches without a reset in one call each; before a step where an
    episode begins for some env, that env's ``h`` and ``c`` are zeroed. Acting (``T = 1``)
    is one call; a learner's sequences are as many calls as steps with a reset in them.
    """

    def __init__(self, body: nn.Module, size: int) -> None:
        super().__init__()
        self.body = body
        self.lstm = nn.LSTM(int(body.out_dim), size)  # type: ignore[arg-type]  # an int: checked by Model.encoder
        self.out_dim = size
        for name, param in self.lstm.named_parameters():
            if name.startswith("bias"):
                nn.init.zeros_(param)
            else:
                nn.init.orthogonal_(param, gain=1.0)
        bias = self.lstm.get_parameter("bias_ih_l0")
        with torch.no_grad():
            # Forget-gate bias 1 (torch orders the gates i, f, g, o): an untrained cell keeps ~73 % of its
            # state a step instead of half, so what an episode showed early still reaches the loss later on.
            bias[size : 2 * size].fill_(1.0)

    def forward(
        self, obs: torch.Tensor | dict[str, torch.Tensor], state: dict[str, torch.Tensor], first: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        steps, batch = first.shape
        x = self.body(_merge(obs)).reshape(steps, batch, -1)
        keep = (~first).to(x.dtype).unsqueeze(-1)
        h, c = state["h"], state["c"]
        resets = first.any(dim=1).tolist()
        starts = [0, *(t for t in range(1, steps) if resets[t])]
        outs = []
        for i, start in enumerate(starts):
            stop = starts[i + 1] if i + 1 < len(starts) else steps
            h, c = h * keep[start], c * keep[start]
            out, (h_n, c_n) = self.lstm(x[start:stop], (h.unsqueeze(0), c.unsqueeze(0)))
            h, c = h_n.squeeze(0), c_n.squeeze(0)
            outs.append(out)
        return torch.cat(outs) if len(outs) > 1 else outs[0], {"h": h, "c": c}


def _merge(obs: Any) -> Any:
    """``[T, B, ...]`` observations as ``[T * B, ...]`` (per key for a dict): the per-step encoder's batch."""
    if isinstance(obs, dict):
        return {k: v.reshape(-1, *v.shape[2:]) for k, v in obs.items()}
    return obs.reshape(-1, *obs.shape[2:])
