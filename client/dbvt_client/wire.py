"""numpy arrays <-> the protocol's little-endian columnar `bytes` (layout: proto/dbvt_proto/v1/*.proto).

Encoding converts the caller's array-likes once and catches what the server could not report usefully
(negative or fractional ids would otherwise wrap silently); everything else about the values (NaN,
inverted boxes, widths that do not match the world) is judged where the world is, by the core.
Decoding is zero-copy `numpy.frombuffer`, after checking that the byte length fits the row count.
"""
from __future__ import annotations

import numpy as np

from dbvt_client.errors import InvalidArgument

IDS = np.dtype("<u8")
# The ids of an answer that sets narrow_ids (a query's hits, a batch's pairs and events, the pair dumps):
# 32 bits, half the bytes on the wire.
NARROW_IDS = np.dtype("<u4")
NARROW_IDS_MAX = 2**32 - 1
FLOATS = np.dtype("<f4")
OFFSETS = np.dtype("<i8")
FRACTIONS = np.dtype("<f8")
BITS = np.dtype("<u4")
FLAGS = np.dtype("u1")


def ids_array(ids, name: str) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise InvalidArgument(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, IDS)
    if arr.dtype.kind == "i":
        negative = np.flatnonzero(arr < 0)
        if negative.size:
            row = int(negative[0])
            raise InvalidArgument(f"{name} row {row}: id {arr[row]} is negative")
    elif arr.dtype.kind != "u":
        raise InvalidArgument(f"{name} must hold integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=IDS)


def float_array(values, name: str, ndim: int) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == FLOATS:
        # Already the wire's: no cast, so nothing can overflow, and no error state to set (which took
        # a third of a streamed step's encoding when the caches were cold).
        arr = values
    else:
        try:
            # Values beyond float32 become infinite, which the world refuses by row; numpy's warning
            # about the cast would only come first.
            with np.errstate(over="ignore"):
                arr = np.asarray(values, dtype=FLOATS)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"{name} must be numeric: {exc}") from None
    if arr.size == 0 and arr.ndim < ndim:
        arr = arr.reshape((0,) * ndim)
    if arr.ndim != ndim:
        raise InvalidArgument(f"{name} must have {ndim} dimensions, got shape {arr.shape}")
    return np.ascontiguousarray(arr)


def bits_array(value, rows: int, name: str) -> np.ndarray:
    """A scalar or per-row array of 32-bit group/mask values, one per row."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "iub":
        raise InvalidArgument(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.ndim == 0:
        arr = np.full(rows, arr, dtype=np.int64)
    if arr.shape != (rows,):
        raise InvalidArgument(f"{name} must be a scalar or have shape ({rows},), got {arr.shape}")
    bad = np.flatnonzero((arr < 0) | (arr > 0xFFFFFFFF))
    if bad.size:
        row = int(bad[0])
        raise InvalidArgument(f"{name} row {row}: {arr[row]} is not a 32-bit unsigned value")
    return np.ascontiguousarray(arr, dtype=BITS)


def flags_array(value, rows: int, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = np.full(rows, bool(arr))
    if arr.shape != (rows,):
        raise InvalidArgument(f"{name} must be a scalar or have shape ({rows},), got {arr.shape}")
    return np.ascontiguousarray(arr.astype(bool), dtype=FLAGS)


def decode(data: bytes, dtype: np.dtype, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A read-only view of `data` as `shape`, or InvalidArgument naming the field and the sizes."""
    expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if len(data) != expected:
        rows = "x".join(str(s) for s in shape)
        raise InvalidArgument(
            f"{name} must hold {rows} {dtype.name} values ({expected} bytes), got {len(data)} bytes")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def decode_id_rows(data: bytes, narrow: bool, name: str) -> np.ndarray:
    """Rows of two ids (pairs, or [sensor, proxy]) as a uint64 array of the caller's own, whatever width
    they came in."""
    if not data:
        # Most of a tick's columns (its sensor events) are empty: one numpy call instead of three.
        return np.empty((0, 2), IDS)
    dtype = NARROW_IDS if narrow else IDS
    if len(data) % (2 * dtype.itemsize):
        raise InvalidArgument(f"{name} has {len(data)} bytes, not whole rows of 2 {dtype.name}")
    return np.frombuffer(data, dtype=dtype).reshape(-1, 2).astype(IDS)


def decode_csr(offsets: bytes, hits: bytes, count: int, narrow: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A query answer's offsets and hits, the hits as uint64 ids whatever width they came in."""
    offsets_arr = decode(offsets, OFFSETS, (count + 1,), "offsets")
    if narrow:
        return offsets_arr, np.frombuffer(hits, dtype=NARROW_IDS).astype(IDS)
    return offsets_arr, np.frombuffer(hits, dtype=IDS)
