"""The learner's own counters on the shared volume: what it trained, for the run's summary.

The replay ratio a run reports must be what the learner did: its train steps over the
samples it learned from. The coordinator cannot count either (it sees the policy
iteration of the data it relays, which lags the learner: the summary read 10-25% low), so
the learner writes both to ``<policy dir>/<policy name>.learner.json`` next to its policy
file, atomically (readers see one whole version), whenever it writes the policy and when
it stops, and reads them back when it resumes from that policy. The coordinator reads
the file where it can see the volume (``warren run``, compose).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from worker.storage.paths import atomic_write, check_name

logger = logging.getLogger(__name__)

#: What follows the policy name in the counters file's name.
SUFFIX = ".learner.json"


@dataclass(frozen=True)
class LearnerCounters:
    """What the learner has done so far (since the run's first learner, when it resumed)."""

    train_steps: int
    samples: int
    """Samples taken into the replay buffer (what the train steps learned from)."""
    policy_iter: int
    written_at: float
    """``time.time()`` when the learner wrote them."""

    @property
    def replay_ratio(self) -> float:
        """Train steps per sample learned from (0 before any sample)."""
        return self.train_steps / self.samples if self.samples else 0.0

    @classmethod
    def now(cls, *, train_steps: int, samples: int, policy_iter: int) -> LearnerCounters:
        return cls(train_steps, samples, policy_iter, time.time())


def counters_path(policy_dir: Path, policy_name: str) -> Path:
    """Where the learner writing ``policy_name`` keeps its counters."""
    return Path(policy_dir) / (check_name(policy_name, what="policy name") + SUFFIX)


def write_counters(path: Path, counters: LearnerCounters) -> None:
    """Replace the counters file atomically (a reader sees the old version or the new one).

    Raises:
        StorageError: the file could not be written.
    """
    atomic_write(path, json.dumps(asdict(counters)).encode(), fsync=False)


def read_counters(path: Path) -> LearnerCounters | None:
    """The counters in ``path``; ``None`` when there is no file or it is not one the learner wrote."""
    try:
        document: Any = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.debug("ignoring the learner's counters in %s: %s", path, exc)
        return None
    try:
        counters = LearnerCounters(
            train_steps=_count(document["train_steps"]),
            samples=_count(document["samples"]),
            policy_iter=_count(document["policy_iter"]),
            written_at=float(document["written_at"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        logger.debug("ignoring the learner's counters in %s: %r", path, exc)
        return None
    return counters if math.isfinite(counters.written_at) else None


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value
