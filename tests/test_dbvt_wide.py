"""The wide query view (dbvt._wide): box and segment queries that walk it answer exactly as brute force,
as the binary tree's own walk, and as the same structure with threads=2, however the tree got its shape.

A batch walks the view when it holds at least proxies / 16 rows (or the view is fresh); a one-row batch on
a tree of more than 16 proxies whose view is stale walks the binary tree. stats()["quads"] says which
happened: the quads of the view, 0 while it is stale.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dbvt
from dbvt import reference
from worlds import W1World, assert_same_csr

grid = st.integers(-6, 6).map(float)
coordinate = st.one_of(grid, grid, st.floats(-40, 40, width=32), st.sampled_from([-0.0, 1e-45, 3.4e38, -3.4e38]))
extent = st.one_of(st.just(0.0), st.integers(0, 3).map(float), st.floats(0, 12, width=32))


@st.composite
def box_rows(draw, dims, n):
    lows = np.array(draw(st.lists(coordinate, min_size=n * dims, max_size=n * dims)), np.float64).reshape(n, dims)
    sizes = np.array(draw(st.lists(extent, min_size=n * dims, max_size=n * dims)), np.float64).reshape(n, dims)
    return np.concatenate([lows, lows + sizes], axis=1).astype(np.float32)


@st.composite
def segment_rows(draw, dims, n):
    ends = draw(box_rows(dims, n))
    for row in range(n):        # segments along an axis and of zero length test the slab test's zero-delta path
        kind = draw(st.sampled_from(["free", "free", "point", "axis"]))
        if kind == "point":
            ends[row, dims:] = ends[row, :dims]
        elif kind == "axis":
            axis = draw(st.integers(0, dims - 1))
            ends[row, dims:] = ends[row, :dims]
            ends[row, dims + axis] += draw(st.sampled_from([-7.0, 2.0, 9.5]))
    return ends


def one_by_one(call, rows):
    """The batch answered a row at a time, as CSR: on a stale view each such call walks the binary tree."""
    parts = [call(rows[i:i + 1]) for i in range(len(rows))]
    offsets = np.concatenate([[0], np.cumsum([len(p[1]) for p in parts])]).astype(np.int64)
    return (offsets, *(np.concatenate([p[k] for p in parts]) for k in range(1, len(parts[0]))))


def answers(structure, queries, segments, **options):
    return {
        "query_aabb": lambda rows: structure.query_aabb(rows, **options),
        "raycast": lambda rows: structure.raycast(rows, **options),
        "raycast first_hit": lambda rows: structure.raycast(rows, first_hit=True, **options),
    }, {"query_aabb": queries, "raycast": segments, "raycast first_hit": segments}


def check_all_walks(real, twin, ref, queries, segments, stale=True, **options):
    """Binary walk (row by row, while the view is stale after a change), the view's walk (the whole
    batch), threads=2 and brute force all agree, byte for byte."""
    calls, rows = answers(real, queries, segments, **options)
    twin_calls, _ = answers(twin, queries, segments, **options)
    ref_calls, _ = answers(ref, queries, segments, **options)
    many = stale and len(real) > 16
    if many:
        assert real.stats()["quads"] == 0, "a change must leave the view stale"
        binary = {name: one_by_one(call, rows[name]) for name, call in calls.items()}
        assert real.stats()["quads"] == 0, "a one-row batch must not rebuild the view of a larger tree"
    for name, call in calls.items():
        wide = call(rows[name])
        if len(real):
            assert real.stats()["quads"] > 0, "a batch of proxies / 16 rows must walk the view"
        expected = ref_calls[name](rows[name])
        assert_same_csr(wide, expected, f"{name}, wide view")
        assert_same_csr(twin_calls[name](rows[name]), expected, f"{name}, threads=2")
        if many:
            assert_same_csr(binary[name], expected, f"{name}, binary walk")


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from([2, 3]), st.booleans())
def test_wide_view_equals_reference_after_builds_moves_and_removals(data, dims, bulk):
    n = data.draw(st.integers(1, 90), label="proxies")
    ids = np.array(data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n, unique=True)), np.uint64)
    boxes = data.draw(box_rows(dims, n), label="boxes")
    real, twin = dbvt.Tree(dims=dims, margin=0.25), dbvt.Tree(dims=dims, margin=0.25, threads=2)
    ref = reference.Tree(dims=dims, margin=0.25)
    for structure in (real, twin, ref):
        if bulk:
            structure.insert(ids, boxes)
        else:
            for i in range(n):
                structure.insert(ids[i:i + 1], boxes[i:i + 1])
    q = max(1, n // 8)
    stale = True
    for step in range(data.draw(st.integers(1, 4), label="steps")):
        check_all_walks(real, twin, ref, data.draw(box_rows(dims, q)), data.draw(segment_rows(dims, q)), stale)
        live = np.array([i for i in ids if i in real], np.uint64)
        if not len(live):
            break
        moved = live[np.array(data.draw(st.lists(st.booleans(), min_size=len(live), max_size=len(live))), bool)]
        new = data.draw(box_rows(dims, len(moved)))
        gone = live[np.array(data.draw(st.lists(st.booleans(), min_size=len(live), max_size=len(live))), bool)][:3]
        for structure in (real, twin, ref):
            if len(moved):
                structure.update(moved, new)
            if len(gone):
                structure.remove(gone)
        stale = len(moved) + len(gone) > 0 or step % 2 == 1
        if step % 2:
            for structure in (real, twin):
                structure.rebuild()
        real.validate()
    check_all_walks(real, twin, ref, data.draw(box_rows(dims, q)), data.draw(segment_rows(dims, q)), stale)


@settings(max_examples=25, deadline=None)
@given(st.data(), st.sampled_from([2, 3]))
def test_wide_view_keeps_masks_sensors_and_hit_limits(data, dims):
    n = data.draw(st.integers(17, 70), label="proxies")
    ids = np.arange(1, n + 1, dtype=np.uint64) * 7919
    boxes = data.draw(box_rows(dims, n), label="boxes")
    group = np.array(data.draw(st.lists(st.sampled_from([1, 2, 3]), min_size=n, max_size=n)), np.uint32)
    sensor = np.array(data.draw(st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=n, max_size=n)), np.uint8)
    real, twin = dbvt.Broadphase(dims=dims, sensor_margin=0.5), dbvt.Broadphase(dims=dims, sensor_margin=0.5, threads=2)
    ref = reference.Broadphase(dims=dims, sensor_margin=0.5)
    for structure in (real, twin, ref):
        structure.create(ids, boxes, group=group, sensor=sensor)
        structure.update()
    q = max(4, n // 4)
    for options in ({}, {"mask": 2}, {"include_sensors": True}, {"mask": 1, "include_sensors": True}):
        # Moving a sensor inside its fat box changes its tight box without touching the tree: the view must
        # still see the change (include_sensors queries test sensors' tight boxes).
        moved = ids[sensor > 0][:2]
        if len(moved):
            shrunk = np.array([real.get(moved)[k] for k in range(len(moved))], np.float32)
            shrunk[:, dims:] = shrunk[:, :dims] + 0.25 * (shrunk[:, dims:] - shrunk[:, :dims])
            for structure in (real, twin, ref):
                structure.move(moved, shrunk)
        check_all_walks(real, twin, ref, data.draw(box_rows(dims, q)), data.draw(segment_rows(dims, q)),
                        len(moved) > 0, **options)
    queries = data.draw(box_rows(dims, q))
    expected = ref.query_aabb(queries)
    total = len(expected[1])
    for limit in sorted({0, total // 2, max(total - 1, 0), total}):
        for structure in (real, twin):
            structure.max_hits = limit
            if total > limit:
                with pytest.raises(dbvt.HitLimit):
                    structure.query_aabb(queries)
            else:
                assert_same_csr(structure.query_aabb(queries), expected, f"query_aabb, max_hits={limit}")
            structure.max_hits = -1


@pytest.mark.parametrize("dims", [3, 2])
def test_wide_view_of_w1_equals_binary_walk_and_threads(dims):
    """A W1 world of 3,000, bulk built then stepped: every box and segment batch (large enough to be cut
    over threads) answers the same on the view, on the binary tree and on threads=2, and as brute force."""
    w = W1World(3000, dims=dims, seed=5)
    real, twin = dbvt.Tree(dims=dims, margin=0.1), dbvt.Tree(dims=dims, margin=0.1, threads=2)
    ref = reference.Tree(dims=dims, margin=0.1)
    for structure in (real, twin, ref):
        structure.insert(w.ids, w.boxes)
    for step in range(3):
        check_all_walks(real, twin, ref, w.query_boxes(400, half=6.0), w.segments(400))
        movers, boxes = w.step()
        for structure in (real, twin, ref):
            structure.update(movers, boxes)


def test_wide_view_quality():
    """The view has about as few quads as a 4-wide tree can (a third of the proxies at best), bulk built
    and after W1 steps alike."""
    w = W1World(20_000, seed=3)
    for bulk in (True, False):
        tree = dbvt.Tree(margin=0.05)
        if bulk:
            tree.insert(w.ids, w.boxes)
        else:
            tree.insert(w.ids[:1], w.boxes[:1])
            tree.insert(w.ids[1:], w.boxes[1:])
        for step in range(4):
            tree.query_aabb(w.query_boxes(2000))
            quads = tree.stats()["quads"]
            assert len(tree) / 3 <= quads <= 0.42 * len(tree), (bulk, step, quads)
            movers, boxes = w.step()
            tree.update(movers, boxes)


def test_every_change_leaves_the_view_stale():
    w = W1World(400, seed=9)
    tree = dbvt.Tree(margin=0.1)
    tree.insert(w.ids, w.boxes)
    big = w.query_boxes(100)
    changes = [lambda: tree.update(w.ids[:1], w.boxes[:1] + 0.01), lambda: tree.remove(w.ids[:1]),
               lambda: tree.insert(w.ids[:1], w.boxes[:1]), tree.rebuild]
    for change in changes:
        tree.query_aabb(big)
        assert tree.stats()["quads"] > 0
        change()
        assert tree.stats()["quads"] == 0
    loaded = dbvt.Tree.from_bytes(tree.to_bytes())
    assert loaded.stats()["quads"] == 0
    assert_same_csr(loaded.query_aabb(big), tree.query_aabb(big), "after a round trip")


def test_batches_on_threads_share_the_view_while_it_is_rebuilt():
    """Reads may run side by side: batches on several Python threads find the view stale at once; one
    rebuilds it (without the GIL) while the others walk the tree, and all answer as brute force."""
    w = W1World(6000, seed=11)
    tree, ref = dbvt.Tree(margin=0.1), reference.Tree(margin=0.1)
    for structure in (tree, ref):
        structure.insert(w.ids, w.boxes)
    queries, segments = w.query_boxes(600), w.segments(600)
    for step in range(4):
        expected = ref.query_aabb(queries), ref.raycast(segments)
        results = {}

        def read(k):
            results[k] = tree.query_aabb(queries) if k % 2 == 0 else tree.raycast(segments)
        threads = [threading.Thread(target=read, args=(k,)) for k in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for k, got in results.items():
            assert_same_csr(got, expected[k % 2], f"step {step}, reader {k}")
        assert len(results) == 6 and tree.stats()["quads"] > 0
        movers, boxes = w.step()
        for structure in (tree, ref):
            structure.update(movers, boxes)
