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
from dbvt_client.results import Hits, RayHits
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
    fields = {"world": world, "include_sensors": bool(include_sensors)}
    if mask is not None:
        mask = int(mask)
        if not 0 <= mask <= 0xFFFFFFFF:
            raise InvalidArgument(f"mask must be a 32-bit unsigned value, not {mask}")
        fields["mask"] = mask
    return fields


def _csr_plan(method: str, requests: list, count: int) -> Plan:
    def finish(response):
        return Hits(*wire.decode_csr(response.offsets, response.hits, count), tick=response.tick,
                    incarnation=response.incarnation)

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


def raycast(world: str, segments, first_hit: bool, mask, max_message_bytes: int,
            include_sensors: bool = False) -> Plan:
    arr = wire.float_array(segments, "segments", 2)
    mode = pb.RAYCAST_MODE_FIRST_HIT if first_hit else pb.RAYCAST_MODE_ALL_HITS
    base = _common(world, mask, include_sensors)
    ranges = _ranges(len(arr), arr[:1].nbytes, max_message_bytes)
    requests = [pb.RaycastRequest(count=b - a, segments=arr[a:b].tobytes(), mode=mode, **base) for a, b in ranges]

    def finish(response):
        offsets, hits = wire.decode_csr(response.offsets, response.hits, len(arr))
        return RayHits(offsets, hits, np.frombuffer(response.fractions, wire.FRACTIONS), tick=response.tick,
                       incarnation=response.incarnation)

    return Plan("Raycast", requests, finish)


def pairs(world: str) -> Plan:
    def finish(response):
        return wire.decode_rows(response.pairs, wire.IDS, 2, "pairs").copy()

    return Plan("GetPairs", [pb.GetPairsRequest(world=world)], finish)


def sensor_pairs(world: str) -> Plan:
    def finish(response):
        return wire.decode_rows(response.pairs, wire.IDS, 2, "pairs").copy()

    return Plan("GetSensorPairs", [pb.GetSensorPairsRequest(world=world)], finish)
