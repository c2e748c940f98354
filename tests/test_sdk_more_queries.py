"""k nearest, box and sphere casts, and the overlap of two worlds through the SDK, against a real server
and in-process, compared with dbvt.reference: on W1 worlds, with masks, first hits and sensors;
query sets too big for one message; and overlaps that hold both worlds still while another client
writes to them, in both orders at once, without waiting on each other.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dbvt import reference
from dbvt_client import Client, Create, InvalidArgument
from servers import ServerThread
from worlds import W1World


def twin(world, n=800, seed=0, dims=3):
    """A W1 world through the SDK and its reference, with a few groups and two sensors."""
    scene = W1World(n, dims=dims, seed=seed)
    ref = reference.Broadphase(dims=dims, margin=0.05)
    group = (np.arange(n) % 3 + 1).astype(np.uint32)
    sensor = np.zeros(n, np.uint8)
    sensor[:2] = 2
    create = Create(scene.ids, scene.boxes.astype(np.float32), group=group, sensor=sensor)
    world.apply(create=create)
    ref.create(create.ids, create.boxes, group=group, sensor=sensor)
    ref.update()
    return scene, ref


def assert_same(got, expected, exact_columns=3):
    for a, b in zip(got[:exact_columns], expected[:exact_columns]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("include_sensors", [False, True])
def test_nearest_and_casts_match_the_reference(client, include_sensors):
    world = client.create_world("asked", dims=3)
    scene, ref = twin(world)
    points = scene.rng.uniform(0, scene.side, size=(50, 3)).astype(np.float32)
    for k, reach, mask in ((1, np.inf, None), (8, np.inf, None), (8, 6.0, 0b10), (5000, np.inf, None)):
        got = world.query_nearest(points, k, reach, mask=mask, include_sensors=include_sensors)
        assert_same(got, ref.query_nearest(points, k, reach, mask=mask, include_sensors=include_sensors))
    boxes = scene.query_boxes(40, half=1.5).astype(np.float32)
    moves = scene.rng.normal(scale=12, size=(40, 3)).astype(np.float32)
    moves[:4] = 0                                                   # zero-length casts are box queries
    for first_hit in (False, True):
        assert_same(world.cast_box(boxes, moves, first_hit, include_sensors=include_sensors),
                    ref.cast_box(boxes, moves, first_hit, include_sensors=include_sensors))
        assert_same(world.cast_sphere(points[:40], 2.0, moves, first_hit, mask=0b101, include_sensors=include_sensors),
                    ref.cast_sphere(points[:40], np.full(40, 2.0, np.float32), moves, first_hit, mask=0b101,
                                    include_sensors=include_sensors))
    assert world.query_nearest(points, 3).tick == 1


def test_overlap_of_two_worlds_matches_the_reference(client):
    a, b = client.create_world("static-level", dims=3), client.create_world("players", dims=3)
    _, ref_a = twin(a, n=700, seed=1)
    _, ref_b = twin(b, n=500, seed=2)
    for mask_a, mask_b, sensors in ((None, None, False), (0b1, 0b110, False), (None, None, True)):
        got = client.overlap("static-level", "players", mask_a=mask_a, mask_b=mask_b, include_sensors=sensors)
        expected = reference.overlap(ref_a, ref_b, mask_a, mask_b, include_sensors=sensors)
        np.testing.assert_array_equal(got.pairs, expected)
        assert (got.tick_a, got.tick_b) == (1, 1)
    assert len(client.overlap("static-level", "players").pairs) > 0


def test_bad_queries_name_the_problem(client):
    world = client.create_world("strict", dims=2)
    world.apply(create=([1], [[0, 0, 1, 1]]))
    with pytest.raises(InvalidArgument, match="k must be"):
        world.query_nearest([[0, 0]], -1)
    with pytest.raises(InvalidArgument, match="row 0"):
        world.query_nearest([[np.nan, 0]], 2)
    with pytest.raises(InvalidArgument, match="displacements"):
        world.cast_box([[0, 0, 1, 1]], [[1, 1], [2, 2]])
    with pytest.raises(InvalidArgument):
        world.cast_sphere([[0, 0]], -1.0, [[1, 1]])
    client.create_world("three", dims=3)
    with pytest.raises(InvalidArgument, match="same dims"):
        client.overlap("strict", "three")


def test_query_sets_bigger_than_a_message_are_answered_at_one_tick():
    server = ServerThread(max_message_bytes=16 * 1024)
    try:
        with Client(server.target) as client:
            world = client.create_world("small-messages")
            scene, ref = twin(world, n=1500)
            points = scene.rng.uniform(0, scene.side, size=(3000, 3)).astype(np.float32)
            got = world.query_nearest(points, 4)
            assert_same(got, ref.query_nearest(points, 4))
            assert got.world_seconds > 0, "an answer in parts keeps its world_seconds"
            moves = np.tile(np.array([[20, 0, 0]], np.float32), (3000, 1))
            assert_same(world.cast_sphere(points, 1.0, moves), ref.cast_sphere(points, np.ones(3000, np.float32), moves))
            crossings = client.overlap("small-messages", "small-messages")   # an answer in many parts
            np.testing.assert_array_equal(crossings.pairs, reference.overlap(ref, ref))
            assert crossings.pairs.nbytes > 16 * 1024
    finally:
        server.stop()


def test_opposite_overlaps_while_both_worlds_change_hold_them_still(server):
    """Two clients ask overlap(a, b) and overlap(b, a) over and over while a third moves proxies in
    both: every answer must be exactly the crossings of the two worlds at the ticks it names."""
    boxes_at = {"left": {}, "right": {}}
    with Client(server.target) as writer:
        scenes = {}
        for name, seed in (("left", 3), ("right", 4)):
            world = writer.create_world(name, dims=3)
            scenes[name] = W1World(600, dims=3, seed=seed)
            world.apply(create=(scenes[name].ids, scenes[name].boxes.astype(np.float32)))
            boxes_at[name][1] = (scenes[name].ids.copy(), scenes[name].boxes.astype(np.float32))
        answers, stop = [], threading.Event()

        def ask(first, second):
            with Client(server.target) as reader:
                while not stop.is_set():
                    answers.append((first, second, reader.overlap(first, second)))

        askers = [threading.Thread(target=ask, args=pair) for pair in (("left", "right"), ("right", "left"))]
        for asker in askers:
            asker.start()
        for tick in range(2, 40):
            for name in ("left", "right"):
                ids, moved = scenes[name].step()
                writer.world(name).apply(move=(ids, moved.astype(np.float32)))
                boxes_at[name][tick] = (scenes[name].ids.copy(), scenes[name].boxes.astype(np.float32))
        stop.set()
        for asker in askers:
            asker.join(30)
        for name in ("left", "right"):
            writer.delete_world(name)
    assert len(answers) >= 4
    for first, second, got in answers:
        world_a, world_b = reference.Broadphase(), reference.Broadphase()
        world_a.create(*boxes_at[first][got.tick_a])
        world_b.create(*boxes_at[second][got.tick_b])
        np.testing.assert_array_equal(got.pairs, reference.overlap(world_a, world_b))


def test_every_query_answer_says_how_long_the_broadphase_took_within_the_call(client):
    """world_seconds: the core's part of a query set, for every kind, on every path (the query
    stream, a Unix socket, in-process), within the call's round trip."""
    world = client.create_world("timed-queries", dims=3)
    scene, _ = twin(world, n=2000)
    boxes = scene.query_boxes(300, half=2.0).astype(np.float32)
    points = boxes[:, :3].copy()
    moves = np.full((300, 3), 3.0, np.float32)
    segments = np.concatenate([points, points + moves], 1)
    planes = np.tile(np.array([[1, 0, 0, -1], [-1, 0, 0, 9], [0, 1, 0, -1]], np.float32), (300, 1, 1))
    asks = {"query_aabb": lambda: world.query_aabb(boxes), "query_sphere": lambda: world.query_sphere(points, 2.0),
            "raycast": lambda: world.raycast(segments), "query_frustum": lambda: world.query_frustum(planes),
            "query_nearest": lambda: world.query_nearest(points, 4), "cast_box": lambda: world.cast_box(boxes, moves),
            "cast_sphere": lambda: world.cast_sphere(points, 2.0, moves)}
    for kind, ask in asks.items():
        started = time.perf_counter()
        answer = ask()
        assert 0 < answer.world_seconds < time.perf_counter() - started, kind
