"""Confined paths and atomic files on the shared volume.

Names of files on the shared volume arrive in messages, so they are untrusted:
:func:`resolve_under` keeps them inside their root, even through symbolic links.
Files are only ever published whole: writers fill a hidden temp file in the target's
directory and ``os.replace`` it onto the final name (DI-engine wrote step files in
place, so readers could see half of one). Temp names start with ``.`` and end with
``.<16 hex>.tmp``: a listing or glob for final names never matches them, and
:func:`sweep_temp_files` can recognise those left behind by crashed writers.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import stat
import time
from contextlib import suppress
from pathlib import Path, PurePosixPath
from typing import Final, NamedTuple

from worker.errors import CorruptFile, StorageError, UnsafePath

log = logging.getLogger(__name__)

#: Allowed shape of a ``data_id`` (and of a policy name): one plain path component.
NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
#: Temp files written by :func:`write_temp`: ``.<name prefix>.<16 hex>.tmp``.
TEMP_PATTERN: Final = re.compile(r"\..*\.[0-9a-f]{16}\.tmp")
#: Only this much of the final name goes into a temp name, to stay under NAME_MAX (255).
_TEMP_NAME_PREFIX_CHARS: Final = 64
#: Mode of new files before the umask; the volume is shared between users and containers.
_FILE_MODE: Final = 0o644
#: Errors of ``fsync`` on a directory that only mean "this filesystem cannot do it".
_DIR_FSYNC_UNSUPPORTED: Final = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EBADF})


class FileStamp(NamedTuple):
    """Identity of one version of a file: any rewrite through ``os.replace`` changes it."""

    mtime_ns: int
    size: int
    inode: int


def check_name(name: object, *, what: str = "data_id") -> str:
    """Check that ``name`` is a safe single file name and return it.

    Only ``[A-Za-z0-9][A-Za-z0-9_.-]{0,199}`` is accepted: no separators, no leading dot
    (reserved for temp files), nothing a shell or another filesystem could misread.

    Raises:
        UnsafePath: ``name`` is not a string of that form.
    """
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise UnsafePath(f"invalid {what} {name!r}: expected [A-Za-z0-9][A-Za-z0-9_.-]{{0,199}}")
    return name


def check_data_id(data_id: object) -> str:
    """Check a ``data_id`` taken from a message and return it (see :func:`check_name`).

    Raises:
        UnsafePath: ``data_id`` could name anything but one plain file.
    """
    return check_name(data_id, what="data_id")


def resolve_under(root: Path, name: str) -> Path:
    """Resolve ``name`` relative to ``root``, refusing anything that would leave ``root``.

    The check runs on real paths, so a symbolic link inside ``root`` that points outside
    is refused too. The returned path is the resolved one: what was checked is what
    gets opened.

    Raises:
        UnsafePath: ``name`` is empty, absolute, contains ``..``, a NUL byte or a
            backslash, names ``root`` itself, or resolves outside ``root``.
    """
    reason = _lexical_problem(name)
    if reason is not None:
        raise UnsafePath(f"unsafe name {name!r} under {str(root)!r}: {reason}")
    real_root = Path(os.path.realpath(root))
    # realpath follows every link that exists; a loop is left unresolved and fails on open.
    resolved = Path(os.path.realpath(real_root / name))
    if resolved == real_root or not resolved.is_relative_to(real_root):
        raise UnsafePath(f"unsafe name {name!r} under {str(root)!r}: resolves to {str(resolved)!r}")
    return resolved


def _lexical_problem(name: object) -> str | None:
    if not isinstance(name, str):
        return f"expected a string, got {type(name).__name__}"
    if not name:
        return "empty name"
    if "\x00" in name:
        return "contains a NUL byte"
    # A backslash is a separator for Windows clients of the same share: refuse the ambiguity.
    if "\\" in name:
        return "contains a backslash"
    if PurePosixPath(name).is_absolute():
        return "absolute path"
    if ".." in PurePosixPath(name).parts:
        return "contains a '..' component"
    return None


def write_temp(path: Path, data: bytes | memoryview, *, fsync: bool) -> Path:
    """Write ``data`` to a new hidden temp file next to ``path`` and return its path.

    The temp file lives in ``path``'s directory so that the later ``os.replace`` is a
    rename within one filesystem, which is atomic. It is removed if writing fails.

    Raises:
        StorageError: the file could not be created or written.
    """
    prefix = path.name[:_TEMP_NAME_PREFIX_CHARS]
    tmp = path.with_name(f".{prefix}.{secrets.token_hex(8)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
    except OSError as exc:
        raise StorageError(f"cannot create a temp file for {str(path)!r}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
    except OSError as exc:
        remove_quietly(tmp)
        raise StorageError(f"cannot write {str(path)!r}: {exc}") from exc
    except BaseException:
        remove_quietly(tmp)
        raise
    return tmp


def publish_temp(tmp: Path, path: Path, *, fsync: bool) -> None:
    """Atomically move the temp file ``tmp`` onto ``path``; ``tmp`` is removed on failure.

    With ``fsync`` the directory is synced too, so the rename itself survives a crash.

    Raises:
        StorageError: the rename failed (``path`` is a directory, permissions...).
    """
    try:
        os.replace(tmp, path)
    except OSError as exc:
        remove_quietly(tmp)
        raise StorageError(f"cannot publish {str(path)!r}: {exc}") from exc
    if fsync:
        _fsync_directory(path.parent)


def atomic_write(path: Path, data: bytes | memoryview, *, fsync: bool) -> None:
    """Write ``data`` to ``path`` so that readers see either the old or the new file whole.

    Args:
        path: final name; its directory must exist.
        data: the complete file content.
        fsync: also flush the file and its directory to stable storage (slower; needed
            only if the data must survive a host crash, not a process crash).

    Raises:
        StorageError: the write or the rename failed; no temp file is left behind.
    """
    tmp = write_temp(path, data, fsync=fsync)
    try:
        publish_temp(tmp, path, fsync=fsync)
    except BaseException:
        remove_quietly(tmp)
        raise


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise StorageError(f"cannot open {str(directory)!r} to sync it: {exc}") from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some network filesystems refuse fsync on directories; their renames are then
        # as durable as they will ever be.
        if exc.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise StorageError(f"cannot sync {str(directory)!r}: {exc}") from exc
    finally:
        os.close(fd)


def remove_quietly(path: Path) -> None:
    """Remove ``path`` if it exists; used for cleanup, where a second error would hide the first."""
    with suppress(OSError):
        os.unlink(path)


def unlink_if_present(path: Path, *, what: str) -> bool:
    """Delete ``path``; False if it was already gone.

    Raises:
        StorageError: the file exists but could not be removed (``what`` names it).
    """
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StorageError(f"cannot delete {what} {str(path)!r}: {exc}") from exc
    return True


def read_regular_file(path: Path, *, max_bytes: int) -> tuple[bytes, FileStamp] | None:
    """Read a whole regular file of at most ``max_bytes``, or return None if it is missing.

    The final component is opened without following links (it was resolved already, so
    a link there now was swapped in after the check) and without blocking (a FIFO
    planted under the name must not hang the reader).

    Returns:
        The content and the stamp of the very file that was read, or None.

    Raises:
        UnsafePath: the name is now a symbolic link.
        CorruptFile: the name is not a regular file, or is larger than ``max_bytes``.
        StorageError: any other I/O error.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{str(path)!r} became a symbolic link") from None
        raise StorageError(f"cannot open {str(path)!r}: {exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptFile(f"{str(path)!r} is not a regular file")
        if info.st_size > max_bytes:
            raise CorruptFile(f"{str(path)!r} is {info.st_size} bytes, over the limit of {max_bytes}")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            # Size the read to the file: a hint of max_bytes would allocate that much per read.
            data = handle.read(min(info.st_size, max_bytes) + 1)
            if len(data) > info.st_size:  # it grew since fstat: read on, up to the limit
                data += handle.read(max_bytes + 1 - len(data))
    except OSError as exc:
        raise StorageError(f"cannot read {str(path)!r}: {exc}") from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise CorruptFile(f"{str(path)!r} grew over the limit of {max_bytes} bytes while being read")
    return data, FileStamp(info.st_mtime_ns, info.st_size, info.st_ino)


def stat_stamp(path: Path) -> FileStamp | None:
    """Return the stamp of ``path`` (not following a final link), or None if it is missing.

    Raises:
        StorageError: the file exists but cannot be examined.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"cannot stat {str(path)!r}: {exc}") from exc
    return FileStamp(info.st_mtime_ns, info.st_size, info.st_ino)


#: A temp file untouched for this long belongs to a writer that died mid-write: any live
#: write (even of a 500 MB chunk to a slow network volume) finishes far sooner.
STALE_TEMP_S: Final = 600.0


def sweep_temp_files(directory: Path, *, older_than_s: float) -> int:
    """Remove temp files in ``directory`` not modified for ``older_than_s`` seconds.

    Only names of the :data:`TEMP_PATTERN` form are touched, and only regular files.
    Ages come from the file's mtime, i.e. the clock of the host that wrote it: keep
    ``older_than_s`` well above both the longest write and any clock skew.

    Returns:
        How many files were removed (files removed concurrently by others are not counted).

    Raises:
        StorageError: ``directory`` cannot be listed.
    """
    cutoff = time.time() - older_than_s
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise StorageError(f"cannot list {str(directory)!r}: {exc}") from exc
    for entry in entries:
        if TEMP_PATTERN.fullmatch(entry.name) is not None and _remove_if_stale(entry, cutoff):
            removed += 1
    return removed


def _remove_if_stale(entry: os.DirEntry[str], cutoff: float) -> bool:
    try:
        if not entry.is_file(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_mtime >= cutoff:
            return False
        os.unlink(entry.path)
    except FileNotFoundError:
        return False  # another sweeper, or the writer publishing it just now
    except OSError as exc:
        # Best effort: one unremovable file must not stop the sweep of the others.
        log.warning("cannot remove stale temp file %r: %s", entry.path, exc)
        return False
    return True
