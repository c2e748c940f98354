"""The shared SDK suite: every test runs against a real server over gRPC and against Client.local().

Answers are compared exactly with dbvt.reference (brute force) fed the same operations.
"""
from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbvt.reference import Broadphase as Reference
from dbvt_client import BatchResult, Create, InvalidArgument, NotFound
from servers import async_client
from worlds import W1World, assert_same_csr, assert_same_pairs

_names = (f"world-{i}" for i in itertools.count())


def test_world_lifecycle(client):
    a = client.create_world("arena", dims=3, margin=0.05)
    flat = client.create_world("flat", dims=2, margin=0.0)
    assert client.list_worlds() == ["arena", "flat"]
    stats = flat.stats()
    assert (stats["name"], stats["dims"], stats["margin"], stats["proxies"], stats["tick"]) == ("flat", 2, 0.0, 0, 0)
    assert {"nodes", "height", "area_ratio", "memory_bytes"} <= set(stats)
    assert isinstance(stats["nodes"], int) and isinstance(stats["area_ratio"], float)
    assert client.world("arena").info().dims == 3
    client.delete_world("arena")
    assert client.list_worlds() == ["flat"]
    assert a.name == "arena"


def _same_result(got: BatchResult, begun, ended, tick):
    assert got.tick == tick
    assert_same_pairs(got.begun, begun, "begun")
    assert_same_pairs(got.ended, ended, "ended")


@pytest.mark.parametrize("dims", [2, 3])
def test_w1_steps_and_queries_match_reference(client, dims):
    world_gen = W1World(600, dims=dims, seed=dims)
    world = client.create_world(next(_names), dims=dims)
    reference = Reference(dims=dims)
    reference.create(world_gen.ids, world_gen.boxes)
    _same_result(world.apply(create=(world_gen.ids, world_gen.boxes)), *reference.update(), tick=1)
    for tick in range(2, 6):
        ids, boxes = world_gen.step()
        reference.move(ids, boxes)
        _same_result(world.apply(move=(ids, boxes)), *reference.update(), tick=tick)
    assert_same_pairs(world.pairs(), reference.pairs())
    boxes = world_gen.query_boxes(200)
    assert_same_csr(world.query_aabb(boxes), reference.query_aabb(boxes), "aabb")
    centers, radii = world_gen.spheres(200)
    assert_same_csr(world.query_sphere(centers, radii), reference.query_sphere(centers, radii), "sphere")
    segments = world_gen.segments(200)
    assert_same_csr(world.raycast(segments), reference.raycast(segments), "raycast")
    assert_same_csr(world.raycast(segments, first_hit=True), reference.raycast(segments, first_hit=True), "first hit")
    planes = world_gen.frusta(50)
    assert_same_csr(world.query_frustum(planes), reference.query_frustum(planes), "frustum")
    assert world.query_aabb(boxes).tick == 5


def test_static_group_mask_filter_pairs_and_queries(client):
    world = client.create_world(next(_names))
    reference = Reference()
    unit = np.array([[0, 0, 0, 1, 1, 1]] * 4, np.float32)
    spec = dict(static=[True, True, False, False], group=[1, 2, 2, 4], mask=[0xFF, 0xFF, 0xFF, 0x1])
    reference.create([1, 2, 3, 4], unit, **spec)
    got = world.apply(create=Create([1, 2, 3, 4], unit, **spec))
    _same_result(got, *reference.update(), tick=1)
    assert_same_pairs(world.pairs(), reference.pairs())
    for mask in (None, 2, 4, 0):
        assert_same_csr(world.query_aabb(unit[:1], mask=mask), reference.query_aabb(unit[:1], mask=mask))
    # The keyword form, with one scalar for every created row.
    reference.create([5, 6], unit[:2] + 5, static=True)
    _same_result(world.apply(create=([5, 6], unit[:2] + 5), static=True), *reference.update(), tick=2)


def test_one_batch_mixes_create_move_and_destroy(client):
    world = client.create_world(next(_names))
    boxes = np.array([[i, 0, 0, i + 1.5, 1, 1] for i in range(6)], np.float32)
    world.apply(create=(np.arange(4), boxes[:4]))
    result = world.apply(create=([10], boxes[4:5]), move=([0], boxes[3:4]), destroy=[2])
    reference = Reference()
    reference.create(np.arange(4), boxes[:4])
    reference.update()
    reference.create([10], boxes[4:5])
    reference.move([0], boxes[3:4])
    reference.destroy([2])
    _same_result(result, *reference.update(), tick=2)
    assert world.stats()["proxies"] == 4


def test_stream_pipelines_and_rejects_only_the_bad_batch(client):
    world = client.create_world(next(_names))
    boxes = np.array([[i, 0, 0, i + 1.5, 1, 1] for i in range(50)], np.float32)
    with world.stream() as stream:
        futures = [stream.submit(create=([i], boxes[i:i + 1])) for i in range(20)]
        bad = stream.submit(destroy=[12345])
        after = stream.apply(create=([20], boxes[20:21]))
    assert [f.result().tick for f in futures] == list(range(1, 21))
    assert [f.result().begun.tolist() for f in futures[1:3]] == [[[0, 1]], [[1, 2]]]
    with pytest.raises(InvalidArgument, match="destroy_ids row 0: unknown id 12345"):
        bad.result()
    assert after.tick == 21 and after.begun.tolist() == [[19, 20]]


def test_empty_batch_is_a_tick(client):
    world = client.create_world(next(_names))
    result = world.apply()
    assert result.tick == 1 and result.begun.shape == (0, 2) and result.begun.dtype == np.uint64


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_batches_match_reference(client, data):
    """Random batches of creates, moves and destroys on a tiny crowded world, against the reference."""
    world = client.create_world(next(_names), dims=2, margin=data.draw(st.sampled_from([0.0, 0.3])))
    # Hypothesis also ends examples in mid-draw (an overrun); a world left behind by each would fill the
    # server's 64 within a few hundred examples.
    try:
        reference = Reference(dims=2)
        coordinate = st.integers(0, 6).map(float)
        box = st.tuples(coordinate, coordinate, st.integers(0, 2), st.integers(0, 2)).map(
            lambda b: [b[0], b[1], b[0] + b[2], b[1] + b[3]])
        tick = 0
        for _ in range(data.draw(st.integers(1, 6))):
            present = _ids_of(reference)
            ids = data.draw(st.lists(st.integers(0, 12), max_size=8, unique=True))
            creating = [i for i in ids if i not in present]
            moving = [i for i in ids if i in present and data.draw(st.booleans())]
            destroying = [i for i in ids if i in present and i not in moving]
            create_boxes = np.array([data.draw(box) for _ in creating], np.float32).reshape(-1, 4)
            move_boxes = np.array([data.draw(box) for _ in moving], np.float32).reshape(-1, 4)
            result = world.apply(create=(creating, create_boxes), move=(moving, move_boxes), destroy=destroying)
            reference.create(creating, create_boxes)
            reference.move(moving, move_boxes)
            reference.destroy(destroying)
            tick += 1
            _same_result(result, *reference.update(), tick=tick)
        assert_same_pairs(world.pairs(), reference.pairs())
    finally:
        client.delete_world(world.name)


def _ids_of(reference) -> list[int]:
    everything = reference.query_aabb([[-1e9, -1e9, 1e9, 1e9]])[1]
    return sorted(int(i) for i in everything)


def _read_in_place(column: np.ndarray) -> bool:
    """Whether an answer's column is a view of the whole message gRPC received, not a copy of its field."""
    base = column.base
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and len(base.obj) > column.nbytes


def test_query_answers_are_read_in_place_over_the_wire(client, mode, server):
    """Over gRPC the SDK's columns are views of the received answer (serialized.reader), sync and async;
    the answers themselves are the same as Client.local()'s, which the other tests check. The ids need
    64 bits: hits sent in 32 (tests/test_narrow_ids.py) are widened, a copy."""
    if mode == "local":
        pytest.skip("Client.local() answers without serializing")
    boxes = np.array([[i, 0, 0, i + 1.5, 1, 1] for i in range(10)], np.float32)
    ids = np.arange(10, dtype=np.uint64) + np.uint64(2**32)

    async def with_async():
        async with async_client(mode, server) as client:
            world = await client.create_world("in-place-async", dims=3)
            await world.apply(create=(ids, boxes))
            answer = await world.query_aabb(boxes[3:5])
            await client.delete_world("in-place-async")
            return answer

    world = client.create_world("in-place", dims=3)
    world.apply(create=(ids, boxes))
    answers = [world.query_aabb(boxes[3:5]), world.raycast([[0, 0.5, 0.5, 3, 0.5, 0.5]]),
               world.query_nearest(boxes[:2, :3], k=2)]
    answers.append(asyncio.run(with_async()))
    for answer in answers:
        assert answer.hits.tolist() and all(_read_in_place(column) for column in answer), answer
    assert answers[0].hits.tolist() == answers[3].hits.tolist() == [2**32 + i for i in (2, 3, 4, 3, 4, 5)]


def test_async_client_has_the_same_api(mode, server):
    async def scenario():
        client = async_client(mode, server)
        async with client:
            world = await client.create_world("async-world", dims=3)
            boxes = np.array([[i, 0, 0, i + 1.5, 1, 1] for i in range(10)], np.float32)
            created = await world.apply(create=(np.arange(10), boxes))
            async with world.stream() as stream:
                pending = [await stream.submit(move=([i], boxes[i:i + 1] + 100)) for i in range(3)]
                moved = await stream.apply(destroy=[9])
            offsets, hits = await world.query_aabb(boxes[3:4])
            ray = await world.raycast([[0, 0.5, 0.5, 3, 0.5, 0.5]], first_hit=True)
            assert (await client.list_worlds()) == ["async-world"]
            pairs = await world.pairs()
            with pytest.raises(InvalidArgument, match="destroy_ids row 0: unknown id 999"):
                await world.apply(destroy=[999])
            with pytest.raises(NotFound, match="no world named 'elsewhere'"):
                await client.world("elsewhere").pairs()
            await client.delete_world("async-world")
            return created, [await p for p in pending], moved, (offsets, hits), ray, pairs

    created, pending, moved, (offsets, hits), ray, pairs = asyncio.run(scenario())
    assert created.tick == 1 and len(created.begun) == 9
    assert [p.tick for p in pending] == [2, 3, 4] and moved.tick == 5
    assert offsets.tolist() == [0, 2] and hits.tolist() == [3, 4]
    assert ray.hits.tolist() == [3] and ray.fractions.tolist() == [1.0]
    assert pairs.tolist() == [[0, 1], [1, 2], [3, 4], [4, 5], [5, 6], [6, 7], [7, 8]]
