"""Path confinement, name checks, atomic writes and temp-file sweeping on the shared volume."""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

import pytest

from worker.errors import StorageError, UnsafePath
from worker.storage import atomic_write, check_data_id, resolve_under, sweep_temp_files
from worker.storage.paths import NAME_PATTERN, TEMP_PATTERN, read_regular_file, write_temp


@pytest.fixture
def root(tmp_path: Path) -> Path:
    directory = tmp_path / "root"
    directory.mkdir()
    return directory


@pytest.mark.parametrize(
    "name",
    ["", "..", "../x", "/etc/passwd", "a/../../b", "a/..", "x/../../../etc/passwd", "a\x00b", "a\\..\\b", "."],
)
def test_resolve_under_refuses_names_that_could_leave_the_root(root: Path, name: str) -> None:
    with pytest.raises(UnsafePath) as info:
        resolve_under(root, name)
    # The message names both the offending name and the root, for the logs.
    assert repr(name) in str(info.value)
    assert str(root) in str(info.value)


def test_resolve_under_refuses_non_string_names(root: Path) -> None:
    with pytest.raises(UnsafePath):
        resolve_under(root, b"x")  # type: ignore[arg-type]


def test_resolve_under_accepts_plain_and_nested_names_inside_the_root(root: Path) -> None:
    assert resolve_under(root, "a") == root.resolve() / "a"
    assert resolve_under(root, "a/b.bin") == root.resolve() / "a" / "b.bin"
    assert resolve_under(root, "./a") == root.resolve() / "a"


def test_resolve_under_refuses_a_symlinked_directory_pointing_outside(root: Path, tmp_path: Path) -> None:
    # Given a directory link inside the root that points outside it
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside, target_is_directory=True)
    # Then a name through that link is refused, even for a file that does not exist yet
    with pytest.raises(UnsafePath, match="escape"):
        resolve_under(root, "escape/new-file")


def test_resolve_under_refuses_a_file_symlink_to_etc_passwd(root: Path) -> None:
    (root / "innocent").symlink_to("/etc/passwd")
    with pytest.raises(UnsafePath, match="innocent"):
        resolve_under(root, "innocent")


def test_resolve_under_follows_a_symlink_that_stays_inside(root: Path) -> None:
    (root / "real").write_bytes(b"x")
    (root / "alias").symlink_to(root / "real")
    assert resolve_under(root, "alias") == (root / "real").resolve()


def test_resolve_under_works_when_the_root_itself_is_a_symlink(tmp_path: Path) -> None:
    # Volumes are often mounted behind a link; confinement compares real paths on both sides.
    real = tmp_path / "real-root"
    real.mkdir()
    link = tmp_path / "link-root"
    link.symlink_to(real, target_is_directory=True)
    assert resolve_under(link, "file") == real.resolve() / "file"


@pytest.mark.parametrize("data_id", ["a", "A9", "run-1_chunk.0003", "x" * 200, "a..b"])
def test_check_data_id_accepts_plain_names(data_id: str) -> None:
    assert check_data_id(data_id) == data_id


@pytest.mark.parametrize(
    "data_id", ["", ".hidden", "-x", "_x", "a/b", "..", "x" * 201, "a b", "a\n", "a\x00", "é", 5, None]
)
def test_check_data_id_refuses_anything_else(data_id: object) -> None:
    with pytest.raises(UnsafePath, match="data_id"):
        check_data_id(data_id)


def test_atomic_write_creates_and_replaces_without_leaving_temp_files(root: Path) -> None:
    target = root / "file.bin"
    atomic_write(target, b"first", fsync=True)
    atomic_write(target, memoryview(b"second version"), fsync=False)
    assert target.read_bytes() == b"second version"
    assert sorted(os.listdir(root)) == ["file.bin"]


def test_atomic_write_removes_its_temp_file_when_the_rename_fails(root: Path) -> None:
    # Given a non-empty directory under the final name, so os.replace must fail
    target = root / "taken"
    target.mkdir()
    (target / "inside").write_bytes(b"")
    # When writing to it
    with pytest.raises(StorageError, match="taken"):
        atomic_write(target, b"data", fsync=False)
    # Then nothing but the directory is left
    assert os.listdir(root) == ["taken"]


def test_atomic_write_into_a_missing_directory_is_a_storage_error(root: Path) -> None:
    with pytest.raises(StorageError, match="temp file"):
        atomic_write(root / "missing" / "file", b"data", fsync=False)


def test_temp_files_are_hidden_and_recognisable(root: Path) -> None:
    tmp = write_temp(root / ("n" * 300)[:200], b"x", fsync=False)
    assert tmp.name.startswith(".")
    assert ".tmp" in tmp.name
    assert TEMP_PATTERN.fullmatch(tmp.name)
    # Neither a shell-style glob nor the name rule for final names matches it.
    assert glob.glob(str(root / "*")) == []
    assert NAME_PATTERN.fullmatch(tmp.name) is None
    assert len(tmp.name) < 255


def test_sweep_removes_only_stale_temp_files(root: Path) -> None:
    # Given one stale temp file, one fresh temp file, a data file and a look-alike
    stale = write_temp(root / "chunk-1", b"x", fsync=False)
    old = time.time() - 3600
    os.utime(stale, (old, old))
    fresh = write_temp(root / "chunk-2", b"x", fsync=False)
    (root / "chunk-3").write_bytes(b"data")
    lookalike = root / ".notes.tmp"
    lookalike.write_bytes(b"")
    os.utime(lookalike, (old, old))
    # When sweeping files older than a minute
    removed = sweep_temp_files(root, older_than_s=60)
    # Then only the stale temp file is gone
    assert removed == 1
    assert not stale.exists()
    assert fresh.exists()
    assert (root / "chunk-3").exists()
    assert lookalike.exists()


def test_sweep_of_a_missing_directory_removes_nothing(tmp_path: Path) -> None:
    assert sweep_temp_files(tmp_path / "nope", older_than_s=0) == 0


def test_read_regular_file_refuses_a_fifo_without_blocking(root: Path) -> None:
    fifo = root / "pipe"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(StorageError, match="not a regular file"):
        read_regular_file(fifo, max_bytes=10)
    assert time.monotonic() - started < 1.0


def test_read_regular_file_refuses_a_final_symlink(root: Path) -> None:
    # resolve_under returned a real path; a link found there later was swapped in.
    (root / "real").write_bytes(b"x")
    (root / "link").symlink_to(root / "real")
    with pytest.raises(UnsafePath, match="symbolic link"):
        read_regular_file(root / "link", max_bytes=10)


def test_read_regular_file_returns_none_for_a_missing_file(root: Path) -> None:
    assert read_regular_file(root / "absent", max_bytes=10) is None
