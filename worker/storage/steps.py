"""Step data files: chunks of RL samples that collectors write and learners read by ``data_id``.

A collector writes the file *before* it publishes the metadata message naming it, and
the write is atomic, so a file that is present is complete. A learner may still look
for it before a network filesystem shows it, which is why :meth:`StepStore.read` waits
a little for a missing file but never retries a present, broken one. Files are msgpack
(:mod:`messaging.codec`), never pickles: reading one cannot run code.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from messaging import codec
from messaging.errors import DecodeError, EncodeError, MessageTooLarge
from worker.errors import CorruptFile, MissingFile, StorageError
from worker.storage.paths import (
    atomic_write,
    check_data_id,
    read_regular_file,
    sweep_temp_files,
    unlink_if_present,
)

#: ``kind`` header of a step data file.
STEP_KIND: Final = "warren.samples"
#: Default cap on one step file, for writing and reading (512 MiB).
DEFAULT_MAX_FILE_BYTES: Final = 512 * 1024 * 1024
#: numpy dtype kinds the codec can store: bool, signed, unsigned, float, complex.
_STORABLE_KINDS: Final = frozenset("biufc")
#: Compressions a step file may be written with; readers recognise an lz4 frame by its magic number.
#: ``auto``: lz4 for chunks of frame stacks (they have side tables) when the lz4 package is
#: installed, none otherwise (for small vector observations it buys nothing).
COMPRESSIONS: Final = ("auto", "none", "lz4")
_LZ4_MAGIC: Final = b"\x04\x22\x4d\x18"
#: A field whose name holds this is a side table (``obs@heads``): its rows are not steps.
SIDE_TABLE: Final = "@"
#: A field whose name starts with this holds an actor's recurrent state at the chunk's first step
#: (``state.pi.h``, ``[N, ...]``): its rows are envs, not steps.
STATE_FIELD: Final = "state."
#: First and largest pause while waiting for a missing file.
_FIRST_WAIT_S: Final = 0.01
_MAX_WAIT_S: Final = 0.5


@dataclass(frozen=True, slots=True, eq=False)
class SampleChunk:
    """One step data file as read back.

    ``fields`` maps a field name to an array whose leading dimension is ``count`` (the steps
    ``T``), or ``count + 1`` (observations: the one after the last step closes the chunk), or
    anything for a side table (a name with ``@``: the heads of frame stacks). The
    arrays are read-only views of the file's bytes: copy one before changing it.
    """

    data_id: str
    count: int
    fields: dict[str, NDArray[Any]]
    meta: dict[str, Any]
    nbytes: int = 0
    """Size of the file."""


class StepStore:
    """Step data files under one directory (``path_data``), named by their ``data_id``.

    Args:
        root: the shared directory; created if missing.
        fsync: flush every file and rename to stable storage (survives host crashes).
        max_file_bytes: largest file written or accepted when reading.
    """

    def __init__(
        self,
        root: Path,
        *,
        fsync: bool = False,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        compression: str = "auto",
    ) -> None:
        if max_file_bytes <= 0:
            raise ValueError(f"max_file_bytes must be positive, got {max_file_bytes}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {list(COMPRESSIONS)}, got {compression!r}")
        if compression == "lz4":
            _lz4_frame()  # fail at start, not at the first chunk
        if compression == "auto":
            compression = "frames" if importlib.util.find_spec("lz4") is not None else "none"
        self._compression = compression
        self._root = Path(root)
        self._fsync = fsync
        self._max_file_bytes = max_file_bytes
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create step data directory {str(self._root)!r}: {exc}") from exc
        self._real_root = Path(os.path.realpath(self._root))

    @property
    def root(self) -> Path:
        """The directory holding the step files."""
        return self._root

    def path(self, data_id: str) -> Path:
        """Return the confined path of ``data_id``'s file.

        Raises:
            UnsafePath: ``data_id`` is not a plain name or would leave the root.
        """
        name = check_data_id(data_id)
        # A data_id is one plain name (no separator, no ".."), so it cannot leave the real
        # root; a symlink planted under the name is refused when opened (O_NOFOLLOW) and
        # replaced, not followed, when written. Resolving the root once saves two
        # realpath() calls per file, half the cost of reading a small one.
        return self._real_root / name

    def write(self, data_id: str, samples: Mapping[str, NDArray[Any]], meta: Mapping[str, Any] | None = None) -> Path:
        """Atomically write one chunk of samples; publish its ``data_id`` only after this returns.

        An existing file of the same ``data_id`` is replaced, so a redelivered task can
        write its chunk again.

        Args:
            data_id: name of the file, shared with readers through a message.
            samples: field name -> array; all arrays share a leading dimension >= 1.
            meta: small msgpack-able extras stored next to the arrays.

        Returns:
            The path of the written file.

        Raises:
            UnsafePath: ``data_id`` is not a plain name.
            TypeError, ValueError: ``samples`` or ``meta`` cannot be stored.
            StorageError: the file would exceed ``max_file_bytes`` or writing failed.
        """
        path = self.path(data_id)
        count = _validate_samples(samples)
        document = {
            "schema": codec.SCHEMA_VERSION,
            "kind": STEP_KIND,
            "data_id": data_id,
            "count": count,
            "fields": dict(samples),
            "meta": dict(meta or {}),
        }
        body = self._encode(data_id, document)
        frames = self._compression == "frames" and any(SIDE_TABLE in name for name in samples)
        if self._compression == "lz4" or frames:
            body = _lz4_frame().compress(body)
        atomic_write(path, body, fsync=self._fsync)
        return path

    def read(self, data_id: str, *, wait_s: float = 5.0) -> SampleChunk:
        """Read the chunk named ``data_id``, waiting up to ``wait_s`` seconds for it to appear.

        The same file can be read any number of times until it is deleted.

        Raises:
            UnsafePath: ``data_id`` is not a plain name or would leave the root.
            MissingFile: no file appeared within ``wait_s``.
            CorruptFile: the file is not a valid chunk for ``data_id`` (never retried:
                writes are atomic, so a present file is complete).
            StorageError: any other I/O error.
        """
        path = self.path(data_id)
        body = self._wait_for(path, data_id, wait_s)
        return _parse_chunk(path, data_id, body, self._max_file_bytes)

    def delete(self, data_id: str) -> bool:
        """Delete ``data_id``'s file; deleting a missing file is fine.

        Returns:
            True if a file was removed, False if there was none.

        Raises:
            UnsafePath: ``data_id`` is not a plain name or would leave the root.
            StorageError: the file exists but could not be removed.
        """
        return unlink_if_present(self.path(data_id), what="step file")

    def sweep_temp(self, older_than_s: float) -> int:
        """Remove temp files that crashed writers left behind, if older than ``older_than_s``.

        Returns:
            How many files were removed.
        """
        return sweep_temp_files(self._root, older_than_s=older_than_s)

    def _encode(self, data_id: str, document: dict[str, Any]) -> bytes:
        try:
            return codec.encode(document, max_bytes=self._max_file_bytes)
        except MessageTooLarge as exc:
            raise StorageError(f"step data {data_id!r} is too large: {exc.message}") from None
        except EncodeError as exc:
            raise TypeError(f"cannot store step data {data_id!r}: {exc.message}") from None

    def _wait_for(self, path: Path, data_id: str, wait_s: float) -> bytes:
        # Polling is the only portable way to wait for a file on a shared volume (no
        # inotify over NFS); the pauses grow so a long wait costs few syscalls.
        deadline = time.monotonic() + wait_s
        pause = _FIRST_WAIT_S
        while True:
            found = read_regular_file(path, max_bytes=self._max_file_bytes)
            if found is not None:
                return found[0]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MissingFile(f"step file {data_id!r} not found in {str(self._root)!r} after {wait_s} s")
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, _MAX_WAIT_S)


def _validate_samples(samples: Mapping[str, NDArray[Any]]) -> int:
    if not isinstance(samples, Mapping) or not samples:
        raise ValueError("samples must be a non-empty mapping of field name -> array")
    counts: set[int] = set()
    for name, array in samples.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"sample field names must be non-empty strings, got {name!r}")
        if not isinstance(array, np.ndarray):
            raise TypeError(f"sample field {name!r} must be a numpy array, got {type(array).__name__}")
        if array.dtype.kind not in _STORABLE_KINDS or array.dtype.fields is not None:
            raise TypeError(f"sample field {name!r} has dtype {array.dtype}: only numeric and bool")
        if array.ndim == 0 or array.shape[0] == 0:
            raise ValueError(f"sample field {name!r} has shape {array.shape}: needs a leading dimension >= 1")
        if SIDE_TABLE not in name and not name.startswith(STATE_FIELD):
            counts.add(int(array.shape[0]))  # side tables and the actor's state are not rows of steps
    if not counts:
        raise ValueError("samples hold side tables only, no field of steps")
    # T steps, and T + 1 rows for observations (the one after the last step closes the chunk).
    if len(counts) > 2 or max(counts) - min(counts) > 1:
        shapes = {name: array.shape for name, array in samples.items()}
        raise ValueError(f"sample fields disagree on the leading dimension (T or T + 1): {shapes}")
    return min(counts)


def _lz4_frame() -> Any:
    try:
        import lz4.frame
    except ImportError:
        raise StorageError("lz4 step files need the lz4 package (pip install 'warren[atari]')") from None
    return lz4.frame


def _decompressed(path: Path, body: bytes, max_bytes: int) -> bytes:
    """``body`` itself, or what its lz4 frame holds (at most ``max_bytes``: no decompression bomb)."""
    if not body.startswith(_LZ4_MAGIC):
        return body
    try:
        decompressor = _lz4_frame().LZ4FrameDecompressor()
        out: bytes = decompressor.decompress(body, max_length=max_bytes)
    except StorageError as exc:
        raise CorruptFile(f"step file {str(path)!r} is lz4-compressed: {exc.message}") from None
    except RuntimeError as exc:
        raise CorruptFile(f"step file {str(path)!r} is not a valid lz4 frame: {exc}") from None
    if not decompressor.eof:
        raise CorruptFile(f"step file {str(path)!r} decompresses to more than {max_bytes} bytes, or is cut short")
    return out


def _parse_chunk(path: Path, data_id: str, body: bytes, max_bytes: int) -> SampleChunk:
    nbytes = len(body)
    body = _decompressed(path, body, max_bytes)
    try:
        document = codec.decode(body, max_bytes=max_bytes)
    except DecodeError as exc:
        raise CorruptFile(f"step file {str(path)!r} is not valid msgpack: {exc.message}") from None
    problem = _document_problem(document, data_id)
    if problem is not None:
        raise CorruptFile(f"step file {str(path)!r} is not a valid chunk: {problem}")
    return SampleChunk(data_id, document["count"], dict(document["fields"]), dict(document["meta"]), nbytes)


def _document_problem(document: Any, data_id: str) -> str | None:
    if not isinstance(document, dict):
        return f"top level is {type(document).__name__}, not a map"
    if document.get("kind") != STEP_KIND:
        return f"kind is {document.get('kind')!r}, expected {STEP_KIND!r}"
    if document.get("schema") != codec.SCHEMA_VERSION:
        return f"schema is {document.get('schema')!r}, expected {codec.SCHEMA_VERSION}"
    if document.get("data_id") != data_id:
        return f"it holds data_id {document.get('data_id')!r}, not {data_id!r}"
    if not isinstance(document.get("meta"), dict):
        return "meta is not a map"
    return _fields_problem(document.get("fields"), document.get("count"))


def _fields_problem(fields: Any, count: Any) -> str | None:
    if type(count) is not int or count < 1:
        return f"count is {count!r}, not a positive integer"
    if not isinstance(fields, dict) or not fields:
        return "fields is not a non-empty map"
    for name, array in fields.items():
        if not isinstance(name, str):
            return f"field name {name!r} is not a string"
        if not isinstance(array, np.ndarray) or array.ndim == 0:
            return f"field {name!r} is {type(array).__name__}, not an array with a leading dimension"
        if SIDE_TABLE not in name and not name.startswith(STATE_FIELD) and array.shape[0] not in (count, count + 1):
            return f"field {name!r} has shape {array.shape}, but count is {count} (rows must be count or count + 1)"
    return None
