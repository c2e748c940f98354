"""Exact answers for a workload: the pair counts and query hits any broadphase must reproduce.

Checking all N^2 pairs, or every query against every box, takes too long at N = 100k for a
benchmark's set-up, so a uniform grid only chooses candidates, and each candidate gets the exact
test: closed intervals on the float32 boxes, and for segments and frusta the float64 arithmetic of
`dbvt.reference`, the core's brute-force twin, operation for operation. The grid can only ever
choose too many candidates, never too few, so the answers stay exact:

- Every box is filed under the grid cell of its min corner. A box that touches a region [lo, hi]
  has its min corner in [lo - widest, hi] on every axis (its max corner is at most the widest box's
  side above its min), so only the cells covering that range are searched. Flooring a division by
  a positive constant is monotone in floating point, so no box whose min corner lies in the range
  can be filed outside those cells, whatever the cells' size; the size only sets the speed.
- Cells are numbered with axis 0 varying fastest and boxes sorted by cell number, so the boxes of
  a run of cells along axis 0 are one contiguous slice of that order.

Cells are as wide as the widest box, so each holds a few boxes in both workloads (W1: about 0.5,
W2: about 3); a workload with one huge box among small ones would make this slow, never wrong.
"""
from __future__ import annotations

import itertools

import numpy as np

# Widens the grid's cell and query ranges past float64 rounding of float32 coordinates (~1e-13 here).
SLACK = 1e-6


def _spans(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For spans [first[i], first[i] + count[i]): the span each element comes from, and the element."""
    owner = np.repeat(np.arange(len(first)), count)
    within = np.arange(len(owner)) - np.repeat(np.cumsum(count) - count, count)
    return owner, np.repeat(first, count) + within


class Grid:
    """Boxes filed by the cell of their min corner, answering which boxes may touch given regions."""

    def __init__(self, boxes: np.ndarray, dims: int):
        self.dims = dims
        lo = boxes[:, :dims].astype(np.float64)
        self.widest = float((boxes[:, dims:].astype(np.float64) - lo).max(initial=0.0)) * (1 + SLACK) + SLACK
        self.origin = lo.min(axis=0) if len(lo) else np.zeros(dims)
        span = lo.max(axis=0) - self.origin if len(lo) else np.zeros(dims)
        # Cells as wide as the widest box, so a box's range spans at most three a side; wider where
        # boxes are far apart, so there are at most about four cells a box in the table of where
        # each cell's boxes start.
        self.cell = max(self.widest, float(np.prod(span + self.widest) / (4 * len(lo) + 1)) ** (1 / dims))
        # One empty cell on either side of the occupied ones, so clipped ranges stay inside the numbering.
        self.extent = np.floor(span / self.cell).astype(np.int64) + 3
        cells = self._cells(lo)
        self.stride = np.concatenate([[1], np.cumprod(self.extent[:-1])]).astype(np.int64)
        keys = cells @ self.stride
        self.order = np.argsort(keys, kind="stable")
        self.start = np.zeros(int(np.prod(self.extent)) + 1, np.int64)
        np.cumsum(np.bincount(keys, minlength=len(self.start) - 1), out=self.start[1:])

    def _cells(self, points: np.ndarray) -> np.ndarray:
        """Cell coordinates of points, clipped to the numbering (points may be infinite)."""
        return np.clip(np.floor((points - self.origin) / self.cell) + 1, 0, self.extent - 1).astype(np.int64)

    def candidates(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(region, box row) of every box whose min corner lies in [lo - widest, hi] of its region:
        a superset of the boxes that touch the regions [lo, hi], given as (r, dims) float64 arrays.
        A region with lo > hi on an axis is empty."""
        first = self._cells(lo - self.widest)
        last = np.maximum(self._cells(hi), first - 1)
        # Every row of cells along axis 0 that a region covers, as (region, key of its first cell).
        region, base = np.arange(len(lo)), first @ self.stride
        for axis in range(1, self.dims):
            owner, cell = _spans(first[:, axis], last[:, axis] - first[:, axis] + 1)
            region, base = region[owner], base[owner] + (cell - first[owner, axis]) * self.stride[axis]
            first, last = first[owner], last[owner]
        start = self.start[base]
        row, position = _spans(start, self.start[base + last[:, 0] - first[:, 0] + 1] - start)
        return region[row], self.order[position]


def pair_count(boxes: np.ndarray, dims: int) -> int:
    """How many unordered pairs of the (n, 2 dims) float32 boxes overlap, on closed intervals."""
    grid = Grid(boxes, dims)
    lo, hi = boxes[:, :dims], boxes[:, dims:]
    a, b = grid.candidates(lo.astype(np.float64), hi.astype(np.float64))
    a, b = a[a < b], b[a < b]
    return int(((lo[a] <= hi[b]) & (lo[b] <= hi[a])).all(axis=1).sum())


def box_touches(queries: np.ndarray, boxes: np.ndarray, q: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether query box q[i] and box b[i] overlap: closed intervals, compared in float32."""
    return ((queries[q, :3] <= boxes[b, 3:]) & (boxes[b, :3] <= queries[q, 3:])).all(axis=1)


def segment_touches(segments: np.ndarray, boxes: np.ndarray, q: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether segment q[i] meets box b[i]: the slab test on t in [0, 1], in float64, operation for
    operation as dbvt.reference (and so the core) computes it, so borderline hits agree."""
    lo, hi = boxes[b, :3].astype(np.float64), boxes[b, 3:].astype(np.float64)
    o = segments[q, :3].astype(np.float64)
    d = segments[q, 3:].astype(np.float64) - o
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / d
        t1, t2 = (lo - o) * inv, (hi - o) * inv
    parallel = d == 0
    inside = (lo <= o) & (o <= hi)
    near = np.where(parallel, np.where(inside, -np.inf, np.inf), np.minimum(t1, t2)).max(axis=1)
    far = np.where(parallel, np.where(inside, np.inf, -np.inf), np.maximum(t1, t2)).min(axis=1)
    return (near <= far) & (far >= 0.0) & (near <= 1.0)


def frustum_touches(planes: np.ndarray, boxes: np.ndarray, q: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether box b[i] passes frustum q[i]: for every plane, its corner furthest along the normal
    has n.p + d >= 0, summed in float64 in dbvt.reference's order."""
    p = planes[q].astype(np.float64)
    normal = p[..., :3]
    corner = np.where(normal >= 0, boxes[b, None, 3:].astype(np.float64), boxes[b, None, :3].astype(np.float64))
    s = normal[..., 0] * corner[..., 0]
    for axis in (1, 2):
        s = s + normal[..., axis] * corner[..., axis]
    return (s + p[..., 3] >= 0).all(axis=1)


def hits(grid: Grid, lo: np.ndarray, hi: np.ndarray, touches, chunk: int) -> list[np.ndarray]:
    """Ascending hit rows of every query: `touches(q, b)` decides candidate pairs, and the candidates
    of query i lie in the region [lo[i], hi[i]]. `chunk` queries at a time bound the memory held."""
    found_q, found_b = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for first in range(0, len(lo), chunk):
        q, b = grid.candidates(lo[first:first + chunk], hi[first:first + chunk])
        keep = touches(q + first, b)
        found_q.append(q[keep] + first)
        found_b.append(b[keep])
    q, b = np.concatenate(found_q), np.concatenate(found_b)
    order = np.lexsort((b, q))
    return np.split(b[order], np.searchsorted(q[order], np.arange(1, len(lo))))


def frustum_bounds(planes: np.ndarray, reach: float, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) bounds, per frustum of the (F, k, 4) planes, of the centres in [lo, hi] of boxes with
    no half side longer than `reach` that pass the frustum's test.

    A box passes a plane when its corner furthest along the normal n is inside, and that corner is
    at most |n|_1 reach further along n than the centre: so the centre lies in the frustum with each
    plane pushed out by that much, and in [lo, hi]. That body is closed, whatever the planes, and
    its corners are among the points where three of its planes meet: those inside all its planes
    bound it. None inside means it is empty, and the bounds are left empty too."""
    dims = lo.shape[0]
    walls = np.concatenate([np.eye(dims), -np.eye(dims)])
    box_planes = np.concatenate([walls, np.concatenate([-lo, hi])[:, None]], axis=1)
    p = planes.astype(np.float64)
    normals = np.concatenate([p[..., :dims], np.broadcast_to(walls, (len(p), *walls.shape))], axis=1)
    offsets = np.concatenate([p[..., dims] + np.abs(p[..., :dims]).sum(axis=2) * reach,
                              np.broadcast_to(box_planes[:, dims], (len(p), len(walls)))], axis=1)
    triples = np.array(list(itertools.combinations(range(normals.shape[1]), dims)))
    matrices, sides = normals[:, triples], -offsets[:, triples]
    # Three planes whose normals are nearly coplanar meet far away, if at all: no corner there.
    solvable = np.abs(np.linalg.det(matrices)) > 1e-12
    matrices[~solvable] = np.eye(dims)
    corners = np.linalg.solve(matrices, sides[..., None])[..., 0]
    scale = 1 + np.abs(corners).max(axis=2)
    inside = (np.einsum("fpk,ftk->ftp", normals, corners) + offsets[:, None, :]
              >= -SLACK * scale[..., None]).all(axis=2) & solvable
    pad = SLACK * np.where(inside, scale, 0).max(axis=1, keepdims=True)
    return (np.where(inside[..., None], corners, np.inf).min(axis=1) - pad,
            np.where(inside[..., None], corners, -np.inf).max(axis=1) + pad)


def query_hits(boxes: np.ndarray, q_aabb: np.ndarray, q_ray: np.ndarray, q_frustum: np.ndarray) -> dict:
    """Ascending hit rows of each query of W1's sets on 3-D `boxes`: {"aabb": [...], "ray": [...],
    "frustum": [...]}, queries as (Q, 6), (R, 6) and (F, 6, 4) float32 arrays."""
    grid = Grid(boxes, 3)
    aabb = hits(grid, q_aabb[:, :3].astype(np.float64), q_aabb[:, 3:].astype(np.float64),
                lambda q, b: box_touches(q_aabb, boxes, q, b), chunk=1000)
    # A box the closed segment meets holds one of its points, which lie between its ends.
    ends = q_ray.reshape(-1, 2, 3).astype(np.float64)
    pad = SLACK * (1 + np.abs(ends).max(initial=0.0))
    ray = hits(grid, ends.min(axis=1) - pad, ends.max(axis=1) + pad,
               lambda q, b: segment_touches(q_ray, boxes, q, b), chunk=200)
    centres = (boxes[:, :3].astype(np.float64) + boxes[:, 3:]) / 2
    bounds = frustum_bounds(q_frustum, grid.widest / 2, centres.min(axis=0), centres.max(axis=0))
    frustum = hits(grid, *bounds, lambda q, b: frustum_touches(q_frustum, boxes, q, b), chunk=10)
    return {"aabb": aabb, "ray": ray, "frustum": frustum}


def w1_expected(boxes, move_ids, move_boxes, q_aabb, q_ray, q_frustum, listed: int = 100) -> dict:
    """W1's expected.json: pairs at step 0 and after every step, total hits of each query set on the
    initial boxes, and the ascending hit rows of the first `listed` queries of each set."""
    expected = {"pairs_step0": pair_count(boxes, 3)}
    for name, found in query_hits(boxes, q_aabb, q_ray, q_frustum).items():
        expected[f"{name}_hits"] = int(sum(len(h) for h in found))
        expected[f"{name}_first100"] = [h.tolist() for h in found[:listed]]
    expected["pairs_per_step"] = _pairs_per_step(boxes, move_ids, move_boxes, 3)
    return expected


def w2_expected(boxes, move_ids, move_boxes, dims: int) -> dict:
    """W2's expected.json: pairs at step 0 and after every step."""
    return {"pairs_step0": pair_count(boxes, dims),
            "pairs_per_step": _pairs_per_step(boxes, move_ids, move_boxes, dims)}


def _pairs_per_step(boxes, move_ids, move_boxes, dims: int) -> list[int]:
    current, counts = boxes.copy(), []
    for ids, moved in zip(move_ids, move_boxes):
        current[ids.astype(np.int64)] = moved
        counts.append(pair_count(current, dims))
    return counts

