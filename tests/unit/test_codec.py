from __future__ import annotations

import contextlib

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from messaging.codec import EXT_NDARRAY, decode, encode
from messaging.errors import DecodeError, EncodeError, MessageTooLarge

NUMPY_DTYPES = st.sampled_from(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ]
)
TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
]


@settings(max_examples=150, deadline=None)
@given(hnp.arrays(NUMPY_DTYPES, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)))
def test_numpy_arrays_round_trip_with_dtype_and_shape(arr: np.ndarray) -> None:
    out = decode(encode({"a": arr}))["a"]
    assert out.dtype == arr.dtype
    assert out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(TORCH_DTYPES),
    st.lists(st.integers(min_value=0, max_value=4), min_size=0, max_size=3),
    st.integers(min_value=0, max_value=2**31 - 1),
)
def test_torch_tensors_round_trip_with_dtype_and_shape(dtype: torch.dtype, shape: list[int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    tensor = (torch.rand(shape, generator=gen) * 100).to(dtype)
    out = decode(encode([tensor]))[0]
    assert isinstance(out, torch.Tensor)
    assert out.dtype == tensor.dtype
    assert tuple(out.shape) == tuple(tensor.shape)
    assert torch.equal(out, tensor)


def test_non_contiguous_and_big_endian_arrays_round_trip() -> None:
    base = np.arange(24, dtype=">i4").reshape(4, 6)
    view = base[:, ::2]
    out = decode(encode(view))
    np.testing.assert_array_equal(out, view)
    assert out.dtype == np.dtype("<i4")


@pytest.mark.parametrize("value", [np.float32(1.5), np.int64(-3), np.bool_(True), np.uint8(7)])
def test_numpy_scalars_keep_their_dtype(value: np.generic) -> None:
    out = decode(encode({"v": value}))["v"]
    assert type(out) is type(value)
    assert out == value


def test_object_and_string_arrays_are_refused_on_encode() -> None:
    with pytest.raises(EncodeError):
        encode(np.array([object()], dtype=object))
    with pytest.raises(EncodeError):
        encode(np.array(["a", "b"]))
    with pytest.raises(EncodeError):
        encode({"s": {1, 2}})


def _ext(payload: bytes, code: int = EXT_NDARRAY) -> bytes:
    return bytes(msgpack.packb(msgpack.ExtType(code, payload)))


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # a byte msgpack never uses
        b"\x92\x01",  # array header promising 2 items, only 1 present
        bytes(range(256)),
        _ext(b"\x03<f4\x01" + (2).to_bytes(8, "little") + b"\x00\x00\x00\x00"),  # 2 floats need 8 bytes, 4 given
        _ext(b"\x03|O8\x00" + b"\x00" * 8),  # object dtype smuggled in
        _ext(b"\x09"),  # truncated header
        _ext(b"\x00\x00", code=42),  # unknown extension type
    ],
)
def test_corrupt_bodies_raise_decode_error_not_msgpack_errors(body: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_but_decode_error(body: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode(body)


def test_size_limit_applies_to_both_directions() -> None:
    big = np.zeros(1000, dtype=np.uint8)
    body = encode(big)
    with pytest.raises(MessageTooLarge):
        encode(big, max_bytes=100)
    with pytest.raises(MessageTooLarge):
        decode(body, max_bytes=100)
    assert decode(body, max_bytes=len(body)).shape == (1000,)
