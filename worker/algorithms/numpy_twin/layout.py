"""The built-in ``mlp`` encoder's parameters, named and shaped as torch names them, without importing torch.

Why: a collector whose actor runs an MLP in numpy needs no torch at all, if it can tell
which arrays a policy file must hold without building the torch network. Importing torch
costs a collector ~2.5 s of CPU at start, which on a small machine is taken from the
learner starting beside it, and a run waits for the learner's first policy. The layout
here is :class:`~worker.models.mlp_encoder.MLPEncoder`'s ``state_dict`` (an
``nn.Sequential`` ``net`` of ``Linear`` and activation modules, so linear layer ``i`` is
``net.{2 i}``); ``tests/unit/test_numpy_actors.py`` holds every built-in numpy actor's
layout to its torch network's ``state_dict``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from worker.models.mlp import MLP
from worker.plugins.contract import Model

__all__ = ["MLPLayout", "Shapes", "mlp_layout"]

#: Tensor names to shapes, in ``state_dict`` order.
Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class MLPLayout:
    """An ``mlp`` encoder on one flat float ``Box``: its input width, hidden widths and activation."""

    in_dim: int
    hidden_sizes: tuple[int, ...]
    activation: str

    @property
    def out_dim(self) -> int:
        return self.hidden_sizes[-1] if self.hidden_sizes else self.in_dim

    def linear_names(self, prefix: str) -> list[str]:
        """The linear layers' module names under ``prefix`` (``"pi_body."`` gives ``pi_body.net.0``, ...)."""
        return [f"{prefix}net.{2 * i}" for i in range(len(self.hidden_sizes))]

    def shapes(self, prefix: str) -> Shapes:
        out: Shapes = {}
        width = self.in_dim
        for name, hidden in zip(self.linear_names(prefix), self.hidden_sizes, strict=True):
            out[f"{name}.weight"] = (hidden, width)
            out[f"{name}.bias"] = (hidden,)
            width = hidden
        return out


def mlp_layout(
    model: Model, space: gym.Space[Any], activations: tuple[str, ...] = ("relu", "tanh")
) -> MLPLayout | None:
    """The layout of ``model``'s encoder for ``space``: the built-in mlp on one float Box with one of ``activations``.

    ``None`` otherwise (another model plug-in, images, a ``Dict`` space...): numpy does
    not run those, torch does.
    """
    if type(model.plugin) is not MLP:
        return None
    if not (isinstance(space, gym.spaces.Box) and space.dtype.kind == "f"):
        return None
    config = model.config
    if config.activation not in activations:
        return None
    return MLPLayout(math.prod(space.shape), tuple(int(h) for h in config.hidden_sizes), str(config.activation))
