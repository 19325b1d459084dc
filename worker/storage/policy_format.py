"""The policy file format: safetensors with a small header, read and checked without running code.

A JSON header names each tensor's dtype, shape and offsets, then come the raw bytes, and
a ``__metadata__`` map of strings: ``warren.format``, ``policy_version`` and what the writer
adds (the algorithm and model with their versions, the digest of the spaces;
``docs/protocol.md`` section 6). Reading one parses JSON and copies bytes; nothing in it
can run code, unlike a pickle. A file holding NaN or infinite weights is refused as
corrupt. Where the files live, and how writers and readers take turns on them, is
:class:`~worker.storage.policies.PolicyStore`'s; here are the bytes, and the readers for a
file outside a run (:func:`read_policy_file`, :func:`read_policy_header`).

torch is imported inside the functions that need it: it costs seconds to import and
processes that only move step data never pay for it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from worker.errors import CorruptFile, MissingFile
from worker.storage.paths import read_regular_file

if TYPE_CHECKING:
    import torch

#: Default cap on one policy file, for writing and reading (1 GiB).
DEFAULT_MAX_POLICY_BYTES: Final = 1024 * 1024 * 1024
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
    """The header's metadata: ``algorithm``, ``model``, ``spaces_digest``... (see
    :meth:`~worker.storage.policies.PolicyStore.write`)."""


def read_policy_file(path: Path, *, numpy: bool = False, max_bytes: int = DEFAULT_MAX_POLICY_BYTES) -> PolicySnapshot:
    """Load the policy file at ``path`` without its lock, with the checks of
    :meth:`~worker.storage.policies.PolicyStore.read`.

    For readers outside a run (``warren eval``, :func:`warren.load_policy`): a file on a
    read-only volume (where no ``<name>.lock`` can be made), a copy handed to someone. A
    publish is a rename of a complete file, so the file read is one whole version.
    ``numpy``: as for :meth:`~worker.storage.policies.PolicyStore.read`.

    Raises:
        MissingFile: there is no file at ``path``.
        UnsafePath, CorruptFile, StorageError: as for :meth:`~worker.storage.policies.PolicyStore.read`.
    """
    found = read_regular_file(Path(path), max_bytes=max_bytes)
    if found is None:
        raise MissingFile(f"no policy file at {str(path)!r}")
    return parse_policy(Path(path), found[0], numpy)


def read_policy_header(path: Path, *, max_bytes: int = DEFAULT_MAX_POLICY_BYTES) -> tuple[int, dict[str, str]]:
    """The policy version and header metadata of the policy file at ``path``, without its tensors or its lock.

    Publishing is a rename of a complete file, so a reader without the lock sees one whole
    version or another, never a torn one.

    Raises:
        MissingFile: there is no file at ``path``.
        UnsafePath, CorruptFile, StorageError: as for :meth:`~worker.storage.policies.PolicyStore.read`.
    """
    found = read_regular_file(Path(path), max_bytes=max_bytes)
    if found is None:
        raise MissingFile(f"no policy file at {str(path)!r}")
    where = f"policy file {str(path)!r}"
    meta = _header_metadata(where, found[0])
    return _checked_version(where, meta), meta


def with_metadata(where: str, body: bytes, meta: Mapping[str, str]) -> bytes:
    """The safetensors file ``body`` with ``meta`` added to its header's ``__metadata__`` (tensor bytes unchanged).

    Offsets in a safetensors header count from the end of the header, so a longer header
    moves no tensor. The header is padded with spaces to a multiple of 8 bytes, as
    safetensors writes it.

    Raises:
        CorruptFile: ``body`` is not a safetensors file.
        ValueError: ``meta`` would change ``warren.format`` or ``policy_version``.
    """
    reserved = {"warren.format", "policy_version"} & set(meta)
    if reserved:
        raise ValueError(f"the header's {sorted(reserved)} cannot be changed by a copy")
    header = _header_json(where, body)
    if not isinstance(header, dict):
        raise CorruptFile(f"{where} is not a safetensors file (its header is not a JSON object)")
    size = struct.unpack("<Q", body[:8])[0]
    merged = dict(header.get("__metadata__") or {})
    merged.update({str(k): str(v) for k, v in meta.items()})
    header["__metadata__"] = merged
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body[8 + size :]


def policy_bytes(state_dict: Mapping[str, torch.Tensor], iter: int, meta: Mapping[str, str]) -> bytes:
    """A policy file's bytes: CPU copies of the tensors, ``meta`` and the format's own keys in its header."""
    from safetensors.torch import save

    header = {str(k): str(v) for k, v in meta.items()}
    header.update({"warren.format": POLICY_FORMAT, "policy_version": str(_check_iter(iter))})
    body: bytes = save(_cpu_copy(state_dict), metadata=header)
    return body


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


def header_version(path: Path, body: bytes) -> int:
    """The policy version in a policy file's header, the header checked as a reader checks it."""
    where = f"policy file {str(path)!r}"
    return _checked_version(where, _header_metadata(where, body))


def _checked_version(where: str, meta: dict[str, str]) -> int:
    if meta.get("warren.format") != POLICY_FORMAT:
        raise CorruptFile(
            f"{where} is not a warren policy (warren.format {meta.get('warren.format')!r}, this warren reads "
            f"{POLICY_FORMAT!r}): written by another version, or not by a warren learner"
        )
    version = meta.get("policy_version", "")
    if not version.isdigit() or int(version) >= 2**63:
        raise CorruptFile(f"{where} has policy_version {version!r}, not an integer in 0..2**63-1")
    return int(version)


def parse_policy(path: Path, body: bytes, numpy: bool) -> PolicySnapshot:
    """The policy file at ``path`` from its bytes, every check of a reader made (format, version, finite values)."""
    from safetensors import SafetensorError

    where = f"policy file {str(path)!r}"
    meta = _header_metadata(where, body)
    version = _checked_version(where, meta)
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
    return PolicySnapshot(state_dict=dict(tensors), iter=version, meta=meta)


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


def _header_json(where: str, body: bytes) -> Any:
    """The JSON header of a safetensors file: 8 bytes of little-endian header length, then JSON."""
    if len(body) < 8:
        raise CorruptFile(f"{where} is {len(body)} bytes: too short for a safetensors file")
    (size,) = struct.unpack("<Q", body[:8])
    if size > min(_MAX_HEADER_BYTES, len(body) - 8):
        raise CorruptFile(f"{where} is not a safetensors file (header length {size} for {len(body)} bytes)")
    try:
        header = json.loads(body[8 : 8 + size])
    except (UnicodeDecodeError, ValueError):
        raise CorruptFile(f"{where} is not a safetensors file (its header is not JSON)") from None
    return header


def _header_metadata(where: str, body: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file (see :func:`_header_json`)."""
    header = _header_json(where, body)
    meta = header.get("__metadata__", {}) if isinstance(header, dict) else None
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise CorruptFile(f"{where}: its safetensors metadata is not a map of strings")
    return meta
