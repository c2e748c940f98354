"""Query-only worlds (`create_world(..., track_pairs=False)`), over gRPC and through Client.local(): their
batches report no pair changes, yet every query and pairs() answer exactly as a tracking world and the
brute-force reference fed the same operations; info and stats say which kind a world is."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from dbvt.reference import Broadphase as Reference
from dbvt_client import InvalidArgument
from dbvt_proto.v1 import broadphase_pb2 as pb
from servers import async_client
from worlds import W1World, assert_same_csr, assert_same_pairs


def assert_no_pair_changes(result, tick: int) -> None:
    assert result.tick == tick
    for changes in (result.begun, result.ended):
        assert changes.shape == (0, 2) and changes.dtype == np.uint64


def assert_same_answers(world, twin, reference, gen: W1World) -> None:
    """Every query kind of `world` equals the tracking `twin`'s and the reference's, and so do the pairs."""
    boxes = gen.query_boxes(150)
    for mask in (None, 2):
        expected = reference.query_aabb(boxes, mask=mask)
        assert_same_csr(world.query_aabb(boxes, mask=mask), expected, f"aabb, mask {mask}")
        assert_same_csr(twin.query_aabb(boxes, mask=mask), expected, f"twin aabb, mask {mask}")
    centers, radii = gen.spheres(150)
    assert_same_csr(world.query_sphere(centers, radii), reference.query_sphere(centers, radii), "sphere")
    segments = gen.segments(150)
    assert_same_csr(world.raycast(segments), reference.raycast(segments), "raycast")
    assert_same_csr(world.raycast(segments, first_hit=True), reference.raycast(segments, first_hit=True), "first hit")
    if gen.dims == 3:
        planes = gen.frusta(40)
        assert_same_csr(world.query_frustum(planes), reference.query_frustum(planes), "frustum")
    expected_pairs = reference.pairs()
    assert_same_pairs(world.pairs(), expected_pairs)
    assert_same_pairs(twin.pairs(), expected_pairs, "twin pairs")


@pytest.mark.parametrize("dims", [3, 2])
def test_query_only_world_answers_like_a_tracking_one(client, dims):
    gen = W1World(2000, dims=dims, seed=60 + dims)
    group = gen.ids % 3 + 1
    world = client.create_world(f"quiet-{dims}d", dims=dims, track_pairs=False)
    twin = client.create_world(f"tracking-{dims}d", dims=dims)
    reference = Reference(dims=dims)
    reference.create(gen.ids, gen.boxes, group=group)
    begun, _ = reference.update()
    assert_no_pair_changes(world.apply(create=(gen.ids, gen.boxes), group=group), tick=1)
    assert_same_pairs(twin.apply(create=(gen.ids, gen.boxes), group=group).begun, begun, "twin begun")
    with world.stream() as stream, twin.stream() as twin_stream:
        for tick in range(2, 6):
            ids, boxes = gen.step()
            reference.move(ids, boxes)
            begun, ended = reference.update()
            assert_no_pair_changes(stream.apply(move=(ids, boxes)), tick)
            tracked = twin_stream.apply(move=(ids, boxes))
            assert_same_pairs(tracked.begun, begun, f"twin begun at tick {tick}")
            assert_same_pairs(tracked.ended, ended, f"twin ended at tick {tick}")
    assert_same_answers(world, twin, reference, gen)
    # Creating and destroying in the same world keeps it exact too.
    gone = gen.ids[::7]
    reference.destroy(gone)
    reference.update()
    assert_no_pair_changes(world.apply(destroy=gone), tick=6)
    twin.apply(destroy=gone)
    assert_same_answers(world, twin, reference, gen)
    assert world.stats()["proxies"] == twin.stats()["proxies"] == len(gen.ids) - len(gone)


def test_info_and_stats_report_the_kind_of_world(client):
    client.create_world("quiet", track_pairs=False)
    client.create_world("tracking")
    assert client.world("quiet").info().track_pairs is False
    assert client.world("quiet").stats()["track_pairs"] is False
    assert client.world("tracking").info().track_pairs is True
    assert client.world("tracking").stats()["track_pairs"] is True


def test_unset_track_pairs_means_a_tracking_world(client):
    """A client that predates the field (or any generic client) gets the old behaviour."""
    created = client._transport.unary("CreateWorld", pb.CreateWorldRequest(name="plain"))
    assert created.world.track_pairs is True
    unit = np.array([[0, 0, 0, 1, 1, 1]] * 2, np.float32)
    assert client.world("plain").apply(create=([1, 2], unit)).begun.tolist() == [[1, 2]]


def test_track_pairs_must_be_a_bool(client):
    with pytest.raises(InvalidArgument, match="create_world: track_pairs must be True or False, not 'no'"):
        client.create_world("odd", track_pairs="no")
    assert client.list_worlds() == []


def test_async_client_creates_query_only_worlds(mode, server):
    async def scenario():
        client = async_client(mode, server)
        async with client:
            world = await client.create_world("async-quiet", track_pairs=False)
            boxes = np.array([[i, 0, 0, i + 1.5, 1, 1] for i in range(5)], np.float32)
            created = await world.apply(create=(np.arange(5), boxes))
            async with world.stream() as stream:
                moved = await stream.apply(move=([0], boxes[4:5]))
            info, pairs = await world.info(), await world.pairs()
            await client.delete_world("async-quiet")
            return created, moved, info, pairs

    created, moved, info, pairs = asyncio.run(scenario())
    assert_no_pair_changes(created, tick=1)
    assert_no_pair_changes(moved, tick=2)
    assert info.track_pairs is False and info.tick == 2
    assert pairs.tolist() == [[0, 3], [0, 4], [1, 2], [2, 3], [3, 4]]
