"""dbvt-bench's own W1 and W2 generators: the documented directory format, the recipes' statistics,
and expected.json against dbvt.reference's brute force, which shares no code with the grid that
dbvt_server.bench.exact uses to choose candidates."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dbvt import reference
from dbvt_server.bench import exact, workload


@pytest.fixture(scope="module")
def w1(tmp_path_factory):
    directory = tmp_path_factory.mktemp("w1")
    made = workload.generate("W1", 500, 6, directory, seed=7)
    return directory, made


def test_w1_directory_has_the_documented_files_and_shapes(w1):
    directory, made = w1
    n, steps, moves = 500, 6, 50
    sizes = {"boxes.f32": n * 6, "moves_ids.u32": steps * moves, "moves_box.f32": steps * moves * 6,
             "q_aabb.f32": 10_000 * 6, "q_ray.f32": 10_000 * 6, "q_frustum.f32": 1_000 * 24}
    for name, values in sizes.items():
        assert (directory / name).stat().st_size == 4 * values, name
    meta = json.loads((directory / "meta.json").read_text())
    assert meta == {"workload": "W1", "n": n, "steps": steps, "dims": 3, "moves_per_step": moves,
                    "world_side": pytest.approx(5 * n ** (1 / 3)), "seed": 7,
                    "n_aabb": 10_000, "n_ray": 10_000, "n_frustum": 1_000}
    loaded = workload.load(directory)
    assert loaded.boxes.dtype == np.float32 and loaded.move_ids.dtype == np.uint64
    assert loaded.q_frustum.shape == (1_000, 6, 4)
    np.testing.assert_array_equal(loaded.move_boxes, made.move_boxes)
    np.testing.assert_array_equal(np.fromfile(directory / "moves_ids.u32", "<u4").reshape(steps, moves),
                                  made.move_ids)
    assert set(loaded.expected) == {"pairs_step0", "pairs_per_step", "aabb_hits", "ray_hits", "frustum_hits",
                                    "aabb_first100", "ray_first100", "frustum_first100"}


def replay(work: workload.Workload) -> tuple[np.ndarray, np.ndarray]:
    """Every move's centre displacement, and the boxes after every step (steps, n, 2 dims)."""
    current, lengths, states = work.boxes.astype(np.float64), [], []
    d = work.dims
    for ids, moved in zip(work.move_ids.astype(np.int64), work.move_boxes):
        before = (current[ids, :d] + current[ids, d:]) / 2
        after = (moved[:, :d].astype(np.float64) + moved[:, d:]) / 2
        lengths.append(np.linalg.norm(after - before, axis=1))
        current[ids] = moved
        states.append(current.copy())
    return np.concatenate(lengths), np.array(states)


def test_w1_follows_its_recipe():
    work = workload.make_w1(4000, 8, seed=3)
    side = work.meta["world_side"]
    assert side == pytest.approx(5 * 4000 ** (1 / 3))
    for ids in work.move_ids:       # a tenth a step, distinct, ascending
        assert len(ids) == 400 and np.all(np.diff(ids.astype(np.int64)) > 0) and ids.max() < 4000
    assert len({tuple(ids) for ids in work.move_ids.tolist()}) == 8, "a new subset every step"
    lengths, states = replay(work)
    assert lengths.max() <= 0.5 + 1e-5 and 0.2 < np.median(lengths) < 0.3     # speeds uniform on [0, 0.5]
    for boxes in (work.boxes, states[-1]):
        sides = boxes[:, 3:] - boxes[:, :3]
        assert sides.min() >= 1 - 1e-5 and sides.max() <= 4 + 1e-5 and 2.3 < np.median(sides) < 2.7
        centres = (boxes[:, :3] + boxes[:, 3:]) / 2
        assert centres.min() >= -1e-4 and centres.max() <= side + 1e-4, "centres stay in the cube"
    np.testing.assert_allclose(work.q_aabb[:, 3:] - work.q_aabb[:, :3], 10, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(work.q_ray[:, 3:] - work.q_ray[:, :3], axis=1), 50, atol=1e-3)
    np.testing.assert_allclose(np.linalg.norm(work.q_frustum[..., :3], axis=2), 1, atol=1e-5)


@pytest.mark.parametrize("dims", [2, 3])
def test_w2_follows_its_recipe(tmp_path, dims):
    made = workload.generate("W2", 1200, 10, tmp_path, dims=dims)
    work = workload.load(tmp_path)
    assert work.kind == "W2" and work.dims == dims and work.q_aabb is None
    assert work.boxes.shape == (1200, 2 * dims) and work.move_boxes.shape == (10, 1200, 2 * dims)
    assert (tmp_path / "boxes.f32").stat().st_size == 4 * 1200 * 2 * dims
    assert not (tmp_path / "q_aabb.f32").exists()
    np.testing.assert_array_equal(work.move_ids, np.tile(np.arange(1200), (10, 1)))   # every proxy, every step
    assert work.meta["world_side"] == pytest.approx(workload.W2_SPACING[dims] * 1200 ** (1 / dims))
    lengths, states = replay(work)
    assert lengths.max() <= 0.15 + 1e-5 and 0.04 < np.median(lengths) < 0.12
    sides = np.concatenate([work.boxes, states.reshape(-1, 2 * dims)])
    sides = sides[:, dims:] - sides[:, :dims]
    assert sides.min() >= 2 * 0.14 * 0.85 - 1e-5 and sides.max() <= 2 * 0.19 * 1.15 * 1.2 + 1e-5
    assert 0.3 < np.median(sides) < 0.45
    assert 2.5 < made.expected["pairs_step0"] / 1200 < 5, "about seven neighbours a proxy"


def test_expected_json_equals_brute_force(w1):
    directory, _ = w1
    work = workload.load(directory)
    expected = work.expected
    broadphase = reference.Broadphase()
    broadphase.create(work.ids, work.boxes)
    assert len(broadphase.pairs()) == expected["pairs_step0"]
    for step in range(work.steps):
        broadphase.move(work.move_ids[step], work.move_boxes[step])
        assert len(broadphase.pairs()) == expected["pairs_per_step"][step]
    tree = reference.Tree()
    tree.insert(work.ids, work.boxes)
    for name, (offsets, hits, *_) in (("aabb", tree.query_aabb(work.q_aabb)), ("ray", tree.raycast(work.q_ray)),
                                      ("frustum", tree.query_frustum(work.q_frustum))):
        assert len(hits) == expected[f"{name}_hits"], name
        first = [sorted(hits[offsets[i]:offsets[i + 1]].tolist()) for i in range(100)]
        assert first == expected[f"{name}_first100"], name
    assert expected["ray_hits"] > 0 and expected["frustum_hits"] > 0
    assert 0.3 < expected["pairs_step0"] / work.n < 0.7, "a box touches about one other"


@pytest.mark.parametrize("dims", [2, 3])
def test_exact_counts_boxes_that_only_touch(dims):
    """Boxes on an integer lattice share faces, edges and corners exactly: closed intervals count them."""
    rng = np.random.default_rng(dims)
    lo = rng.integers(0, 12, (600, dims)).astype(np.float32)
    boxes = np.concatenate([lo, lo + rng.integers(1, 4, (600, dims))], axis=1).astype(np.float32)
    tree = reference.Tree(dims=dims)
    tree.insert(np.arange(600, dtype=np.uint64), boxes)
    assert exact.pair_count(boxes, dims) == len(tree.pairs())


def test_exact_queries_on_degenerate_segments_and_open_plane_sets():
    """Segments of length zero or along an axis, and six random planes that enclose nothing finite:
    the candidates still hold every hit."""
    work = workload.make_w1(800, 0, seed=5)
    rng = np.random.default_rng(5)
    segments = work.q_ray[:300].copy()
    segments[:20, 3:] = segments[:20, :3]
    segments[20:40, 4:] = segments[20:40, 1:3]
    planes = (rng.normal(size=(60, 6, 4)) * [1, 1, 1, 20]).astype(np.float32)
    found = exact.query_hits(work.boxes, work.q_aabb[:300], segments, planes)
    tree = reference.Tree()
    tree.insert(work.ids, work.boxes)
    for name, (offsets, hits, *_) in (("aabb", tree.query_aabb(work.q_aabb[:300])), ("ray", tree.raycast(segments)),
                                      ("frustum", tree.query_frustum(planes))):
        assert [sorted(hits[offsets[i]:offsets[i + 1]].tolist()) for i in range(len(offsets) - 1)] == \
               [h.tolist() for h in found[name]], name


def test_load_refuses_arrays_that_disagree_with_meta(w1, tmp_path):
    directory, _ = w1
    for name in ("boxes.f32", "moves_ids.u32", "moves_box.f32", "q_ray.f32", "meta.json", "expected.json"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    (tmp_path / "q_aabb.f32").write_bytes((directory / "q_aabb.f32").read_bytes()[:-4])
    with pytest.raises(workload.BadWorkload, match="q_aabb.f32"):
        workload.load(tmp_path)
