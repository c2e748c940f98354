"""Query answers' hits in 32 bits: half the bytes where every hit's id fits, and only for a request that
allows it (the SDK's do; a client that does not gets uint64 ids as before). The SDK gives uint64 ids
either way, the same as dbvt.reference's."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from dbvt import reference
from dbvt_client import Client, queries
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc
from servers import ServerThread

# The smallest id that needs 64 bits.
WIDE = 2**32
# Eight unit boxes in a row along x, apart; every query below reaches all of them.
BOXES = np.array([[i, 0, 0, i + 0.8, 1, 1] for i in range(8)], np.float32)
IDS = {"narrow": np.arange(1, 9, dtype=np.uint64),
       # The first four fit in 32 bits (the last of them is 2^32 - 1), the others do not.
       "wide": np.arange(WIDE - 4, WIDE + 4, dtype=np.uint64)}
MESSAGE_BYTES = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def server():
    running = ServerThread()
    with Client(running.target) as client:
        for name, ids in IDS.items():
            client.create_world(name, dims=3).apply(create=(ids, BOXES))
    yield running
    running.stop()


def _everything(world: str) -> dict:
    """Each query kind's plan (the SDK's request and its reading of the answer) reaching every box, and
    the same query's answer in dbvt.reference."""
    inside = np.array([[1, 0, 0, 1], [-1, 0, 0, 9], [0, 1, 0, 1], [0, -1, 0, 2], [0, 0, 1, 1], [0, 0, -1, 2]],
                      np.float32)
    return {
        "aabb": (queries.aabb(world, [[-1, -1, -1, 9, 2, 2]], None, MESSAGE_BYTES),
                 lambda r: r.query_aabb([[-1, -1, -1, 9, 2, 2]])),
        "sphere": (queries.sphere(world, [[4, 0.5, 0.5]], 10, None, MESSAGE_BYTES),
                   lambda r: r.query_sphere([[4, 0.5, 0.5]], [10])),
        "raycast": (queries.raycast(world, [[-1, 0.5, 0.5, 9, 0.5, 0.5]], False, None, MESSAGE_BYTES),
                    lambda r: r.raycast([[-1, 0.5, 0.5, 9, 0.5, 0.5]])),
        "frustum": (queries.frustum(world, [inside], None, MESSAGE_BYTES), lambda r: r.query_frustum([inside])),
        "nearest": (queries.nearest(world, [[4, 0.5, 0.5]], 8, None, None, MESSAGE_BYTES, False),
                    lambda r: r.query_nearest([[4, 0.5, 0.5]], 8)),
        "cast_box": (queries.cast_box(world, [[-3, 0, 0, -2, 1, 1]], [[20, 0, 0]], False, None, MESSAGE_BYTES, False),
                     lambda r: r.cast_box([[-3, 0, 0, -2, 1, 1]], [[20, 0, 0]])),
        "cast_sphere": (queries.cast_sphere(world, [[-3, 0.5, 0.5]], 0.4, [[20, 0, 0]], False, None, MESSAGE_BYTES,
                                            False),
                        lambda r: r.cast_sphere([[-3, 0.5, 0.5]], [0.4], [[20, 0, 0]])),
    }


def _reference(world: str) -> reference.Broadphase:
    made = reference.Broadphase(dims=3)
    made.create(IDS[world], BOXES)
    return made


@pytest.mark.parametrize("world", sorted(IDS))
def test_every_query_kind_sends_hits_in_32_bits_only_where_asked_and_every_id_fits(server, world):
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.BroadphaseServiceStub(channel)
        for kind, (plan, _) in _everything(world).items():
            (request,) = plan.requests
            assert request.narrow_ids, kind
            asked = getattr(stub, plan.method)(request)
            request.narrow_ids = False
            not_asked = getattr(stub, plan.method)(request)
            assert not not_asked.narrow_ids and len(not_asked.hits) == 8 * len(IDS[world]), kind
            assert asked.narrow_ids == (world == "narrow"), kind
            assert len(asked.hits) == (4 if world == "narrow" else 8) * len(IDS[world]), kind
            assert plan.finish(asked).hits.tolist() == plan.finish(not_asked).hits.tolist(), kind


def test_an_answer_is_narrow_when_its_own_hits_fit_whatever_the_world_holds(server):
    """The boxes whose ids fit in 32 bits, the largest of them 2^32 - 1, answer narrow in a world that
    holds larger ids too."""
    low = [[-1, -1, -1, 3.9, 2, 2]]
    plan = queries.aabb("wide", low, None, MESSAGE_BYTES)
    with grpc.insecure_channel(server.target) as channel:
        answer = pb_grpc.BroadphaseServiceStub(channel).QueryAabb(plan.requests[0])
    assert answer.narrow_ids and len(answer.hits) == 4 * 4
    assert plan.finish(answer).hits.tolist() == [WIDE - 4, WIDE - 3, WIDE - 2, WIDE - 1]


@pytest.mark.parametrize("world", sorted(IDS))
def test_the_sdk_gives_uint64_ids_either_way(server, world):
    expected = _reference(world)
    with Client(server.target) as client:
        remote = client.world(world)
        for kind, (plan, ask) in _everything(world).items():
            got, want = ask(remote), ask(expected)
            assert got.hits.dtype == np.uint64, kind
            assert got.hits.tolist() == want[1].tolist() and got.offsets.tolist() == want[0].tolist(), kind
