"""The built-in ``lstm`` model: an ``mlp`` or ``nature_cnn`` encoder, then one LSTM layer: a policy with memory.

For envs that do not show everything in one observation (no velocities, one frame where
a stack was): the LSTM's state ``h``, ``c`` (``lstm_size`` each) carries what earlier
steps showed. It follows the recurrent model contract of
:class:`~worker.plugins.contract.ModelPlugin`: actors keep one state per env, chunks
carry it at their first step, and PPO trains on sequences (``algorithm.seq_len``).

This module stays light (no torch): the coordinator loads model plug-ins to check a job
and to lay out its chunks, which hold the state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from worker.models.mlp import MLPConfig
from worker.models.nature_cnn import NatureCNNConfig, image_shape
from worker.plugins.contract import ModelPlugin
from worker.protocol.checks import check_int, check_sizes

if TYPE_CHECKING:
    import gymnasium as gym
    from torch import nn


@dataclass(frozen=True)
class LSTMConfig:
    encoder: Literal["mlp", "nature_cnn"] = "mlp"
    """What turns one observation into the LSTM's input: the ``mlp`` (flat observations) or ``nature_cnn`` (images)."""
    lstm_size: int = 64
    """Width of the LSTM's state ``h`` and ``c``: the encoder's ``out_dim``."""
    hidden_sizes: tuple[int, ...] = (64,)
    """The ``mlp`` encoder's layer widths (ignored by ``nature_cnn``)."""
    activation: Literal["relu", "tanh"] = "tanh"
    """The ``mlp`` encoder's nonlinearity (ignored by ``nature_cnn``)."""
    features: int = 512
    """Width of ``nature_cnn``'s last layer (ignored by ``mlp``)."""

    def __post_init__(self) -> None:
        if self.encoder not in ("mlp", "nature_cnn"):
            raise ValueError(f"model.encoder must be mlp or nature_cnn, got {self.encoder!r}")
        object.__setattr__(self, "lstm_size", check_int(self.lstm_size, "model.lstm_size", 1, 4096))
        object.__setattr__(self, "hidden_sizes", check_sizes(self.hidden_sizes, "model.hidden_sizes"))
        object.__setattr__(self, "features", check_int(self.features, "model.features", 1, 65536))
        if self.activation not in ("relu", "tanh"):
            raise ValueError(f"model.activation must be relu or tanh, got {self.activation!r}")


class LSTM(ModelPlugin):
    """The ``lstm`` model plug-in (see the module docstring)."""

    Config = LSTMConfig

    def check_space(self, observation_space: gym.Space[Any], config: Any) -> None:
        if config.encoder == "nature_cnn":
            image_shape(observation_space)

    def state_shapes(self, observation_space: gym.Space[Any], config: Any) -> Mapping[str, tuple[int, ...]]:
        return {"h": (config.lstm_size,), "c": (config.lstm_size,)}

    def make_encoder(self, observation_space: gym.Space[Any], config: Any) -> nn.Module:
        # Here, not at import: the coordinator loads the model plug-ins without torch.
        from worker.models.lstm_encoder import LSTMEncoder

        body: nn.Module
        if config.encoder == "nature_cnn":
            from worker.models.nature_cnn import NatureCNN

            body = NatureCNN().make_encoder(observation_space, NatureCNNConfig(features=config.features))
        else:
            from worker.models.mlp import MLP

            body = MLP().make_encoder(observation_space, MLPConfig(config.hidden_sizes, config.activation))
        return LSTMEncoder(body, config.lstm_size)
