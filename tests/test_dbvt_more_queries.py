"""query_nearest, cast_box, cast_sphere and dbvt.overlap: the core against dbvt.reference, and the
reference against oracles too plain to be wrong.

Coordinates are mostly small integers and halves, so ties, boxes touching at one face, points on faces,
casts that start inside, touch exactly at t = 1 or graze a face at exactly their radius are common:
where an inexact walk or recipe would first disagree. The core and the reference share one float64
recipe per query, so their answers must be equal bit for bit. The reference is then checked against
oracles that share nothing with it: Python loops for the nearest, exact rational arithmetic for box
casts, and for ball casts a 50-digit decimal solution over every face, edge and corner of the rounded
box, compared with a tolerance where float64 rounding decides (see test_reference_ball_casts...).
"""
from __future__ import annotations

import itertools
import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dbvt
from dbvt import reference
from worlds import W1World, assert_same_csr, assert_same_pairs

grid = st.integers(-5, 5).map(float)
halves = st.integers(-10, 10).map(lambda x: x / 2)
coordinate = st.one_of(grid, grid, halves, st.floats(-40, 40, width=32))
extent = st.one_of(st.just(0.0), st.integers(0, 3).map(float), st.just(0.5), st.floats(0, 6, width=32))
step = st.one_of(st.just(0.0), st.integers(-12, 12).map(float), halves, st.floats(-30, 30, width=32))
radius = st.one_of(st.just(0.0), st.sampled_from([0.5, 1.0, 2.0, 5.0]), st.floats(0, 4, width=32))
FAST = settings(max_examples=120, deadline=None)


def rows(values, width):
    return np.array(values, np.float64).reshape(-1, width)


@st.composite
def boxes(draw, dims, n):
    lows = rows(draw(st.lists(coordinate, min_size=n * dims, max_size=n * dims)), dims)
    sizes = rows(draw(st.lists(extent, min_size=n * dims, max_size=n * dims)), dims)
    return np.concatenate([lows, lows + sizes], axis=1).astype(np.float32)


@st.composite
def displacements(draw, dims, n):
    """Free, zero-length, or along one axis (sliding along faces)."""
    moves = rows(draw(st.lists(step, min_size=n * dims, max_size=n * dims)), dims)
    for row in range(n):
        shape = draw(st.sampled_from(["free", "free", "zero", "axis"]))
        if shape == "zero":
            moves[row] = 0.0
        elif shape == "axis":
            keep = draw(st.integers(0, dims - 1))
            moves[row, np.arange(dims) != keep] = 0.0
    return moves.astype(np.float32)


@st.composite
def twins(draw, dims):
    """A core structure and its reference twin with the same proxies; now and then some moved since
    they were inserted, so fat boxes and reinsertions are part of the story."""
    kind = draw(st.sampled_from(["Tree", "Broadphase"]))
    margin = draw(st.sampled_from([0.0, 0.05, 1.5]))
    n = draw(st.integers(0, 24))
    ids = np.array(draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n, unique=True)), np.uint64)
    new = draw(boxes(dims, n))
    real, twin = getattr(dbvt, kind)(dims, margin), getattr(reference, kind)(dims, margin)
    if kind == "Tree":
        one_at_a_time = draw(st.booleans())
        for structure in (real, twin):
            if one_at_a_time:
                for i in range(n):
                    structure.insert(ids[i:i + 1], new[i:i + 1])
            else:
                structure.insert(ids, new)
    else:
        groups = np.array(draw(st.lists(st.sampled_from([0, 1, 2, 3, 4]), min_size=n, max_size=n)), np.uint32)
        for structure in (real, twin):
            structure.create(ids, new, group=groups)
    if n and draw(st.booleans()):
        moved = ids[: n // 2 + 1]
        again = draw(boxes(dims, len(moved)))
        for structure in (real, twin):
            (structure.update if kind == "Tree" else structure.move)(moved, again)
    return real, twin


def options(structure, data):
    if isinstance(structure, (dbvt.Tree, reference.Tree)):
        return {}
    return data.draw(st.sampled_from([{}, {"mask": 1}, {"mask": 6}, {"mask": 0}]))


def same_answers(real, twin, call, what):
    """The core equals the reference, before and after a rebuild: answers do not depend on the tree."""
    expected = call(twin)
    assert_same_csr(call(real), expected, what)
    real.rebuild()
    assert_same_csr(call(real), expected, what + " after rebuild()")


@FAST
@given(st.data(), st.sampled_from([2, 3]))
def test_nearest_equals_the_reference(data, dims):
    real, twin = data.draw(twins(dims))
    q = data.draw(st.integers(0, 5))
    points = data.draw(boxes(dims, q))[:, :dims]
    k = data.draw(st.sampled_from([0, 1, 2, 3, 8, 100]))
    max_distance = data.draw(st.sampled_from([math.inf, math.inf, 0.0, 1.0, 2.5, 7.0]))
    extra = options(real, data)
    same_answers(real, twin, lambda s: s.query_nearest(points, k, max_distance, **extra), "query_nearest")


@FAST
@given(st.data(), st.sampled_from([2, 3]), st.booleans())
def test_box_casts_equal_the_reference(data, dims, first_hit):
    real, twin = data.draw(twins(dims))
    q = data.draw(st.integers(0, 5))
    moving, moves = data.draw(boxes(dims, q)), data.draw(displacements(dims, q))
    extra = options(real, data)
    same_answers(real, twin, lambda s: s.cast_box(moving, moves, first_hit=first_hit, **extra), "cast_box")


@FAST
@given(st.data(), st.sampled_from([2, 3]), st.booleans())
def test_ball_casts_equal_the_reference(data, dims, first_hit):
    real, twin = data.draw(twins(dims))
    q = data.draw(st.integers(0, 5))
    centers, moves = data.draw(boxes(dims, q))[:, :dims], data.draw(displacements(dims, q))
    radii = np.array(data.draw(st.lists(radius, min_size=q, max_size=q)), np.float32)
    extra = options(real, data)
    same_answers(real, twin, lambda s: s.cast_sphere(centers, radii, moves, first_hit=first_hit, **extra),
                 "cast_sphere")


@FAST
@given(st.data(), st.sampled_from([2, 3]))
def test_overlap_equals_the_reference(data, dims):
    a, a_twin = data.draw(twins(dims))
    b, b_twin = data.draw(twins(dims))
    masks = {}
    for name, structure in (("mask_a", a), ("mask_b", b)):
        if isinstance(structure, dbvt.Broadphase):
            masks[name] = data.draw(st.sampled_from([None, 1, 6]))
    expected = reference.overlap(a_twin, b_twin, **masks)
    assert_same_pairs(dbvt.overlap(a, b, **masks), expected, "overlap")
    a.rebuild()
    assert_same_pairs(dbvt.overlap(a, b, **masks), expected, "overlap after rebuild()")
    assert_same_pairs(dbvt.overlap(a, a), reference.overlap(a_twin, a_twin), "overlap with itself")


def test_w1_worlds_equal_the_reference_after_moves():
    """Thousands of proxies, deep trees, fat boxes left behind by moves: the walks' pruning at scale."""
    for dims in (2, 3):
        world = W1World(1500, dims=dims, seed=dims)
        real, twin = dbvt.Broadphase(dims), reference.Broadphase(dims)
        groups = (world.ids % 3 + 1).astype(np.uint32)
        for structure in (real, twin):
            structure.create(world.ids, world.boxes, group=groups)
        for _ in range(3):
            moved = world.step()
            real.move(*moved)
            twin.move(*moved)
        centers, _ = world.spheres(60)
        rng = np.random.default_rng(dims)
        moves = rng.normal(size=(60, dims)).astype(np.float32) * 8
        moves[::7] = 0.0
        for mask in (None, 2):
            extra = {} if mask is None else {"mask": mask}
            for k in (1, 8, 40):
                assert_same_csr(real.query_nearest(centers, k, **extra), twin.query_nearest(centers, k, **extra))
            assert_same_csr(real.query_nearest(centers, 8, 6.0, **extra), twin.query_nearest(centers, 8, 6.0, **extra))
            moving = world.query_boxes(60, half=1.5)
            for first_hit in (False, True):
                assert_same_csr(real.cast_box(moving, moves, first_hit, **extra),
                                twin.cast_box(moving, moves, first_hit, **extra))
                assert_same_csr(real.cast_sphere(centers, 2.0, moves, first_hit, **extra),
                                twin.cast_sphere(centers, 2.0, moves, first_hit, **extra))
        other = W1World(1500, dims=dims, seed=10 + dims)
        tree, tree_twin = dbvt.Tree(dims), reference.Tree(dims)
        tree.insert(other.ids, other.boxes)
        tree_twin.insert(other.ids, other.boxes)
        assert_same_pairs(dbvt.overlap(real, tree, mask_a=2), reference.overlap(twin, tree_twin, mask_a=2))
        assert_same_pairs(dbvt.overlap(tree, real), reference.overlap(tree_twin, twin))


@pytest.mark.parametrize("dims", [2, 3])
def test_nearest_breaks_wide_ties_by_id(dims):
    """Dozens of boxes exactly as far from the point, spread over the whole tree, and k smaller than
    that crowd: the walk must still open every subtree exactly as far as its k-th best, since one may
    hold a smaller id."""
    rng = np.random.default_rng(dims)
    n = 400
    axis = rng.integers(0, dims, n)
    sign = rng.choice([-1.0, 1.0], n)
    low = rng.integers(-6, 2, size=(n, dims)).astype(np.float32)
    high = low + rng.integers(5, 9, size=(n, dims))
    near = np.where(sign > 0, 5.0, -6.0)
    low[np.arange(n), axis], high[np.arange(n), axis] = near, near + 1      # every box 5 from the origin
    far = n // 4
    low[:far, 0] += 40
    high[:far, 0] += 40
    ids = rng.permutation(10**6)[:n].astype(np.uint64)
    boxes = np.concatenate([low, high], axis=1)
    real, twin = dbvt.Tree(dims), reference.Tree(dims)
    for structure in (real, twin):
        structure.insert(ids, boxes)
    points = np.zeros((2, dims), np.float32)
    points[1, 0] = 40
    for k in (1, 3, 7, 50):
        got = real.query_nearest(points, k)
        assert_same_csr(got, twin.query_nearest(points, k), f"k={k}")
        assert got[2][0] == 5.0 and got[1][:k].tolist() == sorted(got[1][:k].tolist())


@pytest.mark.parametrize("dims", [2, 3])
def test_first_hit_breaks_wide_ties_by_id(dims):
    """Hundreds of boxes whose faces a box and a ball moving along x reach at the same t, all over the
    tree: first_hit must keep looking in subtrees entered exactly then, for a smaller id."""
    rng = np.random.default_rng(10 + dims)
    n = 400
    low = rng.uniform(-30, 0, size=(n, dims))
    high = rng.uniform(0, 30, size=(n, dims))
    low[:, 0], high[:, 0] = 5, 5 + rng.integers(1, 4, n)            # faces at x = 5, across the x axis
    low[n // 2:, 0] += rng.integers(1, 20, n - n // 2)                # half of them farther along
    high[n // 2:, 0] = low[n // 2:, 0] + 1
    ids = rng.permutation(10**6)[:n].astype(np.uint64)
    real, twin = dbvt.Tree(dims), reference.Tree(dims)
    for structure in (real, twin):
        structure.insert(ids, np.concatenate([low, high], axis=1).astype(np.float32))
    start, move = np.zeros((1, dims), np.float32), np.zeros((1, dims), np.float32)
    move[0, 0] = 8
    front = np.flatnonzero(low[:, 0] == 5)
    for first_hit in (False, True):
        got = real.cast_box(np.concatenate([start - 1, start], axis=1), move, first_hit=first_hit)
        assert_same_csr(got, twin.cast_box(np.concatenate([start - 1, start], axis=1), move, first_hit=first_hit))
        assert got[1][0] == ids[front].min() and got[2][0] == 0.625
        got = real.cast_sphere(start, 1.0, move, first_hit=first_hit)
        assert_same_csr(got, twin.cast_sphere(start, 1.0, move, first_hit=first_hit))
        assert got[1][0] == ids[front].min() and got[2][0] == 0.5


# ---------------------------------------------------------------------------------------------
# The semantics, case by case, in both implementations.

IMPLEMENTATIONS = pytest.mark.parametrize("impl", [dbvt, reference], ids=["core", "reference"])


def tree_of(impl, dims, boxes_by_id):
    tree = impl.Tree(dims)
    tree.insert(list(boxes_by_id), list(boxes_by_id.values()))
    return tree


def rows_of(offsets, *arrays):
    return [[tuple(a[offsets[q]:offsets[q + 1]].tolist()) for a in arrays] for q in range(len(offsets) - 1)]


@IMPLEMENTATIONS
def test_nearest_orders_by_distance_then_id_and_is_closed(impl):
    tree = tree_of(impl, 2, {5: [0, 0, 2, 2], 3: [1, 1, 3, 3], 9: [6, 0, 7, 1], 4: [0, 4, 1, 5]})
    offsets, hits, distances = tree.query_nearest([[1.5, 1.5], [4, 0.5], [10, 10]], 10)
    assert distances.dtype == np.float32
    (ids0, d0), (ids1, d1), (ids2, d2) = rows_of(offsets, hits, distances)
    assert ids0 == (3, 5, 4, 9) and d0[:2] == (0.0, 0.0)            # inside two boxes: both at 0, by id
    assert ids1 == (3, 5, 9, 4) and d1[1:3] == (2.0, 2.0)           # 5 and 9 both 2 away: by id
    assert ids2 == (9, 3, 4, 5)                                      # k larger than the world: all four
    offsets, hits, distances = tree.query_nearest([[4, 0.5]], 3, max_distance=2.0)
    assert hits.tolist() == [3, 5, 9]                                # exactly max_distance away: closed
    assert tree.query_nearest([[4, 0.5]], 0)[1].size == 0
    assert impl.Tree(3).query_nearest([[0, 0, 0]], 4)[0].tolist() == [0, 0]


@IMPLEMENTATIONS
def test_box_casts_touch_at_start_at_the_end_and_not_after(impl):
    tree = tree_of(impl, 2, {1: [0, 0, 1, 1], 2: [5, 0, 6, 1], 3: [10, 0, 11, 1], 4: [2, 0, 3, 1]})
    # A unit box from x = -2 moved by 8 touches 1, 4 and 2, and stops short of 3; moved by 11 it
    # reaches 3's face at exactly t = 1, which counts.
    offsets, hits, fractions = tree.cast_box([[-2, 0, -1, 1]] * 3, [[8, 0], [11, 0], [0, 0]])
    assert rows_of(offsets, hits, fractions) == [
        [(1, 4, 2), (0.125, 0.375, 0.75)],
        [(1, 4, 2, 3), (1 / 11, 3 / 11, 6 / 11, 1.0)],
        [(), ()]]
    # Starting inside a box, or touching faces at the start, is t = 0; a zero-length cast is a box query.
    offsets, hits, fractions = tree.cast_box([[0.5, 0.5, 0.7, 0.7], [1, 0.2, 2, 0.4]], [[10, 0], [0, 0]])
    (first_ids, first_t), second = rows_of(offsets, hits, fractions)
    assert first_ids == (1, 4, 2, 3) and first_t[0] == 0.0 and second == [(1, 4), (0.0, 0.0)]
    query = np.array([[1, 0.2, 2, 0.4]], np.float32)
    assert tree.cast_box(query, [[0, 0]])[1].tolist() == tree.query_aabb(query)[1].tolist()
    # first_hit keeps the smallest t, and of equal ones the smallest id.
    stacked = tree_of(impl, 2, {8: [4, 0, 5, 1], 7: [4, 0, 5, 2]})
    offsets, hits, fractions = stacked.cast_box([[0, 0, 1, 1]], [[10, 0]], first_hit=True)
    assert hits.tolist() == [7] and fractions.tolist() == [0.3]


@IMPLEMENTATIONS
def test_ball_casts_touch_faces_edges_and_corners_exactly(impl):
    tree = tree_of(impl, 2, {1: [0, 0, 1, 1]})
    # Sliding past the bottom face at exactly the radius touches from x = 0 (t = 0.5): closed. A hair
    # farther, never; from inside, at 0.
    offsets, hits, fractions = tree.cast_sphere([[-5, -1], [-5, -1.0001], [0.5, 0.5]], [1.0, 1.0, 0.25],
                                                [[10, 0], [10, 0], [0, 0]])
    assert rows_of(offsets, hits, fractions) == [[(1,), (0.5,)], [(), ()], [(1,), (0.0,)]]
    # Head on into a corner: the centre reaches distance 1 from (0, 0) along the diagonal.
    offsets, hits, fractions = tree.cast_sphere([[-3, -3]], [1.0], [[3, 3]])
    assert hits.tolist() == [1] and abs(fractions[0] - (1 - 1 / (3 * math.sqrt(2)))) < 1e-12
    # 3-D: a ball of radius 5 passing the edge x of a box at exactly 5 (3-4-5) first touches the
    # corner's sphere where the edge begins, at t = 0.5.
    cube = tree_of(impl, 3, {2: [0, 0, 0, 10, 10, 10]})
    offsets, hits, fractions = cube.cast_sphere([[-20, -3, -4]], [5.0], [[40, 0, 0]])
    assert hits.tolist() == [2] and fractions.tolist() == [0.5]
    # A zero-length ball cast is a sphere query.
    centers = np.array([[0.5, -1], [2, 2], [1.6, 1.8]], np.float32)
    radii = np.array([1, 1.4142135, 1], np.float32)
    assert (tree.cast_sphere(centers, radii, np.zeros((3, 2)))[1].tolist()
            == tree.query_sphere(centers, radii)[1].tolist())


# ---------------------------------------------------------------------------------------------
# The reference against oracles that share nothing with it.

def python_nearest(boxes, ids, point, k, max_distance, dims):
    found = []
    for box, id_ in zip(boxes.tolist(), ids.tolist()):
        gap2 = 0.0
        for i in range(dims):
            p, lo, hi = float(point[i]), box[i], box[dims + i]
            gap = lo - p if p < lo else p - hi if p > hi else 0.0
            gap2 = gap2 + gap * gap
        if gap2 <= max_distance * max_distance:
            found.append((gap2, id_))
    found.sort()
    return found[:k]


def exact_box_cast(moving, move, box, dims):
    """The first t in [0, 1] at which the moving box touches `box`, in rationals; None if never."""
    near, far = Fraction(-10**9), Fraction(10**9)
    for i in range(dims):
        lo = Fraction(float(box[i])) - Fraction(float(moving[dims + i]))
        hi = Fraction(float(box[dims + i])) - Fraction(float(moving[i]))
        d = Fraction(float(move[i]))
        if d == 0:
            if lo > 0 or hi < 0:
                return None
            continue
        t1, t2 = sorted((lo / d, hi / d))
        near, far = max(near, t1), min(far, t2)
    if near <= far and far >= 0 and near <= 1:
        return max(near, Fraction(0))
    return None


def decimal_ball_cast(center, radius, move, box, dims):
    """The first t in [0, 1] at which the ball touches `box`, to 50 digits; None if never.

    The ball touches where its centre is at distance r from the box: on one of the rounded box's
    features, picked by which axes the centre is beyond the box on (and on which side). For each, the
    times the centre is at distance r from that face, edge or corner solve a quadratic; a root counts
    when the centre then really lies in that feature's region. The first touch is the least of them."""
    with localcontext() as context:
        context.prec = 50
        c = [Decimal(float(x)) for x in center[:dims]]
        v = [Decimal(float(x)) for x in move[:dims]]
        lo = [Decimal(float(x)) for x in box[:dims]]
        hi = [Decimal(float(x)) for x in box[dims:]]
        r2 = Decimal(float(radius)) ** 2
        slack = Decimal("1e-40")

        def gap2(t):
            total = Decimal(0)
            for i in range(dims):
                p = c[i] + t * v[i]
                total += max(lo[i] - p, Decimal(0), p - hi[i]) ** 2
            return total

        if gap2(Decimal(0)) <= r2:
            return Decimal(0)
        first = None
        for sides in itertools.product((None, 0, 1), repeat=dims):
            beyond = [i for i in range(dims) if sides[i] is not None]
            if not beyond:
                continue
            bound = {i: lo[i] if sides[i] == 0 else hi[i] for i in beyond}
            qa = sum(v[i] * v[i] for i in beyond)
            if qa == 0:
                continue            # not moving across this feature: its touches start on another one
            qb = 2 * sum((c[i] - bound[i]) * v[i] for i in beyond)
            qc = sum((c[i] - bound[i]) ** 2 for i in beyond) - r2
            disc = qb * qb - 4 * qa * qc
            if disc < 0:
                continue
            for t in ((-qb - disc.sqrt()) / (2 * qa), (-qb + disc.sqrt()) / (2 * qa)):
                if not -slack <= t <= 1 + slack:
                    continue
                p = [c[i] + t * v[i] for i in range(dims)]
                inside = all(lo[j] - slack <= p[j] <= hi[j] + slack for j in range(dims) if sides[j] is None)
                beyond_ok = all(p[i] <= lo[i] + slack if sides[i] == 0 else p[i] >= hi[i] - slack for i in beyond)
                if inside and beyond_ok:
                    t = min(max(t, Decimal(0)), Decimal(1))
                    first = t if first is None else min(first, t)
        return first


def on_sixteenths(values):
    """Rounded to multiples of 2^-16, where the rationals' oracle and float64 agree: such floats
    within +-64 subtract exactly, and two quotients of their differences that differ do so by far
    more than a rounding. A drawn float32 as small as 1e-28 did not: 1 - 1e-28 rounds to 1, and a
    box that grazes another at a corner an instant too early touched it in float64."""
    return (np.round(np.asarray(values, np.float64) * 65536) / 65536).astype(np.float32)


def by_query(result):
    offsets, hits, values = result
    return [dict(zip(hits[offsets[q]:offsets[q + 1]].tolist(), values[offsets[q]:offsets[q + 1]].tolist()))
            for q in range(len(offsets) - 1)]


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from([2, 3]))
def test_reference_nearest_and_box_casts_match_plain_python_and_rationals(data, dims):
    n = data.draw(st.integers(0, 10))
    world = on_sixteenths(data.draw(boxes(dims, n)))
    ids = np.array(data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n, unique=True)), np.uint64)
    tree = reference.Tree(dims)
    tree.insert(ids, world)
    q = data.draw(st.integers(1, 4))
    points = data.draw(boxes(dims, q))[:, :dims]
    k, max_distance = data.draw(st.integers(0, 12)), data.draw(st.sampled_from([math.inf, 0.0, 1.0, 3.5]))
    offsets, hits, distances = tree.query_nearest(points, k, max_distance)
    for row, point in enumerate(points):
        expected = python_nearest(world, ids, point, k, max_distance, dims)
        part = slice(offsets[row], offsets[row + 1])
        assert hits[part].tolist() == [id_ for _, id_ in expected]
        assert distances[part].tolist() == [float(np.float32(math.sqrt(g))) for g, _ in expected]

    moving, moves = on_sixteenths(data.draw(boxes(dims, q))), on_sixteenths(data.draw(displacements(dims, q)))
    got = by_query(tree.cast_box(moving, moves))
    for row in range(q):
        expected = {int(i): exact_box_cast(moving[row], moves[row], box, dims) for i, box in zip(ids, world)}
        # Coordinates on sixteenths (see on_sixteenths) subtract exactly in float64, and a quotient
        # rounds correctly: exact.
        assert got[row] == {i: float(t) for i, t in expected.items() if t is not None}


@settings(max_examples=100, deadline=None)
@given(st.data(), st.sampled_from([2, 3]))
def test_reference_ball_casts_match_the_rounded_box_solved_feature_by_feature(data, dims):
    """Hit sets equal except where the ball grazes the box within 1e-9 of its radius (where rounding
    must decide, and does for the core and the reference alike); first touches within 1e-7."""
    n = data.draw(st.integers(0, 6))
    world = data.draw(boxes(dims, n))
    ids = np.arange(n, dtype=np.uint64)
    tree = reference.Tree(dims)
    tree.insert(ids, world)
    q = data.draw(st.integers(1, 3))
    centers, moves = data.draw(boxes(dims, q))[:, :dims], data.draw(displacements(dims, q))
    radii = np.array(data.draw(st.lists(radius, min_size=q, max_size=q)), np.float32)
    got = by_query(tree.cast_sphere(centers, radii, moves))
    for row in range(q):
        scale = 1e-9 * (1 + float(np.abs(centers[row]).max()) + float(np.abs(moves[row]).max()) + float(radii[row]))
        for id_, box in zip(ids.tolist(), world):
            exact = decimal_ball_cast(centers[row], radii[row], moves[row], box, dims)
            if (exact is None) != (id_ not in got[row]):
                wider = decimal_ball_cast(centers[row], float(radii[row]) + scale, moves[row], box, dims)
                narrower = decimal_ball_cast(centers[row], max(float(radii[row]) - scale, 0.0), moves[row], box, dims)
                # A radius within the tolerance of 0 cannot be narrowed: a graze is all the wider ball shows.
                assert wider is not None and (narrower is None or float(radii[row]) <= scale), (
                    row, id_, exact, got[row].get(id_))
            elif exact is not None:
                assert abs(got[row][id_] - float(exact)) <= 1e-7, (row, id_, float(exact), got[row][id_])


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from([2, 3]))
def test_reference_overlap_matches_a_loop_over_all_pairs(data, dims):
    n, m = data.draw(st.integers(0, 10)), data.draw(st.integers(0, 10))
    first, second = data.draw(boxes(dims, n)), data.draw(boxes(dims, m))
    groups = np.array(data.draw(st.lists(st.integers(0, 3), min_size=m, max_size=m)), np.uint32)
    a, b = reference.Tree(dims), reference.Broadphase(dims)
    a.insert(np.arange(n, dtype=np.uint64) * 7, first)
    b.create(np.arange(m, dtype=np.uint64) * 3, second, group=groups)
    mask = data.draw(st.sampled_from([None, 1, 2]))
    expected = sorted((7 * i, 3 * j) for i in range(n) for j in range(m)
                      if all(first[i, k] <= second[j, dims + k] and second[j, k] <= first[i, dims + k] for k in range(dims))
                      and (mask is None or groups[j] & mask))
    assert reference.overlap(a, b, mask_b=mask).tolist() == [list(p) for p in expected]


# ---------------------------------------------------------------------------------------------
# Bad input, limits.

def bad_calls(d):
    """(name, call, error, pattern): every rule of the new calls, for a populated structure."""
    pts = np.zeros((3, d), np.float32)
    nan_row = pts.copy()
    nan_row[1, 0] = np.nan
    box = np.tile(np.float32([0] * d + [1] * d), (2, 1))
    inverted = box.copy()
    inverted[1, 0] = 5
    return [
        ("points NaN", lambda s: s.query_nearest(nan_row, 2), ValueError, r"points row 1: NaN"),
        ("points width", lambda s: s.query_nearest(np.zeros((2, d + 1)), 2), ValueError, r"points must have shape"),
        ("k negative", lambda s: s.query_nearest(pts, -1), ValueError, r"k must be between 0"),
        ("k float", lambda s: s.query_nearest(pts, 2.5), ValueError, r"k must be an integer"),
        ("k bool", lambda s: s.query_nearest(pts, True), ValueError, r"k must be an integer"),
        ("max_distance NaN", lambda s: s.query_nearest(pts, 2, math.nan), ValueError, r"max_distance must be a number >= 0"),
        ("max_distance negative", lambda s: s.query_nearest(pts, 2, -1.0), ValueError, r"max_distance must be"),
        ("max_distance text", lambda s: s.query_nearest(pts, 2, "far"), ValueError, r"max_distance must be a number"),
        ("cast box NaN", lambda s: s.cast_box(np.where(np.arange(2 * d) == 0, np.nan, box), np.zeros((2, d))),
         ValueError, r"boxes row 0: NaN"),
        ("cast box min > max", lambda s: s.cast_box(inverted, np.zeros((2, d))), ValueError, r"boxes row 1: min > max"),
        ("displacements rows", lambda s: s.cast_box(box, np.zeros((3, d))), ValueError,
         r"displacements has 3 rows but boxes has 2"),
        ("displacements NaN", lambda s: s.cast_box(box, nan_row[:2]), ValueError, r"displacements row 1: NaN"),
        ("displacements infinite", lambda s: s.cast_sphere(pts, 1.0, np.where(nan_row == nan_row, 0, np.inf)),
         ValueError, r"displacements row 1: NaN or infinite"),
        ("displacements width", lambda s: s.cast_box(box, np.zeros((2, d + 1))), ValueError,
         r"displacements must have shape"),
        ("ball centre NaN", lambda s: s.cast_sphere(nan_row, 1.0, np.zeros((3, d))), ValueError, r"centers row 1: NaN"),
        ("ball radius negative", lambda s: s.cast_sphere(pts, [1, 2, -1], np.zeros((3, d))), ValueError,
         r"radii row 2: negative radius"),
        ("ball radius NaN", lambda s: s.cast_sphere(pts, [1, np.nan, 1], np.zeros((3, d))), ValueError, r"radii row 1: NaN"),
        ("ball displacement rows", lambda s: s.cast_sphere(pts, 1.0, np.zeros((2, d))), ValueError,
         r"displacements has 2 rows but centers has 3"),
    ]


def bad_cases():
    for dims in (2, 3):
        for kind in ("Tree", "Broadphase"):
            for name, call, error, pattern in bad_calls(dims):
                yield pytest.param(kind, dims, call, error, pattern, id=f"{kind}-{dims}d-{name}")
            if kind == "Broadphase":
                yield pytest.param(kind, dims, lambda s, d=dims: s.cast_sphere(np.zeros((1, d)), 1.0, np.zeros((1, d)), mask=-2),
                                   ValueError, r"mask must be a 32-bit", id=f"{kind}-{dims}d-mask")


@pytest.mark.parametrize("kind, dims, call, error, pattern", list(bad_cases()))
def test_bad_input_is_refused_alike_naming_the_row(kind, dims, call, error, pattern):
    answers = []
    for impl in (dbvt, reference):
        structure = getattr(impl, kind)(dims)
        (structure.insert if kind == "Tree" else structure.create)([1, 2], np.tile(np.float32([0] * dims + [1] * dims), (2, 1)))
        with pytest.raises(error, match=pattern) as caught:
            call(structure)
        answers.append(str(caught.value))
    assert answers[0] == answers[1]


@pytest.mark.parametrize("call, error, pattern", [
    (lambda m: m.overlap(m.Tree(2), m.Tree(3)), ValueError, r"same dims, got 2-D and 3-D"),
    (lambda m: m.overlap(m.Tree(3), m.Broadphase(3), mask_a=1), ValueError, r"mask_a needs a Broadphase"),
    (lambda m: m.overlap(m.Broadphase(3), m.Broadphase(3), mask_b=2**32), ValueError, r"mask must be a 32-bit"),
    (lambda m: m.overlap(m.Tree(3), [1, 2]), TypeError, r"b must be a dbvt.Tree or dbvt.Broadphase, not list"),
    (lambda m: m.overlap(m.Tree(3), m.Tree(3), max_pairs=-1), ValueError, r"max_pairs must be an integer >= 0"),
], ids=["dims", "mask on a Tree", "mask range", "not a structure", "max_pairs"])
def test_overlap_refuses_bad_arguments_alike(call, error, pattern):
    answers = []
    for impl in (dbvt, reference):
        with pytest.raises(error, match=pattern) as caught:
            call(impl)
        answers.append(str(caught.value))
    assert answers[0] == answers[1]
    with pytest.raises(TypeError):
        dbvt.overlap(dbvt.Tree(), reference.Tree())


def test_limits_stop_the_calls():
    pile = np.tile(np.float32([0, 0, 0, 1, 1, 1]), (10, 1))
    for impl in (dbvt, reference):
        a, b = impl.Tree(), impl.Tree()
        a.insert(np.arange(10), pile)
        b.insert(np.arange(10), pile)
        assert len(impl.overlap(a, b, max_pairs=100)) == 100
        with pytest.raises(dbvt.HitLimit, match="more than 99 pairs"):
            impl.overlap(a, b, max_pairs=99)
    tree = dbvt.Tree()
    tree.insert(np.arange(10), pile)
    tree.max_hits = 29
    points = np.zeros((3, 3), np.float32)
    assert len(tree.query_nearest(points[:2], 20)[1]) == 20
    for call in (lambda: tree.query_nearest(points, 20), lambda: tree.cast_box(pile[:3], points),
                 lambda: tree.cast_sphere(points, 1.0, points)):
        with pytest.raises(dbvt.HitLimit, match="more than 29"):
            call()
