"""Turning `world.apply(create=..., move=..., destroy=...)` into one or more `Batch` messages.

A batch that does not fit the server's message size is cut into parts, each under the limit, and
sent on one stream as consecutive parts of the same batch; the server applies nothing until the last
part arrives, so the batch stays atomic however big it is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from dbvt_client import wire
from dbvt_client.errors import DbvtError, InvalidArgument, TickMismatch, from_exception, from_refusal
from dbvt_client.results import BatchResult
from dbvt_client.serialized import field_key, serialized, varint
from dbvt_proto.v1 import broadphase_pb2 as pb

DEFAULT_GROUP = 1
DEFAULT_MASK = 0xFFFFFFFF
# Room left in every message for the world name, the field tags and their lengths.
MESSAGE_OVERHEAD = 4096


@dataclass(frozen=True)
class Create:
    """Proxies to create: `world.apply(create=Create(ids, boxes, static=True, group=2, mask=0b101))`.

    `static`, `group` and `mask` are each a scalar or one value per row. `sensor` is None, "box" or
    "sphere", or a uint8 kind per row (0 none, 1 box, 2 sphere). A plain `(ids, boxes)` tuple works
    too, with `static=`, `group=`, `mask=`, `sensor=` given to `apply` itself.
    """

    ids: Any
    boxes: Any
    static: Any = False
    group: Any = DEFAULT_GROUP
    mask: Any = DEFAULT_MASK
    sensor: Any = None


def _as_create(create, static, group, mask, sensor=None) -> Create | None:
    given = static is not None or group is not None or mask is not None or sensor is not None
    if create is None:
        if given:
            raise TypeError("static=, group=, mask= and sensor= describe created proxies; pass create= as well")
        return None
    if isinstance(create, Create):
        if given:
            raise TypeError("give static/group/mask/sensor either in Create(...) or to apply(), not both")
        return create
    ids, boxes = _ids_and_boxes(create, "create",
                                "(ids, boxes) or Create(ids, boxes, static=, group=, mask=, sensor=)")
    return Create(ids, boxes,
                  False if static is None else static,
                  DEFAULT_GROUP if group is None else group,
                  DEFAULT_MASK if mask is None else mask,
                  sensor)


def _ids_and_boxes(value, keyword: str, forms: str) -> tuple:
    """`create=`/`move=` given as `(ids, boxes)`. Only a tuple is taken apart: unpacking a bare array
    fails with "not enough values to unpack", or for two rows quietly splits it into two scalars."""
    if isinstance(value, tuple) and len(value) == 2:
        return value
    if isinstance(value, np.ndarray):
        given = f"an array of shape {value.shape}"
    elif isinstance(value, tuple):
        given = f"a tuple of {len(value)} items"
    else:
        given = f"a {type(value).__name__}"
    raise TypeError(f"{keyword}= takes {forms}, not {given}")


def _is_default(value, default) -> bool:
    return np.ndim(value) == 0 and value == default


class _Column:
    def __init__(self, field: str, values: np.ndarray):
        self.field = field
        self.values = values
        self.row_bytes = values.itemsize * math.prod(values.shape[1:])


def _boxes_for(ids: np.ndarray, boxes, name: str) -> np.ndarray:
    arr = wire.float_array(boxes, name, 2)
    if arr.shape[0] != len(ids):
        raise InvalidArgument(f"{name} has {arr.shape[0]} rows but its ids have {len(ids)}")
    return arr


def encode(create=None, move=None, destroy=None, static=None, group=None, mask=None,
           sensor=None) -> list[list[_Column]]:
    """The batch's columns, grouped by operation (rows of one operation travel together)."""
    ops: list[list[_Column]] = []
    spec = _as_create(create, static, group, mask, sensor)
    if spec is not None:
        ids = wire.ids_array(spec.ids, "create_ids")
        columns = [_Column("create_ids", ids), _Column("create_boxes", _boxes_for(ids, spec.boxes, "create_boxes"))]
        if not _is_default(spec.static, False):
            columns.append(_Column("create_static", wire.flags_array(spec.static, len(ids), "create_static")))
        if not _is_default(spec.group, DEFAULT_GROUP):
            columns.append(_Column("create_group", wire.bits_array(spec.group, len(ids), "create_group")))
        if not _is_default(spec.mask, DEFAULT_MASK):
            columns.append(_Column("create_mask", wire.bits_array(spec.mask, len(ids), "create_mask")))
        if spec.sensor is not None:
            columns.append(_Column("create_sensor", sensor_kinds(spec.sensor, len(ids))))
        ops.append(columns)
    if move is not None:
        move_ids, move_boxes = _ids_and_boxes(move, "move", "(ids, boxes)")
        ids = wire.ids_array(move_ids, "move_ids")
        ops.append([_Column("move_ids", ids), _Column("move_boxes", _boxes_for(ids, move_boxes, "move_boxes"))])
    if destroy is not None:
        ops.append([_Column("destroy_ids", wire.ids_array(destroy, "destroy_ids"))])
    return ops


SENSOR_KINDS = {None: 0, "box": 1, "sphere": 2}


def sensor_kinds(sensor, n: int) -> np.ndarray:
    """`sensor=` as the wire's uint8 column: 0 none, 1 box, 2 sphere."""
    if sensor is None or isinstance(sensor, str):
        if sensor not in SENSOR_KINDS:
            raise InvalidArgument(f"sensor must be None, 'box', 'sphere' or per-row kinds 0, 1, 2, not {sensor!r}")
        return np.full(n, SENSOR_KINDS[sensor], wire.FLAGS)
    kinds = np.asarray(sensor)
    if kinds.ndim == 0:
        kinds = np.full(n, kinds)
    if kinds.shape != (n,) or kinds.dtype.kind not in "iub":
        raise InvalidArgument(f"sensor must be a scalar kind or {n} integer kinds (0 none, 1 box, 2 sphere), "
                              f"got {kinds.dtype} of shape {kinds.shape}")
    wrong = np.flatnonzero((kinds < 0) | (kinds > 2))
    if wrong.size:
        raise InvalidArgument(f"create_sensor row {wrong[0]}: kind {kinds[wrong[0]]} is not 0 (none), 1 (box) "
                              "or 2 (sphere)")
    return np.ascontiguousarray(kinds, wire.FLAGS)


def split(ops: list[list[_Column]], max_message_bytes: int, expected_tick: int | None = None) -> list[dict]:
    """Batches of at most `max_message_bytes`, each a slice of rows of every operation in turn, each
    carrying `expected_tick` when given: each batch as its fields, the slices numpy views (copied
    once, when serialized: `stream_requests`, `batch_message`)."""
    if expected_tick is not None and (isinstance(expected_tick, bool) or not isinstance(expected_tick, (int, np.integer))
                                      or not 0 <= expected_tick < 2**64):
        raise InvalidArgument(f"expected_tick must be None or an integer tick >= 0, not {expected_tick!r}")
    budget = max_message_bytes - MESSAGE_OVERHEAD
    parts: list[dict] = [{}]
    room = budget
    for columns in ops:
        rows = len(columns[0].values)
        row_bytes = sum(column.row_bytes for column in columns)
        if row_bytes > budget:
            raise InvalidArgument(f"one {columns[0].field} row takes {row_bytes} bytes, but a message of "
                                  f"{max_message_bytes} bytes (the server's max_message_bytes) has room for "
                                  f"{max(budget, 0)} once {MESSAGE_OVERHEAD} are kept for its other fields")
        start = 0
        while start < rows:
            take = min(rows - start, room // row_bytes)
            if take == 0:
                parts.append({})
                room = budget
                continue
            for column in columns:
                # Mostly the whole column fits (a tick's batch): the array itself, no view made.
                parts[-1][column.field] = column.values if take == rows else column.values[start:start + take]
            start += take
            room -= take * row_bytes
    if expected_tick is not None:
        for part in parts:
            part["expected_tick"] = int(expected_tick)
    return parts


def apply_request(world: str, part: dict) -> pb.ApplyBatchRequest:
    """An ApplyBatch call's request for a batch of `split` (its result read by decode_result)."""
    return pb.ApplyBatchRequest(world=world, batch=batch_message(part), narrow_ids=True)


def batch_message(part: dict) -> pb.Batch:
    """A batch of `split` as its generated message."""
    return pb.Batch(**{field: value.tobytes() if isinstance(value, np.ndarray) else value
                       for field, value in part.items()})


def decode_result(result: pb.BatchResult) -> BatchResult:
    narrow = result.narrow_ids
    return BatchResult(tick=result.tick,
                       begun=wire.decode_id_rows(result.begun, narrow, "begun"),
                       ended=wire.decode_id_rows(result.ended, narrow, "ended"),
                       incarnation=result.incarnation,
                       entered=wire.decode_id_rows(result.entered, narrow, "entered"),
                       left=wire.decode_id_rows(result.left, narrow, "left"),
                       world_seconds=result.world_seconds)


def stream_requests(world: str, sequence: int, parts: list[dict]) -> list[bytes]:
    """The stream's messages of a batch cut by `split`, serialized: each column copied once, straight
    into its message (dbvt_client.serialized); the transports send them as they are. Results are read
    by decode_result, which widens ids sent in 32 bits: each message allows them."""
    last = len(parts) - 1
    return [serialized(pb.StreamBatchesRequest, world=world, sequence=sequence, batch=part, more_parts=i < last,
                       narrow_ids=True)
            for i, part in enumerate(parts)]


def moves_alone(create, move, destroy, static, group, mask, sensor, expected_tick) -> tuple[np.ndarray, np.ndarray] | None:
    """A game's tick, a batch of moves alone, as its checked (ids, boxes), which `moves_request` writes
    when they fit one message (`fits_one_message`); None for any other batch, which `encode` and
    `split` make into messages."""
    if (move is None or create is not None or destroy is not None or static is not None or group is not None
            or mask is not None or sensor is not None or expected_tick is not None):
        return None
    move_ids, move_boxes = move if type(move) is tuple and len(move) == 2 else _ids_and_boxes(move, "move", "(ids, boxes)")
    ids = wire.ids_array(move_ids, "move_ids")
    return (ids, _boxes_for(ids, move_boxes, "move_boxes")) if len(ids) else None


def fits_one_message(moves: tuple[np.ndarray, np.ndarray], max_message_bytes: int) -> bool:
    return moves[0].nbytes + moves[1].nbytes <= max_message_bytes - MESSAGE_OVERHEAD


def stream_header(world: str) -> bytes:
    """What every message of `world`'s batch stream starts with: its world field."""
    return serialized(pb.StreamBatchesRequest, world=world)


_SEQUENCE_KEY = field_key(pb.StreamBatchesRequest, "sequence")
_BATCH_KEY = field_key(pb.StreamBatchesRequest, "batch")
_NARROW_IDS = field_key(pb.StreamBatchesRequest, "narrow_ids") + varint(1)
_MOVE_IDS_KEY = field_key(pb.Batch, "move_ids")
_MOVE_BOXES_KEY = field_key(pb.Batch, "move_boxes")


def moves_request(header: bytes, sequence: int, ids: np.ndarray, boxes: np.ndarray) -> bytes:
    """The message of a streamed batch of `moves_alone`, byte for byte what `stream_requests` writes
    for it, but in one join rather than through the general serializer: a tick's encoding runs with
    the caches cold, where each call it makes costs microseconds."""
    batch, ids_size, boxes_size = _moves_framing(ids.nbytes, boxes.nbytes)
    return b"".join((header, _SEQUENCE_KEY, varint(sequence), batch, ids_size, ids, boxes_size, boxes, _NARROW_IDS))


@lru_cache(maxsize=64)
def _moves_framing(ids_bytes: int, boxes_bytes: int) -> tuple[bytes, bytes, bytes]:
    """What precedes the batch and its two columns in `moves_request`'s message: the same for every
    tick that moves as many proxies, so a game's ticks mostly find it here."""
    ids_size, boxes_size = _MOVE_IDS_KEY + varint(ids_bytes), _MOVE_BOXES_KEY + varint(boxes_bytes)
    return _BATCH_KEY + varint(len(ids_size) + ids_bytes + len(boxes_size) + boxes_bytes), ids_size, boxes_size


def stream_refusal(response: pb.StreamBatchesResponse) -> DbvtError:
    """The error a stream's batch was refused with, of the class a unary ApplyBatch would raise."""
    if response.HasField("world_tick"):
        return TickMismatch(response.status_message, response.world_tick, response.world_incarnation)
    return from_refusal(response.status_code, response.status_message, response.world_server)


def outcome(response: pb.StreamBatchesResponse) -> BatchResult | DbvtError:
    """A stream's answer to a batch: its result, or the error it was refused with, or the error
    decoding it raised."""
    try:
        if response.status_code:
            return stream_refusal(response)
        return decode_result(response.result)
    except Exception as exc:
        return from_exception(exc)


def settle(future, response: pb.StreamBatchesResponse) -> DbvtError | None:
    """Resolve a stream's future of a batch with its answer (`outcome`); the error, if it is one. A
    future its caller cancelled is left as it is."""
    answer = outcome(response)
    refused = isinstance(answer, DbvtError)
    if not future.done():
        if refused:
            future.set_exception(answer)
        else:
            future.set_result(answer)
    return answer if refused else None
