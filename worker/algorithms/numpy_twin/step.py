"""How a learner delegates its train step, to torch or to the numpy twin: one pattern for DQN, PPO and SAC.

The learner owns the torch networks and optimizers. They are the algorithm's state: what
the rest of the learner reads (the actors' weights, checkpoints, PPO's values of a
batch) and what any model plug-in can build. A :class:`TrainStep` takes one gradient
step on them, in one of two ways:

* the torch step (any model) works on them directly, and is the readable specification;
* the numpy step (:class:`NumpyStep`; the built-in mlp) works on a numpy twin of them,
  flat float32 vectors of the same parameters and Adam's moments, built from them at the
  start and written back only when the learner is about to read them.

The learner's code is the same whichever runs::

    self.step = pick_step(config, nets, numpy_step.supports(nets), NumpyXStep, TorchXStep, device=device)
    metrics = self.step.train_step(batch)      # update()
    self.step.sync(policy_only=True)           # before actor_weights() reads the policy
    self.step.sync()                           # before state_dict() reads everything
    self.step.sync(); ...load...; self.step.reload()   # load_state_dict()

For the torch step ``sync`` and ``reload`` do nothing. (DQN's steps have one more method,
``update_target()``, which the learner calls when its target network is due.) The first
``sync()`` in ``load_state_dict`` keeps what a checkpoint lacks (SAC's saves no Adam
moments) at the step's newest. Each algorithm's losses are written
once per form, side by side in its ``losses.py``: the torch function, which is the
specification, and its numpy twin with the gradient, which the tests hold to it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["NumpyStep", "TrainStep", "pick_step"]


class _Configured(Protocol):
    @property
    def backend(self) -> str: ...


BatchT = TypeVar("BatchT")
ConfigT = TypeVar("ConfigT", bound=_Configured)
NetsT = TypeVar("NetsT")
NumpyT = TypeVar("NumpyT")
TorchT = TypeVar("TorchT")


class TrainStep(ABC, Generic[BatchT]):
    """One implementation of an algorithm's gradient step on the learner's torch networks (the module docstring)."""

    @abstractmethod
    def train_step(self, batch: BatchT) -> dict[str, float]:
        """One gradient step on ``batch``; returns the algorithm's metrics of it."""

    def sync(self, *, policy_only: bool = False) -> None:
        """Bring the torch networks and optimizers up to this step's state (``policy_only``: the actors' network)."""

    def reload(self) -> None:
        """Take the torch networks' parameters and optimizer state in, after the learner changed them."""


class NumpyStep(TrainStep[BatchT]):
    """A step on a numpy twin, written back to torch lazily: only what a step changed, only when asked.

    Subclasses write :meth:`numpy_step` and the three copies: :meth:`store_policy` (the
    actors' network to torch), :meth:`store_rest` (everything else the step owns: other
    networks, Adam's moments) and :meth:`load` (all of it from torch).
    """

    def __init__(self) -> None:
        self._policy_stale = False
        self._rest_stale = False

    def train_step(self, batch: BatchT) -> dict[str, float]:
        metrics = self.numpy_step(batch)
        self.mark_stale()
        return metrics

    def mark_stale(self) -> None:
        """The twin moved past the torch side (a step; DQN's target sync)."""
        self._policy_stale = self._rest_stale = True

    def sync(self, *, policy_only: bool = False) -> None:
        if self._policy_stale:
            self.store_policy()
            self._policy_stale = False
        if self._rest_stale and not policy_only:
            self.store_rest()
            self._rest_stale = False

    def reload(self) -> None:
        self.load()
        self._policy_stale = self._rest_stale = False

    @abstractmethod
    def numpy_step(self, batch: BatchT) -> dict[str, float]:
        """The step itself, on the twin."""

    @abstractmethod
    def store_policy(self) -> None:
        """Copy the actors' network into torch."""

    @abstractmethod
    def store_rest(self) -> None:
        """Copy the rest of the twin (other networks, Adam's moments, ...) into torch."""

    @abstractmethod
    def load(self) -> None:
        """Copy all of the twin's state from torch."""


def pick_step(
    config: ConfigT,
    nets: NetsT,
    why_not: str | None,
    numpy: Callable[[ConfigT, NetsT], NumpyT],
    torch: Callable[[ConfigT, NetsT], TorchT],
    *,
    device: str = "cpu",
) -> NumpyT | TorchT:
    """The numpy step where it can run (``why_not`` is ``None``) and the job's ``backend`` allows; else the torch step.

    The numpy step is a CPU path: a learner on a GPU (``device``, its
    :class:`~worker.plugins.contract.Placement`'s) runs the torch step, whatever the network.

    Raises:
        ValueError: ``backend = "numpy"`` on networks numpy cannot run, or on a GPU, naming why.
    """
    backend = config.backend
    if device != "cpu":
        if backend == "numpy":
            raise ValueError(
                f"algorithm.backend = 'numpy' trains on the CPU, and this learner runs on {device} "
                "(learner.device): set the backend to 'auto' or 'torch', or the device to 'cpu'"
            )
        return torch(config, nets)
    if backend == "numpy" and why_not is not None:
        raise ValueError(f"algorithm.backend = 'numpy' cannot run this job: {why_not}")
    return numpy(config, nets) if why_not is None and backend != "torch" else torch(config, nets)
