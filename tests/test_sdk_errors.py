"""Every error path, through the SDK (remote and in-process) and the raw protocol: the right class, a
message naming the problem, and the world exactly as it was."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from dbvt_client import (AlreadyExists, Client, Create, InvalidArgument, NotFound, ResourceExhausted)
from dbvt_client import batches
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc
from servers import ServerThread

LIMITS = dict(max_worlds=3, max_proxies_per_world=50)
SMALL_MESSAGES = 16 * 1024


@pytest.fixture(scope="module")
def server():
    running = ServerThread(max_message_bytes=SMALL_MESSAGES, **LIMITS)
    yield running
    running.stop()


@pytest.fixture(params=["grpc", "local"])
def client(request, server):
    made = Client(server.target) if request.param == "grpc" else Client.local(**LIMITS)
    yield made
    for name in made.list_worlds():
        made.delete_world(name)
    made.close()


BOXES = np.array([[i, 0, 0, i + 1.5, 1, 1] for i in range(10)], np.float32)


@pytest.fixture
def world(client):
    made = client.create_world("w")
    made.apply(create=(np.arange(10), BOXES))
    return made


def snapshot(world):
    """What a client can observe of a world: tick, size, pairs and what each original box touches."""
    info = world.info()
    offsets, hits = world.query_aabb(BOXES)
    return info.tick, info.proxies, world.pairs().tolist(), offsets.tolist(), hits.tolist()


NAN = BOXES[:2].copy()
NAN[1, 4] = np.nan
INVERTED = BOXES[:2].copy()
INVERTED[0, 0] = 5.0
FAR = BOXES[:2] + 100

BAD_BATCHES = [
    (dict(create=([20, 21], NAN)), "create_boxes row 1: NaN or infinite"),
    (dict(create=([20, 21], INVERTED)), "create_boxes row 0: min > max on axis 0"),
    (dict(create=([20, 21], FAR), move=([1, 2], NAN)), "move_boxes row 1: NaN"),
    (dict(create=([20, 21], FAR), move=([1, 99], FAR)), "move_ids row 1: unknown id 99"),
    (dict(move=([1, 99], FAR)), "move_ids row 1: unknown id 99"),
    (dict(create=([20], FAR[:1]), move=([1], FAR[:1]), destroy=[3, 98]), "destroy_ids row 1: unknown id 98"),
    (dict(create=([20, 4], FAR)), "create_ids row 1: id 4 is already present"),
    (dict(create=([20, 20], FAR)), "create_ids row 1: id 20 appears twice"),
    (dict(move=([1, 1], FAR)), "move_ids row 1: id 1 appears twice"),
    (dict(create=([20, 20], FAR), destroy=[3]), "create_ids row 1: id 20 already appears in this batch at create_ids row 0"),
    (dict(move=([1, 2], FAR), destroy=[5, 2]), "destroy_ids row 1: id 2 already appears in this batch at move_ids"),
    (dict(create=([20, 21], FAR[:1])), "create_boxes has 1 rows but its ids have 2"),
    (dict(create=([20, 21], FAR[:, :4])), r"create_boxes must be \(n, 6\) for a 3-D world, got \(2, 4\)"),
    (dict(create=([20], FAR[:1]), move=([1, 2], FAR[:, :4])),
     r"move_boxes must be \(n, 6\) for a 3-D world, got \(2, 4\)"),
    (dict(create=([-1, 21], FAR)), "create_ids row 0: id -1 is negative"),
    (dict(create=([1.5, 21], FAR)), "create_ids must hold integers"),
    (dict(create=Create([20, 21], FAR, group=[1, 2**32])), "create_group row 1"),
    (dict(create=Create([20, 21], FAR, mask=[1, 2, 3])), r"create_mask must be a scalar or have shape \(2,\)"),
]


@pytest.mark.parametrize("batch, message", BAD_BATCHES, ids=[m.split(":")[0] for _, m in BAD_BATCHES])
def test_bad_batch_changes_nothing(world, batch, message):
    before = snapshot(world)
    with pytest.raises(InvalidArgument, match=message):
        world.apply(**batch)
    assert snapshot(world) == before
    with world.stream() as stream:
        with pytest.raises(InvalidArgument, match=message):
            stream.apply(**batch)
        assert stream.apply().tick == before[0] + 1, "the stream goes on after a rejected batch"


BAD_QUERIES = [
    ("query_aabb", (NAN,), "boxes row 1: NaN"),
    ("query_aabb", (INVERTED,), "boxes row 0: min > max"),
    ("query_aabb", (BOXES[:, :4],), r"boxes must be \(n, 6\) for a 3-D world, got \(10, 4\)"),
    ("query_sphere", (BOXES[:2, :3], [1.0, -1.0]), "radii row 1: negative radius"),
    ("query_sphere", (BOXES[:2, :3], [1.0, 2.0, 3.0]), r"radii must be a scalar or have shape \(2,\)"),
    ("raycast", (NAN,), "segments row 1: NaN"),
    ("raycast", (BOXES[:3, :4],), r"segments must be \(n, 6\) for a 3-D world, got \(3, 4\)"),
    ("query_sphere", (BOXES[:2, :2], 1.0), r"centers must be \(n, 3\) for a 3-D world, got \(2, 2\)"),
    ("query_frustum", (np.ones((1, 33, 4)),), "k must be between 1 and 32"),
    ("query_frustum", (np.ones((1, 6, 3)),), r"planes must be \(q, k, 4\) for a 3-D world, got \(1, 6, 3\)"),
]


@pytest.mark.parametrize("method, args, message", BAD_QUERIES, ids=[m for _, _, m in BAD_QUERIES])
def test_bad_query_is_invalid_argument(world, method, args, message):
    before = snapshot(world)
    with pytest.raises(InvalidArgument, match=message):
        getattr(world, method)(*args)
    with pytest.raises(InvalidArgument, match="mask must be a 32-bit"):
        world.query_aabb(BOXES, mask=-1)
    assert snapshot(world) == before


def test_unknown_world_is_not_found(client):
    ghost = client.world("ghost")
    for call in (ghost.pairs, ghost.stats, lambda: ghost.apply(destroy=[1]), lambda: ghost.query_aabb(BOXES),
                 lambda: client.delete_world("ghost")):
        with pytest.raises(NotFound, match="no world named 'ghost'"):
            call()
    with ghost.stream() as stream:
        with pytest.raises(NotFound, match="ghost"):
            stream.apply()


def test_world_settings_are_checked(client):
    client.create_world("w")
    with pytest.raises(AlreadyExists, match="a world named 'w' already exists"):
        client.create_world("w")
    with pytest.raises(InvalidArgument, match="dims must be 2 or 3, not 4"):
        client.create_world("x", dims=4)
    with pytest.raises(InvalidArgument, match="create_world: dims must be 2 or 3, not -1"):
        client.create_world("x", dims=-1)
    with pytest.raises(InvalidArgument, match="margin must be a finite number >= 0"):
        client.create_world("x", margin=-1)
    with pytest.raises(InvalidArgument, match=r"fits a float32 \(at most 3.4028235e\+38\), not 1e\+300"):
        client.create_world("x", margin=1e300)
    with pytest.raises(AlreadyExists, match="world 'w' exists with dims=3, not 2"):
        client.create_world("w", dims=2, exist_ok=True)
    assert client.create_world("w", exist_ok=True).name == "w"
    with pytest.raises(InvalidArgument, match="world name must be 1 to 128 printable characters"):
        client.create_world("")
    with pytest.raises(ResourceExhausted, match="above the server's limit of 50"):
        client.create_world("x", max_proxies=51)
    assert client.list_worlds() == ["w"]


def test_limits_are_resource_exhausted(client):
    for name in ("a", "b", "c"):
        client.create_world(name)
    with pytest.raises(ResourceExhausted, match="limit of 3 worlds"):
        client.create_world("d")
    small = client.world("a")
    small.apply(create=(np.arange(45), np.zeros((45, 6))))
    before = snapshot(small)
    with pytest.raises(ResourceExhausted, match="would hold 51 proxies, more than its limit of 50"):
        small.apply(create=(np.arange(100, 106), np.zeros((6, 6))))
    assert snapshot(small) == before
    # Destroying in the same batch makes room.
    assert small.apply(create=(np.arange(100, 106), np.zeros((6, 6))), destroy=[0, 1]).tick == 2


def test_split_batch_is_atomic():
    """A batch far over the message limit is sent in parts and applied as one tick, or not at all."""
    server = ServerThread(max_message_bytes=SMALL_MESSAGES)
    try:
        with Client(server.target) as client:
            world = client.create_world("big")
            n = 5000  # 5000 x 32 bytes: ten times the message limit
            ids = np.arange(n, dtype=np.uint64)
            boxes = np.concatenate([np.stack([ids * 3.0] * 3, 1), np.stack([ids * 3.0 + 1] * 3, 1)], 1)
            bad = boxes.copy()
            bad[-1, 0] = np.inf
            with pytest.raises(InvalidArgument, match=f"create_boxes row {n - 1}: NaN or infinite"):
                world.apply(create=(ids, bad))
            assert world.info().proxies == 0 and world.info().tick == 0
            result = world.apply(create=(ids, boxes), static=np.arange(n) % 2 == 0, group=3)
            assert result.tick == 1 and world.info().proxies == n
            moved = world.apply(move=(ids, boxes + 1.5))
            assert moved.tick == 2 and len(moved.begun) == 0
            offsets, hits = world.query_aabb(boxes + 1.5)  # 5000 queries: several messages too
            assert np.array_equal(hits, ids) and np.array_equal(offsets, np.arange(n + 1))
    finally:
        server.stop()


def test_a_message_too_small_for_one_row_is_named_with_the_room_it_leaves():
    """The server holds max_message_bytes to at least 8192 (tests/test_server_config.py); below the
    room a message keeps for its other fields, the SDK says so rather than blame the row."""
    ops = batches.encode(create=(np.arange(3, dtype=np.uint64), np.zeros((3, 6), np.float32)))
    with pytest.raises(InvalidArgument, match=r"one create_ids row takes 32 bytes, but a message of 2000 bytes "
                                              r"\(the server's max_message_bytes\) has room for 0 once 4096"):
        batches.split(ops, 2000)
    assert [len(part["create_ids"]) for part in batches.split(ops, 4096 + 64)] == [2, 1]


def test_raw_protocol_errors(server):
    """What the SDK never sends, sent anyway: the server still names the problem."""
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.BroadphaseServiceStub(channel)
        stub.CreateWorld(pb.CreateWorldRequest(name="raw"))
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.ApplyBatch(pb.ApplyBatchRequest(world="raw", batch=pb.Batch(create_ids=b"1234567"))))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "create_ids has 7 bytes, not a whole number of uint64 ids" in caught.value.details()
        with pytest.raises(grpc.RpcError) as caught:
            stub.QueryAabb(pb.QueryAabbRequest(world="raw", count=1, boxes=b"\0" * (SMALL_MESSAGES + 24)))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        first = pb.StreamBatchesRequest(world="raw", sequence=1, more_parts=True,
                                        batch=pb.Batch(create_ids=np.uint64(1).tobytes(), create_boxes=bytes(24)))
        interloper = pb.StreamBatchesRequest(world="raw", sequence=2)
        replies = list(stub.StreamBatches(iter([first, interloper, pb.StreamBatchesRequest(world="raw", sequence=3)])))
        assert [r.sequence for r in replies] == [2, 3]
        assert replies[0].status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "arrived before the last part of batch 1" in replies[0].status_message
        assert replies[1].status_code == 0 and replies[1].result.tick == 1
        assert stub.GetWorldStats(pb.GetWorldStatsRequest(world="raw")).world.proxies == 0
        stub.DeleteWorld(pb.DeleteWorldRequest(name="raw"))


def test_staging_a_multi_part_batch_is_bounded(server):
    """Parts are held until the last one; no more than a world under the server's limits could use."""
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.BroadphaseServiceStub(channel)
        stub.CreateWorld(pb.CreateWorldRequest(name="staged"))

        def part(sequence: int, **columns) -> pb.StreamBatchesRequest:
            return pb.StreamBatchesRequest(world="staged", sequence=sequence, more_parts=True, batch=pb.Batch(**columns))

        too_many_ids = part(1, create_ids=np.arange(51, dtype="<u8").tobytes())
        boxes_only = [part(2, create_boxes=bytes(4000)), part(2, create_boxes=bytes(4000))]
        replies = list(stub.StreamBatches(iter([too_many_ids, *boxes_only])))
        assert [r.status_code for r in replies] == [grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]] * 2
        assert "more than 50 create_ids rows cannot be staged" in replies[0].status_message
        assert "a batch of more than 4800 bytes cannot be staged" in replies[1].status_message
        assert stub.GetWorldStats(pb.GetWorldStatsRequest(world="staged")).world.tick == 0
        stub.DeleteWorld(pb.DeleteWorldRequest(name="staged"))
