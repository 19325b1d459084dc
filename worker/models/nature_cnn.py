"""The built-in ``nature_cnn`` model: the convolutional body of DQN's Nature paper (Mnih et al., 2015) for images.

It takes one ``Box`` image of shape ``(C, H, W)``, channels first (a stack of ``C`` grey
frames, as ale-py's vector env gives), or ``(H, W)`` as one channel. Three convolutions
(32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1, ReLU each) and one ReLU layer of
``features`` units. uint8 frames go in as uint8 and are scaled to ``[0, 1]`` inside
``forward``, so no float copy of a frame exists outside the model.

This module stays light (no torch): the coordinator loads model plug-ins to check a job,
and :meth:`NatureCNN.check_space` refuses a space the convolutions cannot take (a flat
vector, an image smaller than the kernels) before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import gymnasium as gym

from worker.plugins.contract import ModelPlugin, UnsupportedSpace
from worker.plugins.spaces import describe_space
from worker.protocol.checks import check_int

if TYPE_CHECKING:
    from torch import nn

#: Smallest height and width the three convolutions reduce to at least one pixel.
MIN_SIDE: Final = 36
#: Most input channels (a frame stack of 4 grey frames is 4; RGB stacks are 12).
MAX_CHANNELS: Final = 64


@dataclass(frozen=True)
class NatureCNNConfig:
    features: int = 512
    """Width of the layer after the convolutions: the encoder's ``out_dim``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", check_int(self.features, "model.features", 1, 65536))


def image_shape(space: gym.Space[Any]) -> tuple[int, int, int]:
    """``(C, H, W)`` of an image space the CNN takes.

    Raises:
        UnsupportedSpace: not a ``Box``, not 2-D or 3-D, too small, or too many channels.
    """
    what = describe_space(space)
    if not isinstance(space, gym.spaces.Box) or len(space.shape) not in (2, 3):
        raise UnsupportedSpace(
            f"model 'nature_cnn' needs an image observation, a Box of shape (C, H, W) or (H, W); got {what}"
        )
    shape = tuple(int(d) for d in space.shape)
    channels, height, width = (1, *shape) if len(shape) == 2 else shape
    if min(height, width) < MIN_SIDE:
        raise UnsupportedSpace(
            f"model 'nature_cnn' needs images of at least {MIN_SIDE}x{MIN_SIDE} (channels first), got {what}"
        )
    if channels > MAX_CHANNELS:
        raise UnsupportedSpace(f"model 'nature_cnn' takes at most {MAX_CHANNELS} channels (channels first), got {what}")
    return channels, height, width


class NatureCNN(ModelPlugin):
    """The ``nature_cnn`` model plug-in (see the module docstring)."""

    Config = NatureCNNConfig

    def check_space(self, observation_space: gym.Space[Any], config: Any) -> None:
        image_shape(observation_space)

    def make_encoder(self, observation_space: gym.Space[Any], config: Any) -> nn.Module:
        # Here, not at import: the coordinator loads the model plug-ins without torch.
        from worker.models.nature_cnn_encoder import NatureCNNEncoder

        assert isinstance(observation_space, gym.spaces.Box)  # image_shape has checked it
        uint8 = observation_space.dtype == "uint8"
        return NatureCNNEncoder(image_shape(observation_space), uint8=uint8, features=config.features)
