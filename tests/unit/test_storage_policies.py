"""PolicyStore: safetensors round trips with a header, change detection, locking, and hostile policy files."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shlex
import struct
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
from filelock import FileLock
from safetensors import safe_open
from safetensors.torch import load_file, save

from worker.errors import CorruptFile, PolicyKept, StorageError, UnsafePath
from worker.storage import PolicySnapshot, PolicyStore
from worker.storage.policies import POLICY_FORMAT


@pytest.fixture
def store(tmp_path: Path) -> PolicyStore:
    return PolicyStore(tmp_path / "policy", lock_timeout_s=2.0)


def small_state(fill: float) -> dict[str, torch.Tensor]:
    return {"fc.weight": torch.full((4, 3), fill), "fc.bias": torch.full((4,), fill), "steps": torch.tensor(7)}


def save_raw(path: Path, obj: Any) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    path.write_bytes(buffer.getvalue())


class ShellOut:
    """A pickle payload that runs a shell command when unpickled by a trusting loader."""

    def __init__(self, marker: Path) -> None:
        self.command = f"touch {shlex.quote(str(marker))}"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (self.command,)


def test_write_then_read_round_trips_tensors_iter_and_header(store: PolicyStore) -> None:
    state = small_state(1.5)
    path = store.write("learner0.pt", state, iter=12, meta={"algorithm": "dqn", "spaces_digest": "0123abcd"})
    snapshot = store.read("learner0.pt")
    assert isinstance(snapshot, PolicySnapshot)
    assert snapshot.iter == 12
    assert snapshot.state_dict.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(snapshot.state_dict[key], value)
        assert snapshot.state_dict[key].dtype == value.dtype
        assert snapshot.state_dict[key].device.type == "cpu"
    # The header keeps what the writer said, and the format and version warren adds
    assert snapshot.meta == {
        "algorithm": "dqn",
        "spaces_digest": "0123abcd",
        "warren.format": POLICY_FORMAT,
        "policy_version": "12",
    }
    # No temp file is left; only the policy and its lock file are in the directory.
    assert sorted(os.listdir(store.root)) == ["learner0.pt", "learner0.pt.lock"]
    assert path == store.root.resolve() / "learner0.pt"


def test_a_module_state_dict_round_trips_and_is_a_standard_safetensors_file(store: PolicyStore) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    path = store.write("net", net.state_dict(), iter=0, meta={"model": "mlp"})
    # Any safetensors reader can read the file, weights and header: nothing warren-specific in the bytes
    raw = load_file(path)
    assert set(raw) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    with safe_open(path, framework="pt") as opened:
        assert opened.metadata() == {"model": "mlp", "warren.format": POLICY_FORMAT, "policy_version": "0"}
    clone = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    snapshot = store.read("net")
    assert snapshot is not None
    clone.load_state_dict(snapshot.state_dict)
    x = torch.randn(5, 4)
    assert torch.equal(clone(x), net(x))


def test_tensors_that_share_storage_are_written_as_copies(store: PolicyStore) -> None:
    # (safetensors refuses shared buffers: tied weights, views of one parameter)
    base = torch.arange(12, dtype=torch.float32)
    store.write("tied", {"a": base.view(3, 4), "b": base.view(3, 4), "c": base[4:8]}, iter=2)
    snapshot = store.read("tied")
    assert snapshot is not None
    assert torch.equal(snapshot.state_dict["a"], snapshot.state_dict["b"])
    assert snapshot.state_dict["c"].tolist() == [4.0, 5.0, 6.0, 7.0]


def test_a_saved_view_holds_only_its_own_values(store: PolicyStore) -> None:
    big = torch.arange(1_000_000, dtype=torch.float32)
    path = store.write("view", {"head": big[:4]}, iter=1)
    assert path.stat().st_size < 100_000  # not the 4 MB storage behind the view
    snapshot = store.read("view")
    assert snapshot is not None
    assert snapshot.state_dict["head"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_read_of_a_policy_never_written_is_none_and_leaves_no_lock_file(store: PolicyStore) -> None:
    assert store.read("absent") is None
    assert os.listdir(store.root) == []


def test_read_if_changed_loads_only_new_versions(store: PolicyStore) -> None:
    # Nothing yet
    assert store.read_if_changed("p", None) == (None, None)
    # First version
    store.write("p", small_state(1.0), iter=1)
    snapshot, stamp = store.read_if_changed("p", None)
    assert snapshot is not None
    assert snapshot.iter == 1
    assert stamp is not None
    # Unchanged: no snapshot, same stamp
    assert store.read_if_changed("p", stamp) == (None, stamp)
    # Rewritten: the new version comes back with a new stamp
    store.write("p", small_state(2.0), iter=2)
    snapshot, new_stamp = store.read_if_changed("p", stamp)
    assert snapshot is not None
    assert snapshot.iter == 2
    assert new_stamp != stamp
    # Deleted: nothing, and the stamp resets
    assert store.delete("p") is True
    assert store.read_if_changed("p", new_stamp) == (None, None)


def test_read_if_changed_does_not_parse_an_unchanged_file(store: PolicyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.write("p", small_state(1.0), iter=1)
    _, stamp = store.read_if_changed("p", None)
    calls: list[object] = []
    real_load = safetensors.torch.load

    def counting_load(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "load", counting_load)
    for _ in range(3):
        assert store.read_if_changed("p", stamp) == (None, stamp)
    assert calls == []
    # (the patched loader is the one reads go through: a changed file is parsed by it)
    store.write("p", small_state(2.0), iter=2)
    assert store.read_if_changed("p", stamp)[0] is not None
    assert len(calls) == 1


def test_delete_of_a_missing_policy_returns_false(store: PolicyStore) -> None:
    assert store.delete("never") is False


def test_a_torch_pickle_checkpoint_is_refused_and_runs_nothing(store: PolicyStore, tmp_path: Path) -> None:
    # Given a torch.save checkpoint (warren's previous format) whose "model" unpickles to os.system("touch <marker>")
    marker = tmp_path / "pwned"
    save_raw(store.root / "evil", {"model": ShellOut(marker), "iter": 1})
    # When a collector reads it
    with pytest.raises(CorruptFile, match="not a safetensors file") as info:
        store.read("evil")
    # Then nothing ran, and the error names the file and does not suggest a pickle loader
    assert not marker.exists()
    assert "evil" in str(info.value)
    said = str(info.value).replace(str(store.root), "<root>")
    assert "weights_only" not in said and "pickle" not in said


def test_a_plain_pickle_is_refused_and_runs_nothing(store: PolicyStore, tmp_path: Path) -> None:
    marker = tmp_path / "pwned-legacy"
    (store.root / "evil").write_bytes(pickle.dumps({"model": ShellOut(marker), "iter": 1}, protocol=2))
    with pytest.raises(CorruptFile, match="evil"):
        store.read("evil")
    assert not marker.exists()


def test_the_malicious_payload_is_live_for_a_trusting_loader(tmp_path: Path) -> None:
    # Control for the two tests above: the same payload does run under plain pickle.
    marker = tmp_path / "pwned-control"
    pickle.loads(pickle.dumps(ShellOut(marker)))  # unsafe on purpose: the point of this test
    assert marker.exists()


def header_file(header: Any, data: bytes = b"") -> bytes:
    """A safetensors-shaped file: 8 bytes of header length, the header's JSON, then ``data``."""
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "too short for a safetensors file"),
        (b"\x00" * 7, "too short for a safetensors file"),
        (b"\x00" * 64, "its header is not JSON"),
        (bytes(range(256)) * 8, "not a safetensors file \\(header length"),
        (b"PK\x03\x04" + b"\x00" * 100, "not a safetensors file \\(header length"),
        (struct.pack("<Q", 10) + b"\xff\xfe not utf8", "its header is not JSON"),
        (header_file([1, 2]), "not a map of strings"),
        (header_file({"__metadata__": {"warren.format": 1}}), "not a map of strings"),
        (header_file({"__metadata__": "x"}), "not a map of strings"),
    ],
)
def test_junk_bytes_are_corrupt(store: PolicyStore, body: bytes, reason: str) -> None:
    (store.root / "junk").write_bytes(body)
    with pytest.raises(CorruptFile, match=reason) as info:
        store.read("junk")
    assert "junk" in str(info.value)


def test_random_bytes_are_corrupt(store: PolicyStore) -> None:
    (store.root / "junk").write_bytes(os.urandom(2048))
    with pytest.raises(CorruptFile, match="junk"):
        store.read("junk")


def test_a_truncated_policy_is_corrupt(store: PolicyStore) -> None:
    path = store.write("p", small_state(1.0), iter=3)
    body = path.read_bytes()
    for cut in (10, len(body) // 2, len(body) - 1):
        path.write_bytes(body[:cut])
        with pytest.raises(CorruptFile, match=re.escape(f"{str(path)!r}")):
            store.read("p")


def _safetensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> bytes:
    body: bytes = save(tensors, metadata=metadata)
    return body


GOOD_TENSORS = {"w": torch.zeros(2, 2)}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        # a safetensors file, but not one a warren learner wrote (no header, another format)
        (_safetensors(GOOD_TENSORS, None), "is not a warren policy \\(warren.format None"),
        (_safetensors(GOOD_TENSORS, {"policy_version": "1"}), "is not a warren policy"),
        (_safetensors(GOOD_TENSORS, {"warren.format": "2", "policy_version": "1"}), "warren.format '2'"),
        # a warren header with a version that is no count
        (_safetensors(GOOD_TENSORS, {"warren.format": POLICY_FORMAT}), "policy_version ''"),
        (_safetensors(GOOD_TENSORS, {"warren.format": POLICY_FORMAT, "policy_version": "-1"}), "policy_version '-1'"),
        (_safetensors(GOOD_TENSORS, {"warren.format": POLICY_FORMAT, "policy_version": "1.5"}), "policy_version"),
        (_safetensors(GOOD_TENSORS, {"warren.format": POLICY_FORMAT, "policy_version": str(2**63)}), "policy_version"),
        # a good header over tensor bytes that do not match it
        (
            header_file(
                {
                    "__metadata__": {"warren.format": POLICY_FORMAT, "policy_version": "1"},
                    "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                },
                b"\x00" * 8,
            ),
            "not a valid safetensors file",
        ),
    ],
)
def test_files_that_are_not_warren_policies_are_corrupt(store: PolicyStore, body: bytes, reason: str) -> None:
    (store.root / "odd").write_bytes(body)
    with pytest.raises(CorruptFile, match=reason):
        store.read("odd")


@pytest.mark.parametrize("numpy", [False, True], ids=["as-torch", "as-numpy"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_policy_holding_nan_or_infinite_weights_is_corrupt(store: PolicyStore, bad: float, numpy: bool) -> None:
    # Given a learner that wrote a diverged policy (every check but the values passes)
    state = small_state(1.0)
    state["fc.bias"][2] = bad
    store.write("p", state, iter=5)
    # Then a reader refuses it, naming the tensor, and keeps whatever it had (as torch tensors or numpy arrays)
    with pytest.raises(CorruptFile, match=r"tensor 'fc\.bias' holds NaN or infinite values"):
        store.read("p", numpy=numpy)


def test_a_policy_read_as_numpy_holds_the_same_arrays_with_their_dtypes(store: PolicyStore) -> None:
    state = {**small_state(1.5), "count": torch.tensor(3.0, dtype=torch.float64), "steps": torch.tensor([2**40, -3])}
    store.write("p", state, iter=4)
    as_numpy, as_torch = store.read("p", numpy=True), store.read("p")
    assert as_numpy is not None and as_torch is not None and as_numpy.iter == 4
    assert set(as_numpy.state_dict) == set(as_torch.state_dict)
    for name, tensor in as_torch.state_dict.items():
        array = as_numpy.state_dict[name]
        assert isinstance(array, np.ndarray), name
        assert str(array.dtype) == str(tensor.dtype).removeprefix("torch."), name
        np.testing.assert_array_equal(array, tensor.numpy())


def test_integer_tensors_are_not_checked_for_nan(store: PolicyStore) -> None:
    store.write("p", {"steps": torch.tensor([2**40, -3])}, iter=1)
    snapshot = store.read("p")
    assert snapshot is not None and snapshot.state_dict["steps"].tolist() == [2**40, -3]


def test_an_oversized_policy_is_corrupt(tmp_path: Path) -> None:
    PolicyStore(tmp_path).write("p", small_state(1.0), iter=1)
    with pytest.raises(CorruptFile, match="limit"):
        PolicyStore(tmp_path, max_file_bytes=64).read("p")


def test_writing_an_oversized_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="limit"):
        PolicyStore(tmp_path, max_file_bytes=64).write("p", small_state(1.0), iter=1)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["../p", "/etc/passwd", "a/../../p", "p\x00", "", ".hidden", "sub/p", "p.lock"])
def test_every_operation_refuses_unsafe_names(store: PolicyStore, name: str) -> None:
    with pytest.raises(UnsafePath):
        store.write(name, small_state(1.0), iter=1)
    with pytest.raises(UnsafePath):
        store.read(name)
    with pytest.raises(UnsafePath):
        store.read_if_changed(name, None)
    with pytest.raises(UnsafePath):
        store.delete(name)
    assert os.listdir(store.root) == []


def test_a_policy_symlinked_outside_the_root_is_refused(store: PolicyStore, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.pt"
    PolicyStore(tmp_path).write("elsewhere.pt", small_state(1.0), iter=1)
    (store.root / "p").symlink_to(outside)
    with pytest.raises(UnsafePath, match="'p'"):
        store.read("p")


@pytest.mark.parametrize(
    ("state", "iteration", "error"),
    [
        ({"w": [1.0]}, 1, TypeError),
        ({1: torch.zeros(1)}, 1, TypeError),
        ([torch.zeros(1)], 1, TypeError),
        ({"w": torch.zeros(1)}, 1.0, TypeError),
        ({"w": torch.zeros(1)}, True, TypeError),
        ({"w": torch.zeros(1)}, -1, ValueError),
    ],
)
def test_write_refuses_malformed_input(store: PolicyStore, state: Any, iteration: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        store.write("p", state, iter=iteration)
    assert os.listdir(store.root) == []


def test_the_writers_header_cannot_overrule_the_format_or_the_version(store: PolicyStore) -> None:
    store.write("p", small_state(1.0), iter=4, meta={"warren.format": "99", "policy_version": "1000", "n": 3})  # type: ignore[dict-item]
    snapshot = store.read("p")
    assert snapshot is not None
    assert (snapshot.iter, snapshot.meta["warren.format"], snapshot.meta["n"]) == (4, POLICY_FORMAT, "3")


def test_a_held_lock_times_out_with_a_storage_error(tmp_path: Path) -> None:
    # Given a policy whose lock another holder keeps
    store = PolicyStore(tmp_path, lock_timeout_s=0.2)
    store.write("p", small_state(1.0), iter=1)
    with FileLock(tmp_path / "p.lock"):
        # Then readers and writers give up with a clear error, leaving no temp file
        with pytest.raises(StorageError, match="could not lock"):
            store.read("p")
        with pytest.raises(StorageError, match="could not lock"):
            store.write("p", small_state(2.0), iter=2)
    assert sorted(os.listdir(tmp_path)) == ["p", "p.lock"]
    snapshot = store.read("p")
    assert snapshot is not None
    assert snapshot.iter == 1


def test_a_concurrent_reader_sees_only_whole_policies(store: PolicyStore) -> None:
    # Given a learner thread rewriting the policy, each version filled with its iter, until
    # the reader has seen a few versions (a loaded machine may not schedule it for a while)
    store.write("hot", {"w": torch.zeros(256, 256)}, iter=0)
    done = threading.Event()
    failures: list[BaseException] = []
    seen: list[int] = []
    written = [0]

    def learner() -> None:
        deadline = time.monotonic() + 30
        try:
            while len(seen) < 3 and time.monotonic() < deadline:
                written[0] += 1
                version = written[0]
                store.write("hot", {"w": torch.full((256, 256), float(version))}, iter=version)
        except BaseException as exc:
            failures.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=learner)
    thread.start()
    # When a collector polls it meanwhile
    stamp = None
    try:
        while not done.is_set():
            snapshot, stamp = store.read_if_changed("hot", stamp)
            if snapshot is not None:
                # Then every snapshot is complete and consistent with its iter
                assert torch.all(snapshot.state_dict["w"] == float(snapshot.iter))
                seen.append(snapshot.iter)
    finally:
        done.set()
        thread.join()
    assert failures == []
    assert seen == sorted(seen)
    assert len(seen) >= 3
    final = store.read("hot")
    assert final is not None
    assert final.iter == written[0]


def test_sweep_temp_removes_a_crashed_learners_leftovers(store: PolicyStore) -> None:
    leftover = store.root / ".p.0123456789abcdef.tmp"
    leftover.write_bytes(b"half a checkpoint")
    os.utime(leftover, (0, 0))
    assert store.sweep_temp(older_than_s=60) == 1
    assert not leftover.exists()


def test_a_policy_of_a_dtype_numpy_lacks_is_corrupt_when_read_as_numpy_and_fine_as_torch(store: PolicyStore) -> None:
    store.write("p", {"w": torch.ones(3, dtype=torch.bfloat16)}, iter=2)
    with pytest.raises(CorruptFile, match="holds tensors numpy cannot read"):
        store.read("p", numpy=True)
    snapshot = store.read("p")
    assert snapshot is not None and snapshot.state_dict["w"].dtype == torch.bfloat16


def test_a_kept_policy_refuses_writes_until_it_is_released(store: PolicyStore) -> None:
    # Given a learner's policy and a copy of it taken for an evaluation
    store.write("policy_main", small_state(1.0), iter=5)
    assert store.copy("policy_main", "policy_main.eval") == 5
    store.write("policy_main", small_state(2.0), iter=9)
    # When the run keeps the evaluated copy as its policy
    assert store.keep("policy_main", source="policy_main.eval") == 5
    # Then the file holds version 5's weights, and the learner's next write is refused, leaving it so
    with pytest.raises(PolicyKept, match="kept"):
        store.write("policy_main", small_state(3.0), iter=12)
    kept = store.read("policy_main")
    assert kept is not None and kept.iter == 5 and torch.equal(kept.state_dict["fc.weight"], torch.full((4, 3), 1.0))
    assert store.is_kept("policy_main") and store.version("policy_main") == 5
    # And once released (a new run starts), writes go through again
    assert store.release("policy_main") and not store.release("policy_main")
    store.write("policy_main", small_state(3.0), iter=12)
    assert store.version("policy_main") == 12


def test_keeping_a_policy_never_written_keeps_nothing(store: PolicyStore) -> None:
    assert store.keep("policy_main") is None and not store.is_kept("policy_main")
    assert list(store.root.iterdir()) == []  # not even a lock file
    assert store.copy("policy_main", "policy_main.eval") is None
    assert store.version("policy_main") is None


@pytest.mark.parametrize("name", ["policy_main.kept", "x.lock"])
def test_the_markers_suffixes_are_no_policy_names(store: PolicyStore, name: str) -> None:
    with pytest.raises(UnsafePath, match="reserved"):
        store.path(name)
