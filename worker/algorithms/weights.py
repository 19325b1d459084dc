"""Checking a set of weights against a network before any of it is loaded (every built-in actor and learner)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["check_fits"]


def check_fits(expected: Mapping[str, torch.Tensor], given: Mapping[str, Any], what: str, network: str) -> None:
    """Raise ``ValueError`` naming the first tensor of ``given`` that does not fit ``expected``.

    Checked before anything is loaded: ``Module.load_state_dict`` copies every tensor whose
    shape fits before it raises for the ones that do not, which would leave a network that
    refused a file holding part of it (a collector acting with half old, half new weights).

    Args:
        expected: the network's ``state_dict()``.
        given: the tensors offered.
        what: what they are, for the message ("the weights").
        network: what they were offered to, for the message ("the Q-network").
    """
    missing, extra = sorted(set(expected) - set(given))[:3], sorted(set(given) - set(expected))[:3]
    if missing or extra:
        raise ValueError(f"{what} do not fit {network}: missing {missing}, unexpected {extra}")
    for name, tensor in expected.items():
        other = given[name]
        if not isinstance(other, torch.Tensor) or tuple(other.shape) != tuple(tensor.shape):
            shape = tuple(other.shape) if isinstance(other, torch.Tensor) else type(other).__name__
            raise ValueError(f"{what} do not fit {network}: {name!r} is {shape}, needs {tuple(tensor.shape)}")
