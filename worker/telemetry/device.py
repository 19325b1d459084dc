"""The learner's GPU in figures (utilisation, memory) for its TensorBoard and Prometheus series."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.plugins.contract import Placement

__all__ = ["DeviceMonitor"]


class DeviceMonitor:
    """The learner's GPU in figures: its utilisation and memory (nothing on the CPU).

    Sampled by the learner's telemetry once a TensorBoard interval, on the learner's thread.
    Utilisation comes from NVML (``nvidia-ml-py``, through torch) and is left out where that
    is missing; memory from torch's allocator.
    """

    def __init__(self, placement: Placement) -> None:
        self.device = placement.device
        self._utilization = not placement.on_cpu

    def sample(self) -> dict[str, float]:
        """``utilization`` (0-1), ``memory_allocated``/``_reserved``/``_used``/``_total`` (bytes); ``{}`` on the CPU."""
        if self.device == "cpu":
            return {}
        import torch

        out: dict[str, float] = {
            "memory_allocated": float(torch.cuda.memory_allocated(self.device)),
            "memory_reserved": float(torch.cuda.memory_reserved(self.device)),
        }
        try:
            free, total = torch.cuda.mem_get_info(self.device)
            out["memory_total"], out["memory_used"] = float(total), float(total - free)
        except RuntimeError:
            pass
        if self._utilization:
            try:
                out["utilization"] = torch.cuda.utilization(self.device) / 100.0
            except Exception:  # no NVML here: the figure is left out from now on
                self._utilization = False
        return out
