"""Image replay batches built on the learner's GPU from :class:`~worker.rl.frame_replay.FrameReplay`'s frame numbers.

On the CPU, :meth:`FrameReplay.sample` gathers ``2 x K`` frames a transition into stacks in
host memory. A learner on a GPU does better in one of two ways:

* **staged** (the default): the batch's distinct frames (a transition's ``obs`` and
  ``next_obs`` share ``K - 1`` of them, and neighbours share more) go to the GPU once, as
  uint8 through pinned memory, and the stacks are gathered there from their positions;
* **resident** (``learner.device_replay``): the frame ring has a copy in the GPU's memory,
  kept up to date as chunks arrive (each new frame crosses once), and a batch is a gather
  on the GPU: only its frame numbers cross. It costs the ring's size in GPU memory,
  :data:`~worker.rl.frame_replay.FRAMES_PER_TRANSITION` frames a transition (7,938 bytes
  for 84x84 frames, so ~7.4 GiB for a million transitions) plus one chunk.

Either way the batch is the one :meth:`FrameReplay.sample` would give for the same draws,
frame for frame, and its frames stay uint8 until the model converts them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from worker.rl.frame_replay import FrameReplay
from worker.rl.placement import to_device
from worker.rl.replay import Columns

__all__ = ["DeviceFrames"]

#: The two stacks of a transition, as :meth:`FrameReplay.sample_slots` names their positions.
_STACKS = ("obs", "next_obs")


class DeviceFrames:
    """Stacks of a :class:`FrameReplay`'s batches on ``device`` (see the module docstring).

    Args:
        replay: the replay whose frames it stacks.
        device: where the batches go.
        resident: keep a copy of the frame ring on ``device`` (allocated here).
    """

    def __init__(self, replay: FrameReplay, device: torch.device, *, resident: bool) -> None:
        self.replay = replay
        self.device = device
        self.ring: torch.Tensor | None = None
        self._copied = replay.frames_added
        """Frames of the ring (by sequence number) already on the device."""
        if resident:
            frames = replay.frames
            self.ring = torch.empty(frames.shape, dtype=torch.from_numpy(frames[:0]).dtype, device=device)
            self._copied = 0
            self.sync()

    @property
    def nbytes(self) -> int:
        """Bytes of the ring's copy on the device (0: staged)."""
        return 0 if self.ring is None else self.ring.numel() * self.ring.element_size()

    def sync(self) -> None:
        """Copy the frames added to the ring since the last call (resident only; a no-op otherwise)."""
        if self.ring is None:
            return
        replay = self.replay
        capacity, added = replay.frame_capacity, replay.frames_added
        first = max(self._copied, added - capacity)  # older ones were overwritten before they were copied
        start, stop = first % capacity, added % capacity
        if added - first == capacity:
            self.ring.copy_(to_device(replay.frames, self.device), non_blocking=True)
        elif start <= stop:
            self.ring[start:stop].copy_(to_device(replay.frames[start:stop], self.device), non_blocking=True)
        else:  # wraps around the ring's end
            self.ring[start:].copy_(to_device(replay.frames[start:], self.device), non_blocking=True)
            self.ring[:stop].copy_(to_device(replay.frames[:stop], self.device), non_blocking=True)
        self._copied = added

    def batch(self, columns: Columns) -> dict[str, Any]:
        """:meth:`FrameReplay.sample_slots`'s ``columns`` as tensors on the device, ``obs`` and ``next_obs`` stacked."""
        columns = dict(columns)
        slots = [columns.pop(f"{name}_slots") for name in _STACKS]
        out: dict[str, Any] = {name: to_device(value, self.device) for name, value in columns.items()}
        if self.ring is not None:
            for name, where in zip(_STACKS, slots, strict=True):
                out[name] = self.ring[to_device(where, self.device)]
            return out
        unique, inverse = np.unique(np.stack(slots), return_inverse=True)
        frames = to_device(self.replay.frames[unique], self.device)
        positions = to_device(inverse.reshape(len(_STACKS), *slots[0].shape), self.device)
        for i, name in enumerate(_STACKS):
            out[name] = frames[positions[i]]
        return out
