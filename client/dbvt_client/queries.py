"""Query requests and the decoding of their answers, shared by `Client` and `AsyncClient`.

A query set too big for one message is cut into parts of whole queries; the transport sends them
as one query set (the server answers it at one tick) and hands back the one answer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from dbvt_client import wire
from dbvt_client.batches import MESSAGE_OVERHEAD
from dbvt_client.errors import InvalidArgument
from dbvt_client.results import Crossings, Hits, NearestHits, RayHits
from dbvt_proto.v1 import broadphase_pb2 as pb

@dataclass
class Plan:
    method: str
    # The query set's parts, each fitting in a message.
    requests: list
    # The result, from the set's one answer.
    finish: Callable[[object], object]


def _ranges(count: int, row_bytes: int, max_message_bytes: int) -> list[tuple[int, int]]:
    per_message = max(1, (max_message_bytes - MESSAGE_OVERHEAD) // max(row_bytes, 1))
    return [(start, min(count, start + per_message)) for start in range(0, count, per_message)] or [(0, 0)]


def _common(world: str, mask, include_sensors: bool = False) -> dict:
    # Every answer's hits are widened to uint64 here, so the server may send them in 32 bits.
    fields = {"world": world, "include_sensors": bool(include_sensors), "narrow_ids": True}
    if mask is not None:
        mask = int(mask)
        if not 0 <= mask <= 0xFFFFFFFF:
            raise InvalidArgument(f"mask must be a 32-bit unsigned value, not {mask}")
        fields["mask"] = mask
    return fields


def _csr_plan(method: str, requests: list, count: int) -> Plan:
    def finish(response):
        offsets, hits = wire.decode_csr(response.offsets, response.hits, count, response.narrow_ids)
        return Hits(offsets, hits, tick=response.tick, incarnation=response.incarnation,
                    world_seconds=response.world_seconds)

    return Plan(method, requests, finish)


def aabb(world: str, boxes, mask, max_message_bytes: int, include_sensors: bool = False) -> Plan:
    arr = wire.float_array(boxes, "boxes", 2)
    base = _common(world, mask, include_sensors)
    ranges = _ranges(len(arr), arr[:1].nbytes, max_message_bytes)
    requests = [pb.QueryAabbRequest(count=b - a, boxes=arr[a:b].tobytes(), **base) for a, b in ranges]
    return _csr_plan("QueryAabb", requests, len(arr))


def sphere(world: str, centers, radii, mask, max_message_bytes: int, include_sensors: bool = False) -> Plan:
    arr = wire.float_array(centers, "centers", 2)
    if np.ndim(radii) == 0:
        # Spread before converting: a converted scalar comes back as one row (ascontiguousarray has ndim >= 1).
        radii = np.full(len(arr), radii)
    radii_arr = wire.float_array(radii, "radii", np.ndim(radii))
    if radii_arr.shape != (len(arr),):
        raise InvalidArgument(f"radii must be a scalar or have shape ({len(arr)},), got {radii_arr.shape}")
    base = _common(world, mask, include_sensors)
    ranges = _ranges(len(arr), arr[:1].nbytes + 4, max_message_bytes)
    requests = [pb.QuerySphereRequest(count=b - a, centers=arr[a:b].tobytes(), radii=radii_arr[a:b].tobytes(), **base)
                for a, b in ranges]
    return _csr_plan("QuerySphere", requests, len(arr))


def frustum(world: str, planes, mask, max_message_bytes: int, include_sensors: bool = False) -> Plan:
    arr = wire.float_array(planes, "planes", 3)
    base = _common(world, mask, include_sensors)
    ranges = _ranges(len(arr), arr[:1].nbytes, max_message_bytes)
    requests = [pb.QueryFrustumRequest(count=b - a, planes_per_query=arr.shape[1], planes=arr[a:b].tobytes(), **base)
                for a, b in ranges]
    return _csr_plan("QueryFrustum", requests, len(arr))


def _fractions_finish(count: int):
    """An answer with a fraction per hit (a raycast's, a cast's) as RayHits."""

    def finish(response):
        offsets, hits = wire.decode_csr(response.offsets, response.hits, count, response.narrow_ids)
        return RayHits(offsets, hits, np.frombuffer(response.fractions, wire.FRACTIONS), tick=response.tick,
                       incarnation=response.incarnation, world_seconds=response.world_seconds)

    return finish


def raycast(world: str, segments, first_hit: bool, mask, max_message_bytes: int,
            include_sensors: bool = False) -> Plan:
    arr = wire.float_array(segments, "segments", 2)
    mode = pb.RAYCAST_MODE_FIRST_HIT if first_hit else pb.RAYCAST_MODE_ALL_HITS
    base = _common(world, mask, include_sensors)
    ranges = _ranges(len(arr), arr[:1].nbytes, max_message_bytes)
    requests = [pb.RaycastRequest(count=b - a, segments=arr[a:b].tobytes(), mode=mode, **base) for a, b in ranges]
    return Plan("Raycast", requests, _fractions_finish(len(arr)))


def nearest(world: str, points, k, max_distance, mask, max_message_bytes: int, include_sensors: bool) -> Plan:
    arr = wire.float_array(points, "points", 2)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < 2**32:
        raise InvalidArgument(f"k must be an integer >= 0, not {k!r}")
    base = _common(world, mask, include_sensors)
    base["k"] = int(k)
    if max_distance is not None and max_distance != float("inf"):
        base["max_distance"] = float(max_distance)
    ranges = _ranges(len(arr), arr[:1].nbytes, max_message_bytes)
    requests = [pb.QueryNearestRequest(count=b - a, points=arr[a:b].tobytes(), **base) for a, b in ranges]

    def finish(response):
        offsets, hits = wire.decode_csr(response.offsets, response.hits, len(arr), response.narrow_ids)
        return NearestHits(offsets, hits, np.frombuffer(response.distances, wire.FLOATS), tick=response.tick,
                           incarnation=response.incarnation, world_seconds=response.world_seconds)

    return Plan("QueryNearest", requests, finish)


def cast_box(world: str, boxes, displacements, first_hit: bool, mask, max_message_bytes: int,
             include_sensors: bool) -> Plan:
    arr = wire.float_array(boxes, "boxes", 2)
    moves = wire.float_array(displacements, "displacements", 2)
    if len(moves) != len(arr):
        raise InvalidArgument(f"displacements has {len(moves)} rows but boxes has {len(arr)}")
    base = _common(world, mask, include_sensors)
    ranges = _ranges(len(arr), arr[:1].nbytes + moves[:1].nbytes, max_message_bytes)
    requests = [pb.CastBoxRequest(count=b - a, boxes=arr[a:b].tobytes(), displacements=moves[a:b].tobytes(),
                                  first_hit=bool(first_hit), **base) for a, b in ranges]
    return Plan("CastBox", requests, _fractions_finish(len(arr)))


def cast_sphere(world: str, centers, radii, displacements, first_hit: bool, mask, max_message_bytes: int,
                include_sensors: bool) -> Plan:
    arr = wire.float_array(centers, "centers", 2)
    if np.ndim(radii) == 0:
        radii = np.full(len(arr), radii)
    radii_arr = wire.float_array(radii, "radii", np.ndim(radii))
    moves = wire.float_array(displacements, "displacements", 2)
    if radii_arr.shape != (len(arr),) or len(moves) != len(arr):
        raise InvalidArgument(f"radii and displacements need one row per centre ({len(arr)}), "
                              f"got {radii_arr.shape} and {moves.shape}")
    base = _common(world, mask, include_sensors)
    ranges = _ranges(len(arr), arr[:1].nbytes + 4 + moves[:1].nbytes, max_message_bytes)
    requests = [pb.CastSphereRequest(count=b - a, centers=arr[a:b].tobytes(), radii=radii_arr[a:b].tobytes(),
                                     displacements=moves[a:b].tobytes(), first_hit=bool(first_hit), **base)
                for a, b in ranges]
    return Plan("CastSphere", requests, _fractions_finish(len(arr)))


def overlap(world_a: str, world_b: str, mask_a, mask_b, include_sensors: bool) -> Plan:
    request = pb.OverlapRequest(world_a=world_a, world_b=world_b, include_sensors=bool(include_sensors),
                                narrow_ids=True)
    for field, mask in (("mask_a", mask_a), ("mask_b", mask_b)):
        if mask is not None:
            setattr(request, field, _common("", mask)["mask"])

    def finish(response):
        return Crossings(wire.decode_id_rows(response.pairs, response.narrow_ids, "pairs"), response.tick_a,
                         response.tick_b, response.incarnation_a, response.incarnation_b)

    return Plan("Overlap", [request], finish)


def _pairs_finish(response):
    return wire.decode_id_rows(response.pairs, response.narrow_ids, "pairs")


def pairs(world: str) -> Plan:
    return Plan("GetPairs", [pb.GetPairsRequest(world=world, narrow_ids=True)], _pairs_finish)


def sensor_pairs(world: str) -> Plan:
    return Plan("GetSensorPairs", [pb.GetSensorPairsRequest(world=world, narrow_ids=True)], _pairs_finish)
