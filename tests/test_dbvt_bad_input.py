"""Every bad-input rule of the dbvt contract, for Tree and Broadphase, core and reference alike.

Each case checks the exception type, that the message names the offending argument and row, and that
the structure is exactly as before (serialized bytes, length, a query and the pair set).
"""
import numpy as np
import pytest

import dbvt
from dbvt import reference

IMPLEMENTATIONS = {"core": dbvt, "reference": reference}
IDS = np.arange(100, 120, dtype=np.uint64)
INF, NAN = np.inf, np.nan


def sample_boxes(dims, n, seed=0):
    rng = np.random.default_rng(seed)
    low = rng.uniform(0, 10, size=(n, dims))
    return np.concatenate([low, low + rng.uniform(0, 3, size=(n, dims))], axis=1).astype(np.float32)


def with_row(boxes, row, values):
    boxes = boxes.copy()
    boxes[row] = values
    return boxes


def add(s, ids, boxes):
    return s.insert(ids, boxes) if hasattr(s, "insert") else s.create(ids, boxes)


def change(s, ids, boxes):
    return s.update(ids, boxes) if hasattr(s, "insert") else s.move(ids, boxes)


def drop(s, ids):
    return s.remove(ids) if hasattr(s, "insert") else s.destroy(ids)


def cases(d):
    """(name, call, exception type, pattern the message must contain) for dims `d`."""
    b2, b3 = sample_boxes(d, 2, 1), sample_boxes(d, 3, 2)
    inverted = [1.0] * d + [0.0] * d
    return [
        ("boxes wrong width", lambda s: add(s, [1, 2], np.zeros((2, 2 * d + 1))), ValueError,
         r"boxes must have shape"),
        ("boxes 1-D", lambda s: add(s, [1], np.zeros(2 * d)), ValueError, r"boxes must have shape"),
        ("ids 2-D", lambda s: add(s, [[1], [2]], b2), ValueError, r"ids must be 1-D"),
        ("ids not integers", lambda s: add(s, [1.5, 2.0], b2), ValueError, r"ids must hold integers"),
        ("fewer boxes than ids", lambda s: add(s, [1, 2, 3], b2), ValueError, r"boxes has 2 rows but ids has 3"),
        ("more boxes than ids", lambda s: add(s, [1], b2), ValueError, r"boxes has 2 rows but ids has 1"),
        ("NaN box", lambda s: add(s, [1, 2, 3], with_row(b3, 2, NAN)), ValueError, r"boxes row 2: NaN"),
        ("infinite box", lambda s: add(s, [1, 2, 3], with_row(b3, 1, INF)), ValueError, r"boxes row 1: NaN or inf"),
        ("min > max", lambda s: add(s, [1, 2, 3], with_row(b3, 2, inverted)), ValueError, r"boxes row 2: min > max"),
        ("duplicate in call", lambda s: add(s, [1, 2, 1], b3), ValueError, r"ids row 2: id 1 appears twice"),
        ("id 0 twice in call", lambda s: add(s, [0, 2, 0], b3), ValueError, r"ids row 2: id 0 appears twice"),
        ("already present", lambda s: add(s, [1, 105, 2], b3), ValueError, r"ids row 1: id 105 is already present"),
        ("negative id", lambda s: add(s, [1, -5], b2), ValueError, r"ids row 1: id -5 is negative"),
        ("unknown on move", lambda s: change(s, [100, 7], b2), KeyError, r"ids row 1: unknown id 7"),
        ("duplicate on move", lambda s: change(s, [100, 101, 100], b3), ValueError,
         r"ids row 2: id 100 appears twice"),
        ("NaN on move", lambda s: change(s, [100, 101], with_row(b2, 1, NAN)), ValueError, r"boxes row 1: NaN"),
        ("min > max on move", lambda s: change(s, [100, 101], with_row(b2, 0, inverted)), ValueError,
         r"boxes row 0: min > max"),
        ("length on move", lambda s: change(s, [100, 101, 102], b2), ValueError, r"boxes has 2 rows but ids has 3"),
        ("negative id on move", lambda s: change(s, [100, -1], b2), ValueError, r"ids row 1: id -1 is negative"),
        ("unknown on remove", lambda s: drop(s, [100, 101, 7]), KeyError, r"ids row 2: unknown id 7"),
        ("duplicate on remove", lambda s: drop(s, [101, 101]), ValueError, r"ids row 1: id 101 appears twice"),
        ("negative id on remove", lambda s: drop(s, [-3]), ValueError, r"ids row 0: id -3 is negative"),
        ("unknown on get", lambda s: s.get([100, 7]), KeyError, r"ids row 1: unknown id 7"),
        ("duplicate on get", lambda s: s.get([100, 100]), ValueError, r"ids row 1: id 100 appears twice"),
        ("query box NaN", lambda s: s.query_aabb(with_row(b2, 1, NAN)), ValueError, r"boxes row 1: NaN"),
        ("query box min > max", lambda s: s.query_aabb(with_row(b2, 1, inverted)), ValueError,
         r"boxes row 1: min > max"),
        ("query box width", lambda s: s.query_aabb(np.zeros((1, 2 * d - 1))), ValueError, r"boxes must have shape"),
        ("negative radius", lambda s: s.query_sphere(np.zeros((3, d)), [1.0, -0.5, 2.0]), ValueError,
         r"radii row 1: negative radius"),
        ("NaN radius", lambda s: s.query_sphere(np.zeros((2, d)), [1.0, NAN]), ValueError, r"radii row 1: NaN"),
        ("radii length", lambda s: s.query_sphere(np.zeros((2, d)), [1.0, 1.0, 1.0]), ValueError,
         r"radii must have shape \(2,\)"),
        ("center NaN", lambda s: s.query_sphere(with_row(np.zeros((2, d)), 1, NAN), 1.0), ValueError,
         r"centers row 1: NaN"),
        ("center width", lambda s: s.query_sphere(np.zeros((2, d + 1)), 1.0), ValueError, r"centers must have shape"),
        ("segment width", lambda s: s.raycast(np.zeros((1, 2 * d + 1))), ValueError, r"segments must have shape"),
        ("segment infinite", lambda s: s.raycast(with_row(np.zeros((2, 2 * d)), 1, INF)), ValueError,
         r"segments row 1: NaN or inf"),
        ("no planes", lambda s: s.query_frustum(np.zeros((1, 0, d + 1))), ValueError, r"k must be between 1 and 32"),
        ("33 planes", lambda s: s.query_frustum(np.zeros((1, 33, d + 1))), ValueError, r"k must be between 1 and 32"),
        ("plane width", lambda s: s.query_frustum(np.zeros((1, 4, d + 2))), ValueError, r"planes must have shape"),
        ("plane NaN", lambda s: s.query_frustum(with_row(np.zeros((2, 4, d + 1)), 1, NAN)), ValueError,
         r"planes row 1: NaN"),
    ]


def broadphase_cases(d):
    b2 = sample_boxes(d, 2, 3)
    return [
        ("group too big", lambda s: s.create([1, 2], b2, group=[1, 2**32]), ValueError, r"group row 1: 4294967296"),
        ("mask negative", lambda s: s.create([1, 2], b2, mask=-1), ValueError, r"mask row 0: -1"),
        ("group length", lambda s: s.create([1, 2], b2, group=[1, 2, 3]), ValueError, r"group must be a scalar"),
        ("mask not integer", lambda s: s.create([1, 2], b2, mask=0.5), ValueError, r"mask must hold integers"),
        ("static length", lambda s: s.create([1, 2], b2, static=[True]), ValueError, r"static must be a scalar"),
        ("query mask too big", lambda s: s.query_aabb(b2, mask=2**32), ValueError, r"mask must be a 32-bit"),
        ("query mask negative", lambda s: s.raycast(np.zeros((1, 2 * d)), mask=-1), ValueError,
         r"mask must be a 32-bit"),
    ]


def populated(module, kind, dims):
    structure = getattr(module, kind)(dims)
    add(structure, IDS, sample_boxes(dims, len(IDS)))
    if kind == "Broadphase":
        structure.update()
    return structure


def snapshot(structure, dims):
    everything = np.array([[-1e30] * dims + [1e30] * dims], np.float32)
    offsets, hits = structure.query_aabb(everything)
    return structure.to_bytes(), len(structure), hits.tolist(), structure.pairs().tolist()


def all_cases():
    for dims in (2, 3):
        for kind in ("Tree", "Broadphase"):
            extra = broadphase_cases(dims) if kind == "Broadphase" else []
            for name, call, error, pattern in cases(dims) + extra:
                yield pytest.param(kind, dims, call, error, pattern, id=f"{kind}-{dims}d-{name}")


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("kind, dims, call, error, pattern", list(all_cases()))
def test_bad_input_is_rejected_and_changes_nothing(implementation, kind, dims, call, error, pattern):
    structure = populated(IMPLEMENTATIONS[implementation], kind, dims)
    before = snapshot(structure, dims)
    with pytest.raises(error, match=pattern):
        call(structure)
    structure.validate()
    assert snapshot(structure, dims) == before
    if kind == "Broadphase":
        begun, ended = structure.update()
        assert begun.shape == ended.shape == (0, 2)


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("kind", ["Tree", "Broadphase"])
@pytest.mark.parametrize("arguments, pattern", [
    ({"dims": 4}, r"dims must be 2 or 3"),
    ({"dims": 1}, r"dims must be 2 or 3"),
    ({"margin": -0.5}, r"margin must be a finite number >= 0"),
    ({"margin": float("nan")}, r"margin must be a finite number >= 0"),
    ({"margin": float("inf")}, r"margin must be a finite number >= 0"),
])
def test_bad_construction_is_rejected(implementation, kind, arguments, pattern):
    with pytest.raises(ValueError, match=pattern):
        getattr(IMPLEMENTATIONS[implementation], kind)(**arguments)


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("kind", ["Tree", "Broadphase"])
def test_garbage_bytes_are_rejected(implementation, kind):
    cls = getattr(IMPLEMENTATIONS[implementation], kind)
    valid = populated(IMPLEMENTATIONS[implementation], kind, 3).to_bytes()
    for data in (b"", b"not a tree at all", valid[: len(valid) // 2]):
        with pytest.raises(ValueError):
            cls.from_bytes(data)


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("kind", ["Tree", "Broadphase"])
def test_membership_of_things_that_are_not_ids_is_false(implementation, kind):
    structure = populated(IMPLEMENTATIONS[implementation], kind, 3)
    assert 100 in structure and np.uint64(119) in structure
    for value in (-1, 2**64, 100.0, "100", None, (100,)):
        assert value not in structure, value


def test_mask_must_be_an_integer_and_tree_bytes_must_be_a_tree():
    import dbvt
    from dbvt import reference
    for kind in (dbvt.Broadphase, reference.Broadphase):
        bp = kind()
        bp.create([1], [[0, 0, 0, 1, 1, 1]])
        for mask in (1.5, "3", True):
            with pytest.raises(ValueError, match="mask"):
                bp.query_aabb([[0, 0, 0, 1, 1, 1]], mask=mask)
    with pytest.raises(ValueError, match="more than a dbvt Tree"):
        dbvt.Tree.from_bytes(dbvt.Broadphase().to_bytes())
