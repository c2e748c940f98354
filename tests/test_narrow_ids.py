"""Ids in 32 bits: a query's hits, a batch's result and the pair dumps take half the bytes where every
id of the answer fits, and only for a request that allows it (the SDK's do; a client that does not
gets uint64 ids as before). The SDK gives uint64 ids either way, the same as dbvt.reference's."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from dbvt import reference
from dbvt_client import Client, queries
from dbvt_proto.v1 import broadphase_pb2 as pb
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


# A box over the first four of BOXES, and one over all eight.
OVER_FOUR = np.array([[0, 0, 0, 3.5, 1, 1]], np.float32)
OVER_ALL = np.array([[0, 0, 0, 7.5, 1, 1]], np.float32)


def _batch(ids, boxes=None, destroy=False) -> pb.Batch:
    ids = np.asarray(ids, "<u8").tobytes()
    return pb.Batch(destroy_ids=ids) if destroy else pb.Batch(create_ids=ids, create_boxes=boxes.tobytes())


@pytest.mark.parametrize("kind", sorted(IDS))
def test_batch_results_and_pair_dumps_send_ids_in_32_bits_only_where_asked_and_every_id_fits(server, kind):
    """A world of BOXES and a box over them all: its pairs (in the batch's result, in GetPairs, in an
    Overlap with the world itself, and with a sensor in GetSensorPairs) fit in 32 bits in the narrow
    world only; the answers' rows are the same either way."""
    name, extra = f"batches-{kind}", int(IDS[kind][0]) - 1
    with Client(server.target) as client:
        client.create_world(name, dims=3).apply(create=(IDS[kind], BOXES))
    width = 4 if kind == "narrow" else 8
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.BroadphaseServiceStub(channel)
        answers = [list(stub.ApplyBatch(pb.ApplyBatchRequest(world=name, batch=_batch([extra], OVER_ALL),
                                                             narrow_ids=True)))[0].result]
        requests = [pb.StreamBatchesRequest(world=name, sequence=1, batch=_batch([extra], destroy=True)),
                    pb.StreamBatchesRequest(world=name, sequence=2, batch=_batch([extra], OVER_ALL), narrow_ids=True)]
        answers += [response.result for response in stub.StreamBatches(iter(requests))]
        assert [len(a.ended) for a in answers] == [0, 8 * 2 * 8, 0] and not answers[1].narrow_ids
        assert len(answers[2].begun) == 8 * 2 * width and answers[2].narrow_ids == (kind == "narrow")
        assert len(answers[0].begun) == 8 * 2 * width and answers[0].narrow_ids == (kind == "narrow")
        for method, request in (("GetPairs", pb.GetPairsRequest(world=name)),
                                ("Overlap", pb.OverlapRequest(world_a=name, world_b=name))):
            call = getattr(stub, method)
            wide = list(call(request))[0]
            request.narrow_ids = True
            asked = list(call(request))[0]
            assert not wide.narrow_ids and asked.narrow_ids == (kind == "narrow"), method
            rows = (8 if method == "GetPairs" else 8 + 2 * 8 + 1) * 2
            assert (len(wide.pairs), len(asked.pairs)) == (rows * 8, rows * width), method
            widened = np.frombuffer(asked.pairs, "<u4" if asked.narrow_ids else "<u8").astype(np.uint64)
            assert widened.tolist() == np.frombuffer(wide.pairs, "<u8").tolist(), method
        list(stub.ApplyBatch(pb.ApplyBatchRequest(world=name, batch=pb.Batch(
            create_ids=np.array([IDS[kind][-1] + 1], "<u8").tobytes(), create_boxes=OVER_ALL.tobytes(),
            create_sensor=np.array([1], "u1").tobytes()))))
        sensed = [list(stub.GetSensorPairs(pb.GetSensorPairsRequest(world=name, narrow_ids=narrow)))[0]
                  for narrow in (False, True)]
        assert [len(s.pairs) for s in sensed] == [9 * 2 * 8, 9 * 2 * width]
        assert not sensed[0].narrow_ids and sensed[1].narrow_ids == (kind == "narrow")


def test_a_result_is_narrow_when_its_own_ids_fit_whatever_the_world_holds(server):
    """In the wide world, a box over the four boxes whose ids fit (the largest 2^32 - 1), with an id
    that fits too: its pairs come in 32 bits."""
    name = "batches-boundary"
    with Client(server.target) as client:
        client.create_world(name, dims=3).apply(create=(IDS["wide"], BOXES))
    with grpc.insecure_channel(server.target) as channel:
        request = pb.ApplyBatchRequest(world=name, batch=_batch([WIDE - 5], OVER_FOUR), narrow_ids=True)
        (answer,) = pb_grpc.BroadphaseServiceStub(channel).ApplyBatch(request)
    assert answer.result.narrow_ids and len(answer.result.begun) == 4 * 2 * 4
    assert np.frombuffer(answer.result.begun, "<u4").reshape(-1, 2).tolist() == [[WIDE - 5, i] for i in
                                                                                    range(WIDE - 4, WIDE)]


@pytest.mark.parametrize("kind", sorted(IDS))
def test_the_sdk_gives_uint64_pairs_either_way(server, kind):
    """The SDK's batch results (applied whole and streamed), pairs, sensor pairs and overlaps, against
    dbvt.reference."""
    name, extra = f"sdk-{kind}", int(IDS[kind][0]) - 1
    expected = _reference(kind)
    with Client(server.target) as client:
        world = client.create_world(name, dims=3)
        world.apply(create=(IDS[kind], BOXES))
        got = [world.apply(create=([extra], OVER_ALL))]
        expected.create([extra], OVER_ALL)
        want = [expected.update()]
        with world.stream() as stream:
            got.append(stream.apply(destroy=[extra]))
            got.append(stream.apply(create=([extra], OVER_ALL), sensor="sphere"))
        expected.destroy([extra])
        want.append(expected.update())
        expected.create([extra], OVER_ALL, sensor="sphere")
        want.append(expected.update())
        for result, (begun, ended) in zip(got, want):
            assert result.begun.dtype == result.ended.dtype == result.entered.dtype == np.uint64
            assert result.begun.tolist() == begun.tolist() and result.ended.tolist() == ended.tolist()
        assert len(got[2].entered) == 2 and got[2].entered.tolist() == expected.sensor_events()[0].tolist()
        assert world.pairs().dtype == np.uint64 and world.pairs().tolist() == expected.pairs().tolist()
        assert world.sensor_pairs().tolist() == expected.sensor_pairs().tolist()
        crossings = client.overlap(name, name).pairs       # each box with itself: overlaps skip sensors
        assert crossings.dtype == np.uint64 and crossings.tolist() == [[i, i] for i in IDS[kind].tolist()]
