"""msgpack codec for everything warren puts on the wire or on the shared volume.

Arrays and tensors travel as msgpack extension types holding a dtype, a shape and the
raw little-endian bytes: no pickle anywhere, so decoding untrusted bytes cannot run
code. Only plain numeric and boolean dtypes are accepted; object, string and
structured dtypes are refused on both sides.

Layout of the array extension payload (all integers little-endian)::

    u8 dtype-length | dtype (ASCII) | u8 ndim | ndim x u64 shape | raw bytes

The same layout serves numpy arrays (code 1), torch tensors (code 2, dtype named as in
torch, e.g. ``bfloat16``) and numpy scalars (code 3, ndim 0).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Final

import msgpack
import numpy as np

from messaging.errors import DecodeError, EncodeError, MessageTooLarge

if TYPE_CHECKING:
    import torch

#: Version of the message layout; sent as the ``schema`` header and stored in files.
SCHEMA_VERSION: Final = 3
#: MIME type set on every AMQP message warren publishes.
CONTENT_TYPE: Final = "application/msgpack"

EXT_NDARRAY: Final = 1
EXT_TENSOR: Final = 2
EXT_NPSCALAR: Final = 3

#: numpy dtype kinds that may cross the wire: bool, signed, unsigned, float, complex.
_SAFE_KINDS: Final = frozenset("biufc")
#: torch dtypes that numpy cannot represent, carried as raw bytes.
_TORCH_ONLY_DTYPES: Final = ("bfloat16",)
_U8: Final = struct.Struct("<B")
_U64: Final = struct.Struct("<Q")


def encode(obj: Any, *, max_bytes: int | None = None) -> bytes:
    """Serialize ``obj`` (maps, lists, scalars, bytes, arrays, tensors) to msgpack bytes.

    Raises:
        EncodeError: an object of an unsupported type or dtype was found.
        MessageTooLarge: the encoded body exceeds ``max_bytes``.
    """
    try:
        body: bytes = msgpack.packb(obj, default=_default, use_bin_type=True)
    except EncodeError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise EncodeError(f"cannot encode {type(obj).__name__}: {exc}") from None
    if max_bytes is not None and len(body) > max_bytes:
        raise MessageTooLarge(f"encoded body is {len(body)} bytes, over the limit of {max_bytes}")
    return body


def decode(data: bytes | bytearray | memoryview, *, max_bytes: int | None = None) -> Any:
    """Parse msgpack bytes produced by :func:`encode` (or any msgpack writer).

    Arrays come back as read-only numpy arrays that share ``data``'s memory; tensors
    come back as writable torch tensors.

    Raises:
        MessageTooLarge: ``data`` is larger than ``max_bytes``.
        DecodeError: ``data`` is not valid msgpack or holds a malformed extension.
    """
    size = len(data)
    if max_bytes is not None and size > max_bytes:
        raise MessageTooLarge(f"body is {size} bytes, over the limit of {max_bytes}")
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except DecodeError:
        raise
    except Exception as exc:  # msgpack raises many unrelated types for bad input
        raise DecodeError(f"undecodable msgpack body ({type(exc).__name__}: {exc})", bytes(data[:64])) from None


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(EXT_NDARRAY, _pack_array(*_array_bytes(obj)))
    if isinstance(obj, np.generic):
        return msgpack.ExtType(EXT_NPSCALAR, _pack_array(*_array_bytes(np.asarray(obj))))
    if type(obj).__module__.startswith("torch") and type(obj).__name__ in ("Tensor", "Parameter"):
        return msgpack.ExtType(EXT_TENSOR, _pack_tensor(obj))
    if isinstance(obj, tuple):
        return list(obj)
    raise EncodeError(f"cannot encode objects of type {type(obj).__module__}.{type(obj).__qualname__}")


def _array_bytes(arr: np.ndarray[Any, Any]) -> tuple[str, tuple[int, ...], bytes]:
    """The little-endian dtype name, shape and raw bytes of ``arr``."""
    if arr.dtype.kind not in _SAFE_KINDS or arr.dtype.fields is not None:
        raise EncodeError(f"refusing to encode array of dtype {arr.dtype!r}: only numeric and bool dtypes")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr.dtype.str, arr.shape, np.ascontiguousarray(arr).tobytes()


def _pack_array(dtype: str, shape: tuple[int, ...], raw: bytes) -> bytes:
    name = dtype.encode("ascii")
    head = [_U8.pack(len(name)), name, _U8.pack(len(shape))]
    head.extend(_U64.pack(dim) for dim in shape)
    head.append(raw)
    return b"".join(head)


def _pack_tensor(tensor: torch.Tensor) -> bytes:
    tensor = tensor.detach().cpu().contiguous()
    name = str(tensor.dtype).removeprefix("torch.")
    if name in _TORCH_ONLY_DTYPES:
        raw = tensor.reshape(-1).view(_torch().uint8).numpy().tobytes()
        return _pack_array(name, tuple(tensor.shape), raw)
    try:
        arr = tensor.numpy()
    except TypeError as exc:
        raise EncodeError(f"refusing to encode tensor of dtype {tensor.dtype}: {exc}") from None
    return _pack_array(name, tuple(tensor.shape), _array_bytes(arr)[2])


def _unpack_array(payload: bytes) -> tuple[str, tuple[int, ...], memoryview]:
    view = memoryview(payload)
    try:
        (name_len,) = _U8.unpack_from(view, 0)
        name = bytes(view[1 : 1 + name_len]).decode("ascii")
        offset = 1 + name_len
        (ndim,) = _U8.unpack_from(view, offset)
        offset += 1
        shape = tuple(_U64.unpack_from(view, offset + 8 * i)[0] for i in range(ndim))
        offset += 8 * ndim
    except (struct.error, UnicodeDecodeError) as exc:
        raise DecodeError(f"malformed array header: {exc}") from None
    if offset > len(view):
        raise DecodeError("malformed array header: truncated")
    return name, shape, view[offset:]


def _numpy_dtype(name: str) -> np.dtype[Any]:
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise DecodeError(f"unknown dtype {name!r}") from None
    if dtype.kind not in _SAFE_KINDS or dtype.fields is not None:
        raise DecodeError(f"refusing dtype {name!r}: only numeric and bool dtypes are accepted")
    return dtype


def _check_size(shape: tuple[int, ...], itemsize: int, raw: memoryview) -> None:
    count = 1
    for dim in shape:
        count *= dim
    if count * itemsize != len(raw):
        raise DecodeError(f"array of shape {shape} needs {count * itemsize} bytes, got {len(raw)}")


def _ext_hook(code: int, payload: bytes) -> Any:
    if code not in (EXT_NDARRAY, EXT_TENSOR, EXT_NPSCALAR):
        raise DecodeError(f"unknown msgpack extension type {code}")
    name, shape, raw = _unpack_array(payload)
    if code == EXT_TENSOR:
        return _decode_tensor(name, shape, raw)
    dtype = _numpy_dtype(name)
    _check_size(shape, dtype.itemsize, raw)
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if code == EXT_NPSCALAR:
        if shape:
            raise DecodeError("numpy scalar with a non-empty shape")
        return arr[()]
    return arr


def _decode_tensor(name: str, shape: tuple[int, ...], raw: memoryview) -> Any:
    torch = _torch()
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise DecodeError(f"unknown tensor dtype {name!r}")
    if name not in _TORCH_ONLY_DTYPES:
        np_dtype = _numpy_dtype(name if name != "bool" else "bool")
        _check_size(shape, np_dtype.itemsize, raw)
        return torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).reshape(shape).copy())
    _check_size(shape, dtype.itemsize, raw)
    if len(raw) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


def _torch() -> Any:
    # torch costs ~1 s to import: only pay for it when a tensor is actually seen.
    import torch

    return torch
