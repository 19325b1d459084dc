"""The policy files as the coordinator handles them: a copy for each eval, and the policy a run leaves.

An eval task loads its policy once, when it starts, while the learner goes on replacing
the policy file. For an eval to be confirmed (the same weights run again over more
episodes) and for the run to leave the policy its eval passed, those weights must
outlive the learner's next write: so every eval reads a copy, ``<policy name>.eval``,
taken when it is launched (one file copy, its header checked, no tensor loaded). When the
run reaches its stop value that copy becomes the policy file and is kept
(:meth:`~worker.storage.PolicyStore.keep`): the learner's writes are refused from then
on, so the file on disk is the policy the run reported.

This needs the policy directory (``warren run`` and the compose stack have it). A
coordinator that cannot see it never creates it: its evals read the learner's file, a
confirmation then reads the newest policy, and the policy left is unknown to it.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from worker.errors import StorageError
from worker.storage import PolicyStore

logger = logging.getLogger(__name__)

#: What follows the policy name in the name of the copy an eval reads.
EVAL_SUFFIX = ".eval"


class RunPolicy:
    """The policy file ``name`` under ``root`` (the learner's ``path_policy``), from the coordinator's side."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.eval_name = name + EVAL_SUFFIX
        self._root = Path(root)
        self._store: PolicyStore | None = None
        self._said: set[str] = set()

    def store(self) -> PolicyStore | None:
        """The store of the policy directory once it exists (``None`` before, or where it is not visible)."""
        if self._store is None and self._root.is_dir():
            try:
                self._store = PolicyStore(self._root)
            except StorageError as exc:
                self._say(f"cannot use the policy directory {self._root}: {exc.message}")
        return self._store

    def release(self) -> None:
        """A run starts: a policy file an earlier run kept may be written again (its learner resumes training)."""
        store = self.store()
        if store is None:
            return
        try:
            if store.release(self.name):
                logger.info("%s was kept by an earlier run: released for this one", self.name)
        except StorageError as exc:
            self._say(f"cannot release the kept {self.name}: {exc.message}")

    def for_eval(self) -> str:
        """The policy file an eval launched now reads: a fresh copy of the learner's, else the learner's own."""
        store = self.store()
        if store is None:
            return self.name
        try:
            copied = store.copy(self.name, self.eval_name)
        except StorageError as exc:
            self._say(f"cannot copy {self.name} for the evals ({exc.message}): they read the learner's file")
            return self.name
        return self.name if copied is None else self.eval_name

    def finish(self, evaluated: str | None) -> int | None:
        """The run ends; with ``evaluated`` (the file of the eval that ended it at the stop value), that policy
        becomes the policy file and is kept. The eval's copy is removed either way.

        Returns:
            The version of the policy file now; ``None`` when it is not known (no directory, an error: said once).
        """
        store = self.store()
        if store is None:
            return None
        version: int | None = None
        if evaluated is not None:
            try:
                version = store.keep(self.name, source=None if evaluated == self.name else evaluated)
            except StorageError as exc:
                self._say(f"cannot keep the evaluated policy as {self.name}: {exc.message}")
        with contextlib.suppress(StorageError):
            if store.path(self.eval_name).exists():  # no lock file left for a copy never taken
                store.delete(self.eval_name)
        return self.version() if version is None else version

    def version(self) -> int | None:
        """The version in the policy file's header now; ``None``: no file, or not visible from here."""
        store = self.store()
        if store is None:
            return None
        try:
            return store.version(self.name)
        except StorageError as exc:
            self._say(f"cannot read the version of {self.name}: {exc.message}")
            return None

    def _say(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            logger.warning("%s", message)
