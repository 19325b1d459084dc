"""Acting in numpy: the built-in algorithms' choice between their two actors, and the numpy actors' base.

Each built-in algorithm has two actors: numpy where it runs the network exactly, torch
for any other model. The numpy actor is built from the network's layout (its tensors'
names and shapes, known without torch), so a collector that runs it never imports torch;
the torch actor runs whatever the model plug-in builds. ``algorithm.backend = "torch"``
asks for the torch one.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import numpy as np

from worker.algorithms.numpy_twin.layout import Shapes
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Actor, Algorithm

__all__ = ["NumpyActor", "TwoActors"]


class TwoActors(Algorithm):
    """:meth:`make_actor` and :attr:`weights_format` from :meth:`numpy_layout`."""

    @abstractmethod
    def numpy_layout(self) -> Any | None:
        """What the numpy actor is built from, or ``None`` where numpy cannot run the network (the backend aside)."""

    @abstractmethod
    def numpy_actor(self, layout: Any, seed: int | None) -> Actor:
        """The numpy actor for ``layout`` (imports no torch)."""

    @abstractmethod
    def torch_actor(self, seed: int | None) -> Actor:
        """The torch actor (any model)."""

    def actor_layout(self) -> Any | None:
        """:meth:`numpy_layout`, unless the job asks for torch (``algorithm.backend = "torch"``)."""
        return None if self.config.backend == "torch" else self.numpy_layout()

    def make_actor(self, seed: int | None) -> Actor:
        layout = self.actor_layout()
        return self.torch_actor(seed) if layout is None else self.numpy_actor(layout, seed)

    @property
    def weights_format(self) -> Literal["torch", "numpy"]:
        return "torch" if self.actor_layout() is None else "numpy"


class NumpyActor(Actor):
    """An actor whose network is numpy arrays of a known layout, zero until weights are loaded.

    A collector always loads the learner's first policy before acting. Policy files come
    as numpy arrays (or torch tensors, from a learner in the same process) and are taken
    all or nothing: a file that does not fit, or one array of it that cannot be read,
    leaves the actor with the weights it had.

    Args:
        shapes: every tensor a policy file holds, by name (its ``state_dict`` layout).
        seed: the seed of the actor's draws (:attr:`rng`).
    """

    network: ClassVar[str]
    """What the weights are, for messages: ``"the Q-network"``."""

    def __init__(self, shapes: Shapes, seed: int | None) -> None:
        self.shapes = shapes
        self.rng = np.random.default_rng(seed)

    def load_weights(self, weights: Mapping[str, Any]) -> None:
        """Take a policy's arrays (numpy, or torch tensors), strictly: all of them fit, or none is taken."""
        check_fits(self.shapes, weights, "the weights", self.network)
        try:
            self.take(weights)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"the weights do not fit {self.network}: {exc}") from None

    @abstractmethod
    def take(self, weights: Mapping[str, Any]) -> None:
        """Copy ``weights`` in (their names and shapes are checked), converting all of them before changing any."""
