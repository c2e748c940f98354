"""Sensors in the core, beside `dbvt.reference`: a hypothesis state machine drives sensors and proxies
(create, move, destroy, statics, group and mask, box and sphere, a sensor margin) on both, and after
every update compares the events (begun, ended, entered, left) and the whole sets; after every step
both validate. Coordinates are mostly quarter units on a small lattice, so proxies touching a shape
exactly, sitting on the margin's edge, and tied centres are common.
"""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import dbvt
from dbvt import reference
from worlds import assert_same_csr, update_both

lattice = st.integers(-16, 16).map(lambda q: q / 4)
size = st.integers(0, 12).map(lambda q: q / 4)
new_id = st.integers(0, 60)
SENSOR_MARGINS = [0.0, 0.25, 1.0, 2.5]


@st.composite
def boxes(draw, dims, n):
    lows = np.array(draw(st.lists(lattice, min_size=n * dims, max_size=n * dims)), np.float64).reshape(n, dims)
    sizes = np.array(draw(st.lists(size, min_size=n * dims, max_size=n * dims)), np.float64).reshape(n, dims)
    return np.concatenate([lows, lows + sizes], axis=1).astype(np.float32)


class SensorMachine(RuleBasedStateMachine):
    @initialize(dims=st.sampled_from([2, 3]), margin=st.sampled_from([0.0, 0.1, 1.0]),
                sensor_margin=st.sampled_from(SENSOR_MARGINS))
    def start(self, dims, margin, sensor_margin):
        self.dims = dims
        self.real = dbvt.Broadphase(dims=dims, margin=margin, sensor_margin=sensor_margin)
        self.ref = reference.Broadphase(dims=dims, margin=margin, sensor_margin=sensor_margin)
        self.present: set[int] = set()

    @rule(data=st.data())
    def create(self, data):
        ids = np.array([i for i in data.draw(st.lists(new_id, unique=True, max_size=6)) if i not in self.present],
                       np.uint64)
        n = len(ids)
        new = data.draw(boxes(self.dims, n))
        settings_ = dict(sensor=np.array(data.draw(st.lists(st.sampled_from([0, 0, 1, 2]), min_size=n, max_size=n)),
                                         np.uint8),
                         static=np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), np.uint8),
                         group=np.array(data.draw(st.lists(st.sampled_from([1, 2, 3]), min_size=n, max_size=n)),
                                        np.uint32),
                         mask=np.array(data.draw(st.lists(st.sampled_from([1, 3, 0xFFFFFFFF]), min_size=n,
                                                          max_size=n)), np.uint32))
        self.real.create(ids, new, **settings_)
        self.ref.create(ids, new, **settings_)
        self.present |= set(ids.tolist())

    @precondition(lambda self: self.present)
    @rule(data=st.data(), step=st.sampled_from([0.25, 0.5, 1.0, 3.0]))
    def move(self, data, step):
        ids = np.array(data.draw(st.lists(st.sampled_from(sorted(self.present)), unique=True, min_size=1,
                                          max_size=6)), np.uint64)
        if data.draw(st.booleans()):
            moved = data.draw(boxes(self.dims, len(ids)))
        else:
            shift = np.array(data.draw(st.lists(st.sampled_from([-1, 0, 1]), min_size=len(ids) * self.dims,
                                                max_size=len(ids) * self.dims)), np.float32).reshape(-1, self.dims)
            moved = self.ref.get(ids) + np.float32(step) * np.concatenate([shift, shift], axis=1)
        self.real.move(ids, moved)
        self.ref.move(ids, moved)

    @precondition(lambda self: self.present)
    @rule(data=st.data())
    def destroy(self, data):
        ids = np.array(data.draw(st.lists(st.sampled_from(sorted(self.present)), unique=True, min_size=1,
                                          max_size=3)), np.uint64)
        self.real.destroy(ids)
        self.ref.destroy(ids)
        self.present -= set(ids.tolist())

    @rule()
    def update(self):
        for got, expected in zip(self.real.update(), self.ref.update()):
            np.testing.assert_array_equal(got, expected)
        for got, expected in zip(self.real.sensor_events(), self.ref.sensor_events()):
            np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(self.real.sensor_pairs(), self.ref.sensor_pairs())

    @rule()
    def round_trip(self):
        self.real = dbvt.Broadphase.from_bytes(self.real.to_bytes())
        self.ref = reference.Broadphase.from_bytes(self.ref.to_bytes())

    @rule(data=st.data(), include_sensors=st.booleans())
    def query(self, data, include_sensors):
        probes = data.draw(boxes(self.dims, 3))
        assert_same_csr(self.real.query_aabb(probes, include_sensors=include_sensors),
                        self.ref.query_aabb(probes, include_sensors=include_sensors))
        centres = probes[:, :self.dims]
        assert_same_csr(self.real.query_sphere(centres, 2.0, include_sensors=include_sensors),
                        self.ref.query_sphere(centres, 2.0, include_sensors=include_sensors))
        for got, expected in zip(self.real.query_nearest(centres, 3, include_sensors=include_sensors),
                                 self.ref.query_nearest(centres, 3, include_sensors=include_sensors)):
            np.testing.assert_array_equal(got, expected)
        moves = np.ones((3, self.dims), np.float32)
        for got, expected in zip(self.real.cast_box(probes, moves, include_sensors=include_sensors),
                                 self.ref.cast_box(probes, moves, include_sensors=include_sensors)):
            np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(dbvt.overlap(self.real, self.real, include_sensors=include_sensors),
                                      reference.overlap(self.ref, self.ref, include_sensors=include_sensors))

    @invariant()
    def agree(self):
        self.real.validate()
        self.ref.validate()
        np.testing.assert_array_equal(self.real.pairs(), self.ref.pairs())
        assert len(self.real) == len(self.ref)


SensorMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
TestSensorsAgainstTheReference = SensorMachine.TestCase


def ball_world(sensor_margin=1.0):
    bp = dbvt.Broadphase(dims=3, margin=0.05, sensor_margin=sensor_margin)
    # A sphere sensor of radius 2 at the origin, and a unit box at x = 3 (1 beyond the ball).
    bp.create([1], [[-2, -2, -2, 2, 2, 2]], sensor="sphere")
    bp.create([2], [[3, 0, 0, 4, 1, 1]])
    bp.update()
    return bp


def move_to(bp, x):
    bp.move([2], [[x, 0, 0, x + 1, 1, 1]])
    bp.update()
    return bp.sensor_events()


def test_edges_do_not_flicker_between_the_shape_and_the_margin():
    bp = ball_world(sensor_margin=1.0)
    assert len(bp.sensor_pairs()) == 0
    entered, _ = move_to(bp, 2.0)                    # touches the ball (distance 2 = radius): enters
    np.testing.assert_array_equal(entered, [[1, 2]])
    for x in (2.5, 2.9, 3.0, 2.2, 3.0):              # within radius + margin: stays, no events
        assert all(len(rows) == 0 for rows in move_to(bp, x))
    _, left = move_to(bp, 3.01)                      # beyond radius + margin: leaves
    np.testing.assert_array_equal(left, [[1, 2]])
    for x in (2.5, 2.9):                             # back in the band, outside: nothing enters
        assert all(len(rows) == 0 for rows in move_to(bp, x))


def test_two_sensors_never_pair_and_queries_skip_sensors_unless_asked():
    bp = dbvt.Broadphase(dims=2)
    bp.create([1, 2], [[0, 0, 2, 2], [1, 1, 3, 3]], sensor="box")
    bp.create([3], [[1, 1, 2, 2]])
    bp.update()
    np.testing.assert_array_equal(bp.sensor_pairs(), [[1, 3], [2, 3]])
    assert len(bp.pairs()) == 0
    assert bp.query_aabb([[0, 0, 5, 5]])[1].tolist() == [3]
    assert sorted(bp.query_aabb([[0, 0, 5, 5]], include_sensors=True)[1].tolist()) == [1, 2, 3]


def test_a_destroyed_proxy_leaves_and_a_destroyed_sensor_takes_its_pairs_with_it():
    bp = dbvt.Broadphase(dims=3)
    bp.create([1, 2], [[0, 0, 0, 4, 4, 4], [10, 10, 10, 14, 14, 14]], sensor="box")
    bp.create([3, 4], [[1, 1, 1, 2, 2, 2], [11, 11, 11, 12, 12, 12]])
    bp.update()
    bp.destroy([3, 2])
    bp.update()
    np.testing.assert_array_equal(bp.sensor_events()[1], [[1, 3], [2, 4]])
    assert len(bp.sensor_pairs()) == 0


@pytest.mark.parametrize("bad, complaint", [("cube", "sensor must be None"), ([0, 3], "sensor row 1: kind 3"),
                                            ([1.5, 0], "must be integers")])
def test_bad_sensor_kinds_name_the_problem(bad, complaint):
    bp = dbvt.Broadphase(dims=2)
    with pytest.raises(ValueError, match=complaint):
        bp.create([1, 2], [[0, 0, 1, 1], [0, 0, 1, 1]], sensor=bad)
    assert len(bp) == 0


def test_sensors_need_pair_tracking_and_a_sane_margin():
    with pytest.raises(ValueError, match="sensors need pair tracking"):
        dbvt.Broadphase(track_pairs=False).create([1], [[0, 0, 0, 1, 1, 1]], sensor="box")
    for margin in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="sensor_margin must be a finite number >= 0"):
            dbvt.Broadphase(sensor_margin=margin)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("sensor_margin", [0.0, 0.75])
def test_passing_over_pairs_whose_slack_remains_never_misses_an_event(dims, sensor_margin):
    """A moving sensor re-tests only the partners whose drift since their last test, with its own, may
    have reached the distance to their next threshold. Here sensors and many proxies around them take
    small quarter-unit steps, so that partners come to rest exactly on a threshold (distance = radius,
    or radius + margin) after several moves of either side, sometimes both in one tick, sometimes
    after a long wait; and now and then a proxy jumps. After every update the events and the whole
    set must be the reference's, and validate() checks that every pair a re-test would pass over is
    already decided as a test would decide it."""
    rng = np.random.default_rng(1234 + dims)
    real = dbvt.Broadphase(dims=dims, margin=0.1, sensor_margin=sensor_margin)
    ref = reference.Broadphase(dims=dims, margin=0.1, sensor_margin=sensor_margin)
    n, sensors = 120, 4
    lows = rng.integers(-24, 24, size=(n, dims)) / 4
    sizes = rng.integers(0, 6, size=(n, dims)) / 4
    centres = rng.integers(-8, 8, size=(sensors, dims)) / 4
    radii = np.array([3.0, 4.0, 2.5, 3.5])[:, None]
    kinds = np.array([2, 2, 1, 1], np.uint8)

    def proxy_boxes():
        return np.concatenate([lows, lows + sizes], axis=1).astype(np.float32)

    def sensor_boxes():
        return np.concatenate([centres - radii, centres + radii], axis=1).astype(np.float32)

    sensor_ids = np.arange(1000, 1000 + sensors, dtype=np.uint64)
    for world in (real, ref):
        world.create(np.arange(n, dtype=np.uint64), proxy_boxes())
        world.create(sensor_ids, sensor_boxes(), sensor=kinds)
    velocity = rng.choice([-0.25, 0.0, 0.25], size=(sensors, dims))
    for tick in range(150):
        update_both(real, ref)
        real.validate()
        if tick % 40 == 39:
            real = dbvt.Broadphase.from_bytes(real.to_bytes())
        movers = rng.choice(n, size=12, replace=False)
        lows[movers] += rng.choice([-0.25, 0.0, 0.25], size=(12, dims))
        if tick % 7 == 0:
            lows[movers[:2]] = rng.integers(-24, 24, size=(2, dims)) / 4
        if tick % 5 == 0:
            velocity = rng.choice([-0.25, 0.0, 0.25], size=(sensors, dims))
        centres += velocity
        boxes = proxy_boxes()
        for world in (real, ref):
            world.move(movers.astype(np.uint64), boxes[movers])
            world.move(sensor_ids, sensor_boxes())
    np.testing.assert_array_equal(real.sensor_pairs(), ref.sensor_pairs())


def test_sensors_keep_a_subtree_of_their_own_through_every_change():
    """Sensors' leaves live apart from the rest (validate() checks it): created one by one or in the
    first bulk insert, moved, destroyed down to none and created again, after rebuild() and a round
    trip; and the answers stay the reference's throughout."""
    rng = np.random.default_rng(5)
    real = dbvt.Broadphase(dims=3, margin=0.1, sensor_margin=0.5)
    ref = reference.Broadphase(dims=3, margin=0.1, sensor_margin=0.5)

    def boxes(n, size):
        lows = rng.uniform(-20, 20, size=(n, 3))
        return np.concatenate([lows, lows + size], axis=1).astype(np.float32)

    def both(method, *args, **kwargs):
        getattr(real, method)(*args, **kwargs)
        getattr(ref, method)(*args, **kwargs)
        real.validate()

    def agree():
        update_both(real, ref)
        real.validate()
        probes = boxes(20, 3.0)
        for include_sensors in (False, True):
            assert_same_csr(real.query_aabb(probes, include_sensors=include_sensors),
                            ref.query_aabb(probes, include_sensors=include_sensors))

    # The first create is a bulk build of sensors and proxies together.
    both("create", np.arange(40, dtype=np.uint64), boxes(40, 2.0), sensor=np.tile(np.uint8([0, 0, 0, 2]), 10))
    agree()
    both("create", np.arange(100, 110, dtype=np.uint64), boxes(10, 8.0), sensor="box")
    agree()
    moved = np.r_[0:40:3, 100:110:3].astype(np.uint64)
    both("move", moved, boxes(len(moved), 4.0))
    agree()
    real.rebuild()
    real.validate()
    real = dbvt.Broadphase.from_bytes(real.to_bytes())
    agree()
    sensors = [3, 7, 11, 15, 19, 23, 27, 31, 35, 39] + list(range(100, 110))
    both("destroy", np.array(sensors, np.uint64))
    agree()
    both("destroy", np.arange(0, 40, 4, dtype=np.uint64))     # every proxy left is a sensor...
    both("destroy", np.array([i for i in range(40) if i % 4 not in (0, 3)], np.uint64))
    both("create", np.arange(200, 205, dtype=np.uint64), boxes(5, 6.0), sensor="sphere")
    agree()
    both("create", np.arange(300, 305, dtype=np.uint64), boxes(5, 1.0))   # ...and then not only
    agree()
    real.rebuild()
    agree()


def test_partner_lists_find_sensors_of_every_size_and_proxies_of_every_size():
    """Proxies' partner refreshes look sensors up in a grid of cells as wide as a sensor on average:
    a sensor far larger spans too many cells and is tested by every lookup, and a proxy far larger
    looks in the sensors' subtree instead. validate() compares every list with a walk of the whole
    tree, and the events must be the reference's, while sensors come and go."""
    rng = np.random.default_rng(9)
    real = dbvt.Broadphase(dims=3, margin=0.2)
    ref = reference.Broadphase(dims=3, margin=0.2)
    centres = rng.uniform(-50, 50, size=(60, 3))
    sides = np.where(np.arange(60)[:, None] < 3, 400.0, rng.uniform(2, 12, size=(60, 1)))   # 3 giant sensors
    sensors = np.concatenate([centres - sides / 2, centres + sides / 2], axis=1).astype(np.float32)
    sensor_ids = np.arange(1000, 1060, dtype=np.uint64)
    lows = rng.uniform(-60, 60, size=(400, 3))
    sizes = np.where(np.arange(400)[:, None] < 4, 500.0, rng.uniform(0, 2, size=(400, 1)))    # 4 giant proxies
    proxies = np.concatenate([lows, lows + sizes], axis=1).astype(np.float32)
    for world in (real, ref):
        world.create(np.arange(400, dtype=np.uint64), proxies)
        world.create(sensor_ids, sensors, sensor="sphere")
    for tick in range(12):
        update_both(real, ref)
        real.validate()
        if tick == 6:
            new_ids = np.arange(2000, 2005, dtype=np.uint64)
            new_boxes = sensors[10:15] + np.float32(3)
            for world in (real, ref):
                world.destroy(sensor_ids[:10])
                world.create(new_ids, new_boxes, sensor="box")
            sensor_ids = np.concatenate([sensor_ids[10:], new_ids])
            sensors = np.concatenate([sensors[10:], new_boxes])
        movers = rng.choice(400, size=80, replace=False)
        proxies[movers] += rng.uniform(-4, 4, size=(80, 1)).astype(np.float32)
        sensors += np.float32(1.5) * rng.choice([-1, 0, 1], size=(len(sensors), 1)).astype(np.float32)
        for world in (real, ref):
            world.move(movers.astype(np.uint64), proxies[movers])
            world.move(sensor_ids, sensors)



def test_sensors_that_change_their_fat_boxes_between_full_grid_builds():
    """Between full builds of the grid, the few sensors whose fat boxes changed are looked up in a
    second grid, and the first's entries for their old boxes answer by their boxes now: a few sensors jump each
    tick (some twice before an update, one to a box over too many cells), until enough have changed
    that the whole grid is built again. Every list must match a walk, and every event the reference's."""
    rng = np.random.default_rng(21)
    real = dbvt.Broadphase(dims=3, margin=0.2)
    ref = reference.Broadphase(dims=3, margin=0.2)
    centres = rng.uniform(-40, 40, size=(48, 3))
    sensors = np.concatenate([centres - 6.0, centres + 6.0], axis=1).astype(np.float32)
    sensor_ids = np.arange(1000, 1048, dtype=np.uint64)
    lows = rng.uniform(-45, 45, size=(500, 3))
    proxies = np.concatenate([lows, lows + 1.5], axis=1).astype(np.float32)
    kinds = np.where(np.arange(48) % 3 == 0, 1, 2).astype(np.uint8)
    for world in (real, ref):
        world.create(np.arange(500, dtype=np.uint64), proxies, sensor=None)
        world.create(sensor_ids, sensors, sensor=kinds)
    for tick in range(30):
        jumpers = rng.choice(48, size=3, replace=False)
        for _ in range(2):
            sensors[jumpers] += np.tile(rng.uniform(-9, 9, size=(3, 3)), 2).astype(np.float32)
            for world in (real, ref):
                world.move(sensor_ids[jumpers], sensors[jumpers])
        if tick == 11:
            sensors[5] = [-300, -300, -300, 300, 300, 300]      # over too many cells: tested by every lookup
            for world in (real, ref):
                world.move(sensor_ids[5:6], sensors[5:6])
        movers = rng.choice(500, size=120, replace=False)
        proxies[movers] += rng.uniform(-3, 3, size=(120, 1)).astype(np.float32)
        for world in (real, ref):
            world.move(movers.astype(np.uint64), proxies[movers])
        update_both(real, ref)
        np.testing.assert_array_equal(real.sensor_pairs(), ref.sensor_pairs())
        real.validate()


def fold(pairs: set, entered, left) -> set:
    return (pairs - {tuple(row) for row in left.tolist()}) | {tuple(row) for row in entered.tolist()}


def test_a_sphere_sensor_reaches_the_ball_in_its_fat_box_not_the_corners():
    real = dbvt.Broadphase(dims=3, margin=0.0)
    ref = reference.Broadphase(dims=3, margin=0.0)
    for world in (real, ref):
        world.create([1], [[-10, -10, -10, 10, 10, 10]], sensor="sphere")
        # In the corner of the sensor's fat box but outside its ball; and just inside the ball.
        world.create([2, 3], [[9, 9, 9, 9.5, 9.5, 9.5], [0, 0, 9.9, 0.1, 0.1, 10]])
        world.update()
    real.validate()
    assert real.stats()["fat_pairs"] == 1
    np.testing.assert_array_equal(real.sensor_pairs(), [[1, 3]])
    for step in range(1, 40):                   # its cube moves ahead of it, and is left behind in turn
        x = np.float32(0.5 * step if step < 20 else 0.5 * (40 - step))
        for world in (real, ref):
            world.move([1], [[x - 10, -10, -10, x + 10, 10, 10]])
            world.move([2], [[9 - x / 4, 9, 9, 9.5 - x / 4, 9.5, 9.5]])
            world.update()
        for got, expected in zip(real.sensor_events(), ref.sensor_events()):
            np.testing.assert_array_equal(got, expected)
        real.validate()


@pytest.mark.parametrize("dims", [2, 3])
def test_large_sphere_sensors_walk_their_balls_and_list_hundreds_of_partners(dims):
    """A sphere sensor's partner refresh walks only the nodes its reach's ball touches, and takes
    whole the nodes inside it; its hundreds of partners are then sorted by radix. Every list must
    match validate()'s walk of the whole tree, and every event the reference's, as the sensors sweep
    through a crowd on a lattice (boxes exactly on the ball's edge are common)."""
    rng = np.random.default_rng(31 + dims)
    real = dbvt.Broadphase(dims=dims, margin=0.25)
    ref = reference.Broadphase(dims=dims, margin=0.25)
    lows = rng.integers(-40, 40, size=(900, dims)).astype(np.float32) / np.float32(2)
    proxies = np.concatenate([lows, lows + np.float32(0.5)], axis=1)
    centres = rng.integers(-10, 10, size=(4, dims)).astype(np.float32)
    radius = np.float32(15)
    for world in (real, ref):
        world.create(np.arange(900, dtype=np.uint64), proxies)
        world.create(np.arange(1000, 1004, dtype=np.uint64), np.concatenate([centres - radius, centres + radius], 1),
                     sensor="sphere")
    velocity = rng.choice([-0.75, -0.25, 0.25, 0.75], size=(4, dims)).astype(np.float32)
    for tick in range(16):
        centres += velocity
        movers = rng.choice(900, size=150, replace=False)
        proxies[movers] += np.tile(rng.choice([-0.5, 0, 0.5], size=(150, dims)).astype(np.float32), 2)
        for world in (real, ref):
            world.move(np.arange(1000, 1004, dtype=np.uint64), np.concatenate([centres - radius, centres + radius], 1))
            world.move(movers.astype(np.uint64), proxies[movers])
        update_both(real, ref)
        real.validate()
    assert len(real.sensor_pairs()) > 4 * 128


@pytest.mark.parametrize("seed", range(4))
def test_the_grid_finds_sensors_whose_reach_a_box_just_touches_where_float32_rounds_coarsely(seed):
    """The grid tests a float32 ball around each sensor's reach before the exact test: far from the
    origin (a float32 step is 1/64 here) its rounding must never drop a box that touches the reach.
    On a lattice of that step, with sensors' centres half a step off it, boxes touch the reaches
    exactly and often; validate() compares every list with a walk of the whole tree."""
    rng = np.random.default_rng(seed)
    step, far = np.float32(1 / 64), np.float32(131072)
    real = dbvt.Broadphase(dims=3, margin=0.0)
    ref = reference.Broadphase(dims=3, margin=0.0)
    lows = far + rng.integers(-640, 640, size=(3000, 3)).astype(np.float32) * step
    proxies = np.concatenate([lows, lows + step * rng.integers(0, 3, size=(3000, 1)).astype(np.float32)], axis=1)
    centres = far + rng.integers(-320, 320, size=(40, 3)).astype(np.float32) * step + step / 2
    radii = step * rng.integers(60, 200, size=(40, 1)).astype(np.float32) + step / 4
    sensor_ids = np.arange(10000, 10040, dtype=np.uint64)
    for world in (real, ref):
        world.create(np.arange(3000, dtype=np.uint64), proxies)
        world.create(sensor_ids, np.concatenate([centres - radii, centres + radii], axis=1), sensor="sphere")
    for tick in range(6):
        update_both(real, ref)
        real.validate()
        movers = rng.choice(3000, size=400, replace=False)
        proxies[movers] += np.tile(rng.integers(-9, 10, size=(400, 3)).astype(np.float32) * step, 2)
        centres += rng.integers(-3, 4, size=(40, 3)).astype(np.float32) * step
        for world in (real, ref):
            world.move(movers.astype(np.uint64), proxies[movers])
            world.move(sensor_ids, np.concatenate([centres - radii, centres + radii], axis=1))


@pytest.mark.parametrize("kind", ["box", "sphere"])
@pytest.mark.parametrize("dims", [2, 3])
def test_sensors_at_the_limits_of_float32_reach_everything_they_must(dims, kind):
    top = np.float32(3.4e38)
    real = dbvt.Broadphase(dims=dims, margin=1e37, sensor_margin=1e37)
    ref = reference.Broadphase(dims=dims, margin=1e37, sensor_margin=1e37)
    low, high = np.full(dims, top - np.float32(4e37)), np.full(dims, top)
    near = np.concatenate([low, low + np.float32(1e37)])
    for world in (real, ref):
        world.create([1], [np.concatenate([low, high])], sensor=kind)
        world.create([2, 3], [near, -near[::-1]])
        world.update()
    for step in range(6):
        shift = np.float32(step * 3e36)
        for world in (real, ref):
            world.move([1], [np.concatenate([low - shift, high - shift])])
            world.move([2], [near - shift * 2])
            world.update()
        for got, expected in zip(real.sensor_events(), ref.sensor_events()):
            np.testing.assert_array_equal(got, expected)
        real.validate()


def test_a_world_saved_when_a_sphere_sensors_reach_was_its_whole_fat_box_loads_without_events():
    # Written by the build before the reach was a ball (commit 969d356): three sphere sensors whose
    # lists hold every proxy in their fat boxes' corners too, 77 sensor pairs inside.
    data = (Path(__file__).parent / "data" / "sensors_with_box_reach.dbvt").read_bytes()
    bp = dbvt.Broadphase.from_bytes(data)
    inside = {tuple(row) for row in bp.sensor_pairs().tolist()}
    assert len(inside) == 77 and bp.stats()["fat_pairs"] == 377
    bp.update()
    assert all(len(rows) == 0 for rows in bp.sensor_events())
    assert bp.stats()["fat_pairs"] < 377            # the corners' proxies are partners no more
    bp.validate()
    rng = np.random.default_rng(3)
    ids = np.arange(300, dtype=np.uint64)
    boxes = bp.get(ids)
    for _ in range(8):
        boxes += rng.uniform(-0.6, 0.6, size=(300, 1)).astype(np.float32)
        bp.move(ids, boxes)
        bp.update()
        inside = fold(inside, *bp.sensor_events())
        assert inside == {tuple(row) for row in bp.sensor_pairs().tolist()}
        bp.validate()                               # inside exactly where the rule says
