"""W1-like worlds for the tests, and the exact comparisons the tests make on their answers.

The world follows the W1 benchmark's recipe (n boxes with sides 1..4 in a cube of side 5 n^(1/dims), so
a box touches about one other; a tenth of them move each step with their own bouncing velocity) but is
generated here, so the tests never depend on the benchmark's files. Ids are random 64-bit values, not
0..n-1, so the core's id table is exercised with large and sparse keys.
"""
from __future__ import annotations

import math

import numpy as np

from dbvt_server.worlds import FAT_PAIRS_PER_PAIR


class W1World:
    def __init__(self, n: int, dims: int = 3, seed: int = 0, moving_fraction: float = 0.1):
        self.rng = np.random.default_rng(seed)
        self.n, self.dims = n, dims
        self.side = 5.0 * n ** (1.0 / dims)
        self.ids = unique_ids(self.rng, n)
        self.half = self.rng.uniform(0.5, 2.0, size=(n, dims))
        self.centers = self.rng.uniform(0.0, self.side, size=(n, dims))
        velocity = self.rng.normal(size=(n, dims))
        velocity /= np.linalg.norm(velocity, axis=1, keepdims=True)
        self.velocity = velocity * self.rng.uniform(0.0, 0.5, size=(n, 1))
        self.moves_per_step = int(n * moving_fraction)

    @property
    def boxes(self) -> np.ndarray:
        return boxes_around(self.centers, self.half)

    def step(self, movable: np.ndarray | None = None):
        """Move a random tenth (of `movable` rows, default all) one step; returns (ids, new boxes)."""
        pool = np.arange(self.n) if movable is None else np.flatnonzero(movable)
        rows = np.sort(self.rng.choice(pool, min(self.moves_per_step, len(pool)), replace=False))
        moved = self.centers[rows] + self.velocity[rows]
        outside = (moved < 0.0) | (moved > self.side)
        self.velocity[rows] = np.where(outside, -self.velocity[rows], self.velocity[rows])
        self.centers[rows] = np.clip(moved, 0.0, self.side)
        return self.ids[rows], boxes_around(self.centers[rows], self.half[rows])

    def query_boxes(self, q: int, half: float = 5.0) -> np.ndarray:
        return boxes_around(self.rng.uniform(0.0, self.side, size=(q, self.dims)), np.full((q, self.dims), half))

    def spheres(self, q: int):
        centers = self.rng.uniform(0.0, self.side, size=(q, self.dims)).astype(np.float32)
        return centers, self.rng.uniform(0.0, 6.0, size=q).astype(np.float32)

    def segments(self, q: int, length: float = 50.0) -> np.ndarray:
        """Random segments, with some axis-parallel and some of zero length (the slab test's edge cases)."""
        start = self.rng.uniform(0.0, self.side, size=(q, self.dims))
        direction = self.rng.normal(size=(q, self.dims))
        parallel = self.rng.random(q) < 0.2
        direction[parallel] = np.eye(self.dims)[self.rng.integers(0, self.dims, parallel.sum())]
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        end = start + length * direction
        degenerate = self.rng.random(q) < 0.05
        end[degenerate] = start[degenerate]
        return np.concatenate([start, end], axis=1).astype(np.float32)

    def frusta(self, q: int, far: float = 50.0) -> np.ndarray:
        """(q, k, dims+1) inward planes of view volumes looking in random directions from random eyes."""
        eyes = self.rng.uniform(0.0, self.side, size=(q, self.dims))
        forwards = self.rng.normal(size=(q, self.dims))
        return np.stack([view_planes(eye, fwd, self.rng.normal(size=self.dims), far=far)
                         for eye, fwd in zip(eyes, forwards)]).astype(np.float32)

    def polytopes(self, q: int, k: int) -> np.ndarray:
        """(q, k, dims+1) planes of convex k-DOPs: k random planes tangent to a sphere inside the world."""
        centers = self.rng.uniform(0.0, self.side, size=(q, 1, self.dims))
        normals = self.rng.normal(size=(q, k, self.dims))
        normals /= np.linalg.norm(normals, axis=2, keepdims=True)
        radius = self.rng.uniform(5.0, 40.0, size=(q, 1))
        offsets = (normals * centers).sum(axis=2) + radius
        return np.concatenate([-normals, offsets[..., None]], axis=2).astype(np.float32)


def unique_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    ids = np.unique(rng.integers(0, 2**64 - 1, size=n + n // 8 + 16, dtype=np.uint64, endpoint=True))
    return rng.permutation(ids)[:n]


def boxes_around(centers: np.ndarray, half: np.ndarray) -> np.ndarray:
    return np.concatenate([centers - half, centers + half], axis=1).astype(np.float32)


def view_planes(eye, forward, up, fov: float = math.radians(60), near: float = 0.1, far: float = 50.0):
    """Inward planes (n, d) of a symmetric perspective view volume: near, far, then the sides through the
    eye (2 sides in 2-D, 4 in 3-D). A point p is inside when n.p + d >= 0 for every plane."""
    f = forward / np.linalg.norm(forward)
    if len(f) == 2:
        sides = [np.array([-f[1], f[0]])]
    else:
        right = np.cross(f, up)
        right /= np.linalg.norm(right)
        sides = [right, np.cross(right, f)]
    slope = math.tan(fov / 2)
    planes = [(f, -f @ (eye + near * f)), (-f, f @ (eye + far * f))]
    for side in sides:
        for sign in (1.0, -1.0):
            normal = f * slope - sign * side
            normal /= np.linalg.norm(normal)
            planes.append((normal, -normal @ eye))
    return np.array([np.append(normal, d) for normal, d in planes])


def assert_same_csr(got, expected, what: str = "query"):
    """CSR results equal exactly: dtypes, offsets, hits (and fractions for raycasts)."""
    assert len(got) == len(expected), f"{what}: {len(got)} result arrays, expected {len(expected)}"
    names = ("offsets", "hits", "fractions")
    for name, a, b in zip(names, got, expected):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, f"{what}: {name} dtype {a.dtype}, expected {b.dtype}"
        if not np.array_equal(a, b):
            raise AssertionError(f"{what}: {name} differ\n{describe_csr_difference(got, expected)}")


def describe_csr_difference(got, expected) -> str:
    offsets_a, offsets_b = np.asarray(got[0]), np.asarray(expected[0])
    if offsets_a.shape != offsets_b.shape:
        return f"offsets shape {offsets_a.shape} vs {offsets_b.shape}"
    for q in range(len(offsets_a) - 1):
        parts = [tuple(np.asarray(arr)[off[q]:off[q + 1]].tolist() for arr in result[1:])
                 for result, off in ((got, offsets_a), (expected, offsets_b))]
        if parts[0] != parts[1]:
            return f"first differing query {q}: got {parts[0]}, expected {parts[1]}"
    return "offsets equal, values differ"


def assert_same_pairs(got, expected, what: str = "pairs"):
    got = np.asarray(got)
    assert got.dtype == np.uint64 and got.ndim == 2 and got.shape[1] == 2, f"{what}: {got.dtype} {got.shape}"
    if not np.array_equal(got, expected):
        extra = set(map(tuple, got.tolist())) - set(map(tuple, np.asarray(expected).tolist()))
        missing = set(map(tuple, np.asarray(expected).tolist())) - set(map(tuple, got.tolist()))
        raise AssertionError(f"{what} differ: {len(got)} vs {len(expected)} rows; unexpected {sorted(extra)[:5]}, "
                             f"missing {sorted(missing)[:5]}, order equal as sets: {not extra and not missing}")


def update_both(real, ref):
    """One update() of the core and of the reference: the same pairs begun and ended, and the same
    sensor events."""
    for got, expected in zip(real.update(), ref.update()):
        np.testing.assert_array_equal(got, expected)
    for got, expected in zip(real.sensor_events(), ref.sensor_events()):
        np.testing.assert_array_equal(got, expected)


def assert_a_pair_limit_refusal(refusal: Exception, pairs: int, limit: int) -> None:
    """A batch refused by a world's pair limit `limit`, whose reference says it would make `pairs`:
    past the limit, for its pairs (named exactly) or its fat boxes' pairs; within it, only for the fat
    boxes' pairs (FAT_PAIRS_PER_PAIR times the limit, a bound on memory; docs/operations.md, Limits)."""
    told = str(refusal)
    if f"more than {FAT_PAIRS_PER_PAIR * limit} pairs of boxes grown" not in told:
        assert pairs > limit and f"{pairs} pairs, past its limit of {limit}" in told, told
