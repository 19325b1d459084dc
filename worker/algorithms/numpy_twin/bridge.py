"""Between the numpy twin and the torch networks: copies both ways, and whether numpy can run a network.

The one module of the twin that imports torch: the learner uses it, collectors never do.
Parameters travel by name (the twin's :class:`~worker.algorithms.numpy_twin.params.FlatParams`
is laid out in ``named_parameters`` order), and Adam's moments as the torch optimizer keeps
them (``exp_avg``, ``exp_avg_sq`` and ``step`` per parameter), so a learner's checkpoint
code, written once against torch, serves both steps.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from worker.algorithms.numpy_twin.adam import FlatAdam
from worker.algorithms.numpy_twin.params import FlatParams
from worker.models.mlp_encoder import MLPEncoder

__all__ = ["linear_names", "load_adam", "load_params", "mlp_problem", "store_adam", "store_params", "twin_of"]

#: A network, or parameters by name (a bare tensor such as SAC's ``log_alpha``: ``{"log_alpha": tensor}``).
Parameters = nn.Module | Mapping[str, torch.Tensor]


def mlp_problem(body: nn.Module, activations: tuple[str, ...]) -> str | None:
    """Why numpy cannot run ``body`` (``None``: it can): the built-in mlp on one float Box, one of ``activations``."""
    if not isinstance(body, MLPEncoder):
        return f"the model is not the built-in mlp ({type(body).__name__})"
    if not body.flat_float_input:
        return f"the observation space is not one float Box ({body.flatten.space})"
    if body.activation not in activations:
        return f"activation {body.activation!r} (numpy runs {' or '.join(activations)} here)"
    return None


def linear_names(module: nn.Module, prefix: str = "") -> list[str]:
    """The module names of ``module``'s linear layers in order, under ``prefix``."""
    return [f"{prefix}{name}" for name, m in module.named_modules() if isinstance(m, nn.Linear)]


def twin_of(module: nn.Module) -> FlatParams:
    """A :class:`FlatParams` of ``module``'s parameters, holding their values."""
    flat = FlatParams({name: tuple(p.shape) for name, p in module.named_parameters()})
    load_params(flat, module)
    return flat


def load_params(flat: FlatParams, module: Parameters) -> None:
    """Copy ``module``'s parameters into ``flat``."""
    flat.load({name: p.detach() for name, p in _named(module).items()})


def store_params(flat: FlatParams, module: Parameters) -> None:
    """Copy ``flat``'s parameters into ``module``."""
    with torch.no_grad():
        for name, param in _named(module).items():
            param.copy_(torch.from_numpy(flat.views[name]))


def store_adam(adam: FlatAdam, flat: FlatParams, optimizer: torch.optim.Optimizer, module: Parameters) -> None:
    """Give ``optimizer`` (over ``module``'s parameters) ``adam``'s moments and step count; none before a step."""
    params = _named(module)
    if not adam.steps:
        for param in params.values():
            optimizer.state.pop(param, None)
        return
    m, v = flat.split(adam.m), flat.split(adam.v)
    for name, param in params.items():
        optimizer.state[param] = {
            "step": torch.tensor(float(adam.steps), dtype=torch.float32),
            "exp_avg": torch.from_numpy(m[name].copy()),
            "exp_avg_sq": torch.from_numpy(v[name].copy()),
        }


def load_adam(adam: FlatAdam, flat: FlatParams, optimizer: torch.optim.Optimizer, module: Parameters) -> None:
    """Take ``optimizer``'s moments and step count into ``adam``: zero, and no step, where it has taken none."""
    params = _named(module)
    states = [optimizer.state.get(param, {}) for param in params.values()]
    if not all("exp_avg" in state for state in states):
        adam.m.fill(0.0)
        adam.v.fill(0.0)
        adam.steps = 0
        return
    flat.load({name: state["exp_avg"] for name, state in zip(params, states, strict=True)}, into=adam.m)
    flat.load({name: state["exp_avg_sq"] for name, state in zip(params, states, strict=True)}, into=adam.v)
    adam.steps = round(float(states[0]["step"]))


def _named(module: Parameters) -> dict[str, torch.Tensor]:
    return dict(module.named_parameters()) if isinstance(module, nn.Module) else dict(module)
