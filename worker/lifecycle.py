"""Signals: the first SIGTERM/SIGINT asks for a clean stop, the second exits at once."""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType

logger = logging.getLogger(__name__)


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
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
