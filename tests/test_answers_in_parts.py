"""Answers of any size, at one tick: no message the server sends passes its limit, and the SDK joins
the parts into the one answer a caller gets, however busy the world is."""
from __future__ import annotations

import asyncio
import threading

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbvt import reference
from dbvt_client import AsyncClient, Client, InvalidArgument, parts
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc
from servers import ServerThread, wait_until

SMALL = 16 * 1024
# Boxes that all overlap: n of them make n(n-1)/2 pairs, and every query over them hits all n.
PILE = 1500


@pytest.fixture(scope="module")
def server():
    running = ServerThread(max_message_bytes=SMALL)
    yield running
    running.stop()


def pile(n: int, dims: int = 3) -> np.ndarray:
    rng = np.random.default_rng(n)
    low = rng.uniform(0, 0.4, (n, dims)).astype(np.float32)
    return np.concatenate([low, low + 0.6], axis=1)


def all_pairs(ids: np.ndarray) -> list[list[int]]:
    a, b = np.triu_indices(len(ids), 1)
    return np.sort(np.stack([ids[a], ids[b]], axis=1), axis=1).tolist()


@settings(max_examples=60, deadline=None)
@given(columns=st.lists(st.binary(max_size=3000), min_size=1, max_size=3), tick=st.integers(0, 2**40),
       limit=st.integers(1, 2000))
def test_cut_and_joined_give_back_the_message(columns, tick, limit):
    message = pb.RaycastResponse(tick=tick, **dict(zip(("offsets", "hits", "fractions"), columns)))
    pieces = list(parts.cut(message, limit))
    assert all(piece.tick == tick for piece in pieces)
    if len(pieces) > 1:
        assert all(piece.ByteSize() <= max(limit, parts.SMALLEST_PART + parts.PART_OVERHEAD) for piece in pieces)
    assert parts.joined(pieces) == message


def test_parts_of_a_query_set_must_agree():
    first = pb.QueryAabbRequest(world="a", count=1, boxes=b"x" * 24)
    with pytest.raises(InvalidArgument, match="part 1 of the query set differs"):
        parts.joined_queries([first, pb.QueryAabbRequest(world="a", count=1, boxes=b"y" * 24, mask=1)])
    whole = parts.joined_queries([first, pb.QueryAabbRequest(world="a", count=2, boxes=b"y" * 48)])
    assert (whole.count, whole.boxes) == (3, b"x" * 24 + b"y" * 48)


def test_a_batch_whose_pair_changes_pass_the_message_size_answers_whole(server):
    ids = np.arange(1, PILE + 1, dtype=np.uint64)
    expected = all_pairs(ids)
    assert len(expected) * 16 > 20 * SMALL
    with Client(server.target) as client:
        world = client.create_world("pile")
        assert world.apply(create=(ids, pile(PILE))).begun.tolist() == expected
        assert world.pairs().tolist() == expected
        # A small request with a big answer: the unary call's answer comes in parts.
        assert world.apply(destroy=ids).ended.tolist() == expected
        world.apply(create=(ids, pile(PILE)))
        with world.stream() as stream:
            assert stream.apply(destroy=ids).ended.tolist() == expected
            assert stream.apply(create=(ids, pile(PILE))).begun.tolist() == expected
        client.delete_world("pile")


@pytest.mark.parametrize("kind", ["aabb", "sphere", "raycast", "frustum"])
def test_a_query_whose_answer_passes_the_message_size_answers_whole(server, kind):
    ids = np.arange(1, PILE + 1, dtype=np.uint64)
    boxes = pile(PILE)
    queries = 6
    with Client(server.target) as client, Client.local() as local:
        answers = []
        for each in (client, local):
            world = each.create_world(f"all-hit-{kind}")
            world.apply(create=(ids, boxes))
            answers.append(ask(world, kind, queries))
            each.delete_world(f"all-hit-{kind}")
    remote, in_process = answers
    assert len(remote.hits) == queries * PILE and len(remote.hits) * 8 > 4 * SMALL
    for got, wanted in zip(remote, in_process):
        assert np.array_equal(got, wanted)


def ask(world, kind: str, queries: int):
    if kind == "aabb":
        return world.query_aabb(np.tile([[-1, -1, -1, 2, 2, 2]], (queries, 1)))
    if kind == "sphere":
        return world.query_sphere(np.full((queries, 3), 0.5), 5.0)
    if kind == "raycast":
        return world.raycast(np.tile([[0.5, 0.5, -1, 0.5, 0.5, 2]], (queries, 1)))
    inside_out = [[1, 0, 0, 1], [-1, 0, 0, 2], [0, 1, 0, 1], [0, -1, 0, 2], [0, 0, 1, 1], [0, 0, -1, 2]]
    return world.query_frustum(np.tile([inside_out], (queries, 1, 1)))


def test_no_message_the_server_sends_passes_its_limit(server):
    """A channel that refuses any message over the server's limit still gets every answer."""
    ids = np.arange(1, PILE + 1, dtype=np.uint64)
    options = [("grpc.max_receive_message_length", SMALL)]
    with Client(server.target) as client:
        client.create_world("bounded").apply(create=(ids, pile(PILE)))
    with grpc.insecure_channel(server.target, options=options) as channel:
        stub = pb_grpc.BroadphaseServiceStub(channel)
        pairs_parts = list(stub.GetPairs(pb.GetPairsRequest(world="bounded")))
        assert len(pairs_parts) > 1 and len(parts.joined(pairs_parts).pairs) == 16 * len(all_pairs(ids))
        query = pb.QueryAabbRequest(world="bounded", count=4, boxes=np.tile(
            np.array([-1, -1, -1, 2, 2, 2], "<f4"), 4).tobytes())
        with pytest.raises(grpc.RpcError) as too_big:
            stub.QueryAabb(query)
        assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert int(dict(too_big.value.trailing_metadata())[parts.ANSWER_BYTES_KEY]) > 8 * 4 * PILE > SMALL
        answer = parts.joined([part.aabb for part in stub.Query(iter([pb.QueryRequest(aabb=query)]))])
        assert len(answer.hits) == 8 * 4 * PILE
        destroy = pb.Batch(destroy_ids=ids.tobytes())
        replies = list(stub.StreamBatches(iter([pb.StreamBatchesRequest(world="bounded", sequence=1, batch=destroy)])))
        assert [reply.more_parts for reply in replies] == [True] * (len(replies) - 1) + [False]
        stub.DeleteWorld(pb.DeleteWorldRequest(name="bounded"))


def test_a_query_set_in_parts_is_answered_at_one_tick_while_another_client_writes(server):
    """Boxes far from the queries move all the time; every answer is one tick's, and exact."""
    queried = np.arange(1, 201, dtype=np.uint64)
    movers = np.arange(1000, 1100, dtype=np.uint64)
    rng = np.random.default_rng(7)
    boxes = np.concatenate([rng.uniform(0, 10, (200, 3)), rng.uniform(0, 10, (200, 3)) * 0 + 0.5], 1)
    boxes[:, 3:] += boxes[:, :3]
    boxes = boxes.astype(np.float32)
    far = np.tile(np.array([100, 100, 100, 101, 101, 101], np.float32), (100, 1))
    query_boxes = rng.uniform(0, 10, (3000, 3))
    query_boxes = np.concatenate([query_boxes, query_boxes + 1], 1).astype(np.float32)
    expected = reference.Broadphase(dims=3)
    expected.create(queried, boxes)
    wanted = expected.query_aabb(query_boxes)
    stop = threading.Event()
    with Client(server.target) as writer_client, Client(server.target) as reader:
        world = writer_client.create_world("busy")
        world.apply(create=(queried, boxes))
        world.apply(create=(movers, far))

        def write():
            with writer_client.world("busy").stream() as stream:
                step = 0
                while not stop.is_set():
                    step += 1
                    stream.apply(move=(movers, far + step % 7))

        writer = threading.Thread(target=write)
        writer.start()
        try:
            ticks = set()
            for _ in range(5):
                hits = reader.world("busy").query_aabb(query_boxes)
                assert np.array_equal(hits.offsets, wanted[0]) and np.array_equal(hits.hits, wanted[1])
                ticks.add(hits.tick)
        finally:
            stop.set()
            writer.join(30)
        assert len(ticks) > 1, "the writer never got a batch in between: the test proved nothing"
        writer_client.delete_world("busy")


def test_the_async_client_joins_parts_too(server):
    ids = np.arange(1, PILE + 1, dtype=np.uint64)

    async def drive():
        async with AsyncClient(server.target) as client:
            world = await client.create_world("async-pile")
            assert len((await world.apply(create=(ids, pile(PILE)))).begun) == len(all_pairs(ids))
            assert len(await world.pairs()) == len(all_pairs(ids))
            hits = await world.query_aabb(np.tile([[-1, -1, -1, 2, 2, 2]], (4, 1)))
            assert len(hits.hits) == 4 * PILE
            assert len((await world.apply(destroy=ids)).ended) == len(all_pairs(ids))
            await world.apply(create=(ids, pile(PILE)))
            async with world.stream() as stream:
                assert len((await stream.apply(destroy=ids)).ended) == len(all_pairs(ids))
            await client.delete_world("async-pile")

    asyncio.run(drive())


def test_a_bad_query_set_gets_a_clear_status_and_holds_nothing(server):
    box = np.array([0, 0, 0, 1, 1, 1], "<f4").tobytes()
    aabb = pb.QueryRequest(aabb=pb.QueryAabbRequest(world="sets", count=1, boxes=box))
    sphere = pb.QueryRequest(sphere=pb.QuerySphereRequest(world="sets", count=1, centers=box[:12],
                                                          radii=np.float32(1).tobytes()))
    masked = pb.QueryRequest(aabb=pb.QueryAabbRequest(world="sets", count=1, boxes=box, mask=1))
    with Client(server.target) as client:
        client.create_world("sets")
    with grpc.insecure_channel(server.target) as channel:
        query = pb_grpc.BroadphaseServiceStub(channel).Query
        for parts_sent, message in (([aabb, sphere], "part 1 of the query set holds sphere, not aabb"),
                                    ([pb.QueryRequest()], "part 0 of the query set holds no query"),
                                    ([], "the query set has no parts"),
                                    ([aabb, masked], "part 1 of the query set differs from part 0")):
            with pytest.raises(grpc.RpcError) as refused:
                list(query(iter(parts_sent), timeout=30))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in refused.value.details()
    # The handler gives its parts back as it ends, which may be just after the client has its status.
    wait_until(lambda: server.running.service.staged.value == 0)
    with Client(server.target) as client:
        client.delete_world("sets")
