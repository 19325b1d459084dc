"""Videos during training: one episode of every ``coordinator.video_every_evals``-th eval's policy, filmed.

Filming is ``warren eval`` itself, run as a process of its own: the coordinator copies the
eval's copy of the policy (``<name>.eval``, which the next eval replaces) to
``<name>.video`` (its header's version checked to be the eval's) and starts ``warren eval
<name>.video --episodes 1 --video <videos dir>`` with the eval's seed, with the
video also added to TensorBoard (``<tensorboard dir>/videos``, tag ``eval/video``, at the
run's env steps). The coordinator's loop never waits on a render: the process runs beside
it, one at a time (an eval that comes while one is filming is not filmed), and a failure
(PyAV missing, an env that cannot be filmed) is its own log's, said once here. When the
run ends, a video being made gets :data:`FINISH_S` to finish.

The videos go to ``videos/`` beside the policy directory (``runs/<id>/videos`` for
``warren run``), named ``eval-<eval number>-policy-<version>-000.mp4``, with the process's
log in ``videos/videos.log``.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from pathlib import Path
from typing import IO, Final

from worker.coordinator.policy_files import RunPolicy
from worker.coordinator.task import Task
from worker.errors import StorageError
from worker.protocol import FinishInfo

logger = logging.getLogger(__name__)

#: What follows the policy name in the name of the copy a video is made of.
VIDEO_SUFFIX: Final = ".video"
#: How long a video being made when the run ends gets to finish.
FINISH_S: Final = 30.0


class EvalVideos:
    """Films every ``every``-th eval's policy (see the module docstring); ``every`` 0: none."""

    def __init__(self, every: int, policy: RunPolicy, out_dir: Path, tensorboard_dir: Path | None) -> None:
        self.every = every
        self.policy = policy
        self.out_dir = out_dir
        self.tensorboard_dir = None if tensorboard_dir is None else tensorboard_dir / "videos"
        self.name = policy.name + VIDEO_SUFFIX
        self.made = 0
        """Filming processes started."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._said: set[str] = set()

    def evaluated(self, number: int, task: Task, finish: FinishInfo, env_steps: int) -> bool:
        """Eval ``number`` (1 on) ended: film its policy if it is one to film; returns whether filming started."""
        if self.every <= 0 or number % self.every != 0 or finish.train_iter < 1:
            return False
        if self._busy():
            logger.info("eval %d is not filmed: the video of an earlier eval is still being made", number)
            return False
        cfg = task.start.cfg if task.start is not None else None
        store = self.policy.store()
        evaluated = cfg.policy_update_path if cfg is not None else None
        if store is None or cfg is None or evaluated is None or evaluated == self.policy.name:
            self._say(f"the evals read {self.policy.name} itself, not a copy: no videos are made")
            return False
        try:
            if store.version(evaluated) != finish.train_iter:
                return False
            store.copy(evaluated, self.name)
        except StorageError as exc:
            self._say(f"cannot copy the evaluated policy for a video: {exc.message}")
            return False
        stem = f"eval-{number:04d}-policy-{finish.train_iter}"
        command = [
            sys.executable,
            "-m",
            "worker.cli",
            "eval",
            str(store.path(self.name)),
            "--episodes",
            "1",
            "--seed",
            str(cfg.env.seed if cfg.env.seed is not None else 0),
            "--video",
            str(self.out_dir),
            "--video-name",
            stem,
            "--json",
            str(self.out_dir / f"{stem}.json"),
            "--log-level",
            "WARNING",
        ]
        if self.tensorboard_dir is not None:
            command += ["--tensorboard-dir", str(self.tensorboard_dir), "--tensorboard-step", str(env_steps)]
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if self._log is None:
                self._log = (self.out_dir / "videos.log").open("ab")
            self._proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        except OSError as exc:
            self._say(f"cannot start filming: {exc}")
            return False
        self.made += 1
        logger.info("filming policy %d (eval %d) into %s", finish.train_iter, number, self.out_dir)
        return True

    def _busy(self) -> bool:
        proc = self._proc
        if proc is None:
            return False
        code = proc.poll()
        if code is None:
            return True
        if code != 0:
            self._say(f"filming an eval's policy failed (exit code {code}): see {self.out_dir / 'videos.log'}")
        self._proc = None
        return False

    def close(self, timeout_s: float = FINISH_S) -> None:
        """The run ends: let a video being made finish (``timeout_s``), else stop it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("the video being made did not finish within %.0f s: stopped", timeout_s)
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5.0)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _say(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            logger.warning("%s", message)
