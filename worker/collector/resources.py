"""What a collector worker can use, as its ``resource`` replies say: the GPUs it sees and the CPUs it may run on.

Measured without importing torch: a collector whose actor is numpy never loads it.
"""

from __future__ import annotations

import os


def measured_resources(gpus: int) -> dict[str, int]:
    """What this process can use: the GPUs it sees (:func:`worker.devices.visible_gpus`) and the CPUs it may run on.

    Args:
        gpus: the GPU count measured at start (:func:`worker.devices.visible_gpus`; it cannot change while
            a process runs).
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return {"gpu": gpus, "cpu": cpus}
