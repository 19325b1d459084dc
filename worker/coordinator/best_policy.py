"""The best policy a run's evals saw, kept as its own file beside the learner's: ``<policy name>.best``.

The coordinator sees every eval's return and the policy version it ran. Each eval reads a
copy of the policy file that the coordinator alone writes, ``<name>.eval``
(:mod:`~worker.coordinator.policy_files`), and the next copy is made only when the next
eval starts: so when an eval ends, that copy still holds the weights it evaluated (its
header's version is checked to be the eval's). An eval whose mean return is at least the
best so far (ties go to the newer version, which trained longer) has its copy published as
``<name>.best``, with the eval in the header (:func:`~worker.agent.header.best_header`:
its return, episodes, seeds and the run's env steps). The untrained policy (version 0)
is never the best: its return says nothing of what training made.

``warren run --resume`` continues from the best file's own header (its eval return), so a
resumed run replaces it only with a better eval. A new run in a policy directory an
earlier run used replaces that run's best at its first eval of a trained policy.
Without the policy directory (a coordinator on another machine), evals read the
learner's file, whose version may have moved on: no best is kept then (said once).
"""

from __future__ import annotations

import logging

from worker.agent.header import BEST_SUFFIX, best_header
from worker.coordinator.policy_files import RunPolicy
from worker.coordinator.task import Task
from worker.errors import StorageError
from worker.protocol import FinishInfo
from worker.storage.policy_format import read_policy_header

logger = logging.getLogger(__name__)


class BestPolicy:
    """Keeps ``<policy name>.best`` as the policy of the best eval so far (see the module docstring)."""

    def __init__(self, policy: RunPolicy) -> None:
        self.policy = policy
        self.name = policy.name + BEST_SUFFIX
        self.eval_return: float | None = None
        """The best eval's mean return so far (``None``: no best kept yet)."""
        self.version: int | None = None
        """The policy version of the best file (``None``: none)."""
        self._said: set[str] = set()

    def resumed(self) -> None:
        """The run resumes: the best so far is the best file's, as its header says."""
        store = self.policy.store()
        if store is None:
            return
        try:
            version, meta = read_policy_header(store.path(self.name))
            eval_return = float(meta["eval_return"])
        except (StorageError, KeyError, ValueError):
            return  # none yet, or not one a coordinator kept: the next eval replaces it
        self.eval_return, self.version = eval_return, version
        logger.info("the best policy so far: version %d (eval return %g), %s", version, eval_return, self.name)

    def evaluated(self, task: Task, finish: FinishInfo, env_steps: int) -> bool:
        """An eval ended with ``finish``: keep its policy as the best if it is; returns whether it was kept."""
        version, eval_return = int(finish.train_iter), float(finish.reward_mean)
        if version < 1 or (self.eval_return is not None and eval_return < self.eval_return):
            return False
        cfg = task.start.cfg if task.start is not None else None
        evaluated = cfg.policy_update_path if cfg is not None else None
        store = self.policy.store()
        if store is None or evaluated is None or evaluated == self.policy.name:
            self._say(f"the evals read {self.policy.name} itself, not a copy: no best policy is kept")
            return False
        header = best_header(
            eval_return,
            finish.real_episode_count,
            env_steps,
            eval_seed=cfg.env.seed if cfg is not None else None,
            eval_envs=cfg.env.env_num if cfg is not None else 1,
        )
        try:
            # The coordinator alone writes the eval's copy: checked, it cannot change before the copy.
            if store.version(evaluated) != version:
                logger.info("%s no longer holds version %d: not kept as the best", evaluated, version)
                return False
            store.copy(evaluated, self.name, meta=header)
        except StorageError as exc:
            self._say(f"cannot keep the best policy as {self.name}: {exc.message}")
            return False
        self.eval_return, self.version = eval_return, version
        logger.info("policy %d is the best so far (eval return %g): kept as %s", version, eval_return, self.name)
        return True

    def _say(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            logger.warning("%s", message)
