"""Small builders the RL unit tests share: spaces, a bound algorithm, chunks that fit a layout."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from worker.algorithms.random import sample_actions
from worker.plugins import Algorithm, Spaces, installed
from worker.plugins.binding import build_algorithm
from worker.rl.chunks import ChunkLayout


def flat_spaces(obs_dim: int = 4, n_actions: int = 2) -> Spaces:
    """CartPole-shaped spaces: a flat float32 ``Box`` of observations, ``Discrete`` actions."""
    return Spaces(gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32), gym.spaces.Discrete(n_actions))


def bound(
    name: str,
    spaces: Spaces,
    model: Mapping[str, Any] | None = None,
    model_name: str | None = None,
    **config: Any,
) -> Algorithm:
    """The built-in algorithm ``name`` on ``spaces``, configured as a job's ``[algorithm]`` and ``[model]`` would."""
    return build_algorithm(
        installed(), spaces, algorithm=name, config=config, model=model_name, model_config=dict(model or {})
    )


def chunk_fields(
    layout: ChunkLayout, spaces: Spaces, steps: int, envs: int, seed: int = 0
) -> dict[str, npt.NDArray[Any]]:
    """A chunk's fields as a collector writes them: random in-space values, every step valid, nothing ended."""
    rng = np.random.default_rng(seed)
    fields: dict[str, npt.NDArray[Any]] = {}
    for name, field in layout.fields.items():
        rows = () if field.per_chunk else (steps + int(field.bootstrap_row),)
        fields[name] = np.zeros((*rows, envs, *field.shape), dtype=field.dtype)
    obs_space = spaces.observation
    leaves = (
        {f"obs.{k}": v for k, v in obs_space.spaces.items()}
        if isinstance(obs_space, gym.spaces.Dict)
        else {"obs": obs_space}
    )
    for name, leaf in leaves.items():
        leaf.seed(seed)
        fields[name] = np.stack(
            [np.stack([np.asarray(leaf.sample()) for _ in range(envs)]) for _ in range(steps + 1)]
        ).astype(layout.fields[name].dtype)
    for name in layout.frame_fields:
        # Every row a head: a valid (if not a small) encoding of any stacks.
        stacks = fields[name]
        fields[name] = np.ascontiguousarray(stacks[:, :, -1])
        older = np.ascontiguousarray(stacks[:, :, :-1])
        fields[f"{name}@heads"] = older.reshape(-1, *older.shape[2:])
        at_rows = np.repeat(np.arange(steps + 1, dtype=np.int32), envs)
        fields[f"{name}@at"] = np.stack([at_rows, np.tile(np.arange(envs, dtype=np.int32), steps + 1)], axis=1)
    fields["action"] = np.stack([sample_actions(spaces.action, envs, rng) for _ in range(steps)])
    fields["reward"] = rng.normal(size=(steps, envs)).astype(np.float32)
    fields["valid"][:] = True
    return fields


def torch_loss_and_grads(
    loss: Callable[..., Any], *arrays: npt.NDArray[Any], wrt: tuple[int, ...] = (0,)
) -> tuple[float, list[npt.NDArray[Any]]]:
    """A torch loss (a specification) on tensors of ``arrays``: its value and its gradients in the arrays at ``wrt``."""
    import torch

    tensors = [torch.tensor(a, requires_grad=i in wrt) for i, a in enumerate(arrays)]
    value = loss(*tensors)
    grads = torch.autograd.grad(value, [tensors[i] for i in wrt])
    return float(value.detach()), [g.numpy() for g in grads]
