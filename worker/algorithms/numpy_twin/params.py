"""A network's parameters as one flat float32 vector of named views, with a gradient vector of the same layout.

Why one vector: the numpy train steps' optimizer and gradient clip then work on whole
vectors (the global norm is one dot product, Adam a handful of ufuncs, a target network's
Polyak update three) instead of a call per tensor. Names and shapes are torch's
(``named_parameters`` order, ``[out, in]`` weights), so copying to and from the torch
network is by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from worker.algorithms.numpy_twin.layers import F32, Dense
from worker.algorithms.numpy_twin.layout import Shapes

__all__ = ["FlatParams"]


class FlatParams:
    """``shapes``' tensors, zero, laid end to end in :attr:`params`; :attr:`grad` alike.

    Args:
        shapes: tensor names to shapes, in the order they are laid out.
    """

    def __init__(self, shapes: Shapes) -> None:
        self.names = list(shapes)
        self.shapes = [tuple(shape) for shape in shapes.values()]
        self.size = sum(math.prod(shape) for shape in self.shapes)
        self.params = np.zeros(self.size, dtype=np.float32)
        self.grad = np.zeros(self.size, dtype=np.float32)
        self.views = self.split(self.params)
        """Each parameter by name, a view of :attr:`params`."""
        self.grads = self.split(self.grad)
        """Each parameter's gradient by name, a view of :attr:`grad`."""

    def split(self, flat: F32) -> dict[str, F32]:
        """Views of ``flat`` (a vector of this layout: a target network, Adam's moments) by name."""
        views: dict[str, F32] = {}
        offset = 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            size = math.prod(shape)
            views[name] = flat[offset : offset + size].reshape(shape)
            offset += size
        return views

    def load(self, arrays: Mapping[str, Any], into: F32 | None = None) -> None:
        """Copy the parameters of ``arrays`` (numpy arrays or torch tensors, by name) into :attr:`params` (or ``into``).

        All are converted before any is copied: one that cannot be (a tensor that requires
        grad, say) leaves the vector as it was. Shapes are the caller's to have checked.
        """
        converted = [np.asarray(arrays[name], dtype=np.float32) for name in self.names]
        views = self.views if into is None else self.split(into)
        for name, array in zip(self.names, converted, strict=True):
            views[name][...] = array

    def dense(self, layers: Sequence[str], activation: Literal["tanh", "relu"], *, activate_last: bool) -> Dense:
        """The linear layers ``layers`` (module names: ``<name>.weight``, ``<name>.bias``) over these views."""
        weights = [(self.views[f"{n}.weight"], self.views[f"{n}.bias"]) for n in layers]
        grads = [(self.grads[f"{n}.weight"], self.grads[f"{n}.bias"]) for n in layers]
        return Dense(weights, grads, activation, activate_last=activate_last)
