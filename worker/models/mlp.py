"""The built-in ``mlp`` model: every supported observation space flattened, then fully connected layers.

Flattening per leaf space: a ``Box`` is reshaped to one row and cast to float32 (uint8
images scaled to ``[0, 1]``), a ``Discrete`` becomes a one-hot vector, a
``MultiDiscrete`` one one-hot per component, a ``MultiBinary`` its bits as floats; a
``Dict`` concatenates its keys' flattenings in key order. For images a CNN does better,
but nothing refuses them here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from worker.plugins.contract import ModelPlugin
from worker.protocol.checks import check_sizes

if TYPE_CHECKING:
    import gymnasium as gym
    from torch import nn


@dataclass(frozen=True)
class MLPConfig:
    hidden_sizes: tuple[int, ...] = (128, 128)
    """Widths of the hidden layers; the encoder's ``out_dim`` is the last one (the input size if none)."""
    activation: Literal["relu", "tanh"] = "relu"
    """Nonlinearity after every hidden layer."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden_sizes", check_sizes(self.hidden_sizes, "model.hidden_sizes"))
        if self.activation not in ("relu", "tanh"):
            raise ValueError(f"model.activation must be relu or tanh, got {self.activation!r}")


class MLP(ModelPlugin):
    """The ``mlp`` model plug-in (see the module docstring)."""

    Config = MLPConfig

    def make_encoder(self, observation_space: gym.Space[Any], config: Any) -> nn.Module:
        # Here, not at import: the coordinator loads the model plug-ins to check a job, without torch.
        from worker.models.mlp_encoder import MLPEncoder

        return MLPEncoder(observation_space, config.hidden_sizes, config.activation)
