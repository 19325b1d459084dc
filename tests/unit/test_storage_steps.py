"""StepStore: round trips, atomicity under a concurrent reader, and hostile or broken files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.typing import NDArray

from messaging import codec
from worker.errors import CorruptFile, MissingFile, StorageError, UnsafePath
from worker.storage import STEP_KIND, StepStore
from worker.storage.steps import SIDE_TABLE

REPO_ROOT = Path(__file__).resolve().parents[2]
DTYPES = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_, np.float16, np.complex64]


@pytest.fixture
def store(tmp_path: Path) -> StepStore:
    return StepStore(tmp_path / "data")


def make_chunk(k: int = 3, fill: float = 0.0) -> dict[str, NDArray[Any]]:
    return {
        "obs": np.full((k, 4), fill, dtype=np.float32),
        "action": np.arange(k, dtype=np.int64),
        "reward": np.full(k, fill, dtype=np.float32),
        "done": np.zeros(k, dtype=bool),
        "truncated": np.ones(k, dtype=bool),
        "next_obs": np.full((k, 4), fill + 1, dtype=np.float32),
    }


def write_document(store: StepStore, name: str, /, **overrides: Any) -> None:
    """Write step file ``name`` by hand, with some header or body fields changed."""
    document: dict[str, Any] = {
        "schema": codec.SCHEMA_VERSION,
        "kind": STEP_KIND,
        "data_id": name,
        "count": 2,
        "fields": {"obs": np.zeros((2, 4), np.float32), "reward": np.zeros(2, np.float32)},
        "meta": {},
    }
    document.update(overrides)
    (store.root / name).write_bytes(codec.encode(document))


@st.composite
def sample_chunks(draw: st.DrawFn) -> dict[str, NDArray[Any]]:
    count = draw(st.integers(min_value=1, max_value=16))
    # Field names of steps: a name with the side-table marker ("@") is a side table (frame stacks' heads).
    step_name = st.text(min_size=1, max_size=12).filter(lambda name: SIDE_TABLE not in name)
    names = draw(st.lists(step_name, min_size=1, max_size=5, unique=True))
    chunk: dict[str, NDArray[Any]] = {}
    for name in names:
        dtype = draw(st.sampled_from(DTYPES))
        tail = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3))
        chunk[name] = draw(hnp.arrays(dtype, (count, *tail)))
    return chunk


META_VALUES = st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.text(max_size=8) | st.booleans()


@settings(max_examples=50, deadline=None)
@given(chunk=sample_chunks(), meta=st.dictionaries(st.text(max_size=8), META_VALUES, max_size=3))
def test_chunks_of_any_dtype_and_shape_round_trip(chunk: dict[str, NDArray[Any]], meta: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        store = StepStore(Path(directory))
        path = store.write("chunk-1", chunk, meta)
        read = store.read("chunk-1", wait_s=0)
    assert path.name == "chunk-1"
    assert read.data_id == "chunk-1"
    assert read.count == next(iter(chunk.values())).shape[0]
    assert read.meta == meta
    assert read.fields.keys() == chunk.keys()
    for name, array in chunk.items():
        assert read.fields[name].dtype == array.dtype
        np.testing.assert_array_equal(read.fields[name], array)  # NaNs compare equal here


def test_write_leaves_only_the_final_file_and_can_be_read_many_times(store: StepStore) -> None:
    store.write("c1", make_chunk(5, fill=2.0), {"policy_iter": 7})
    assert os.listdir(store.root) == ["c1"]
    first, second = store.read("c1"), store.read("c1")
    assert first.count == second.count == 5
    assert first.meta == {"policy_iter": 7}
    np.testing.assert_array_equal(second.fields["next_obs"], np.full((5, 4), 3.0, np.float32))


def test_write_replaces_an_earlier_chunk_of_the_same_id(store: StepStore) -> None:
    store.write("c1", make_chunk(2))
    store.write("c1", make_chunk(4))
    assert store.read("c1").count == 4


def test_root_is_created_with_its_parents(tmp_path: Path) -> None:
    store = StepStore(tmp_path / "a" / "b" / "data")
    assert store.root.is_dir()


@pytest.mark.parametrize(
    ("samples", "error"),
    [
        ({}, ValueError),
        ({"obs": np.zeros((0, 4))}, ValueError),
        ({"obs": np.float32(1.0)}, TypeError),
        ({"obs": np.zeros(())}, ValueError),
        ({"obs": [1, 2]}, TypeError),
        ({"obs": np.zeros(3), "reward": np.zeros(5)}, ValueError),  # neither T nor T + 1 rows
        ({"obs": np.zeros(3), "reward": np.zeros(4), "done": np.zeros(5)}, ValueError),
        ({"obs": np.array(["a", "b"])}, TypeError),
        ({"obs": np.array([object(), object()])}, TypeError),
        ({1: np.zeros(3)}, TypeError),
    ],
)
def test_write_refuses_malformed_samples(store: StepStore, samples: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        store.write("c1", samples)
    assert os.listdir(store.root) == []


def test_observations_may_have_one_row_more_than_the_steps(store: StepStore) -> None:
    # Given a chunk of 3 steps whose observations close with the one after the last step
    samples: dict[str, NDArray[Any]] = {
        "obs": np.arange(16, dtype=np.float32).reshape(4, 4),
        "action": np.arange(3, dtype=np.int64),
    }
    # When it is written and read back
    store.write("c1", samples)
    chunk = store.read("c1", wait_s=0)
    # Then its count is the steps, and the T + 1 observations come back whole
    assert chunk.count == 3
    np.testing.assert_array_equal(chunk.fields["obs"], samples["obs"])


def test_write_refuses_meta_the_codec_cannot_store(store: StepStore) -> None:
    with pytest.raises(TypeError, match="c1"):
        store.write("c1", make_chunk(), {"callback": print})
    assert os.listdir(store.root) == []


def test_write_refuses_chunks_over_the_size_limit(tmp_path: Path) -> None:
    store = StepStore(tmp_path, max_file_bytes=1024)
    with pytest.raises(StorageError, match="too large"):
        store.write("big", {"obs": np.zeros(1024, np.float32)})
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("data_id", ["../escape", "/etc/passwd", "a/../../b", "a\x00", ".hidden", ""])
def test_every_operation_refuses_unsafe_ids(store: StepStore, data_id: str) -> None:
    with pytest.raises(UnsafePath):
        store.write(data_id, make_chunk())
    with pytest.raises(UnsafePath):
        store.read(data_id, wait_s=0)
    with pytest.raises(UnsafePath):
        store.delete(data_id)


def test_read_refuses_a_step_file_symlinked_outside_the_root(store: StepStore, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"top secret")
    (store.root / "chunk").symlink_to(secret)
    with pytest.raises(UnsafePath, match="chunk"):
        store.read("chunk", wait_s=0)


def test_missing_file_raises_after_roughly_the_wait(store: StepStore) -> None:
    started = time.monotonic()
    with pytest.raises(MissingFile, match="ghost"):
        store.read("ghost", wait_s=0.3)
    elapsed = time.monotonic() - started
    assert 0.29 <= elapsed < 1.5


def test_read_picks_up_a_file_that_appears_during_the_wait(store: StepStore) -> None:
    # Given a writer that publishes the chunk a moment after the reader starts waiting
    timer = threading.Timer(0.2, store.write, args=("late", make_chunk(3)))
    timer.start()
    try:
        chunk = store.read("late", wait_s=5.0)
    finally:
        timer.join()
    assert chunk.count == 3


def test_random_bytes_are_a_corrupt_file_not_a_retry(store: StepStore) -> None:
    (store.root / "junk").write_bytes(os.urandom(4096))
    started = time.monotonic()
    with pytest.raises(CorruptFile, match="junk"):
        store.read("junk", wait_s=5.0)
    assert time.monotonic() - started < 1.0  # corrupt files are not waited on


def test_a_truncated_file_is_corrupt(store: StepStore) -> None:
    path = store.write("cut", make_chunk(8))
    body = path.read_bytes()
    path.write_bytes(body[: len(body) // 2])
    with pytest.raises(CorruptFile, match="cut"):
        store.read("cut", wait_s=0)


def test_an_empty_file_is_corrupt(store: StepStore) -> None:
    (store.root / "empty").write_bytes(b"")
    with pytest.raises(CorruptFile, match="empty"):
        store.read("empty", wait_s=0)


def test_a_torch_pickle_where_step_data_belongs_is_corrupt(store: StepStore) -> None:
    # The seed's format: must be refused, never unpickled.
    (store.root / "legacy").write_bytes(b"\x80\x02}q\x00.")
    with pytest.raises(CorruptFile, match="legacy"):
        store.read("legacy", wait_s=0)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"kind": "warren.policy"}, "kind"),
        ({"kind": None}, "kind"),
        ({"schema": 1}, "schema"),
        ({"data_id": "other"}, "data_id"),
        ({"count": 3}, "shape"),
        ({"count": 0}, "count"),
        ({"count": True}, "count"),
        ({"count": "2"}, "count"),
        ({"fields": {}}, "fields"),
        ({"fields": [1, 2]}, "fields"),
        ({"fields": {"obs": np.zeros((2, 4)), "reward": np.zeros(4)}}, "reward"),
        ({"fields": {"obs": np.zeros((1, 4)), "reward": np.zeros(2)}}, "obs"),
        ({"fields": {"obs": np.float32(1.0)}}, "obs"),
        ({"fields": {"obs": np.zeros(())}}, "obs"),
        ({"fields": {"obs": [0, 0]}}, "obs"),
        ({"fields": {3: np.zeros(2)}}, "field name"),
        ({"meta": [1]}, "meta"),
    ],
)
def test_files_that_are_not_what_they_claim_are_corrupt(
    store: StepStore, overrides: dict[str, Any], reason: str
) -> None:
    write_document(store, "claim", **overrides)
    with pytest.raises(CorruptFile, match=reason) as info:
        store.read("claim", wait_s=0)
    assert str(store.root / "claim") in str(info.value)


def test_a_valid_document_that_is_not_a_map_is_corrupt(store: StepStore) -> None:
    (store.root / "list").write_bytes(codec.encode([1, 2, 3]))
    with pytest.raises(CorruptFile, match="not a map"):
        store.read("list", wait_s=0)


def test_a_file_renamed_to_another_id_is_corrupt(store: StepStore) -> None:
    store.write("original", make_chunk())
    os.rename(store.root / "original", store.root / "impostor")
    with pytest.raises(CorruptFile, match="original"):
        store.read("impostor", wait_s=0)


def test_an_oversized_file_is_corrupt(tmp_path: Path) -> None:
    StepStore(tmp_path).write("big", {"obs": np.zeros(4096, np.float32)})
    small = StepStore(tmp_path, max_file_bytes=1024)
    with pytest.raises(CorruptFile, match="limit"):
        small.read("big", wait_s=0)


def test_a_directory_under_the_name_is_corrupt(store: StepStore) -> None:
    (store.root / "dir").mkdir()
    with pytest.raises(CorruptFile, match="regular file"):
        store.read("dir", wait_s=0)


def test_read_arrays_are_read_only(store: StepStore) -> None:
    store.write("c1", make_chunk())
    chunk = store.read("c1")
    with pytest.raises(ValueError, match="read-only"):
        chunk.fields["reward"][0] = 1.0


def test_delete_removes_the_file_once(store: StepStore) -> None:
    store.write("c1", make_chunk())
    assert store.path("c1").is_file()
    assert store.delete("c1") is True
    assert not store.path("c1").exists()
    assert store.delete("c1") is False
    with pytest.raises(MissingFile):
        store.read("c1", wait_s=0)


def test_sweep_temp_removes_a_crashed_writers_leftovers(store: StepStore) -> None:
    leftover = store.root / ".c1.0123456789abcdef.tmp"
    leftover.write_bytes(b"half")
    old = time.time() - 600
    os.utime(leftover, (old, old))
    store.write("c2", make_chunk())
    assert store.sweep_temp(older_than_s=60) == 1
    assert os.listdir(store.root) == ["c2"]


READER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    from worker.storage import StepStore

    store = StepStore(Path(sys.argv[1]))
    stop = Path(sys.argv[2])
    reads, versions, errors = 0, set(), []
    print("ready", flush=True)
    while not stop.exists():
        try:
            chunk = store.read("hot", wait_s=2.0)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        version = chunk.meta["version"]
        obs = chunk.fields["obs"]
        # Every array of one version is filled with that version number.
        if chunk.count != 4096 or not (obs == version).all() or not (chunk.fields["reward"] == version).all():
            errors.append(f"inconsistent chunk for version {version}")
        reads += 1
        versions.add(version)
    print(json.dumps({"reads": reads, "versions": len(versions), "errors": errors[:5]}))
    """
)


def test_a_reader_in_another_process_never_sees_a_partial_file(store: StepStore, tmp_path: Path) -> None:
    # Given a chunk big enough (~640 KiB) that a torn write would be visible
    def chunk(version: int) -> dict[str, NDArray[Any]]:
        return {"obs": np.full((4096, 32), version, np.float32), "reward": np.full(4096, version, np.float32)}

    store.write("hot", chunk(0), {"version": 0})
    stop = tmp_path / "stop"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    reader = subprocess.Popen(
        [sys.executable, "-c", READER_SCRIPT, str(store.root), str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "ready"
        # When this process rewrites the chunk as fast as it can for a while
        version, deadline = 0, time.monotonic() + 1.5
        while time.monotonic() < deadline:
            version += 1
            store.write("hot", chunk(version), {"version": version})
        stop.touch()
        out, err = reader.communicate(timeout=15)
    finally:
        reader.kill()
    # Then every read saw one complete version, and several versions were seen
    assert reader.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["errors"] == []
    assert report["reads"] > 10
    assert report["versions"] > 2
    assert os.listdir(store.root) == ["hot"]


def test_an_lz4_store_writes_compressed_files_any_store_reads_back_exactly(tmp_path: Path) -> None:
    pytest.importorskip("lz4")
    frames = np.zeros((65, 8, 84, 84), np.uint8)
    frames[:, :, 40:44, 10:12] = 200  # a mostly uniform screen, as Atari's are
    samples: dict[str, NDArray[Any]] = {"obs": frames, "reward": np.ones((64, 8), np.float32)}
    plain, packed = StepStore(tmp_path / "plain"), StepStore(tmp_path / "lz4", compression="lz4")
    plain.write("c1", samples)
    packed.write("c1", samples)
    assert (tmp_path / "lz4" / "c1").stat().st_size * 20 < (tmp_path / "plain" / "c1").stat().st_size
    # a store that writes uncompressed still reads compressed files (the magic number says which)
    read = StepStore(tmp_path / "lz4").read("c1")
    np.testing.assert_array_equal(read.fields["obs"], frames)
    assert read.nbytes == (tmp_path / "lz4" / "c1").stat().st_size


def test_an_lz4_file_that_is_cut_short_or_decompresses_past_the_cap_is_corrupt(tmp_path: Path) -> None:
    lz4_frame = pytest.importorskip("lz4.frame")
    store = StepStore(tmp_path, max_file_bytes=64 * 1024)
    (tmp_path / "bomb").write_bytes(lz4_frame.compress(bytes(1024 * 1024)))  # 1 MiB of zeros in a few KB
    with pytest.raises(CorruptFile, match="decompresses to more than"):
        store.read("bomb", wait_s=0)
    whole = lz4_frame.compress(codec.encode({"x": 1}))
    (tmp_path / "cut").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CorruptFile):
        store.read("cut", wait_s=0)


def test_an_unknown_compression_is_refused() -> None:
    with pytest.raises(ValueError, match="compression must be one of"):
        StepStore(Path(tempfile.mkdtemp()), compression="zip")


def test_the_default_store_compresses_frame_stack_chunks_only(tmp_path: Path) -> None:
    pytest.importorskip("lz4")
    store = StepStore(tmp_path)
    frames = np.zeros((3, 2, 84, 84), np.uint8)
    store.write(
        "pixels", {"obs": frames, "obs@heads": np.zeros((2, 3, 84, 84), np.uint8), "valid": np.ones((2, 2), bool)}
    )
    store.write("vectors", {"obs": np.zeros((3, 2, 4), np.float32), "valid": np.ones((2, 2), bool)})
    assert (tmp_path / "pixels").read_bytes()[:4] == b"\x04\x22\x4d\x18"
    assert (tmp_path / "vectors").read_bytes()[:4] != b"\x04\x22\x4d\x18"
    assert store.read("pixels").fields["obs@heads"].shape == (2, 3, 84, 84)


def test_a_chunk_of_side_tables_only_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    store = StepStore(tmp_path)
    with pytest.raises(ValueError, match="side tables only"):
        store.write("chunk-1", {f"obs{SIDE_TABLE}heads": np.zeros((2, 3), np.uint8)}, {})
    assert list(tmp_path.iterdir()) == []
