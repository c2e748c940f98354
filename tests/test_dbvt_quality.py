"""Tree quality: height stays within 2*log2(n) for awkward layouts, whichever way the boxes went in, and
after W1-like motion; area_ratio is always reported and finite.

The layouts are the ones that break naive trees: a row (every box's centre on one line), points on a
line (every surface area is zero, so a pure SAH cost cannot tell splits apart), a lattice of equal boxes
(endless cost ties), boxes sharing one centre, and identical boxes (no split separates them).
"""
import math

import numpy as np
import pytest

import dbvt
from worlds import W1World, boxes_around

N = 4096
LAYOUTS = ["random", "row", "points on a line", "grid", "equal centres", "identical", "identical points"]


def layout(name, n, dims, seed=0):
    rng = np.random.default_rng(seed)
    if name == "random":
        centers = rng.uniform(0, 5 * n ** (1 / dims), size=(n, dims))
        half = rng.uniform(0.5, 2.0, size=(n, dims))
    elif name == "row":
        centers = np.zeros((n, dims))
        centers[:, 0] = 1.5 * rng.permutation(n)
        half = np.full((n, dims), 1.0)
    elif name == "points on a line":
        centers = np.zeros((n, dims))
        centers[:, 0] = rng.permutation(n)
        half = np.zeros((n, dims))
    elif name == "grid":
        side = math.ceil(n ** (1 / dims))
        cells = np.stack(np.unravel_index(rng.permutation(side**dims)[:n], (side,) * dims), axis=1)
        centers, half = 2.0 * cells, np.full((n, dims), 1.0)
    elif name == "equal centres":
        centers, half = np.full((n, dims), 7.0), rng.uniform(0.5, 20.0, size=(n, dims))
    elif name == "identical":
        centers, half = np.full((n, dims), 7.0), np.full((n, dims), 1.0)
    else:
        centers, half = np.full((n, dims), 7.0), np.zeros((n, dims))
    return boxes_around(centers, half)


def height_bound(n):
    return 2 * math.log2(n)


def check_quality(tree, label, ids):
    tree.validate()
    stats = tree.stats()
    n = len(tree)
    assert stats["proxies"] == n == len(ids) and stats["nodes"] >= n
    # A query holding everything walks the whole tree, however deep: the walk's stack must grow.
    everything = np.array([[-1e30] * tree.dims + [1e30] * tree.dims], np.float32)
    assert np.array_equal(tree.query_aabb(everything)[1], np.sort(ids)), label
    assert np.isfinite(stats["area_ratio"]) and stats["area_ratio"] >= 0, (label, stats)
    assert stats["height"] <= height_bound(n), (label, stats)
    assert stats["memory_bytes"] > 0, (label, stats)
    return stats


def insert_in_batches(tree, ids, boxes, batch):
    tree.insert(ids[:1], boxes[:1])
    for start in range(1, len(ids), batch):
        tree.insert(ids[start:start + batch], boxes[start:start + batch])


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("mode", ["bulk", "batches of 1", "batches of 64", "batches of 1000 (along a Morton curve)"])
def test_height_after_inserts(mode, name, dims):
    n = 1024 if mode == "batches of 1" else N
    boxes = layout(name, n, dims)
    ids = np.random.default_rng(1).permutation(n).astype(np.uint64) * 7919
    tree = dbvt.Tree(dims)
    if mode == "bulk":
        tree.insert(ids, boxes)
    else:
        insert_in_batches(tree, ids, boxes, int(mode.split()[2]))
    check_quality(tree, f"{name} {dims}-D after {mode}", ids)
    tree.remove(ids[::2])
    check_quality(tree, f"{name} {dims}-D after removing half", ids[1::2])
    tree.rebuild()
    check_quality(tree, f"{name} {dims}-D after rebuild", ids[1::2])


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("margin", [0.0, 0.1])
def test_height_after_w1_moves(dims, margin):
    world = W1World(10_000, dims, seed=30 + dims)
    bulk, incremental = dbvt.Tree(dims, margin), dbvt.Tree(dims, margin)
    bulk.insert(world.ids, world.boxes)
    insert_in_batches(incremental, world.ids, world.boxes, 500)
    for step in range(20):
        ids, boxes = world.step()
        for tree in (bulk, incremental):
            assert 0 <= tree.update(ids, boxes) <= len(ids)
        if step % 5 == 4:
            check_quality(bulk, f"bulk {dims}-D step {step}", world.ids)
            check_quality(incremental, f"incremental {dims}-D step {step}", world.ids)


def test_broadphase_stays_shallow_under_w1_moves():
    world = W1World(10_000, 3, seed=40)
    broadphase = dbvt.Broadphase(3)
    broadphase.create(world.ids, world.boxes)
    broadphase.update()
    for _ in range(10):
        broadphase.move(*world.step())
        broadphase.update()
    broadphase.validate()
    stats = broadphase.stats()
    assert stats["proxies"] == 10_000 and np.isfinite(stats["area_ratio"])
    assert stats["height"] <= height_bound(10_000), stats


@pytest.mark.parametrize("n", [0, 1, 2])
def test_stats_of_tiny_trees_are_finite(n):
    tree = dbvt.Tree()
    tree.insert(np.arange(n), layout("identical points", n, 3) if n else np.zeros((0, 6)))
    stats = tree.stats()
    assert stats["proxies"] == n and stats["height"] <= 1
    assert np.isfinite(stats["area_ratio"]) and stats["memory_bytes"] >= 0


@pytest.mark.parametrize("n", [1_000, 80_000])    # 80,000 moves take the split (threaded) path
@pytest.mark.parametrize("threads", [1, 2])
def test_a_step_a_fat_box_can_hold_again_is_predicted_and_a_jump_is_not(n, threads):
    """Pairs of unit boxes 1.5 apart along x, no margin. A step of 0.4 grows each fat box ahead, by its
    size at most, so the next such step stays inside, and each pair's fat boxes meet. A jump of 5 is
    more than a box grown by its size could hold again: it grows nothing, and no fat boxes meet."""
    half = n // 2
    x = np.repeat(np.arange(half) * 10.0, 2) + np.tile([0.0, 1.5], half)
    boxes = np.zeros((n, 6), np.float32)
    boxes[:, 0], boxes[:, 3], boxes[:, 4], boxes[:, 5] = x, x + 1, 1, 1
    ids = np.arange(n, dtype=np.uint64)

    def shifted(by: float) -> np.ndarray:
        return boxes + np.float32(by) * np.array([1, 0, 0, 1, 0, 0], np.float32)

    bp = dbvt.Broadphase(dims=3, margin=0.0, threads=threads)
    bp.create(ids, boxes)
    bp.update()
    assert bp.stats()["fat_pairs"] == 0
    assert bp.move(ids, shifted(0.4)) == n
    bp.update()
    assert bp.stats()["fat_pairs"] == half
    assert bp.move(ids, shifted(0.8)) == 0
    assert bp.move(ids, shifted(5.8)) == n
    bp.update()
    assert bp.stats()["fat_pairs"] == 0 and len(bp.pairs()) == 0
