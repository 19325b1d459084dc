"""The learner's device setting, checked and judged without torch: what ``warren run`` and the job file ask.

``learner.device`` (``WARREN_DEVICE``, ``warren learner --device``) is ``auto``, ``cpu``,
``cuda`` or ``cuda:N``. Whether a machine can run it is answered here from ``/dev`` and
``CUDA_VISIBLE_DEVICES`` alone, so that the coordinator and ``warren run`` refuse a job
that asks for a GPU the machine lacks before any process starts, without importing torch.
The learner's own check, with torch, is :func:`worker.learner.device.resolve_placement`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from messaging import ConfigurationError

__all__ = [
    "AUTOCAST_SETTINGS",
    "check_autocast_setting",
    "check_device_setting",
    "device_index",
    "device_refusal",
    "run_device_refusal",
    "visible_gpus",
]

_DEVICE_RE: Final = re.compile(r"^(auto|cpu|cuda|cuda:\d{1,3})$")
#: ``learner.autocast``'s values: ``off`` (fp32), ``bf16``.
AUTOCAST_SETTINGS: Final = ("off", "bf16")


def check_device_setting(value: object, where: str) -> str:
    """``value`` if it is a device setting (``auto``, ``cpu``, ``cuda``, ``cuda:N``).

    Raises:
        ConfigurationError: it is not, naming ``where``.
    """
    if not isinstance(value, str) or not _DEVICE_RE.match(value):
        raise ConfigurationError(f"{where} must be auto, cpu, cuda or cuda:N, got {value!r}")
    return value


def check_autocast_setting(value: object, where: str) -> str:
    """``value`` if it is an autocast setting (:data:`AUTOCAST_SETTINGS`).

    Raises:
        ConfigurationError: it is not, naming ``where``.
    """
    if value not in AUTOCAST_SETTINGS:
        raise ConfigurationError(f"{where} must be {' or '.join(AUTOCAST_SETTINGS)}, got {value!r}")
    return str(value)


def visible_gpus(dev: Path = Path("/dev")) -> int:
    """NVIDIA GPUs this process may use, counted without importing torch.

    The ``/dev/nvidia<N>`` devices, narrowed by ``CUDA_VISIBLE_DEVICES`` as CUDA reads it
    (the entries up to the first that is not a device: ``-1``, an empty one). A count, not
    a promise that CUDA works: the workers only report it (``resource``).
    """
    devices = sum(1 for path in dev.glob("nvidia*") if path.name[len("nvidia") :].isdigit())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return devices
    listed = 0
    for part in visible.split(","):
        entry = part.strip()
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        listed += 1
    return min(devices, listed)


def device_index(setting: str) -> int | None:
    """``N`` of ``cuda:N``; ``None`` for ``cuda`` (the current device) and the rest."""
    return int(setting.split(":", 1)[1]) if setting.startswith("cuda:") else None


def device_refusal(setting: str, where: str, *, gpus: int | None = None, dev: Path = Path("/dev")) -> str | None:
    """Why ``setting`` cannot run on this machine, found without torch (``None``: it may).

    ``cuda`` needs a visible NVIDIA GPU (:func:`visible_gpus`; ``cuda:N``, more than ``N``).
    A machine whose GPUs show no ``/dev/nvidia<N>`` (WSL's ``/dev/dxg``) is left to the
    learner's own check, with torch.

    Args:
        setting: a checked device setting.
        where: what set it, for the message (``learner.device``, ``WARREN_DEVICE``).
        gpus: the GPU count (default: :func:`visible_gpus` of ``dev``).
    """
    if not setting.startswith("cuda") or (dev / "dxg").exists():
        return None
    count = visible_gpus(dev) if gpus is None else gpus
    index = device_index(setting) or 0
    if index < count:
        return None
    seen = (
        "no NVIDIA GPU" if count == 0 else f"{count} NVIDIA GPU{'s' if count > 1 else ''} (cuda:0 to cuda:{count - 1})"
    )
    hidden = " (CUDA_VISIBLE_DEVICES hides some)" if os.environ.get("CUDA_VISIBLE_DEVICES") is not None else ""
    return (
        f"{where} = {setting!r} asks for a CUDA GPU, and this machine shows {seen}{hidden} to this process: "
        f"set {where} to 'auto' (the GPU when there is one, else the CPU) or 'cpu'"
    )


def run_device_refusal(job_device: str, env: Mapping[str, str]) -> str | None:
    """:func:`device_refusal` of the device a learner started with ``env`` on this machine would use.

    ``WARREN_DEVICE``, when set, wins over the job's ``learner.device`` (as in the learner).

    Raises:
        ConfigurationError: ``WARREN_DEVICE`` is not a device setting.
    """
    raw = env.get("WARREN_DEVICE")
    if raw:
        return device_refusal(check_device_setting(raw, "WARREN_DEVICE"), "WARREN_DEVICE")
    return device_refusal(job_device, "learner.device")
