"""PolicyStore: round trips, change detection, locking, and hostile policy files."""

from __future__ import annotations

import io
import os
import pickle
import re
import shlex
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from filelock import FileLock

from worker.errors import CorruptFile, StorageError, UnsafePath
from worker.storage import PolicySnapshot, PolicyStore


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


def test_write_then_read_round_trips_tensors_and_iter(store: PolicyStore) -> None:
    state = small_state(1.5)
    path = store.write("learner0.pt", state, iter=12)
    snapshot = store.read("learner0.pt")
    assert isinstance(snapshot, PolicySnapshot)
    assert snapshot.iter == 12
    assert snapshot.state_dict.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(snapshot.state_dict[key], value)
        assert snapshot.state_dict[key].device.type == "cpu"
    # No temp file is left; only the policy and its lock file are in the directory.
    assert sorted(os.listdir(store.root)) == ["learner0.pt", "learner0.pt.lock"]
    assert path == store.root.resolve() / "learner0.pt"


def test_a_module_state_dict_round_trips_and_is_a_standard_checkpoint(store: PolicyStore) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    path = store.write("net", net.state_dict(), iter=0)
    # Any weights-only torch.load can read the file: the format is plain torch.save.
    raw = torch.load(path, map_location="cpu", weights_only=True)
    assert set(raw) == {"model", "iter"}
    clone = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    snapshot = store.read("net")
    assert snapshot is not None
    clone.load_state_dict(snapshot.state_dict)
    x = torch.randn(5, 4)
    assert torch.equal(clone(x), net(x))


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


def test_read_if_changed_does_not_unpickle_an_unchanged_file(
    store: PolicyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.write("p", small_state(1.0), iter=1)
    _, stamp = store.read_if_changed("p", None)
    calls: list[object] = []
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: calls.append(args))
    for _ in range(3):
        assert store.read_if_changed("p", stamp) == (None, stamp)
    assert calls == []


def test_delete_of_a_missing_policy_returns_false(store: PolicyStore) -> None:
    assert store.delete("never") is False


def test_malicious_pickle_is_refused_and_runs_nothing(store: PolicyStore, tmp_path: Path) -> None:
    # Given a checkpoint whose "model" unpickles to os.system("touch <marker>")
    marker = tmp_path / "pwned"
    save_raw(store.root / "evil", {"model": ShellOut(marker), "iter": 1})
    # When a collector reads it
    with pytest.raises(CorruptFile, match="loader refused it") as info:
        store.read("evil")
    # Then nothing ran, and the error does not suggest turning weights_only off
    assert not marker.exists()
    assert "evil" in str(info.value)
    assert "weights_only" not in str(info.value)


def test_malicious_legacy_pickle_is_refused_and_runs_nothing(store: PolicyStore, tmp_path: Path) -> None:
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


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "not a weights-only torch checkpoint"),
        (b"\x00" * 64, "not a weights-only torch checkpoint"),
        (bytes(range(256)) * 8, "not a weights-only torch checkpoint"),
        (b"PK\x03\x04" + b"\x00" * 100, "not a weights-only torch checkpoint"),
    ],
)
def test_junk_bytes_are_corrupt(store: PolicyStore, body: bytes, reason: str) -> None:
    (store.root / "junk").write_bytes(body)
    with pytest.raises(CorruptFile, match=reason):
        store.read("junk")


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


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (torch.zeros(3), "top level"),
        ({"iter": 1}, "'model'"),
        ({"model": [torch.zeros(1)], "iter": 1}, "'model'"),
        ({"model": {"w": 1.0}, "iter": 1}, "'model'"),
        ({"model": {3: torch.zeros(1)}, "iter": 1}, "'model'"),
        ({"model": {"w": torch.zeros(1)}}, "'iter'"),
        ({"model": {"w": torch.zeros(1)}, "iter": "3"}, "'iter'"),
        ({"model": {"w": torch.zeros(1)}, "iter": 3.0}, "'iter'"),
        ({"model": {"w": torch.zeros(1)}, "iter": True}, "'iter'"),
    ],
)
def test_checkpoints_of_the_wrong_layout_are_corrupt(store: PolicyStore, document: Any, reason: str) -> None:
    save_raw(store.root / "odd", document)
    with pytest.raises(CorruptFile, match=reason):
        store.read("odd")


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
    save_raw(outside, {"model": {}, "iter": 1})
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
