"""Process start-up: native thread pools sized for sharing cores, and signal handling.

The first SIGTERM/SIGINT asks for a clean stop, the second exits at once; the first is
remembered (:func:`stop_signal`), so a command it stopped exits with 128 + its number,
as a shell reports a process a signal ended.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType

logger = logging.getLogger(__name__)

#: Native thread pools numpy (OpenBLAS) and torch (OpenMP) read their size from at load.
_POOL_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def single_threaded_math() -> None:
    """One BLAS/OpenMP thread per process unless the environment says otherwise.

    Call before numpy or torch is imported. warren's processes (collectors, a learner, the
    broker) share a few cores, and a pool of BLAS threads spinning on a collector's tiny
    matrices costs more than it gains: one collector measured 1.9 CPU-s per second of
    rollout with the default pool on 2 cores, 1.0 with one thread, for 10% less speed
    alone and more in company.
    """
    for variable in _POOL_VARIABLES:
        os.environ.setdefault(variable, "1")


#: The stop signals this process received, first first (see :func:`stop_signal`).
_received: list[int] = []


def stop_signal() -> int | None:
    """The number of the first SIGTERM or SIGINT this process received (``None``: none).

    ``warren run`` and ``warren coordinator`` exit with 128 + it when the signal, not an
    error or a budget, ended the run.
    """
    return _received[0] if _received else None


def install_stop_handlers(stop: threading.Event) -> None:
    """Route SIGTERM and SIGINT to ``stop``; a second signal ends the process immediately.

    The handler only sets the event: the main thread notices it and shuts down in order.
    The immediate exit skips every clean-up on purpose: messages not acked yet go back to
    their queues, so the broker hands them to another worker.
    """

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            logger.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(128 + signum)
        logger.info("%s received: stopping cleanly (send it again to exit at once)", signal.Signals(signum).name)
        _received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def limit_torch_threads(num_threads: int = 1) -> None:
    """Cap torch's intra-op thread pool (imports torch: call it where torch is needed anyway).

    Collector processes run small batched forward passes; several of them share a host
    with the learner, and torch's default of one thread per core makes them fight over the
    cores for no gain. Call once at process start.
    """
    import torch

    if torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)
