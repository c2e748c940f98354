"""Hypothesis state machines running `dbvt.Tree` and `dbvt.Broadphase` beside `dbvt.reference`.

Every rule does the same thing to both; after every step both validate and agree on length, boxes,
pairs and a fixed probe set of every query kind. Coordinates are often small integers, so touching
faces, equal centres, zero-size boxes and segments ending exactly on a face are common: the closed
interval edge cases where an inexact tree would first disagree with brute force.
"""
import math

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import dbvt
from dbvt import reference
from worlds import assert_same_csr, assert_same_pairs

grid = st.integers(-4, 4).map(float)
# Now and then a value at float32's limits: fat boxes, unions and costs must survive overflow mid-story.
limits = st.sampled_from([3.4028235e38, -3.4028235e38, 1e30, -1e30, 1e-45, -1e-45, -0.0])
coordinate = st.one_of(grid, grid, grid, st.floats(-60, 60, width=32), limits)
extent = st.one_of(st.just(0.0), st.integers(0, 3).map(float), st.floats(0, 20, width=32))
new_id = st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1))
MACHINE_SETTINGS = settings(max_examples=80, stateful_step_count=40, deadline=None)


def rows_of(values, width):
    return np.array(values, np.float64).reshape(-1, width)


@st.composite
def boxes(draw, dims, n):
    lows = rows_of(draw(st.lists(coordinate, min_size=n * dims, max_size=n * dims)), dims)
    sizes = rows_of(draw(st.lists(extent, min_size=n * dims, max_size=n * dims)), dims)
    return np.concatenate([lows, lows + sizes], axis=1).astype(np.float32)


@st.composite
def segments(draw, dims, n):
    starts = rows_of(draw(st.lists(coordinate, min_size=n * dims, max_size=n * dims)), dims)
    ends = rows_of(draw(st.lists(coordinate, min_size=n * dims, max_size=n * dims)), dims)
    for row in range(n):
        shape = draw(st.sampled_from(["free", "free", "degenerate", "axis-parallel"]))
        if shape == "degenerate":
            ends[row] = starts[row]
        elif shape == "axis-parallel":
            axis = draw(st.integers(0, dims - 1))
            ends[row] = starts[row]
            ends[row, axis] += draw(st.sampled_from([-9.0, -1.0, 2.0, 7.5]))
    return np.concatenate([starts, ends], axis=1).astype(np.float32)


def view_projection(eye, target, fov, near, far):
    """An OpenGL-style perspective projection times a look-at view (column vectors)."""
    forward = (target - eye) / np.linalg.norm(target - eye)
    up = np.array([0.0, 0.0, 1.0]) if abs(forward[2]) < 0.9 else np.array([0.0, 1.0, 0.0])
    side = np.cross(forward, up)
    side /= np.linalg.norm(side)
    up = np.cross(side, forward)
    view = np.eye(4)
    view[0, :3], view[1, :3], view[2, :3] = side, up, -forward
    view[:3, 3] = -view[:3, :3] @ eye
    c = 1.0 / math.tan(fov / 2)
    projection = np.array([[c, 0, 0, 0], [0, c, 0, 0],
                           [0, 0, (far + near) / (near - far), 2 * far * near / (near - far)], [0, 0, -1, 0]])
    return projection @ view


@st.composite
def planes(draw, dims, n):
    if dims == 3 and draw(st.booleans()):
        matrices = []
        for _ in range(n):
            eye = np.array(draw(st.lists(grid, min_size=3, max_size=3)))
            target = eye + np.array(draw(st.lists(st.integers(-3, 3), min_size=3, max_size=3).filter(any)), float)
            fov = math.radians(draw(st.sampled_from([30, 60, 90, 120])))
            matrices.append(view_projection(eye, target, fov, draw(st.sampled_from([0.1, 1.0])), 20.0))
        return dbvt.frustum_planes(np.array(matrices).reshape(n, 4, 4))
    k = draw(st.integers(1, 6))
    values = draw(st.lists(st.one_of(st.integers(-2, 2).map(float), st.floats(-3, 3, width=32)),
                           min_size=n * k * (dims + 1), max_size=n * k * (dims + 1)))
    return np.array(values, np.float32).reshape(n, k, dims + 1)


def raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the exception itself is what is being compared
        return exc
    raise AssertionError("bad input was accepted")


class TwinMachine(RuleBasedStateMachine):
    """Shared rules: queries, pairs, round trip, bad input. Subclasses create `real` and `ref`."""

    def start(self, real, ref, dims, data):
        self.real, self.ref, self.dims = real, ref, dims
        self.present = set()
        self.probes = (data.draw(boxes(dims, 3)), data.draw(boxes(dims, 3))[:, :dims], data.draw(segments(dims, 3)),
                       data.draw(planes(dims, 2)))

    def query_options(self, data):
        return {}

    def fresh_ids(self, data, max_size=8):
        drawn = data.draw(st.lists(new_id, unique=True, max_size=max_size))
        return np.array([i for i in drawn if i not in self.present], np.uint64)

    def some_present_ids(self, data):
        return np.array(data.draw(st.lists(st.sampled_from(sorted(self.present)), unique=True, min_size=1,
                                           max_size=8)), np.uint64)

    def absent_id(self, also_avoid=()):
        return next(i for i in range(10**6) if i not in self.present and i not in also_avoid)

    def cluster(self, data):
        """Many boxes on a tiny lattice at once: equal centres and touching faces en masse."""
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        n = data.draw(st.integers(10, 60))
        low = rng.integers(-3, 3, size=(n, self.dims)).astype(np.float32)
        size = rng.integers(0, 3, size=(n, self.dims)).astype(np.float32)
        ids = np.array([i for i in dict.fromkeys(rng.integers(0, 400, n).tolist()) if i not in self.present],
                       np.uint64)
        return ids, np.concatenate([low, low + size], axis=1)[: len(ids)]

    @precondition(lambda self: self.present)
    @rule(data=st.data())
    def nudge(self, data):
        """Small moves and growths mostly stay inside the fat boxes: the path where the core reinserts
        nothing and must still notice every tight overlap that began or ended."""
        ids, d = self.some_present_ids(data), self.dims
        steps = st.lists(st.sampled_from([-1.0, -0.25, 0.0, 0.0, 0.25, 0.5]), min_size=len(ids) * d,
                         max_size=len(ids) * d)
        shift, grow = rows_of(data.draw(steps), d), np.abs(rows_of(data.draw(steps), d))
        old = self.ref.get(ids).astype(np.float64)
        new = np.concatenate([old[:, :d] + shift, old[:, d:] + shift + grow], axis=1).astype(np.float32)
        self.change(self.real, ids, new)
        self.change(self.ref, ids, new)

    @rule(data=st.data())
    def query_aabb(self, data):
        q = data.draw(boxes(self.dims, data.draw(st.integers(0, 4))))
        options = self.query_options(data)
        assert_same_csr(self.real.query_aabb(q, **options), self.ref.query_aabb(q, **options), "query_aabb")

    @rule(data=st.data())
    def query_sphere(self, data):
        n = data.draw(st.integers(0, 4))
        centers = data.draw(boxes(self.dims, n))[:, :self.dims]
        radii = np.array(data.draw(st.lists(extent, min_size=n, max_size=n)), np.float32)
        options = self.query_options(data)
        assert_same_csr(self.real.query_sphere(centers, radii, **options),
                        self.ref.query_sphere(centers, radii, **options), "query_sphere")

    @rule(data=st.data(), first_hit=st.booleans())
    def raycast(self, data, first_hit):
        q = data.draw(segments(self.dims, data.draw(st.integers(0, 4))))
        options = self.query_options(data)
        assert_same_csr(self.real.raycast(q, first_hit=first_hit, **options),
                        self.ref.raycast(q, first_hit=first_hit, **options), f"raycast first_hit={first_hit}")

    @rule(data=st.data())
    def query_frustum(self, data):
        q = data.draw(planes(self.dims, data.draw(st.integers(1, 3))))
        options = self.query_options(data)
        assert_same_csr(self.real.query_frustum(q, **options), self.ref.query_frustum(q, **options), "query_frustum")

    @rule()
    def rebuild(self):
        self.real.rebuild()
        self.ref.rebuild()

    @rule()
    def round_trip(self):
        self.real = type(self.real).from_bytes(self.real.to_bytes())
        self.ref = type(self.ref).from_bytes(self.ref.to_bytes())

    def bad_calls(self, data):
        """(name, call on a structure) pairs of input every implementation must reject."""
        d, fresh = self.dims, self.fresh_ids(data, 3)
        good = data.draw(boxes(d, len(fresh)))
        unknown = self.absent_id(fresh.tolist())
        nan_boxes = np.concatenate([good, np.full((1, 2 * d), np.nan, np.float32)])
        inverted = np.concatenate([good, np.array([[1.0] * d + [0.0] * d], np.float32)])
        ids = np.append(fresh, np.uint64(unknown))  # valid rows first: a rejected call must not half-apply
        calls = {
            "nan box": lambda s: self.add(s, ids, nan_boxes),
            "inverted box": lambda s: self.add(s, ids, inverted),
            "duplicate in call": lambda s: self.add(s, np.append(ids, ids[-1]), np.zeros((len(ids) + 1, 2 * d))),
            "wrong length": lambda s: self.add(s, ids, np.zeros((len(ids) + 1, 2 * d))),
            "wrong width": lambda s: self.add(s, ids, np.zeros((len(ids), 2 * d + 1))),
            "negative id": lambda s: self.add(s, np.array([3, -1]), np.zeros((2, 2 * d))),
            "unknown on move": lambda s: self.change(s, np.array([unknown]), np.zeros((1, 2 * d))),
            "unknown on remove": lambda s: self.drop(s, np.array([unknown])),
            "negative radius": lambda s: s.query_sphere(np.zeros((2, d)), np.array([1.0, -1.0])),
            "no planes": lambda s: s.query_frustum(np.zeros((1, 0, d + 1))),
            "33 planes": lambda s: s.query_frustum(np.zeros((1, 33, d + 1))),
            "segment width": lambda s: s.raycast(np.zeros((1, 2 * d + 2))),
            "query box NaN": lambda s: s.query_aabb(np.full((1, 2 * d), np.nan)),
        }
        if self.present:
            old = self.some_present_ids(data)
            calls["id already present"] = lambda s: self.add(s, np.concatenate([fresh, old]),
                                                             np.zeros((len(fresh) + len(old), 2 * d)))
            calls["repeat on move"] = lambda s: self.change(s, np.concatenate([old, old[:1]]),
                                                            np.zeros((len(old) + 1, 2 * d)))
            calls["inverted on move"] = lambda s: self.change(s, old, np.tile(inverted[-1], (len(old), 1)))
            calls["repeat on remove"] = lambda s: self.drop(s, np.concatenate([old, old[-1:]]))
        return calls

    @rule(data=st.data())
    def bad_input(self, data):
        calls = self.bad_calls(data)
        call = calls[data.draw(st.sampled_from(sorted(calls)))]
        before = self.real.to_bytes(), self.ref.to_bytes()
        got, expected = raised(lambda: call(self.real)), raised(lambda: call(self.ref))
        assert type(got) is type(expected) and str(got) == str(expected), (got, expected)
        assert (self.real.to_bytes(), self.ref.to_bytes()) == before

    @invariant()
    def agree(self):
        self.real.validate()
        self.ref.validate()
        assert len(self.real) == len(self.ref) == len(self.present)
        assert (self.real.dims, self.real.margin) == (self.ref.dims, self.ref.margin)
        ids = np.array(sorted(self.present), np.uint64)
        assert np.array_equal(self.real.get(ids), self.ref.get(ids))
        assert all(i in self.real for i in ids[:5])
        assert_same_pairs(self.real.pairs(), self.ref.pairs())
        query_boxes, centers, probe_segments, probe_planes = self.probes
        radii = np.array([0.0, 1.0, 4.5], np.float32)
        for name, args in (("query_aabb", (query_boxes,)), ("query_sphere", (centers, radii)),
                           ("raycast", (probe_segments,)), ("query_frustum", (probe_planes,))):
            assert_same_csr(getattr(self.real, name)(*args), getattr(self.ref, name)(*args), f"probe {name}")


class TreeMachine(TwinMachine):
    @initialize(dims=st.sampled_from([2, 3]), margin=st.sampled_from([0.0, 0.1, 2.0]), data=st.data())
    def create_trees(self, dims, margin, data):
        self.start(dbvt.Tree(dims, margin), reference.Tree(dims, margin), dims, data)

    def add(self, tree, ids, boxes):
        tree.insert(ids, boxes)

    def change(self, tree, ids, boxes):
        return tree.update(ids, boxes)

    def drop(self, tree, ids):
        tree.remove(ids)

    @rule(data=st.data())
    def insert(self, data):
        ids = self.fresh_ids(data)
        new = data.draw(boxes(self.dims, len(ids)))
        self.real.insert(ids, new)
        self.ref.insert(ids, new)
        self.present.update(ids.tolist())

    @rule(data=st.data())
    def insert_cluster(self, data):
        ids, new = self.cluster(data)
        self.real.insert(ids, new)
        self.ref.insert(ids, new)
        self.present.update(ids.tolist())

    @precondition(lambda self: self.present)
    @rule(data=st.data())
    def update(self, data):
        ids = self.some_present_ids(data)
        new = data.draw(boxes(self.dims, len(ids)))
        reinserted = self.real.update(ids, new)
        self.ref.update(ids, new)
        assert 0 <= reinserted <= len(ids)

    @precondition(lambda self: self.present)
    @rule(data=st.data())
    def remove(self, data):
        ids = self.some_present_ids(data)
        self.real.remove(ids)
        self.ref.remove(ids)
        self.present.difference_update(ids.tolist())


class BroadphaseMachine(TwinMachine):
    @initialize(dims=st.sampled_from([2, 3]), margin=st.sampled_from([0.0, 0.05, 2.0]),
                track_pairs=st.sampled_from([True, True, False]), data=st.data())
    def create_broadphases(self, dims, margin, track_pairs, data):
        self.start(dbvt.Broadphase(dims, margin, track_pairs), reference.Broadphase(dims, margin, track_pairs),
                   dims, data)

    @invariant()
    def same_tracking(self):
        assert self.real.track_pairs == self.ref.track_pairs

    def add(self, bp, ids, boxes):
        bp.create(ids, boxes)

    def change(self, bp, ids, boxes):
        return bp.move(ids, boxes)

    def drop(self, bp, ids):
        bp.destroy(ids)

    def query_options(self, data):
        return data.draw(st.one_of(st.just({}), st.fixed_dictionaries({"mask": st.sampled_from([0, 1, 2, 3, 6])})))

    def filters(self, data, n):
        """static/group/mask: scalars or per-row arrays with few distinct bits, so filters matter."""
        bits = st.sampled_from([0, 1, 2, 3, 0xFFFFFFFF])
        per_row = data.draw(st.booleans())
        if per_row:
            return (np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool),
                    np.array(data.draw(st.lists(bits, min_size=n, max_size=n)), np.uint32),
                    np.array(data.draw(st.lists(bits, min_size=n, max_size=n)), np.uint32))
        return data.draw(st.booleans()), data.draw(bits), data.draw(bits)

    def create_both(self, ids, new, data):
        static, group, mask = self.filters(data, len(ids))
        self.real.create(ids, new, static=static, group=group, mask=mask)
        self.ref.create(ids, new, static=static, group=group, mask=mask)
        self.present.update(ids.tolist())

    @rule(data=st.data())
    def create(self, data):
        ids = self.fresh_ids(data)
        self.create_both(ids, data.draw(boxes(self.dims, len(ids))), data)

    @rule(data=st.data())
    def create_cluster(self, data):
        self.create_both(*self.cluster(data), data)

    @precondition(lambda self: self.present)
    @rule(data=st.data())
    def move(self, data):
        ids = self.some_present_ids(data)
        new = data.draw(boxes(self.dims, len(ids)))
        reinserted = self.real.move(ids, new)
        self.ref.move(ids, new)
        assert 0 <= reinserted <= len(ids)

    @precondition(lambda self: self.present)
    @rule(data=st.data())
    def destroy(self, data):
        ids = self.some_present_ids(data)
        self.real.destroy(ids)
        self.ref.destroy(ids)
        self.present.difference_update(ids.tolist())

    @rule()
    def update(self):
        begun, ended = self.real.update()
        expected_begun, expected_ended = self.ref.update()
        assert_same_pairs(begun, expected_begun, "begun")
        assert_same_pairs(ended, expected_ended, "ended")

    def bad_calls(self, data):
        calls = super().bad_calls(data)
        ids = np.array([self.absent_id(), self.absent_id() + 10**6], np.uint64)
        new = np.zeros((len(ids), 2 * self.dims), np.float32)
        calls["group too big"] = lambda bp: bp.create(ids, new, group=2**32)
        calls["mask negative"] = lambda bp: bp.create(ids, new, mask=np.full(len(ids), -1))
        calls["static length"] = lambda bp: bp.create(ids, new, static=np.zeros(len(ids) + 1, bool))
        calls["query mask too big"] = lambda bp: bp.query_aabb(new, mask=2**32)
        return calls


TestTreeMachine = TreeMachine.TestCase
TestTreeMachine.settings = MACHINE_SETTINGS
TestBroadphaseMachine = BroadphaseMachine.TestCase
TestBroadphaseMachine.settings = MACHINE_SETTINGS
