"""The ``nature_cnn`` model's torch module: uint8 (or float) images in, ``[B, features]`` float32 out."""

from __future__ import annotations

import torch
from torch import nn


class NatureCNNEncoder(nn.Module):
    """Three convolutions and a ReLU layer; see :mod:`worker.models.nature_cnn`."""

    def __init__(self, input_shape: tuple[int, int, int], *, uint8: bool, features: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.input_shape = input_shape
        # uint8 frames are scaled here, on their way into the first convolution; a float
        # image is taken as it is (its env decided its range).
        self.scale = 1.0 / 255.0 if uint8 else 1.0
        self.conv = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = int(self.conv(torch.zeros(1, channels, height, width)).shape[1])
        self.fc = nn.Sequential(nn.Linear(flat, features), nn.ReLU())
        self.out_dim = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.reshape(-1, *self.input_shape).to(torch.float32)
        if self.scale != 1.0:
            x = x * self.scale
        if torch.is_grad_enabled():
            # Training: on CPU the convolutions' backward pass runs ~1.35x faster on NHWC
            # (channels-last) input; the weights keep their layout, so checkpoints and the
            # actors' weights do not change. A no-grad forward (collectors) gains nothing.
            x = x.contiguous(memory_format=torch.channels_last)
        out: torch.Tensor = self.fc(self.conv(x))
        return out
