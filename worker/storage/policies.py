"""Policy files: ``{"model": state_dict, "iter": int}`` checkpoints a learner publishes for collectors.

The learner rewrites a policy file every few iterations and collectors re-read it every
few seconds, so a write goes to a temp file first and only the rename onto the final
name happens under a :class:`filelock.FileLock` on ``<name>.lock``; readers take the
same lock while they read the bytes. Loading is ``torch.load(weights_only=True)`` from
memory: a file holding anything but tensors and plain containers (such as a pickle
whose ``__reduce__`` calls ``os.system``) is refused before any of it runs.

torch is imported inside the functions that need it: it costs seconds to import and
processes that only move step data never pay for it.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from filelock import FileLock, Timeout

from worker.errors import CorruptFile, StorageError, UnsafePath
from worker.storage.paths import (
    FileStamp,
    check_name,
    publish_temp,
    read_regular_file,
    remove_quietly,
    resolve_under,
    stat_stamp,
    sweep_temp_files,
    unlink_if_present,
    write_temp,
)

if TYPE_CHECKING:
    import torch

#: Default cap on one policy file, for writing and reading (1 GiB).
DEFAULT_MAX_POLICY_BYTES: Final = 1024 * 1024 * 1024
#: Suffix of the lock file next to each policy file; policy names may not end with it.
LOCK_SUFFIX: Final = ".lock"
#: Longest piece of a loader's error message quoted in a CorruptFile.
_MAX_REASON_CHARS: Final = 200


@dataclass(frozen=True, slots=True, eq=False)
class PolicySnapshot:
    """One policy as loaded: CPU tensors keyed like ``Module.state_dict()``, and its train iteration."""

    state_dict: dict[str, torch.Tensor]
    iter: int


class PolicyStore:
    """Policy files under one directory (``path_policy``), named by plain file names.

    Args:
        root: the shared directory; created if missing.
        lock_timeout_s: how long a read or a publish waits for ``<name>.lock``.
        fsync: flush every file and rename to stable storage (survives host crashes).
        max_file_bytes: largest policy file written or accepted when reading.
    """

    def __init__(
        self,
        root: Path,
        *,
        lock_timeout_s: float = 10.0,
        fsync: bool = False,
        max_file_bytes: int = DEFAULT_MAX_POLICY_BYTES,
    ) -> None:
        if lock_timeout_s < 0:
            raise ValueError(f"lock_timeout_s must be >= 0, got {lock_timeout_s}")
        if max_file_bytes <= 0:
            raise ValueError(f"max_file_bytes must be positive, got {max_file_bytes}")
        self._root = Path(root)
        self._lock_timeout_s = lock_timeout_s
        self._fsync = fsync
        self._max_file_bytes = max_file_bytes
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create policy directory {str(self._root)!r}: {exc}") from exc

    @property
    def root(self) -> Path:
        """The directory holding the policy files."""
        return self._root

    def path(self, name: str) -> Path:
        """Return the confined path of policy ``name``.

        Raises:
            UnsafePath: ``name`` is not a plain file name, ends with ``.lock``, or
                would leave the root.
        """
        return self.check_name(self._root, name)

    @staticmethod
    def check_name(root: Path, name: str) -> Path:
        """Validate policy ``name`` under ``root`` without a store; see :meth:`path`.

        Raises:
            UnsafePath: as :meth:`path`.
        """
        resolved = resolve_under(root, name)
        check_name(name, what="policy name")
        if name.endswith(LOCK_SUFFIX):
            raise UnsafePath(f"invalid policy name {name!r}: the {LOCK_SUFFIX!r} suffix is reserved")
        return resolved

    def write(self, name: str, state_dict: Mapping[str, torch.Tensor], iter: int) -> Path:
        """Publish a policy: serialize it, then swap it in under the lock.

        Tensors are detached and copied to the CPU first, so the file holds just
        their values (a saved view would otherwise drag its whole storage along).

        Args:
            name: file name under the root, e.g. ``"learner0.pt"``.
            state_dict: parameter name -> tensor, as from ``Module.state_dict()``.
            iter: the learner's train iteration that produced these weights.

        Returns:
            The path of the published file.

        Raises:
            UnsafePath: ``name`` is not acceptable (see :meth:`path`).
            TypeError, ValueError: ``state_dict`` or ``iter`` have the wrong form.
            StorageError: the file is too large, writing failed, or the lock timed out.
        """
        path = self.path(name)
        body = self._serialize(name, state_dict, iter)
        tmp = write_temp(path, body, fsync=self._fsync)
        try:
            with self._locked(path):
                publish_temp(tmp, path, fsync=self._fsync)
        except BaseException:
            remove_quietly(tmp)
            raise
        return path

    def read(self, name: str) -> PolicySnapshot | None:
        """Load policy ``name``, or return None if it has not been written yet.

        Raises:
            UnsafePath: ``name`` is not acceptable (see :meth:`path`).
            CorruptFile: the file is not a weights-only checkpoint of the expected form.
            StorageError: the lock timed out or the file could not be read.
        """
        path = self.path(name)
        loaded = self._load(path)
        return None if loaded is None else loaded[0]

    def read_if_changed(
        self, name: str, last_stamp: FileStamp | None
    ) -> tuple[PolicySnapshot | None, FileStamp | None]:
        """Load policy ``name`` only if it changed since ``last_stamp``.

        Collectors poll every few seconds; comparing (mtime, size, inode) costs one
        ``stat`` where a load costs a full unpickle. Every publish is a rename of a new
        file, so the inode alone changes on each write.

        Args:
            name: the policy file name.
            last_stamp: the stamp this method returned last time, or None at first.

        Returns:
            ``(snapshot, stamp)``: the new snapshot and its stamp if the file changed;
            ``(None, last_stamp)`` if it did not; ``(None, None)`` if there is no file.

        Raises:
            UnsafePath, CorruptFile, StorageError: as for :meth:`read`.
        """
        path = self.path(name)
        stamp = stat_stamp(path)
        if stamp is None:
            return None, None
        if stamp == last_stamp:
            return None, last_stamp
        loaded = self._load(path)
        if loaded is None:  # removed between the stat and the load
            return None, None
        return loaded

    def delete(self, name: str) -> bool:
        """Delete policy ``name`` (its lock file stays: a waiter may hold it open).

        Returns:
            True if a file was removed, False if there was none.

        Raises:
            UnsafePath: ``name`` is not acceptable (see :meth:`path`).
            StorageError: the lock timed out or the file could not be removed.
        """
        path = self.path(name)
        with self._locked(path):
            return unlink_if_present(path, what="policy file")

    def sweep_temp(self, older_than_s: float) -> int:
        """Remove temp files that crashed learners left behind, if older than ``older_than_s``.

        Returns:
            How many files were removed.
        """
        return sweep_temp_files(self._root, older_than_s=older_than_s)

    def _serialize(self, name: str, state_dict: Mapping[str, torch.Tensor], iter: int) -> bytes:
        import torch

        payload = {"model": _cpu_copy(state_dict), "iter": _check_iter(iter)}
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        body = buffer.getvalue()
        if len(body) > self._max_file_bytes:
            raise StorageError(f"policy {name!r} is {len(body)} bytes, over the limit of {self._max_file_bytes}")
        return body

    def _load(self, path: Path) -> tuple[PolicySnapshot, FileStamp] | None:
        # Only the read of the bytes happens under the lock; unpickling them does not
        # need it and would keep the learner waiting.
        if stat_stamp(path) is None:
            return None  # do not leave lock files behind for policies that never existed
        with self._locked(path):
            found = read_regular_file(path, max_bytes=self._max_file_bytes)
        if found is None:
            return None
        body, stamp = found
        return _parse_policy(path, body), stamp

    @contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        lock_path = path.with_name(path.name + LOCK_SUFFIX)
        lock = FileLock(lock_path, timeout=self._lock_timeout_s)
        try:
            lock.acquire()
        except Timeout:
            raise StorageError(
                f"could not lock {str(lock_path)!r} within {self._lock_timeout_s} s: "
                "another process holds it (a stuck learner or collector?)"
            ) from None
        except OSError as exc:
            raise StorageError(f"cannot lock {str(lock_path)!r}: {exc}") from exc
        try:
            yield
        finally:
            lock.release()


def _cpu_copy(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    import torch

    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
    copy: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise TypeError(f"state_dict must map str -> Tensor, got {key!r} -> {type(value).__name__}")
        copy[key] = value.detach().to("cpu", copy=True)
    return copy


def _check_iter(iter: int) -> int:
    if type(iter) is not int:
        raise TypeError(f"iter must be an int, got {type(iter).__name__}")
    if iter < 0:
        raise ValueError(f"iter must be >= 0, got {iter}")
    return iter


def _parse_policy(path: Path, body: bytes) -> PolicySnapshot:
    import torch

    try:
        document = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # `from None`, and only the gist of torch's message: the rest advises retrying
        # with weights_only=False, which must never happen with a file from the volume.
        raise CorruptFile(
            f"policy file {str(path)!r} is not a weights-only torch checkpoint: the loader refused it "
            f"({_unpickler_detail(exc)}); junk bytes, or a pickle of objects other than tensors "
            "and plain containers (possibly malicious)"
        ) from None
    except Exception as exc:  # torch.load raises RuntimeError, EOFError, IndexError... for junk
        first_line = str(exc).strip().split("\n", 1)[0]
        reason = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
        raise CorruptFile(
            f"policy file {str(path)!r} is not a weights-only torch checkpoint ({reason[:_MAX_REASON_CHARS]})"
        ) from None
    problem = _policy_problem(document)
    if problem is not None:
        raise CorruptFile(f"policy file {str(path)!r} has the wrong layout: {problem}")
    return PolicySnapshot(state_dict=dict(document["model"]), iter=document["iter"])


def _unpickler_detail(exc: Exception) -> str:
    paragraphs = (part.strip() for part in str(exc).split("\n\n"))
    kept = [part for part in paragraphs if part and "weights_only" not in part and "documentation" not in part]
    return " ".join(kept)[:_MAX_REASON_CHARS] or type(exc).__name__


def _policy_problem(document: Any) -> str | None:
    import torch

    if not isinstance(document, dict):
        return f"top level is {type(document).__name__}, not a dict"
    model, iteration = document.get("model"), document.get("iter")
    if not isinstance(model, dict):
        return f"'model' is {type(model).__name__}, not a dict"
    for key, value in model.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            return f"'model' maps {key!r} to {type(value).__name__}, not str -> Tensor"
    if type(iteration) is not int:
        return f"'iter' is {type(iteration).__name__}, not an int"
    if not 0 <= iteration < 2**63:
        return f"'iter' is {iteration}, outside 0..2**63-1"
    return None
