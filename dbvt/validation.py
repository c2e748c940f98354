"""Argument conversion shared by `Tree`, `Broadphase` and `dbvt.reference`.

Every public call converts its arguments here exactly once, so that the Cython loops can run without
further checks and every implementation rejects the same input with the same message. A message
always names the argument and the first offending row.
"""
from __future__ import annotations

import numpy as np

from dbvt._rows import first_bad_row

MAX_FRUSTUM_PLANES = 32
# More threads than this for one structure's queries would only be a typo: each needs 64 rows.
MAX_THREADS = 1024
UINT32_MAX = 0xFFFFFFFF
INT64_MAX = 2**63 - 1


def check_dims(dims: int) -> int:
    if dims not in (2, 3):
        raise ValueError(f"dims must be 2 or 3, not {dims!r}")
    return int(dims)


def check_margin(margin: float) -> float:
    margin = float(margin)
    if not np.isfinite(margin) or margin < 0.0:
        raise ValueError(f"margin must be a finite number >= 0, not {margin!r}")
    return margin


def check_sensor_margin(margin: float) -> float:
    value = float(margin)
    if not np.isfinite(value) or value < 0.0:
        raise ValueError(f"sensor_margin must be a finite number >= 0, not {margin!r}")
    return value


def check_threads(threads) -> int:
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads must be an int from 1 to {MAX_THREADS}, not {threads!r}")
    return int(threads)


SENSOR_KINDS = {None: 0, "box": 1, "sphere": 2}


def as_sensor_kinds(sensor, rows: int) -> np.ndarray:
    """create()'s `sensor=`: None, "box" or "sphere" for every row, or one kind per row (0 none, 1 box,
    2 sphere), as uint8."""
    if sensor is None or isinstance(sensor, str):
        if sensor not in SENSOR_KINDS:
            raise ValueError(f"sensor must be None, 'box', 'sphere' or per-row kinds 0, 1, 2, not {sensor!r}")
        return np.full(rows, SENSOR_KINDS[sensor], np.uint8)
    kinds = np.asarray(sensor)
    if kinds.ndim == 0:
        kinds = np.full(rows, kinds)
    if kinds.shape != (rows,):
        raise ValueError(f"sensor must be a scalar or have shape ({rows},), got {kinds.shape}")
    if kinds.dtype.kind not in "iub":
        raise ValueError(f"sensor kinds must be integers 0 (none), 1 (box) or 2 (sphere), not {kinds.dtype}")
    wrong = np.flatnonzero((kinds < 0) | (kinds > 2))
    if wrong.size:
        raise ValueError(f"sensor row {wrong[0]}: kind {kinds[wrong[0]]} is not 0 (none), 1 (box) or 2 (sphere)")
    return np.ascontiguousarray(kinds, np.uint8)


def as_ids(ids, name: str = "ids") -> np.ndarray:
    """A 1-D C-contiguous uint64 array of user ids."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, np.uint64)
    if arr.dtype.kind == "i":
        negative = np.flatnonzero(arr < 0)
        if negative.size:
            row = int(negative[0])
            raise ValueError(f"{name} row {row}: id {arr[row]} is negative")
    elif arr.dtype.kind != "u":
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.uint64)


def _as_rows(values, width: int, name: str, rows: int | None, against: str = "ids", box_dims: int = 0,
             threads: int = 1) -> np.ndarray:
    """(n, width) C-contiguous finite float32 rows; with box_dims, boxes [min..., max...] too. A
    large batch is checked on `threads` threads (a structure's own)."""
    try:
        arr = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric: {exc}") from None
    if arr.size == 0 and rows in (None, 0):
        arr = arr.reshape(0, width)
    if arr.ndim != 2 or arr.shape[1] != width:
        raise ValueError(f"{name} must have shape (n, {width}), got {arr.shape}")
    if rows is not None and arr.shape[0] != rows:
        raise ValueError(f"{name} has {arr.shape[0]} rows but {against} has {rows}")
    arr = np.ascontiguousarray(arr)
    _check_rows(arr, name, box_dims, threads)
    return arr


def _check_rows(arr: np.ndarray, name: str, dims: int, threads: int = 1) -> None:
    """Every value finite (else the first row with a NaN or an infinity is named); with dims, rows
    [min..., max...] with min <= max on every axis (else the first inverted row is named)."""
    row, finite = first_bad_row(arr, dims, threads)
    if row < 0:
        return
    if not finite:
        raise ValueError(f"{name} row {row}: NaN or infinite value {arr[row].tolist()}")
    axis = int(np.flatnonzero(arr[row, :dims] > arr[row, dims:])[0])
    raise ValueError(f"{name} row {row}: min > max on axis {axis} ({arr[row].tolist()})")


def as_boxes(boxes, dims: int, rows: int | None = None, name: str = "boxes", threads: int = 1) -> np.ndarray:
    """(n, 2*dims) float32 rows [min..., max...], finite, min <= max on every axis."""
    return _as_rows(boxes, 2 * dims, name, rows, box_dims=dims, threads=threads)


def as_points(points, dims: int, name: str) -> np.ndarray:
    return _as_rows(points, dims, name, None)


def as_segments(segments, dims: int) -> np.ndarray:
    """(q, 2*dims) float32 rows [from..., to...]."""
    return _as_rows(segments, 2 * dims, "segments", None)


def as_displacements(displacements, dims: int, rows: int, against: str) -> np.ndarray:
    """(n, dims) float32 displacements of casts, one per row of `against`."""
    return _as_rows(displacements, dims, "displacements", rows, against)


def as_count(k, name: str = "k") -> int:
    """A number of results per query: an integer >= 0 (0 asks for nothing)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, not {k!r}")
    k = int(k)
    if not 0 <= k <= INT64_MAX:
        raise ValueError(f"{name} must be between 0 and {INT64_MAX}, not {k}")
    return k


def as_distance(value, name: str = "max_distance") -> float:
    """A distance limit: a number >= 0, inf for none."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, not {value!r}")
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {value!r}") from None
    if not value >= 0.0:
        raise ValueError(f"{name} must be a number >= 0 (inf for no limit), not {value!r}")
    return value


def as_radii(radii, rows: int) -> np.ndarray:
    arr = np.asarray(radii, dtype=np.float32)
    if arr.ndim == 0:
        arr = np.full(rows, arr, np.float32)
    if arr.shape != (rows,):
        raise ValueError(f"radii must have shape ({rows},), got {arr.shape}")
    arr = np.ascontiguousarray(arr)
    if rows:
        _check_rows(arr.reshape(rows, 1), "radii", 0)
        negative = np.flatnonzero(arr < 0)
        if negative.size:
            row = int(negative[0])
            raise ValueError(f"radii row {row}: negative radius {arr[row]}")
    return arr


def as_planes(planes, dims: int) -> np.ndarray:
    """(q, k, dims+1) float32 planes (n..., d), 1 <= k <= 32."""
    try:
        arr = np.asarray(planes, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"planes must be numeric: {exc}") from None
    if arr.size == 0 and arr.ndim != 3:
        arr = arr.reshape(0, 1, dims + 1)
    if arr.ndim != 3 or arr.shape[2] != dims + 1:
        raise ValueError(f"planes must have shape (q, k, {dims + 1}), got {arr.shape}")
    if not 1 <= arr.shape[1] <= MAX_FRUSTUM_PLANES:
        raise ValueError(f"planes: k must be between 1 and {MAX_FRUSTUM_PLANES}, got {arr.shape[1]}")
    arr = np.ascontiguousarray(arr)
    if arr.shape[0]:
        _check_rows(arr.reshape(arr.shape[0], -1), "planes", 0)
    return arr


def as_uint32(value, rows: int, name: str) -> np.ndarray:
    """A scalar or per-row array of 32-bit group/mask bits."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "b"):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.ndim == 0:
        arr = np.full(rows, arr, dtype=np.int64)
    if arr.shape != (rows,):
        raise ValueError(f"{name} must be a scalar or have shape ({rows},), got {arr.shape}")
    bad = np.flatnonzero((arr < 0) | (arr > UINT32_MAX)) if rows else np.zeros(0, np.int64)
    if bad.size:
        row = int(bad[0])
        raise ValueError(f"{name} row {row}: {arr[row]} is not a 32-bit unsigned value")
    return np.ascontiguousarray(arr, dtype=np.uint32)


def as_flags(value, rows: int, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = np.full(rows, bool(arr))
    if arr.shape != (rows,):
        raise ValueError(f"{name} must be a scalar or have shape ({rows},), got {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.uint8)


def as_mask(mask) -> int | None:
    """An optional query mask; None (every proxy, whatever its group) stays None."""
    if mask is None:
        return None
    if not isinstance(mask, (int, np.integer)) or isinstance(mask, bool):
        raise ValueError(f"mask must be an integer, not {mask!r}")
    mask = int(mask)
    if not 0 <= mask <= UINT32_MAX:
        raise ValueError(f"mask must be a 32-bit unsigned value, not {mask}")
    return mask


def check_overlap(a, b, mask_a, mask_b, max_pairs, has_groups) -> tuple:
    """overlap()'s arguments: structures of one dims, masks only where there are groups to filter
    (`has_groups(structure)`), and an optional limit on the pairs. Returns the masks and the limit
    (-1: none)."""
    if a.dims != b.dims:
        raise ValueError(f"overlap needs structures of the same dims, got {a.dims}-D and {b.dims}-D")
    masks = []
    for name, structure, mask in (("mask_a", a, mask_a), ("mask_b", b, mask_b)):
        if mask is not None and not has_groups(structure):
            raise ValueError(f"{name} needs a Broadphase: a Tree's proxies have no groups to filter")
        masks.append(as_mask(mask))
    if max_pairs is None:
        return masks[0], masks[1], -1
    if isinstance(max_pairs, bool) or not isinstance(max_pairs, (int, np.integer)) or not 0 <= max_pairs <= INT64_MAX:
        raise ValueError(f"max_pairs must be an integer >= 0 or None, not {max_pairs!r}")
    return masks[0], masks[1], int(max_pairs)


def first_duplicate(ids: np.ndarray) -> int:
    """Row of the first id that repeats an earlier row, or -1. Used by the reference only;
    the Cython structures find duplicates with their own hash table."""
    if ids.size < 2:
        return -1
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    repeats = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if not repeats.size:
        return -1
    return int(order[repeats + 1].min())


class HitLimit(Exception):
    """A call's queries hit more proxies than the structure's `max_hits` allows, or an overlap found more
    pairs than its `max_pairs`; nothing is returned."""


# The id errors every implementation raises. Rows are checked in order and the first row with a
# problem is reported: a repeat of an earlier row in the same call is a duplicate; otherwise an insert
# of a present id, or a move/remove of an absent one, is reported as such.
def duplicate_id(row: int, id_: int, name: str = "ids") -> ValueError:
    return ValueError(f"{name} row {row}: id {id_} appears twice in this call")


def already_present(row: int, id_: int, name: str = "ids") -> ValueError:
    return ValueError(f"{name} row {row}: id {id_} is already present")


def unknown_id(row: int, id_: int, name: str = "ids") -> KeyError:
    return KeyError(f"{name} row {row}: unknown id {id_}")
