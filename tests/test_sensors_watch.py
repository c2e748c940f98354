"""Sensors through the SDK, against a real server and in-process: batch events, the whole set, queries
skipping sensors, and watchers. Watchers on their own connections fold their feeds and must match
the brute-force reference at every tick; a watcher that stops reading gets a resync and is right
again; `from_tick` replays; a filtered watcher sees only its sensors; a deleted world ends its feed.
"""
from __future__ import annotations

import asyncio
import threading
import time

import grpc
import numpy as np
import pytest

from dbvt import reference
from dbvt_client import Client, Create, InvalidArgument, NotFound, ResourceExhausted, SensorSet, watching
from dbvt_proto.v1 import broadphase_pb2 as pb
from dbvt_proto.v1 import broadphase_pb2_grpc as pb_grpc
from servers import ServerThread, async_client
from worlds import W1World

SENSORS = 40


class Scene:
    """A small W1 world with sphere sensors that all move every tick, and its reference."""

    def __init__(self, world, n=600, seed=3, sensor_margin=0.5, small_ids=False):
        self.world = world
        self.w1 = W1World(n, dims=3, seed=seed)
        if small_ids:
            # Every id below 2^32, so that answers and feeds may narrow them.
            self.w1.ids = np.arange(1, n + 1, dtype=np.uint64)
        self.ref = reference.Broadphase(dims=3, margin=0.05, sensor_margin=sensor_margin)
        rng = np.random.default_rng(seed)
        self.sensor_ids = np.arange(SENSORS, dtype=np.uint64) + np.uint64(10**6 if small_ids else 1 << 62)
        self.centres = rng.uniform(0, self.w1.side, size=(SENSORS, 3))
        self.velocity = rng.normal(size=(SENSORS, 3))
        self.radius = 6.0
        self.sets = {}                      # tick -> the reference's set after it

    def sensor_boxes(self):
        return np.concatenate([self.centres - self.radius, self.centres + self.radius], axis=1).astype(np.float32)

    def start(self):
        create = Create(np.concatenate([self.w1.ids, self.sensor_ids]),
                        np.concatenate([self.w1.boxes.astype(np.float32), self.sensor_boxes()]),
                        sensor=np.r_[np.zeros(len(self.w1.ids), np.uint8), np.full(SENSORS, 2, np.uint8)])
        result = self.world.apply(create=create)
        self.ref.create(create.ids, create.boxes, sensor=create.sensor)
        self.check(result)
        return result

    def step(self):
        ids, boxes = self.w1.step()
        self.centres += self.velocity
        move = (np.concatenate([ids, self.sensor_ids]), np.concatenate([boxes.astype(np.float32),
                                                                       self.sensor_boxes()]))
        result = self.world.apply(move=move)
        self.ref.move(*move)
        self.check(result)
        return result

    def check(self, result):
        self.ref.update()
        entered, left = self.ref.sensor_events()
        np.testing.assert_array_equal(result.entered, entered)
        np.testing.assert_array_equal(result.left, left)
        self.sets[result.tick] = self.ref.sensor_pairs()


def collect(feed, until_tick, into):
    for events in feed:
        into.append(events)
        if events.tick >= until_tick:
            return


def read_while_stepping(scene, steps: int, readers: list) -> None:
    """The readers started, the scene stepped, then the readers waited for."""
    for reader in readers:
        reader.start()
    for _ in range(steps):
        scene.step()
    for reader in readers:
        reader.join(20)


def assert_folds_to_the_reference(messages, sets, sensors=None):
    folded = SensorSet()
    assert messages and messages[0].resync, "a feed starts with a resync"
    last = -1
    for events in messages:
        assert events.tick >= last, "ticks arrive in order"
        last = events.tick
        folded.fold(events)
        expected = sets[events.tick]
        if sensors is not None:
            expected = expected[np.isin(expected[:, 0], sensors)]
        np.testing.assert_array_equal(folded.inside, expected)


def test_batches_report_entered_and_left_and_queries_skip_sensors(client):
    world = client.create_world("sensed", sensor_margin=0.5)
    scene = Scene(world)
    scene.start()
    for _ in range(5):
        scene.step()
    np.testing.assert_array_equal(world.sensor_pairs(), scene.ref.sensor_pairs())
    assert world.info().sensor_margin == 0.5
    everything = np.array([[-1e9] * 3 + [1e9] * 3], np.float32)
    assert len(world.query_aabb(everything).hits) == len(scene.w1.ids)
    assert len(world.query_aabb(everything, include_sensors=True).hits) == len(scene.w1.ids) + SENSORS
    np.testing.assert_array_equal(world.pairs(), scene.ref.pairs())


def test_two_watchers_on_their_own_connections_match_the_reference_at_every_tick(server):
    with Client(server.target) as writer, Client(server.target) as one, Client(server.target) as two:
        world = writer.create_world("watched", sensor_margin=0.5)
        scene = Scene(world)
        scene.start()
        feeds = [one.world("watched").watch(), two.world("watched").watch(sensors=scene.sensor_ids[:10])]
        got = [[], []]
        read_while_stepping(scene, 20, [threading.Thread(target=collect, args=(feed, 21, into))
                                        for feed, into in zip(feeds, got)])
        for feed in feeds:
            feed.close()
    assert_folds_to_the_reference(got[0], scene.sets)
    assert_folds_to_the_reference(got[1], scene.sets, sensors=scene.sensor_ids[:10])
    assert all((events.entered[:, 0] < scene.sensor_ids[10]).all() for events in got[1])


def raw_feed(channel, world: str, narrow_ids: bool, until_tick: int, into: list) -> None:
    """A feed read with the generated stub: its messages as they came."""
    stub = pb_grpc.BroadphaseServiceStub(channel)
    for message in stub.WatchSensors(pb.WatchSensorsRequest(world=world, narrow_ids=narrow_ids), timeout=30):
        into.append(message)
        if message.tick >= until_tick:
            return


def test_a_feed_of_ids_that_fit_32_bits_comes_in_32_bits_to_watchers_that_allow_it(server):
    """The same ticks to a watcher that allows ids of 32 bits and to one that does not: each message
    in its own width, each feed read in its width folding to the reference's set at every tick, and
    the SDK's watcher exact too. (The two may join at different ticks: each starts with a resync.)"""
    with Client(server.target) as writer, Client(server.target) as reader, \
            grpc.insecure_channel(server.target) as channel:
        world = writer.create_world("narrow-feed", sensor_margin=0.5)
        scene = Scene(world, small_ids=True)
        scene.start()
        narrow, wide, sdk = [], [], []
        feed = reader.world("narrow-feed").watch()
        read_while_stepping(scene, 10, [
            threading.Thread(target=raw_feed, args=(channel, "narrow-feed", True, 11, narrow)),
            threading.Thread(target=raw_feed, args=(channel, "narrow-feed", False, 11, wide)),
            threading.Thread(target=collect, args=(feed, 11, sdk))])
        feed.close()
        writer.delete_world("narrow-feed")
    assert_folds_to_the_reference(sdk, scene.sets)
    for messages, dtype in ((narrow, "<u4"), (wide, "<u8")):
        assert messages and messages[0].resync and messages[-1].tick >= 11
        inside: set = set()
        for message in messages:
            rows = {column: set(map(tuple, np.frombuffer(getattr(message, column), dtype).reshape(-1, 2).tolist()))
                    for column in ("entered", "left", "inside")}
            if any(rows.values()):      # a heartbeat has no rows, and no width
                assert message.narrow_ids == (dtype == "<u4")
            if message.resync:
                inside = rows["inside"]
            inside = (inside - rows["left"]) | rows["entered"]
            assert inside == set(map(tuple, scene.sets[message.tick].tolist())), (dtype, message.tick)
    assert any(message.entered for message in narrow[1:]), "sensors entered while watched"


def test_the_sdk_asks_its_feeds_for_ids_of_32_bits():
    assert watching.watch_request("w", None, None).narrow_ids
    assert watching.watch_request("w", [1, 2], 5).narrow_ids


def test_a_watcher_that_stops_reading_gets_a_resync_and_is_right_again():
    """A big box sensor, and 20,000 proxies moved into it and out again each tick (320 kB of events a
    tick): a watcher that reads nothing fills its connection's window, the server's backlog of 3
    ticks overflows, and the watcher, reading again, gets a resync and folds to the right sets."""
    server = ServerThread(max_watch_backlog=3)
    ids = np.arange(20_000, dtype=np.uint64)
    x = 2.0 * ids.astype(np.float64)
    inside = np.column_stack([x, np.zeros_like(x), np.zeros_like(x), x + 1, np.ones_like(x),
                              np.ones_like(x)]).astype(np.float32)
    outside = inside + np.array([0, 10, 0, 0, 10, 0], np.float32)
    try:
        with Client(server.target) as writer, Client(server.target) as reader:
            world = writer.create_world("flooded")
            world.apply(create=Create(np.array([1 << 40], np.uint64), np.array([[-1, -1, -1, 40_001, 2, 2]], np.float32),
                                      sensor="box"))
            world.apply(create=(ids, outside))
            with reader.world("flooded").watch() as feed:
                messages = [next(feed)]
                for tick in range(3, 63):
                    world.apply(move=(ids, inside if tick % 2 else outside))
                while messages[-1].tick < 62:
                    messages.append(next(feed))
    finally:
        server.stop()
    assert any(events.resync for events in messages[1:]), "the overflowing backlog became a resync"
    everything = np.column_stack([np.full(len(ids), 1 << 40, np.uint64), ids])
    sets = {tick: everything if tick % 2 and tick > 2 else everything[:0] for tick in range(2, 63)}
    assert_folds_to_the_reference(messages, sets)


def test_from_tick_replays_what_was_missed(client):
    world = client.create_world("resumed", sensor_margin=0.5)
    scene = Scene(world)
    scene.start()
    for _ in range(3):
        scene.step()
    held = SensorSet()
    with world.watch() as feed:
        held.fold(next(feed))
    assert held.tick == 4
    for _ in range(6):
        scene.step()
    with world.watch(from_tick=held.tick) as feed:
        while held.tick < 10:
            events = next(feed)
            assert not events.resync, "ticks still held are replayed, not resynced"
            held.fold(events)
            np.testing.assert_array_equal(held.inside, scene.sets[events.tick])


def test_a_from_tick_older_than_the_history_gets_a_resync():
    server = ServerThread(watch_history=2)
    try:
        with Client(server.target) as client:
            world = client.create_world("forgotten", sensor_margin=0.5)
            scene = Scene(world, n=300)
            scene.start()
            for _ in range(6):
                scene.step()
            with world.watch(from_tick=1) as feed:
                events = next(feed)
            assert events.resync and events.tick == 7
            np.testing.assert_array_equal(events.inside, scene.sets[7])
    finally:
        server.stop()


def test_a_quiet_world_sends_heartbeats(client):
    world = client.create_world("quiet")
    world.apply(create=([1], [[0, 0, 0, 1, 1, 1]]), sensor="box")
    with world.watch() as feed:
        assert next(feed).resync
        started = time.monotonic()
        beat = next(feed)
    assert not beat.resync and not len(beat.entered) and not len(beat.left) and beat.tick == 1
    assert 0.5 < time.monotonic() - started < 3


def test_deleting_the_world_ends_its_feeds_with_not_found(client):
    world = client.create_world("doomed")
    with world.watch() as feed:
        next(feed)
        client.delete_world("doomed")
        with pytest.raises(NotFound, match="doomed"):
            for _ in range(5):
                next(feed)


def test_the_async_client_watches_too(mode, server):
    async def run():
        async with async_client(mode, server) as client:
            world = await client.create_world("async-watched")
            await world.apply(create=([1], [[0, 0, 0, 4, 4, 4]]), sensor="box")
            async with await world.watch() as feed:
                first = await feed.__anext__()
                await world.apply(create=([2], [[1, 1, 1, 2, 2, 2]]))
                second = await feed.__anext__()
                while not len(second.entered):
                    second = await feed.__anext__()
            await client.delete_world("async-watched")
            return first, second

    first, second = asyncio.run(run())
    assert first.resync and len(first.inside) == 0
    np.testing.assert_array_equal(second.entered, [[1, 2]])


def test_a_refused_batch_leaves_every_sensor_exactly_as_it_was(client):
    """A proxy in the margin band is inside only because of its history: a batch that would take it
    out, refused for the pair limit, must not lose that."""
    world = client.create_world("band", sensor_margin=2.0, max_pairs=5)
    world.apply(create=Create([1], [[0, 0, 0, 4, 4, 4]], sensor="box"))
    world.apply(create=([2], [[3, 3, 3, 5, 5, 5]]))                 # touches the box: enters
    assert world.apply(move=([2], [[5, 5, 5, 6, 6, 6]])).left.size == 0   # into the band: stays
    pile = np.tile(np.array([[20, 20, 20, 21, 21, 21]], np.float32), (6, 1))
    with pytest.raises(ResourceExhausted, match="max_pairs"):
        world.apply(create=(np.arange(10, 16, dtype=np.uint64), pile), move=([2], [[30, 30, 30, 31, 31, 31]]))
    np.testing.assert_array_equal(world.sensor_pairs(), [[1, 2]])
    result = world.apply(move=([2], [[5.5, 5, 5, 6, 6, 6]]))            # still in the band: no event
    assert result.entered.size == result.left.size == 0
    np.testing.assert_array_equal(world.apply(move=([2], [[7, 7, 7, 8, 8, 8]])).left, [[1, 2]])


def test_bad_sensor_requests_get_a_clear_status_and_change_nothing(server):
    with Client(server.target) as client:
        world = client.create_world("strict-sensors")
        world.apply(create=([1], [[0, 0, 0, 1, 1, 1]]))
        bad = pb.ApplyBatchRequest(world="strict-sensors", batch=pb.Batch(
            create_ids=np.array([2], "<u8").tobytes(), create_boxes=np.zeros((1, 6), "<f4").tobytes(),
            create_sensor=bytes([3])))
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.BroadphaseServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.ApplyBatch(bad, timeout=10))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "create_sensor row 0: kind 3" in refused.value.details()
            with pytest.raises(grpc.RpcError) as unknown:
                next(iter(stub.WatchSensors(pb.WatchSensorsRequest(world="no-such-world"), timeout=10)))
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert world.info().tick == 1 and world.info().proxies == 1
        with pytest.raises(InvalidArgument, match="from_tick 9 is ahead of the world's tick 1"):
            next(iter(world.watch(from_tick=9)))
        with pytest.raises(InvalidArgument, match="sensor must be"):
            world.apply(create=([3], [[0, 0, 0, 1, 1, 1]]), sensor="cube")
        client.delete_world("strict-sensors")
