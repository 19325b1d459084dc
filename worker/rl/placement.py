"""The built-in learners on their device: batches moved there, Adam's state placed as torch keeps it, bf16 autocast.

A learner's :class:`~worker.plugins.contract.Placement` says where its networks live. On
the CPU everything here is what the learners did before devices existed: a numpy batch
becomes a tensor sharing its memory (``torch.from_numpy``), and nothing is copied. On a
CUDA GPU a numpy batch is copied once into pinned (page-locked) host memory and from
there to the GPU without blocking, so the copy overlaps the work already queued on the
GPU; uint8 frames travel as uint8 (a quarter of float32's bytes) and become floats in the
model, on the GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from worker.plugins.contract import Placement

__all__ = ["adam_state", "autocast", "to_device", "torch_device"]


def torch_device(placement: Placement | None) -> torch.device:
    """The torch device of ``placement`` (``None``: the CPU)."""
    return torch.device("cpu" if placement is None else placement.device)


def to_device(value: Any, device: torch.device) -> Any:
    """A numpy array (or a tensor, or a dict of either) as a tensor on ``device``.

    On the CPU a writable array is shared, not copied (a read-only one is copied, which
    ``torch.from_numpy`` needs); elsewhere it goes through pinned memory with a
    non-blocking copy.
    """
    if isinstance(value, dict):
        return {key: to_device(v, device) for key, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    array = np.asarray(value)
    if device.type == "cpu":
        return torch.from_numpy(array if array.flags.writeable else array.copy())
    staging = torch.empty(array.shape, dtype=_torch_dtype(array.dtype), pin_memory=True)
    np.copyto(staging.numpy(), array, casting="no")
    return staging.to(device, non_blocking=True)


def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


@contextlib.contextmanager
def autocast(placement: Placement | None) -> Iterator[None]:
    """bf16 autocast on the GPU where ``placement.autocast`` asks for it; nothing otherwise."""
    if placement is None or placement.autocast != "bf16" or placement.on_cpu:
        yield
        return
    with torch.autocast(device_type=torch.device(placement.device).type, dtype=torch.bfloat16):
        yield


def adam_state(
    optimizer: torch.optim.Optimizer,
    param: torch.Tensor,
    step: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Adam's state of ``param`` from a checkpoint's CPU tensors, where torch's Adam keeps it.

    The moments go to the parameter's device. The step count too where the optimizer is
    fused or capturable (its kernels read it there), else it stays a CPU scalar, as
    ``Optimizer.load_state_dict`` places it.
    """
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    on_device = bool(group.get("fused") or group.get("capturable"))
    return {
        "step": step.detach().to(device=param.device if on_device else "cpu", dtype=torch.float32).clone(),
        "exp_avg": exp_avg.detach().to(device=param.device, dtype=param.dtype).clone(),
        "exp_avg_sq": exp_avg_sq.detach().to(device=param.device, dtype=param.dtype).clone(),
    }
