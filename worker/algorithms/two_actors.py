"""Built-in algorithms with two actors: numpy where it runs the network exactly, torch for any other model.

The numpy actor is built from the network's layout (its tensors' names and shapes, known
without torch), so a collector that runs it never imports torch; the torch actor runs
whatever the model plug-in builds. ``algorithm.backend = "torch"`` asks for the torch one.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Literal

from worker.plugins.contract import Actor, Algorithm

__all__ = ["TwoActors"]


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
