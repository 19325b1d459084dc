"""Where the learner runs, resolved with torch; a GPU's out-of-memory said plainly.

The setting itself (``learner.device``: ``auto``, ``cpu``, ``cuda``, ``cuda:N``; the job's,
or ``WARREN_DEVICE`` / ``warren learner --device`` on the learner's machine, which win as
for its torch threads) is checked torch-free in :mod:`worker.devices`, where ``warren run``
refuses a GPU the machine lacks before it starts any process. :func:`resolve_placement`
is the learner's own check at its start: CUDA must be usable there, not only present.
``auto`` is the first CUDA GPU torch sees, else the CPU (where MLP jobs keep their numpy
train steps).

An update (or a replay buffer allocated on the device) that runs out of device memory stops
the learner with a :class:`~worker.errors.DeviceOutOfMemory` that names the job's settings to
lower (:func:`out_of_memory`); the policy file keeps the last good weights, since an update
that raised wrote nothing.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Final

from messaging import ConfigurationError
from worker.devices import device_index
from worker.errors import DeviceOutOfMemory
from worker.plugins.contract import Placement

__all__ = ["is_out_of_memory", "out_of_memory", "resolve_placement"]

logger = logging.getLogger(__name__)

#: The job's settings that size what one update or the replay buffer puts on the device, by algorithm setting.
_UPDATE_SETTINGS: Final = ("minibatch_size", "batch_size", "batch_steps")
_REPLAY_SETTINGS: Final = ("replay_capacity",)


def resolve_placement(
    setting: str, where: str, *, autocast: str = "off", device_replay: bool = False, supported: bool = True
) -> Placement:
    """The learner's :class:`Placement` from its settings, checked with torch.

    Args:
        setting: a checked device setting.
        where: what set it, for messages (``learner.device``, ``WARREN_DEVICE``).
        autocast: ``learner.autocast``.
        device_replay: ``learner.device_replay``.
        supported: whether the algorithm's learner can run on a GPU (:attr:`Algorithm.devices`);
            ``auto`` then runs it on the CPU, and ``cuda`` is refused.

    Raises:
        ConfigurationError: ``cuda`` where torch has no usable CUDA device, or for an algorithm that
            runs on the CPU only; ``bf16`` autocast on an explicit ``cpu``.
    """
    if setting == "cpu" or (setting == "auto" and not supported):
        device = "cpu"
    elif not supported:
        raise ConfigurationError(
            f"{where} = {setting!r}: this job's algorithm runs its learner on the CPU only "
            "(its plug-in names no other device): set it to 'auto' or 'cpu'"
        )
    else:
        device = _cuda_device(setting, where)
    if device == "cpu" and autocast != "off":
        if setting == "cpu":
            raise ConfigurationError(
                f"learner.autocast = {autocast!r} computes on a CUDA GPU, and {where} = 'cpu': "
                "set learner.autocast = 'off' (or the device to 'auto' or 'cuda')"
            )
        logger.warning(
            "learner.autocast = %r applies on a CUDA GPU only: this learner runs on the CPU, in fp32", autocast
        )
        autocast = "off"
    return Placement(device=device, autocast=autocast, device_replay=device_replay and device != "cpu")


def _cuda_device(setting: str, where: str) -> str:
    """``cuda:N`` for ``setting`` (``auto``: ``cpu`` when torch has no CUDA device).

    Raises:
        ConfigurationError: ``cuda`` or ``cuda:N`` that torch cannot use here.
    """
    import torch

    available = torch.cuda.is_available()
    if setting == "auto":
        return f"cuda:{torch.cuda.current_device()}" if available else "cpu"
    if not available:
        build = "this torch is built without CUDA" if torch.version.cuda is None else "torch finds no usable CUDA GPU"
        raise ConfigurationError(f"{where} = {setting!r}, and {build}: set {where} to 'auto' or 'cpu'")
    count = torch.cuda.device_count()
    index = device_index(setting)
    if index is None:
        return f"cuda:{torch.cuda.current_device()}"
    if index >= count:
        raise ConfigurationError(
            f"{where} = {setting!r}, and torch sees {count} CUDA GPU{'s' if count > 1 else ''} (cuda:0 to "
            f"cuda:{count - 1}): name one of them"
        )
    return setting


# -- out of memory ----------------------------------------------------------------------


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's out-of-memory error of a GPU (never imports torch)."""
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch is not None else None
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)


def out_of_memory(
    exc: BaseException, call: str, *, algorithm_config: Any, placement: Placement, policy: str
) -> DeviceOutOfMemory:
    """The error the learner stops with when ``exc``, from the algorithm's ``call``, is a GPU out of memory.

    It names the settings that size what ``call`` put on the device, with their values: the
    batch settings for an update, the replay capacity (and ``learner.device_replay``) for
    data taken in.

    Args:
        exc: the out-of-memory error (:func:`is_out_of_memory`).
        call: ``update``, ``add`` or ``make_learner``.
        algorithm_config: the algorithm's settings (their names are looked up on it).
        placement: where the learner runs.
        policy: what the policy file keeps, for the message (``policy_main keeps version 12``).
    """
    names = _REPLAY_SETTINGS if call == "add" else _UPDATE_SETTINGS
    lower = [f"algorithm.{n} ({getattr(algorithm_config, n)})" for n in names if hasattr(algorithm_config, n)]
    if call == "add" and placement.device_replay:
        lower.append("learner.device_replay (true: replay in the GPU's memory; false keeps it in the host's)")
    if call == "make_learner" or not lower:
        lower.append("the model's size ([model])")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DeviceOutOfMemory(
        f"the learner ran out of memory on {placement.device} in {call} ({first[:200]}): lower "
        f"{' or '.join(lower)}, or run it on a GPU with more free memory; {policy}"
    )
