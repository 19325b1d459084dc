"""Checking a set of weights against a network before any of it is loaded (every built-in actor and learner).

No torch here: the numpy actors check numpy arrays with it, on collectors that never import torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["check_fits"]


def check_fits(expected: Mapping[str, Any], given: Mapping[str, Any], what: str, network: str) -> None:
    """Raise ``ValueError`` naming the first tensor of ``given`` that does not fit ``expected``.

    Checked before anything is loaded: ``Module.load_state_dict`` copies every tensor whose
    shape fits before it raises for the ones that do not, which would leave a network that
    refused a file holding part of it (a collector acting with half old, half new weights).

    Args:
        expected: the network's ``state_dict()``, or its tensors' shapes (tuples) by name.
        given: the tensors (torch or numpy arrays) offered.
        what: what they are, for the message ("the weights").
        network: what they were offered to, for the message ("the Q-network").
    """
    missing, extra = sorted(set(expected) - set(given))[:3], sorted(set(given) - set(expected))[:3]
    if missing or extra:
        raise ValueError(f"{what} do not fit {network}: missing {missing}, unexpected {extra}")
    for name, want in expected.items():
        need = tuple(want) if isinstance(want, tuple) else tuple(want.shape)
        other = given[name]
        shape = getattr(other, "shape", None)
        # A torch network takes torch tensors only (load_state_dict would copy the tensors and
        # then refuse an array); numpy actors take either.
        wrong_kind = not isinstance(want, tuple) and _library(other) != _library(want)
        if shape is None or not hasattr(other, "dtype") or wrong_kind or tuple(shape) != need:
            found = tuple(shape) if shape is not None and not wrong_kind else type(other).__name__
            raise ValueError(f"{what} do not fit {network}: {name!r} is {found}, needs {need}")


def _library(value: Any) -> str:
    """The top-level package of ``value``'s type: ``torch``, ``numpy``..."""
    return type(value).__module__.split(".", 1)[0]
