"""A world: one `dbvt.Broadphase`, its tick, and the protocol's atomic batch on top of it.

This is the service itself, transport aside: dbvt-server runs it behind gRPC and `Client.local()`
calls it in-process (`dbvt_server.local`), so both answer every request (and every bad one) identically. Requests come in
and responses go out as the generated messages, numpy in between; a query's answer, megabytes of hits,
is its message's fields with the core's arrays in them, which the server serializes straight into
the message that carries it (dbvt_client.serialized) and the in-process transport makes a message of;
a batch's answer, every tick, comes serialized in one pass over its pairs (dbvt_server._result_bytes).
Not thread-safe: callers serialize the calls on one world (the server with one lock per world).
"""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np

import dbvt
from dbvt import Broadphase, FatPairLimit, HitLimit, validation
from dbvt_client import wire
from dbvt_client.errors import InvalidArgument, ResourceExhausted, TickMismatch, quoted
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_server import images
from dbvt_server._result_bytes import batch_result

BATCH_OPS = ("create_ids", "move_ids", "destroy_ids")
# The pairs of fat boxes (grown by the margin) a world may hold per pair of its limit, while a batch
# is applied: they bound the memory and time of the update before its pairs can be counted.
FAT_PAIRS_PER_PAIR = 4
# An empty id column, shared (read-only, as the columns read from a message are).
NO_IDS = np.frombuffer(b"", dtype=wire.IDS)


class _CoreCall:
    """The seconds a query set's call into the core took (World._core_call)."""

    __slots__ = ("seconds",)

    def __init__(self):
        self.seconds = 0.0


def column(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`arr` as a column of the wire (for `serialized`), copied only if its layout is not the wire's."""
    return np.ascontiguousarray(arr, dtype=dtype)


def id_columns(allowed: bool, **columns: np.ndarray) -> dict:
    """Columns of ids as the wire's, with the answer's `narrow_ids`: uint32 where the request `allowed`
    it and every id of them all fits, half the bytes to send; uint64 otherwise."""
    narrow = allowed and all(ids.size == 0 or int(ids.max()) <= wire.NARROW_IDS_MAX for ids in columns.values())
    dtype = wire.NARROW_IDS if narrow else wire.IDS
    return {**{name: column(ids, dtype) for name, ids in columns.items()}, "narrow_ids": narrow}


def message_fields(fields: dict) -> dict:
    """`fields` for a generated message: its columns as bytes."""
    return {name: value.tobytes() if isinstance(value, np.ndarray) else value for name, value in fields.items()}


def _renamed(exc: Exception, field: str) -> Exception:
    """The core names its argument `ids`/`boxes`; a batch has several, so say which one."""
    message = str(exc.args[0]) if exc.args else str(exc)
    for argument in ("ids", "boxes", "static", "group", "mask", "sensor"):
        if message.startswith(argument + " "):
            message = f"{field}_{argument}{message[len(argument):]}"
            break
    return InvalidArgument(message)


class World:
    def __init__(self, name: str, dims: int, margin: float, max_proxies: int, track_pairs: bool,
                 max_pairs: int = 2**62, max_hits: int = -1, incarnation: int = 0, ephemeral: bool = True,
                 broadphase: Broadphase | None = None, tick: int = 0, sensor_margin: float = 0.0,
                 threads: int = 1):
        self.name = name
        self.max_proxies = max_proxies
        self.max_pairs = max_pairs
        # `threads` for a new core; a decoded one (`broadphase`) got the server's from images.decode.
        self.broadphase = broadphase or Broadphase(dims=dims, margin=margin, track_pairs=track_pairs,
                                                   sensor_margin=sensor_margin, threads=threads)
        self.sensor_margin = float(sensor_margin)
        # The core stops a query call past this many hits, before it has built their answer.
        self.broadphase.max_hits = max_hits
        self.dims = int(dims)
        self.margin = float(margin)
        self.track_pairs = bool(track_pairs)
        self.tick = tick
        # Random at creation; a new one whenever the world's history is lost (see docs/operations.md).
        self.incarnation = incarnation
        self.ephemeral = ephemeral
        # The server it is being moved to (host:port), while it moves: every call but the mover's is
        # refused (Moving).
        self.moving_to = ""
        # dbvt_server.persistence.WorldFiles of a world kept in the data directory: every batch is
        # journaled before it is applied.
        self.files = None
        # dbvt_server.watch.SensorFeed: each tick's sensor events go to the world's watchers.
        self.feed = None

    @classmethod
    def from_image(cls, image, max_hits: int, name: str | None = None, ephemeral: bool = False) -> "World":
        """The world a dbvt_server.images.Image holds, under `name` if given."""
        settings = dict(image.settings)
        if name is not None:
            settings["name"] = name
        return cls(**settings, max_hits=max_hits, ephemeral=ephemeral, broadphase=image.broadphase)

    def settings(self) -> dict:
        """What a world image keeps besides the core (dbvt_server.images.SETTINGS)."""
        return dict(name=self.name, dims=self.dims, margin=self.margin, max_proxies=self.max_proxies,
                    track_pairs=self.track_pairs, max_pairs=self.max_pairs, tick=self.tick,
                    incarnation=self.incarnation, sensor_margin=self.sensor_margin)

    def info(self) -> pb.WorldInfo:
        return pb.WorldInfo(name=self.name, dims=self.dims, margin=self.margin, max_proxies=self.max_proxies,
                            proxies=len(self.broadphase), tick=self.tick, track_pairs=self.track_pairs,
                            max_pairs=self.max_pairs, incarnation=self.incarnation, ephemeral=self.ephemeral,
                            sensor_margin=self.sensor_margin, moving_to=self.moving_to)

    def stats(self, request: pb.GetWorldStatsRequest) -> pb.GetWorldStatsResponse:
        counts, measures = {}, {}
        for key, value in self.broadphase.stats().items():
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
                counts[key] = int(value)
            elif isinstance(value, (float, np.floating)):
                measures[key] = float(value)
        return pb.GetWorldStatsResponse(world=self.info(), tree_counts=counts, tree_measures=measures)

    # ---- batches -------------------------------------------------------------------------------
    def apply(self, batch: pb.Batch, narrow_ids: bool = False) -> pb.BatchResult:
        """The batch applied (see `applied`), and its result."""
        return pb.BatchResult.FromString(self.applied(batch, narrow_ids))

    def applied(self, batch: pb.Batch, narrow_ids: bool = False) -> bytes:
        """Validate the whole batch, journal it (a persistent world), apply it, then update(); its
        BatchResult serialized, the pairs in 32 bits where `narrow_ids` allows it (the rule of
        id_columns, in one pass: dbvt_server._result_bytes).

        create runs first: the core checks its own arguments before changing anything. The move and
        destroy ids are checked against the world beforehand whenever an earlier step could already
        have changed it, and ids are distinct across the batch, so nothing after create can fail but
        the pair limit, which undoes the batch. A batch refused after its journal record was written
        has the record taken back.
        """
        if batch.HasField("expected_tick") and batch.expected_tick != self.tick:
            raise TickMismatch(f"world {quoted(self.name)} is at tick {self.tick} (incarnation {self.incarnation}), "
                               f"not at the expected tick {batch.expected_tick}; nothing of the batch was applied",
                               self.tick, self.incarnation)
        begun, ended, seconds = self._checked_apply(batch)
        entered, left = self.broadphase.sensor_events()
        self.tick += 1
        if self.files is not None:
            self.files.applied(self)
        if self.feed is not None:
            self.feed.publish(self.tick, entered, left)
        return batch_result(self.tick, self.incarnation, begun, ended, entered, left, narrow_ids, seconds)

    def _checked_apply(self, batch: pb.Batch) -> tuple[np.ndarray, np.ndarray, float]:
        """The batch checked and applied: its begun and ended pairs, and the seconds the core took."""
        dims, bp = self.dims, self.broadphase
        # Most batches leave two of the three operations empty (a tick only moves): no call for those.
        create_ids = self._ids(data, "create_ids") if (data := batch.create_ids) else NO_IDS
        move_ids = self._ids(data, "move_ids") if (data := batch.move_ids) else NO_IDS
        destroy_ids = self._ids(data, "destroy_ids") if (data := batch.destroy_ids) else NO_IDS
        n = len(create_ids)
        create_boxes = (self._floats(data, (n, 2 * dims), "create_boxes") if (data := batch.create_boxes) or n
                        else np.empty((0, 2 * dims), wire.FLOATS))
        move_boxes = self._floats(batch.move_boxes, (len(move_ids), 2 * dims), "move_boxes")
        static = wire.decode(batch.create_static, wire.FLAGS, (n,), "create_static") if batch.create_static else False
        group = wire.decode(batch.create_group, wire.BITS, (n,), "create_group") if batch.create_group else 1
        mask = wire.decode(batch.create_mask, wire.BITS, (n,), "create_mask") if batch.create_mask else 0xFFFFFFFF
        sensor = wire.decode(batch.create_sensor, wire.FLAGS, (n,), "create_sensor") if batch.create_sensor else None
        try:
            if n:
                validation.as_boxes(create_boxes, dims, n, "create_boxes")
            if n or len(destroy_ids):
                # A batch of moves alone (the streamed tick) is checked once, by the core, before it
                # changes anything; beside other operations the boxes are checked before any of them.
                validation.as_boxes(move_boxes, dims, len(move_ids), "move_boxes")
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if (n > 0) + (len(move_ids) > 0) + (len(destroy_ids) > 0) > 1:
            # Within one operation the core finds repeated ids itself, with its hash table.
            self._check_distinct(create_ids, move_ids, destroy_ids)
        if n and len(move_ids):
            self._check_present(move_ids, "move")
        if (n or len(move_ids)) and len(destroy_ids):
            self._check_present(destroy_ids, "destroy")
        if len(bp) + n - len(destroy_ids) > self.max_proxies:
            raise ResourceExhausted(
                f"world {quoted(self.name)} would hold {len(bp) + n - len(destroy_ids)} proxies, "
                f"more than its limit of {self.max_proxies}")
        if self.files is not None:
            self.files.append(self, batch)
        started = time.perf_counter()
        try:
            begun, ended = self._changed(create_ids, create_boxes, (static, group, mask, sensor), move_ids,
                                         move_boxes, destroy_ids)
        except BaseException:
            if self.files is not None:
                self.files.take_back()
            raise
        return begun, ended, time.perf_counter() - started

    def _changed(self, create_ids, create_boxes, settings, move_ids, move_boxes, destroy_ids):
        """The checked batch applied to the core; its begun and ended pairs."""
        static, group, mask, sensor = settings
        bp, n = self.broadphase, len(create_ids)
        # What undoing the batch needs, should it take the world past its pair limit; nothing where
        # the limit is past reach: a world of a few thousand proxies under the default limit is
        # spared a copy of its moved boxes every tick.
        proxies = len(bp) + n - len(destroy_ids)
        limited = self.track_pairs and proxies * (proxies - 1) // 2 > self.max_pairs
        moved_from = np.empty(move_boxes.shape, move_boxes.dtype) if limited and len(move_ids) else None
        destroyed = None
        if limited and len(destroy_ids):
            try:
                destroyed = (bp.get(destroy_ids), bp.settings(destroy_ids))
            except (ValueError, KeyError) as exc:
                raise _renamed(exc, "destroy") from None
        if n:
            try:
                bp.create(create_ids, create_boxes, static=static, group=group, mask=mask, sensor=sensor)
            except (ValueError, KeyError) as exc:
                raise _renamed(exc, "create") from None
        if len(move_ids):
            try:
                bp.move(move_ids, move_boxes, previous=moved_from)
            except (ValueError, KeyError) as exc:
                raise _renamed(exc, "move") from None
        if len(destroy_ids):
            try:
                bp.destroy(destroy_ids)
            except (ValueError, KeyError) as exc:
                raise _renamed(exc, "destroy") from None
        if not limited:
            # Not even every box touching every other would pass the limit (nor the fat boxes its
            # FAT_PAIRS_PER_PAIR times, with room to spare for the entries found before they are
            # merged): the update cannot be refused.
            return bp.update()
        return self._update_within_limit(create_ids, move_ids, moved_from, destroy_ids, destroyed)

    def _update_within_limit(self, create_ids, move_ids, moved_from, destroy_ids, destroyed):
        """The batch's update(), or, when it takes the world past max_pairs, the batch undone and
        ResourceExhausted. The core stops early once the fat boxes' pairs pass FAT_PAIRS_PER_PAIR
        times the limit, so that boxes piled on one spot cannot fill the memory first."""
        bp = self.broadphase
        try:
            begun, ended = bp.update(max_fat_pairs=FAT_PAIRS_PER_PAIR * self.max_pairs)
            if bp.pair_count <= self.max_pairs:
                return begun, ended
            found = f"{bp.pair_count} pairs"
        except FatPairLimit:
            found = f"more than {FAT_PAIRS_PER_PAIR * self.max_pairs} pairs of boxes grown by the margin"
        # Back to where the world was: the pairs are a function of the boxes and their settings; who
        # is inside a sensor also depends on history, so that is set back from the events.
        refused = bp.sensor_events()
        if len(create_ids):
            bp.destroy(create_ids)
        if len(move_ids):
            bp.move(move_ids, moved_from)
        if len(destroy_ids):
            boxes, (static, group, mask, sensor) = destroyed
            bp.create(destroy_ids, boxes, static=static, group=group, mask=mask, sensor=sensor)
        bp.update()
        _set_sensors_back(bp, refused, bp.sensor_events())
        raise ResourceExhausted(f"the batch would give world {quoted(self.name)} {found}, past its limit of "
                                f"{self.max_pairs} pairs (max_pairs); nothing of it was applied")

    @staticmethod
    def _ids(data: bytes, name: str) -> np.ndarray:
        if len(data) % wire.IDS.itemsize:
            raise InvalidArgument(f"{name} has {len(data)} bytes, not a whole number of uint64 ids")
        return np.frombuffer(data, dtype=wire.IDS)

    @staticmethod
    def _check_distinct(*columns: np.ndarray) -> None:
        everything = np.concatenate(columns)
        if len(everything) < 2:
            return
        order = np.argsort(everything, kind="stable")
        repeats = np.flatnonzero(everything[order][1:] == everything[order][:-1])
        if not repeats.size:
            return
        second = int(order[repeats + 1].min())
        first = int(np.flatnonzero(everything == everything[second])[0])
        starts = np.cumsum([0] + [len(c) for c in columns])

        def where(position: int) -> str:
            op = int(np.searchsorted(starts, position, side="right")) - 1
            return f"{BATCH_OPS[op]} row {position - int(starts[op])}"

        raise InvalidArgument(f"{where(second)}: id {everything[second]} already appears in this batch "
                              f"at {where(first)}; each id may appear once per batch")

    def _floats(self, data: bytes, shape: tuple[int, ...], name: str) -> np.ndarray:
        """`data` as float32 rows of `shape`, or an error in shapes, as the caller wrote the array.

        The server learns only the rows (from the ids or the count) and the bytes, so the caller's
        last dimension is worked out from them: `create_boxes must be (n, 6) for a 3-D world, got (1, 4)`.
        """
        itemsize = wire.FLOATS.itemsize
        if not data and not shape[0]:
            return np.empty(shape, wire.FLOATS)
        if len(data) == itemsize * math.prod(shape):
            return np.frombuffer(data, dtype=wire.FLOATS).reshape(shape)
        leading = shape[:-1]
        rows = math.prod(leading)
        if rows and len(data) % (itemsize * rows) == 0:
            got = str((*leading, len(data) // (itemsize * rows)))
        else:
            got = f"{len(data)} bytes for {rows} rows"
        wanted = f"(n, {shape[-1]})" if len(shape) == 2 else f"(q, k, {shape[-1]})"
        raise InvalidArgument(f"{name} must be {wanted} for a {self.dims}-D world, got {got}")

    def _check_present(self, ids: np.ndarray, op: str) -> None:
        try:
            self.broadphase.get(ids)
        except KeyError as exc:
            raise _renamed(exc, op) from None

    # ---- queries ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _core_call(self, count: int):
        """Around a query set's call into the core: its seconds, as `.seconds` of what it yields (the
        answer's world_seconds), and, past the hit limit, ResourceExhausted."""
        call = _CoreCall()
        started = time.perf_counter()
        try:
            yield call
        except HitLimit:
            raise ResourceExhausted(
                f"the {count} queries hit more than {self.broadphase.max_hits} proxies, the most one call may return "
                "(--max-hits-per-call); ask them in smaller calls") from None
        call.seconds = time.perf_counter() - started

    def _answer(self, request, call: _CoreCall, offsets: np.ndarray, hits: np.ndarray, **columns) -> dict:
        """A query's answer as its message's fields, the core's arrays as the wire's columns, for
        dbvt_client.serialized to write once, into whatever message carries it; its hits in 32 bits
        where the request allows it and every id fits, half the bytes to send; and the core call's
        seconds as its world_seconds."""
        return dict(tick=self.tick, incarnation=self.incarnation, offsets=column(offsets, wire.OFFSETS),
                    **id_columns(request.narrow_ids, hits=hits), world_seconds=call.seconds, **columns)

    @staticmethod
    def _mask(request) -> int | None:
        return request.mask if request.HasField("mask") else None

    def query_aabb(self, request: pb.QueryAabbRequest) -> dict:
        boxes = self._floats(request.boxes, (request.count, 2 * self.dims), "boxes")
        with self._core_call(request.count) as call:
            offsets, hits = self.broadphase.query_aabb(boxes, mask=self._mask(request),
                                                       include_sensors=request.include_sensors)
        return self._answer(request, call, offsets, hits)

    def query_sphere(self, request: pb.QuerySphereRequest) -> dict:
        centers = self._floats(request.centers, (request.count, self.dims), "centers")
        radii = wire.decode(request.radii, wire.FLOATS, (request.count,), "radii")
        with self._core_call(request.count) as call:
            offsets, hits = self.broadphase.query_sphere(centers, radii, mask=self._mask(request),
                                                         include_sensors=request.include_sensors)
        return self._answer(request, call, offsets, hits)

    def raycast(self, request: pb.RaycastRequest) -> dict:
        segments = self._floats(request.segments, (request.count, 2 * self.dims), "segments")
        first_hit = request.mode == pb.RAYCAST_MODE_FIRST_HIT
        with self._core_call(request.count) as call:
            offsets, hits, fractions = self.broadphase.raycast(segments, first_hit=first_hit, mask=self._mask(request),
                                                               include_sensors=request.include_sensors)
        return self._answer(request, call, offsets, hits, fractions=column(fractions, wire.FRACTIONS))

    def query_frustum(self, request: pb.QueryFrustumRequest) -> dict:
        planes = self._floats(request.planes, (request.count, request.planes_per_query, self.dims + 1), "planes")
        with self._core_call(request.count) as call:
            offsets, hits = self.broadphase.query_frustum(planes, mask=self._mask(request),
                                                          include_sensors=request.include_sensors)
        return self._answer(request, call, offsets, hits)

    def query_nearest(self, request: pb.QueryNearestRequest) -> dict:
        points = self._floats(request.points, (request.count, self.dims), "points")
        reach = request.max_distance if request.HasField("max_distance") else math.inf
        with self._core_call(request.count) as call:
            offsets, hits, distances = self.broadphase.query_nearest(
                points, request.k, reach, mask=self._mask(request), include_sensors=request.include_sensors)
        return self._answer(request, call, offsets, hits, distances=column(distances, wire.FLOATS))

    def cast_box(self, request: pb.CastBoxRequest) -> dict:
        boxes = self._floats(request.boxes, (request.count, 2 * self.dims), "boxes")
        moves = self._floats(request.displacements, (request.count, self.dims), "displacements")
        with self._core_call(request.count) as call:
            offsets, hits, fractions = self.broadphase.cast_box(boxes, moves, first_hit=request.first_hit,
                                                                mask=self._mask(request),
                                                                include_sensors=request.include_sensors)
        return self._answer(request, call, offsets, hits, fractions=column(fractions, wire.FRACTIONS))

    def cast_sphere(self, request: pb.CastSphereRequest) -> dict:
        centers = self._floats(request.centers, (request.count, self.dims), "centers")
        radii = wire.decode(request.radii, wire.FLOATS, (request.count,), "radii")
        moves = self._floats(request.displacements, (request.count, self.dims), "displacements")
        with self._core_call(request.count) as call:
            offsets, hits, fractions = self.broadphase.cast_sphere(centers, radii, moves, first_hit=request.first_hit,
                                                                   mask=self._mask(request),
                                                                   include_sensors=request.include_sensors)
        return self._answer(request, call, offsets, hits, fractions=column(fractions, wire.FRACTIONS))

    def pairs(self, request: pb.GetPairsRequest) -> pb.GetPairsResponse:
        return pb.GetPairsResponse(tick=self.tick, incarnation=self.incarnation,
                                   **message_fields(id_columns(request.narrow_ids, pairs=self.broadphase.pairs())))

    def sensor_pairs(self, request: pb.GetSensorPairsRequest) -> pb.GetSensorPairsResponse:
        return pb.GetSensorPairsResponse(tick=self.tick, incarnation=self.incarnation, **message_fields(
            id_columns(request.narrow_ids, pairs=self.broadphase.sensor_pairs())))

    def apply_batch(self, request: pb.ApplyBatchRequest) -> pb.ApplyBatchResponse:
        return pb.ApplyBatchResponse(result=self.apply(request.batch, request.narrow_ids))

    def export(self, request: pb.ExportWorldRequest) -> pb.ExportWorldResponse:
        """The world's image (dbvt_server.images) at its current tick, which the server sends in parts."""
        data = b"".join(images.encode(self.settings(), self.broadphase))
        return pb.ExportWorldResponse(world=self.info(), total_bytes=len(data), data=data)


def overlap(a: World, b: World, request: pb.OverlapRequest, max_hits: int) -> pb.OverlapResponse:
    """Every [id in a, id in b] whose tight boxes overlap; the caller holds both worlds still."""
    if a.dims != b.dims:
        raise InvalidArgument(f"world {quoted(a.name)} is {a.dims}-D and world {quoted(b.name)} is {b.dims}-D: "
                              "only worlds of the same dims overlap")
    mask_a = request.mask_a if request.HasField("mask_a") else None
    mask_b = request.mask_b if request.HasField("mask_b") else None
    try:
        pairs = dbvt.overlap(a.broadphase, b.broadphase, mask_a, mask_b, max_pairs=max_hits,
                             include_sensors=request.include_sensors)
    except HitLimit:
        raise ResourceExhausted(f"worlds {quoted(a.name)} and {quoted(b.name)} cross in more than {max_hits} "
                                "pairs, the most one call may return (--max-hits-per-call); use masks to ask "
                                "for less") from None
    return pb.OverlapResponse(tick_a=a.tick, tick_b=b.tick, incarnation_a=a.incarnation, incarnation_b=b.incarnation,
                              **message_fields(id_columns(request.narrow_ids, pairs=pairs)))


def _set_sensors_back(bp: Broadphase, refused: tuple, undone: tuple) -> None:
    """After a refused batch was undone: each sensor pair either update touched is set inside or
    outside as before the batch (an undone move does not bring back a proxy that had left from the
    margin band, nor take out one that entered there)."""
    entered_before, left_before = (set(map(tuple, rows.tolist())) for rows in refused)
    entered_undo, left_undo = (set(map(tuple, rows.tolist())) for rows in undone)
    touched = sorted(entered_before | left_before | entered_undo | left_undo)
    if not touched:
        return
    rows = np.array(touched, np.uint64).reshape(-1, 2)
    inside = np.array([pair in left_before or (pair not in entered_before and pair in left_undo) for pair in touched])
    alive = np.array([int(a) in bp and int(b) in bp for a, b in touched], bool)
    bp.set_sensor_pairs(rows[alive], inside[alive])


# The RPCs that act on one world, by method name: what the server runs under that world's lock.
WORLD_RPCS = {
    "GetWorldStats": World.stats,
    "ApplyBatch": World.apply_batch,
    "QueryAabb": World.query_aabb,
    "QuerySphere": World.query_sphere,
    "Raycast": World.raycast,
    "QueryFrustum": World.query_frustum,
    "GetPairs": World.pairs,
    "GetSensorPairs": World.sensor_pairs,
    "QueryNearest": World.query_nearest,
    "CastBox": World.cast_box,
    "CastSphere": World.cast_sphere,
    "ExportWorld": World.export,
}
