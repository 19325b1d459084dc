"""Files on the shared volume: step data chunks, policy checkpoints, and the path rules for both.

Everything here treats names and file contents as untrusted: names are confined to
their root, files are published atomically, and readers turn anything malformed into
:class:`~worker.errors.CorruptFile` instead of crashing or running code.
"""

from __future__ import annotations

from worker.storage.paths import (
    STALE_TEMP_S,
    FileStamp,
    atomic_write,
    check_data_id,
    resolve_under,
    sweep_temp_files,
)
from worker.storage.policies import PolicyStore
from worker.storage.policy_format import PolicySnapshot
from worker.storage.steps import STEP_KIND, SampleChunk, StepStore

__all__ = [
    "STALE_TEMP_S",
    "STEP_KIND",
    "FileStamp",
    "PolicySnapshot",
    "PolicyStore",
    "SampleChunk",
    "StepStore",
    "atomic_write",
    "check_data_id",
    "resolve_under",
    "sweep_temp_files",
]
