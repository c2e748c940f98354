"""The oracle itself: `dbvt.reference`'s vectorised answers equal a plain per-pair Python loop.

The loops below restate the contract's arithmetic one box at a time (Python floats are float64, and
float32 inputs convert to them exactly), so the reference's chunking, sweeping, sorting and CSR
assembly are checked against something too simple to get wrong.
"""
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dbvt import reference

coordinate = st.one_of(st.integers(-3, 3).map(float), st.floats(-50, 50, width=32))


@st.composite
def worlds(draw, dims):
    n = draw(st.integers(0, 12))
    lows = draw(st.lists(st.lists(coordinate, min_size=dims, max_size=dims), min_size=n, max_size=n))
    sizes = draw(st.lists(st.lists(st.sampled_from([0.0, 1.0, 2.0, 0.5]), min_size=dims, max_size=dims),
                          min_size=n, max_size=n))
    boxes = np.array([lo + [a + b for a, b in zip(lo, size)] for lo, size in zip(lows, sizes)],
                     np.float32).reshape(n, 2 * dims)
    ids = np.array(draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n, unique=True)), np.uint64)
    return ids, boxes


def overlaps(a, b, dims):
    return all(a[i] <= b[dims + i] and b[i] <= a[dims + i] for i in range(dims))


def sphere_touches(box, center, radius, dims):
    dist2 = 0.0
    for i in range(dims):
        gap = min(max(float(center[i]), float(box[i])), float(box[dims + i])) - float(center[i])
        dist2 = dist2 + gap * gap
    return dist2 <= float(radius) * float(radius)


def segment_entry(box, segment, dims):
    near, far = -math.inf, math.inf
    for i in range(dims):
        o, lo, hi = float(segment[i]), float(box[i]), float(box[dims + i])
        d = float(segment[dims + i]) - o
        if d == 0:
            if not lo <= o <= hi:
                return None
            continue
        t1, t2 = (lo - o) * (1.0 / d), (hi - o) * (1.0 / d)
        near, far = max(near, min(t1, t2)), min(far, max(t1, t2))
    return max(near, 0.0) if near <= far and far >= 0 and near <= 1 else None


def frustum_contains(box, planes, dims):
    for plane in planes:
        vertex = [float(box[dims + i] if plane[i] >= 0 else box[i]) for i in range(dims)]
        s = float(plane[0]) * vertex[0]
        for i in range(1, dims):
            s = s + float(plane[i]) * vertex[i]
        if s + float(plane[dims]) < 0:
            return False
    return True


def csr_lists(offsets, hits):
    return [sorted(hits[offsets[q]:offsets[q + 1]].tolist()) for q in range(len(offsets) - 1)]


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from([2, 3]))
def test_reference_matches_per_pair_loops(data, dims):
    ids, boxes = data.draw(worlds(dims))
    tree = reference.Tree(dims)
    tree.insert(ids, boxes)
    _, queries = data.draw(worlds(dims))
    _, segment_ends = data.draw(worlds(dims))
    radii = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=len(queries),
                                        max_size=len(queries))), np.float32)
    k = data.draw(st.integers(1, 3))
    plane_values = data.draw(st.lists(st.integers(-2, 2), min_size=2 * k * (dims + 1), max_size=2 * k * (dims + 1)))
    planes = np.array(plane_values, np.float32).reshape(2, k, dims + 1)

    expected = [[int(i) for i, b in zip(ids, boxes) if overlaps(q, b, dims)] for q in queries]
    assert csr_lists(*tree.query_aabb(queries)) == [sorted(e) for e in expected]

    centers = queries[:, :dims]
    expected = [[int(i) for i, b in zip(ids, boxes) if sphere_touches(b, c, r, dims)] for c, r in zip(centers, radii)]
    assert csr_lists(*tree.query_sphere(centers, radii)) == [sorted(e) for e in expected]

    expected = [[int(i) for i, b in zip(ids, boxes) if frustum_contains(b, p, dims)] for p in planes]
    assert csr_lists(*tree.query_frustum(planes)) == [sorted(e) for e in expected]

    for first_hit in (False, True):
        offsets, hits, fractions = tree.raycast(segment_ends, first_hit=first_hit)
        for q, segment in enumerate(segment_ends):
            entries = sorted((t, int(i)) for i, b in zip(ids, boxes)
                             if (t := segment_entry(b, segment, dims)) is not None)
            entries = entries[:1] if first_hit else entries
            got = list(zip(fractions[offsets[q]:offsets[q + 1]].tolist(), hits[offsets[q]:offsets[q + 1]].tolist()))
            assert got == entries

    expected = sorted((min(int(ids[a]), int(ids[b])), max(int(ids[a]), int(ids[b])))
                      for a in range(len(ids)) for b in range(a + 1, len(ids)) if overlaps(boxes[a], boxes[b], dims))
    assert tree.pairs().tolist() == [list(p) for p in expected]


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from([2, 3]))
def test_reference_broadphase_filters_and_reports_changes(data, dims):
    ids, boxes = data.draw(worlds(dims))
    static = np.array(data.draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids))), bool)
    group = np.array(data.draw(st.lists(st.integers(0, 3), min_size=len(ids), max_size=len(ids))), np.uint32)
    mask = np.array(data.draw(st.lists(st.integers(0, 3), min_size=len(ids), max_size=len(ids))), np.uint32)
    world = reference.Broadphase(dims)
    world.create(ids, boxes, static=static, group=group, mask=mask)
    expected = sorted((min(int(ids[a]), int(ids[b])), max(int(ids[a]), int(ids[b])))
                      for a in range(len(ids)) for b in range(a + 1, len(ids))
                      if overlaps(boxes[a], boxes[b], dims) and group[a] & mask[b] and group[b] & mask[a]
                      and not (static[a] and static[b]))
    begun, ended = world.update()
    assert begun.tolist() == [list(p) for p in expected] and ended.shape == (0, 2)
    assert world.update()[0].shape == (0, 2)
    world.destroy(ids[: len(ids) // 2])
    begun, ended = world.update()
    gone = {int(i) for i in ids[: len(ids) // 2]}
    assert begun.shape == (0, 2)
    assert ended.tolist() == [list(p) for p in expected if p[0] in gone or p[1] in gone]


def test_reference_big_world_sweep_equals_quadratic_check():
    """The pair sweep works in blocks on big worlds; compare one against the all-pairs matrix."""
    rng = np.random.default_rng(3)
    centers = rng.uniform(0, 30, size=(1500, 3))
    boxes = np.concatenate([centers - 1, centers + rng.uniform(0, 2, size=(1500, 3))], 1).astype(np.float32)
    ids = rng.permutation(1500).astype(np.uint64) * 3
    tree = reference.Tree()
    tree.insert(ids, boxes)
    matrix = ((boxes[:, None, :3] <= boxes[None, :, 3:]) & (boxes[None, :, :3] <= boxes[:, None, 3:])).all(2)
    a, b = np.nonzero(np.triu(matrix, 1))
    expected = np.sort(np.stack([ids[a], ids[b]], 1), axis=1)
    expected = expected[np.lexsort((expected[:, 1], expected[:, 0]))]
    assert np.array_equal(tree.pairs(), expected)
