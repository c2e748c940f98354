"""A W1-like world of 10k proxies, 3-D and 2-D: after every step, every query result, the pair set and
the Broadphase's begun/ended pairs equal the brute-force reference's exactly.

Most proxies go in with one bulk insert into the empty structure; the rest arrive (and some leave) in
small batches between steps, so both insertion paths and removal run at scale.
"""
import threading

import numpy as np
import pytest

import dbvt
from dbvt import reference
from worlds import W1World, assert_same_csr, assert_same_pairs

N = 10_000
STEPS = 4
QUERIES = 120


def compare_queries(real, ref, world, label, **mask):
    boxes = world.query_boxes(QUERIES)
    assert_same_csr(real.query_aabb(boxes, **mask), ref.query_aabb(boxes, **mask), f"{label} query_aabb")
    centers, radii = world.spheres(QUERIES)
    assert_same_csr(real.query_sphere(centers, radii, **mask), ref.query_sphere(centers, radii, **mask),
                    f"{label} query_sphere")
    segments = world.segments(QUERIES)
    for first_hit in (False, True):
        assert_same_csr(real.raycast(segments, first_hit=first_hit, **mask),
                        ref.raycast(segments, first_hit=first_hit, **mask), f"{label} raycast first_hit={first_hit}")
    planes = world.frusta(12)
    assert_same_csr(real.query_frustum(planes, **mask), ref.query_frustum(planes, **mask), f"{label} query_frustum")
    planes = world.polytopes(4, 32)
    assert_same_csr(real.query_frustum(planes, **mask), ref.query_frustum(planes, **mask), f"{label} 32 planes")


class Membership:
    """Which of the world's rows are in the structures; arrivals and departures between steps.

    Arrivals are the lowest absent rows, so rows that left in an earlier step come back later (an id
    reused after its removal was reported); a row never leaves in the step it arrived.
    """

    def __init__(self, world, initial_fraction=0.9):
        self.world = world
        self.present = np.zeros(world.n, bool)
        self.present[: int(world.n * initial_fraction)] = True

    def arrivals(self, count):
        rows = np.flatnonzero(~self.present)[:count]
        self.present[rows] = True
        return rows

    def departures(self, count, allowed):
        rows = self.world.rng.choice(np.flatnonzero(self.present & allowed), count, replace=False)
        self.present[rows] = False
        return rows


@pytest.mark.parametrize("dims", [3, 2])
def test_tree_equals_reference_through_w1_steps(dims):
    world = W1World(N, dims, seed=10 + dims)
    members = Membership(world)
    real, ref = dbvt.Tree(dims, margin=0.2), reference.Tree(dims, margin=0.2)
    rows = np.flatnonzero(members.present)
    for tree in (real, ref):
        tree.insert(world.ids[rows], world.boxes[rows])
    for step in range(STEPS):
        label = f"dims={dims} step {step}"
        real.validate()
        assert len(real) == len(ref)
        compare_queries(real, ref, world, label)
        assert_same_pairs(real.pairs(), ref.pairs(), f"{label} pairs")

        ids, boxes = world.step(members.present)
        reinserted = real.update(ids, boxes)
        ref.update(ids, boxes)
        assert 0 <= reinserted <= len(ids)
        arrived = np.zeros(N, bool)
        for batch in range(4):
            new = members.arrivals(50)
            arrived[new] = True
            real.insert(world.ids[new], world.boxes[new])
            ref.insert(world.ids[new], world.boxes[new])
        gone = members.departures(100, ~arrived)
        real.remove(world.ids[gone])
        ref.remove(world.ids[gone])
    real.validate()
    assert np.array_equal(real.get(world.ids[members.present]), ref.get(world.ids[members.present]))
    assert_same_pairs(real.pairs(), ref.pairs(), f"dims={dims} final pairs")


# The wide margin keeps most moves inside their fat boxes (nothing reinserted, pairs still change).
@pytest.mark.parametrize("dims, margin", [(3, 0.05), (2, 0.5)])
def test_broadphase_equals_reference_through_w1_steps(dims, margin):
    world = W1World(N, dims, seed=20 + dims)
    rng = np.random.default_rng(dims)
    static = rng.random(N) < 0.2
    group = (1 << rng.integers(0, 3, N)).astype(np.uint32)
    mask = rng.choice(np.array([0xFFFFFFFF, 0xFFFFFFFF ^ 2, 1 | 4], np.uint32), N)
    members = Membership(world)
    real, ref = dbvt.Broadphase(dims, margin), reference.Broadphase(dims, margin)

    def create(rows):
        for bp in (real, ref):
            bp.create(world.ids[rows], world.boxes[rows], static=static[rows], group=group[rows], mask=mask[rows])

    create(np.flatnonzero(members.present))
    for step in range(STEPS + 1):
        label = f"dims={dims} step {step}"
        begun, ended = real.update()
        expected_begun, expected_ended = ref.update()
        assert_same_pairs(begun, expected_begun, f"{label} begun")
        assert_same_pairs(ended, expected_ended, f"{label} ended")
        real.validate()
        assert len(real) == len(ref)
        assert_same_pairs(real.pairs(), ref.pairs(), f"{label} pairs")
        compare_queries(real, ref, world, label)
        compare_queries(real, ref, world, f"{label} mask=3", mask=3)

        ids, boxes = world.step(members.present & ~static)
        real.move(ids, boxes)
        ref.move(ids, boxes)
        arrived = members.arrivals(150)
        create(arrived)
        gone = members.departures(100, ~static & ~np.isin(np.arange(N), arrived))
        real.destroy(world.ids[gone])
        ref.destroy(world.ids[gone])


def test_two_worlds_used_from_two_threads_answer_as_when_alone():
    """The server runs different worlds in parallel with the GIL released: no state may be shared."""
    worlds = [W1World(N, 3, seed=50 + i) for i in range(2)]
    broadphases = []
    for world in worlds:
        broadphases.append(dbvt.Broadphase(3))
        broadphases[-1].create(world.ids, world.boxes)
    probes = [(w.query_boxes(500), w.segments(500), w.frusta(20), [w.step() for _ in range(6)]) for w in worlds]

    def run(i):
        bp, (boxes, segments, planes, moves) = broadphases[i], probes[i]
        answers = []
        for ids, new in moves:
            bp.move(ids, new)
            answers += [*bp.update(), *bp.query_aabb(boxes), *bp.raycast(segments), *bp.query_frustum(planes)]
        return answers

    snapshots = [bp.to_bytes() for bp in broadphases]
    alone = [run(i) for i in range(2)]
    broadphases[:] = [dbvt.Broadphase.from_bytes(data) for data in snapshots]
    together = [None, None]
    threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, run(i))) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(2):
        assert len(together[i]) == len(alone[i])
        assert all(np.array_equal(a, b) for a, b in zip(together[i], alone[i])), f"world {i}"


@pytest.mark.parametrize("id_bits, base", [(12, 0), (40, 0), (64, 0), (12, 2**62 + 2**40)])
def test_thousands_of_pair_changes_come_sorted_whatever_the_ids(id_bits, base):
    """An update with more pair changes than RADIX_FROM (256) sorts them by radix over the bits in
    which the ids differ: ids of 12 bits (two passes a key), 40 and 64 (six), and 12 bits above a
    base whose high bits every id shares (two), pairs begun and ended in one update."""
    rng = np.random.default_rng(id_bits)
    n = 3000
    ids = np.unique(rng.integers(0, 2 ** id_bits - 1, size=2 * n, dtype=np.uint64, endpoint=True))[:n]
    ids = ids + np.uint64(base)
    ids = rng.permutation(ids)
    centres = rng.uniform(0, 60, size=(len(ids), 2))
    boxes = np.concatenate([centres - 1.2, centres + 1.2], axis=1).astype(np.float32)
    real, ref = dbvt.Broadphase(dims=2), reference.Broadphase(dims=2)
    for bp in (real, ref):
        bp.create(ids, boxes)
    for step in range(3):
        begun, ended = real.update()
        expected = ref.update()
        assert_same_pairs(begun, expected[0], f"step {step} begun")
        assert_same_pairs(ended, expected[1], f"step {step} ended")
        assert len(begun) + len(ended) > 2048
        centres = rng.uniform(0, 60, size=(len(ids), 2))
        boxes = np.concatenate([centres - 1.2, centres + 1.2], axis=1).astype(np.float32)
        for bp in (real, ref):
            bp.move(ids, boxes)
