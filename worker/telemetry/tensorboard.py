"""TensorBoard scalars: one event file per role and process, under the run's ``tensorboard/``.

The events are written by tensorboard's own ``EventFileWriter``, the writer
``torch.utils.tensorboard`` hands its events to: classic scalar summaries, shown by
TensorBoard and read back by its ``EventAccumulator`` (and the tools that read event
files) exactly as torch's are. Not through ``torch.utils.tensorboard`` itself, nor
tensorboardX: both import torch (tensorboardX whenever torch is installed, ~0.7 s here),
and the coordinator must start without it.

A role writes into ``<tensorboard_dir>/<role>``: TensorBoard shows each directory with
event files as one run, and a second process of the same role (a restart) adds its file
next to the first one's, continuing the same curves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from messaging import ConfigurationError

logger = logging.getLogger(__name__)

#: How often buffered events reach the file (TensorBoard re-reads a live run every ~5 s).
FLUSH_S: Final = 5.0
#: Events buffered before a write waits for the writer thread.
_QUEUE: Final = 1000


class ScalarLog:
    """Scalars for TensorBoard, appended to one event file of ``logdir``.

    A failing write (disk full, directory removed) is logged once and ends the log:
    figures for TensorBoard never stop a role.

    Raises:
        ConfigurationError: ``logdir`` cannot be created or written.
    """

    def __init__(self, logdir: Path, *, flush_s: float = FLUSH_S) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        self.logdir = logdir
        try:
            self._writer: Any = EventFileWriter(str(logdir), max_queue_size=_QUEUE, flush_secs=flush_s)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot write TensorBoard events in {logdir} (WARREN_TENSORBOARD_DIR, --tensorboard-dir): {exc}"
            ) from None
        logger.info("TensorBoard events in %s", logdir)

    def add(self, values: Mapping[str, float], step: int, *, wall_time: float | None = None) -> None:
        """One point of each tag in ``values`` at ``step`` (one event holds them all)."""
        if self._writer is None or not values:
            return
        summary = self._summary(
            value=[self._summary.Value(tag=tag, simple_value=float(value)) for tag, value in values.items()]
        )
        event = self._event(wall_time=time.time() if wall_time is None else wall_time, step=int(step), summary=summary)
        try:
            self._writer.add_event(event)
        except Exception as exc:  # the writer thread's error, raised here: whatever it is, stop writing
            logger.warning("TensorBoard events in %s stopped: %r", self.logdir, exc)
            self._writer = None

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Write what is buffered and close the file (idempotent)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception as exc:  # as in add(): the last events are lost, the role goes on
                logger.warning("closing the TensorBoard events in %s: %r", self.logdir, exc)


def board_for(tensorboard_dir: Path | None, role: str) -> ScalarLog | None:
    """The role's event log under ``tensorboard_dir`` (``None``: no TensorBoard events)."""
    return None if tensorboard_dir is None else ScalarLog(tensorboard_dir / role)


class Means:
    """Running sums of named values, turned into their means (for one TensorBoard point per interval)."""

    def __init__(self) -> None:
        self._sums: dict[str, list[float]] = {}

    def add(self, values: Mapping[str, float]) -> None:
        sums = self._sums
        for name, value in values.items():
            entry = sums.get(name)
            if entry is None:
                sums[name] = [float(value), 1.0]
            else:
                entry[0] += value
                entry[1] += 1.0

    def take(self) -> dict[str, float]:
        """The means since the last take (empty when nothing was added)."""
        means = {name: total / count for name, (total, count) in self._sums.items()}
        self._sums = {}
        return means
