"""Policy files: the weights a learner publishes for collectors, as safetensors with a small header.

The learner rewrites a policy file every few updates and collectors re-read it every
second or so, so a write goes to a temp file first and only the rename onto the final
name happens under a :class:`filelock.FileLock` on ``<name>.lock``; readers take the
same lock while they read the bytes.

The format is safetensors with a small header (:mod:`worker.storage.policy_format`, which
also reads a file outside a run, without its lock). Reading one parses JSON and copies
bytes; nothing in it can run code, unlike a pickle. A file holding NaN or infinite
weights is refused as corrupt: a collector keeps the policy it has.

A policy file can be *kept* (:meth:`PolicyStore.keep`): a marker ``<name>.kept`` next to
it, made under the file's lock, after which every write of that name is refused with
:class:`~worker.errors.PolicyKept` until :meth:`PolicyStore.release`. A run that ends at
its stop value keeps the policy its evaluation passed, so the file the run leaves is the
one it reported, not whatever the learner made while the run was shutting down.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

from filelock import FileLock, Timeout

from worker.errors import PolicyKept, StorageError, UnsafePath
from worker.storage.paths import (
    FileStamp,
    atomic_write,
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
from worker.storage.policy_format import (
    DEFAULT_MAX_POLICY_BYTES,
    POLICY_FORMAT,
    PolicySnapshot,
    header_version,
    parse_policy,
    policy_bytes,
    read_policy_file,
    read_policy_header,
    with_metadata,
)

__all__ = [
    "DEFAULT_MAX_POLICY_BYTES",
    "KEPT_SUFFIX",
    "LOCK_SUFFIX",
    "POLICY_FORMAT",
    "PolicySnapshot",
    "PolicyStore",
    "read_policy_file",
    "read_policy_header",
    "with_metadata",
]

if TYPE_CHECKING:
    import torch

#: Suffix of the lock file next to each policy file; policy names may not end with it.
LOCK_SUFFIX: Final = ".lock"
#: Suffix of the marker of a kept policy file (:meth:`PolicyStore.keep`); policy names may not end with it.
KEPT_SUFFIX: Final = ".kept"


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
            UnsafePath: ``name`` is not a plain file name, ends with ``.lock`` or ``.kept``,
                or would leave the root.
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
        for reserved in (LOCK_SUFFIX, KEPT_SUFFIX):
            if name.endswith(reserved):
                raise UnsafePath(f"invalid policy name {name!r}: the {reserved!r} suffix is reserved")
        return resolved

    def write(
        self, name: str, state_dict: Mapping[str, torch.Tensor], iter: int, meta: Mapping[str, str] | None = None
    ) -> Path:
        """Publish a policy: serialize it, then swap it in under the lock.

        Tensors are detached, copied to the CPU and made contiguous first (safetensors
        stores plain buffers; shared or strided ones would be refused).

        Args:
            name: file name under the root, e.g. ``"policy_main"``.
            state_dict: parameter name -> tensor, as from ``Module.state_dict()``.
            iter: the policy version (the learner's update count) that produced these weights.
            meta: strings for the header (``algorithm``, ``model``, ``spaces_digest``...).

        Returns:
            The path of the published file.

        Raises:
            UnsafePath: ``name`` is not acceptable (see :meth:`path`).
            TypeError, ValueError: ``state_dict`` or ``iter`` have the wrong form.
            PolicyKept: the file is kept (:meth:`keep`); it stays as it is.
            StorageError: the file is too large, writing failed, or the lock timed out.
        """
        path = self.path(name)
        self._publish(path, self._serialize(name, state_dict, iter, meta or {}))
        return path

    def copy(self, name: str, to: str, *, meta: Mapping[str, str] | None = None) -> int | None:
        """Publish the bytes of policy ``name`` as policy ``to``; returns the version copied (``None``: no ``name``).

        The header is checked (a warren policy with a version), the tensors are not
        loaded: a process that only moves policy files never imports torch. ``meta``:
        strings added to the copy's header metadata (the tensors' bytes stay as they are);
        ``warren.format`` and ``policy_version`` cannot be changed this way.

        Raises:
            UnsafePath: a name is not acceptable (see :meth:`path`).
            CorruptFile: ``name`` is not a warren policy file.
            PolicyKept: ``to`` is kept (:meth:`keep`).
            StorageError: reading or writing failed, or a lock timed out.
        """
        source, target = self.path(name), self.path(to)
        found = self._read_bytes(source)
        if found is None:
            return None
        version = header_version(source, found[0])
        body = found[0] if not meta else with_metadata(f"policy file {str(source)!r}", found[0], meta)
        self._publish(target, body)
        return version

    def version(self, name: str) -> int | None:
        """The policy version in the header of policy ``name`` (its tensors are not loaded); ``None``: no file.

        Raises:
            UnsafePath, CorruptFile, StorageError: as for :meth:`read`.
        """
        path = self.path(name)
        found = self._read_bytes(path)
        return None if found is None else header_version(path, found[0])

    def keep(self, name: str, source: str | None = None) -> int | None:
        """Hold policy ``name`` as it is from now on, after copying policy ``source`` onto it (when given).

        Until :meth:`release`, every :meth:`write` or :meth:`copy` to ``name`` is refused
        with :class:`~worker.errors.PolicyKept`. The copy and the marker are made under
        the file's lock, the one a writer publishes under: a write either landed before
        (and the copy replaces it) or is refused.

        Returns:
            The version of the file kept; ``None`` when there is neither ``source`` nor
            ``name`` (nothing is kept then).

        Raises:
            UnsafePath, CorruptFile, StorageError: as for :meth:`copy`.
        """
        path = self.path(name)
        found = self._read_bytes(self.path(source)) if source is not None else None
        if found is None and stat_stamp(path) is None:
            return None  # nothing to keep: no lock file left behind either
        if found is not None:
            header_version(self.path(source or name), found[0])
        tmp = write_temp(path, found[0], fsync=self._fsync) if found is not None else None
        try:
            with self._locked(path):
                if tmp is not None:
                    publish_temp(tmp, path, fsync=self._fsync)
                    tmp = None
                elif stat_stamp(path) is None:
                    return None
                marker = json.dumps({"kept_at": time.time()}).encode()
                atomic_write(self._kept_marker(path), marker, fsync=self._fsync)
        finally:
            if tmp is not None:
                remove_quietly(tmp)
        return self.version(name)

    def is_kept(self, name: str) -> bool:
        """Whether policy ``name`` is kept (:meth:`keep`) and so refuses writes.

        Raises:
            UnsafePath: ``name`` is not acceptable (see :meth:`path`).
        """
        return stat_stamp(self._kept_marker(self.path(name))) is not None

    def release(self, name: str) -> bool:
        """Let policy ``name`` be written again (a new run, or a resumed one, starts).

        Returns:
            True if it was kept.

        Raises:
            UnsafePath: ``name`` is not acceptable (see :meth:`path`).
            StorageError: the lock timed out or the marker could not be removed.
        """
        path = self.path(name)
        marker = self._kept_marker(path)
        if stat_stamp(marker) is None:
            return False  # no lock file left behind for a policy never kept
        with self._locked(path):
            return unlink_if_present(marker, what="kept policy marker")

    def read(self, name: str, *, numpy: bool = False) -> PolicySnapshot | None:
        """Load policy ``name``, or return None if it has not been written yet.

        ``numpy``: the arrays as numpy arrays (no torch import), else as torch tensors.

        Raises:
            UnsafePath: ``name`` is not acceptable (see :meth:`path`).
            CorruptFile: the file is not a weights-only checkpoint of the expected form.
            StorageError: the lock timed out or the file could not be read.
        """
        path = self.path(name)
        loaded = self._load(path, numpy)
        return None if loaded is None else loaded[0]

    def read_if_changed(
        self, name: str, last_stamp: FileStamp | None, *, numpy: bool = False
    ) -> tuple[PolicySnapshot | None, FileStamp | None]:
        """Load policy ``name`` only if it changed since ``last_stamp`` (``numpy``: as for :meth:`read`).

        Collectors poll every ``update_policy_second`` (10 ms to a second); comparing
        (mtime, size, inode) costs one ``stat`` where a load costs a read and a copy of every
        tensor. Every publish is a rename of a new file, so the inode alone changes on each write.

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
        loaded = self._load(path, numpy)
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

    def _publish(self, path: Path, body: bytes) -> None:
        """Swap ``body`` in as ``path`` under its lock, unless the file is kept."""
        tmp = write_temp(path, body, fsync=self._fsync)
        try:
            with self._locked(path):
                if stat_stamp(self._kept_marker(path)) is not None:
                    raise PolicyKept(
                        f"policy {path.name!r} is kept as its run left it ({path.name}{KEPT_SUFFIX}): not replaced"
                    )
                publish_temp(tmp, path, fsync=self._fsync)
        except BaseException:
            remove_quietly(tmp)
            raise

    @staticmethod
    def _kept_marker(path: Path) -> Path:
        return path.with_name(path.name + KEPT_SUFFIX)

    def _serialize(
        self, name: str, state_dict: Mapping[str, torch.Tensor], iter: int, meta: Mapping[str, str]
    ) -> bytes:
        body = policy_bytes(state_dict, iter, meta)
        if len(body) > self._max_file_bytes:
            raise StorageError(f"policy {name!r} is {len(body)} bytes, over the limit of {self._max_file_bytes}")
        return body

    def _load(self, path: Path, numpy: bool) -> tuple[PolicySnapshot, FileStamp] | None:
        # Only the read of the bytes happens under the lock; decoding them does not
        # need it and would keep the learner waiting.
        found = self._read_bytes(path)
        if found is None:
            return None
        body, stamp = found
        return parse_policy(path, body, numpy), stamp

    def _read_bytes(self, path: Path) -> tuple[bytes, FileStamp] | None:
        if stat_stamp(path) is None:
            return None  # do not leave lock files behind for policies that never existed
        with self._locked(path):
            return read_regular_file(path, max_bytes=self._max_file_bytes)

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
