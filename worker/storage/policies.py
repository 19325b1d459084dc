"""Policy files: the weights a learner publishes for collectors, as safetensors with a small header.

The learner rewrites a policy file every few updates and collectors re-read it every
second or so, so a write goes to a temp file first and only the rename onto the final
name happens under a :class:`filelock.FileLock` on ``<name>.lock``; readers take the
same lock while they read the bytes.

The format is safetensors (``docs/protocol.md`` section 6): a JSON header naming each
tensor's dtype, shape and offsets, then the raw bytes, and a ``__metadata__`` map of
strings: ``warren.format``, ``policy_version`` and what the writer adds (the algorithm
and model with their versions, the digest of the spaces). Reading one parses JSON and
copies bytes; nothing in it can run code, unlike a pickle. A file holding NaN or
infinite weights is refused as corrupt: a collector keeps the policy it has.

torch is imported inside the functions that need it: it costs seconds to import and
processes that only move step data never pay for it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
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
#: ``warren.format`` of the policy files this version writes and reads.
POLICY_FORMAT: Final = "1"
#: Longest safetensors header accepted (names, shapes and metadata of every tensor).
_MAX_HEADER_BYTES: Final = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True, eq=False)
class PolicySnapshot:
    """One policy as loaded: CPU tensors (or numpy arrays) keyed as ``Module.state_dict()``, its version, its header."""

    state_dict: dict[str, Any]
    iter: int
    """The policy version (the learner's update count) that produced the weights."""
    meta: dict[str, str] = field(default_factory=dict)
    """The header's metadata: ``algorithm``, ``model``, ``spaces_digest``... (see :meth:`PolicyStore.write`)."""


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
            StorageError: the file is too large, writing failed, or the lock timed out.
        """
        path = self.path(name)
        body = self._serialize(name, state_dict, iter, meta or {})
        tmp = write_temp(path, body, fsync=self._fsync)
        try:
            with self._locked(path):
                publish_temp(tmp, path, fsync=self._fsync)
        except BaseException:
            remove_quietly(tmp)
            raise
        return path

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

    def _serialize(
        self, name: str, state_dict: Mapping[str, torch.Tensor], iter: int, meta: Mapping[str, str]
    ) -> bytes:
        from safetensors.torch import save

        header = {str(k): str(v) for k, v in meta.items()}
        header.update({"warren.format": POLICY_FORMAT, "policy_version": str(_check_iter(iter))})
        body: bytes = save(_cpu_copy(state_dict), metadata=header)
        if len(body) > self._max_file_bytes:
            raise StorageError(f"policy {name!r} is {len(body)} bytes, over the limit of {self._max_file_bytes}")
        return body

    def _load(self, path: Path, numpy: bool) -> tuple[PolicySnapshot, FileStamp] | None:
        # Only the read of the bytes happens under the lock; decoding them does not
        # need it and would keep the learner waiting.
        if stat_stamp(path) is None:
            return None  # do not leave lock files behind for policies that never existed
        with self._locked(path):
            found = read_regular_file(path, max_bytes=self._max_file_bytes)
        if found is None:
            return None
        body, stamp = found
        return _parse_policy(path, body, numpy), stamp

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
        copy[key] = value.detach().to("cpu", copy=True).contiguous()
    return copy


def _check_iter(iter: int) -> int:
    if type(iter) is not int:
        raise TypeError(f"iter must be an int, got {type(iter).__name__}")
    if iter < 0:
        raise ValueError(f"iter must be >= 0, got {iter}")
    return iter


def _parse_policy(path: Path, body: bytes, numpy: bool) -> PolicySnapshot:
    from safetensors import SafetensorError

    where = f"policy file {str(path)!r}"
    meta = _header_metadata(where, body)
    if meta.get("warren.format") != POLICY_FORMAT:
        raise CorruptFile(
            f"{where} is not a warren policy (warren.format {meta.get('warren.format')!r}, this warren reads "
            f"{POLICY_FORMAT!r}): written by another version, or not by a warren learner"
        )
    version = meta.get("policy_version", "")
    if not version.isdigit() or int(version) >= 2**63:
        raise CorruptFile(f"{where} has policy_version {version!r}, not an integer in 0..2**63-1")
    try:
        tensors = _load_numpy(body) if numpy else _load_torch(body)
    except SafetensorError as exc:
        raise CorruptFile(f"{where} is not a valid safetensors file ({str(exc)[:_MAX_REASON_CHARS]})") from None
    except (KeyError, TypeError, ValueError) as exc:  # safetensors' numpy loader on a dtype numpy lacks (bf16, f8)
        kind = "numpy" if numpy else "torch"
        raise CorruptFile(f"{where} holds tensors {kind} cannot read ({str(exc)[:_MAX_REASON_CHARS]})") from None
    for key, tensor in tensors.items():
        if not _finite(tensor):
            raise CorruptFile(f"{where}: tensor {key!r} holds NaN or infinite values")
    return PolicySnapshot(state_dict=dict(tensors), iter=int(version), meta=meta)


def _load_torch(body: bytes) -> dict[str, Any]:
    from safetensors.torch import load as load_tensors

    return load_tensors(body)


def _load_numpy(body: bytes) -> dict[str, Any]:
    from safetensors.numpy import load as load_arrays

    return load_arrays(body)


def _finite(tensor: Any) -> bool:
    if isinstance(tensor, np.ndarray):
        return tensor.dtype.kind != "f" or bool(np.isfinite(tensor).all())
    return not tensor.is_floating_point() or bool(tensor.isfinite().all())


def _header_metadata(where: str, body: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file: 8 bytes of little-endian header length, then JSON."""
    if len(body) < 8:
        raise CorruptFile(f"{where} is {len(body)} bytes: too short for a safetensors file")
    (size,) = struct.unpack("<Q", body[:8])
    if size > min(_MAX_HEADER_BYTES, len(body) - 8):
        raise CorruptFile(f"{where} is not a safetensors file (header length {size} for {len(body)} bytes)")
    try:
        header = json.loads(body[8 : 8 + size])
    except (UnicodeDecodeError, ValueError):
        raise CorruptFile(f"{where} is not a safetensors file (its header is not JSON)") from None
    meta = header.get("__metadata__", {}) if isinstance(header, dict) else None
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise CorruptFile(f"{where}: its safetensors metadata is not a map of strings")
    return meta
