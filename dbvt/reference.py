"""Brute-force twin of `dbvt.Tree` and `dbvt.Broadphase`: the oracle the tests compare the core against.

Same names, arguments, result shapes, errors and messages as the Cython core (arguments go through
`dbvt.validation` in the same order), and the same floating-point recipe for every test, so the two
must agree bit for bit. Every answer is computed over all proxies with numpy; nothing is clever here
except that proxies are kept sorted by id, so hits found in row order are already in id order.
"""
from __future__ import annotations

import io
import operator

import numpy as np

from dbvt import validation as v

# Elements per temporary (queries x proxies x axes): keeps a 10k-proxy world's scratch arrays small.
_SCRATCH = 1 << 21
_F64 = np.float64


def _chunks(count: int, cost_per_item: int):
    step = max(1, _SCRATCH // max(cost_per_item, 1))
    for start in range(0, count, step):
        yield start, min(count, start + step)


def _csr(q: int, query_rows: np.ndarray, hits: np.ndarray):
    offsets = np.zeros(q + 1, np.int64)
    np.cumsum(np.bincount(query_rows, minlength=q), out=offsets[1:])
    return offsets, np.ascontiguousarray(hits, dtype=np.uint64)


def _fraction_csr(q: int, query_rows: list, proxy_rows: list, fractions: list, ids: np.ndarray, first_hit: bool):
    """(offsets, hits, fractions) of the hits found chunk by chunk, each query's ordered by fraction
    then id; with first_hit, only each query's first."""
    qi, pi, fr = np.concatenate(query_rows), np.concatenate(proxy_rows), np.concatenate(fractions)
    # Rows are ascending by id within a query, so sorting by (query, fraction, row) is (fraction, id).
    order = np.lexsort((pi, fr, qi))
    qi, pi, fr = qi[order], pi[order], fr[order]
    if first_hit:
        first = np.ones(len(qi), bool)
        first[1:] = qi[1:] != qi[:-1]
        qi, pi, fr = qi[first], pi[first], fr[first]
    offsets, hits = _csr(q, qi, ids[pi])
    return offsets, hits, np.ascontiguousarray(fr, dtype=_F64)


def _matrix_csr(q: int, boxes: np.ndarray, ids: np.ndarray, cost: int, hit_matrix):
    """CSR of the (q, n) boolean matrices `hit_matrix(start, stop)`, computed a few queries at a time."""
    query_rows, proxy_rows = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for start, stop in _chunks(q, len(boxes) * cost):
        qi, pi = np.nonzero(hit_matrix(start, stop))
        query_rows.append(qi + start)
        proxy_rows.append(pi)
    return _csr(q, np.concatenate(query_rows), ids[np.concatenate(proxy_rows)])


def box_hits(tight, ids, dims, queries):
    lo, hi = tight[:, :dims], tight[:, dims:]

    def overlap(a, b):
        return ((queries[a:b, None, :dims] <= hi) & (lo <= queries[a:b, None, dims:])).all(axis=2)

    return _matrix_csr(len(queries), tight, ids, dims, overlap)


def sphere_hits(tight, ids, dims, centers, radii):
    lo, hi = tight[:, :dims].astype(_F64), tight[:, dims:].astype(_F64)
    r = radii.astype(_F64)

    def touches(a, b):
        c = centers[a:b, None, :].astype(_F64)
        gap = np.minimum(np.maximum(c, lo), hi) - c
        dist2 = gap[..., 0] * gap[..., 0]
        for axis in range(1, dims):
            dist2 = dist2 + gap[..., axis] * gap[..., axis]
        return dist2 <= (r[a:b] * r[a:b])[:, None]

    return _matrix_csr(len(centers), tight, ids, dims, touches)


def _segment_entry(tight, dims, segments):
    """(q, n) entry parameters of the slab test, +inf where the closed segment misses the box."""
    lo, hi = tight[:, :dims].astype(_F64), tight[:, dims:].astype(_F64)
    o = segments[:, None, :dims].astype(_F64)
    d = segments[:, None, dims:].astype(_F64) - o
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / d
        t1, t2 = (lo - o) * inv, (hi - o) * inv
    parallel = d == 0
    inside = (lo <= o) & (o <= hi)
    near = np.where(parallel, np.where(inside, -np.inf, np.inf), np.minimum(t1, t2)).max(axis=2)
    far = np.where(parallel, np.where(inside, np.inf, -np.inf), np.maximum(t1, t2)).min(axis=2)
    hit = (near <= far) & (far >= 0.0) & (near <= 1.0)
    return np.where(hit, np.maximum(near, 0.0), np.inf)


def ray_hits(tight, ids, dims, segments, first_hit):
    q = len(segments)
    query_rows, proxy_rows, fractions = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    for start, stop in _chunks(q, len(tight) * dims * 4):
        entry = _segment_entry(tight, dims, segments[start:stop])
        qi, pi = np.nonzero(entry != np.inf)
        query_rows.append(qi + start)
        proxy_rows.append(pi)
        fractions.append(entry[qi, pi])
    return _fraction_csr(q, query_rows, proxy_rows, fractions, ids, first_hit)


def frustum_hits(tight, ids, dims, planes):
    lo, hi = tight[:, :dims].astype(_F64), tight[:, dims:].astype(_F64)
    k = planes.shape[1]

    def inside(a, b):
        p = planes[a:b, :, None, :].astype(_F64)
        normal = p[..., :dims]
        vertex = np.where(normal >= 0, hi, lo)
        s = normal[..., 0] * vertex[..., 0]
        for axis in range(1, dims):
            s = s + normal[..., axis] * vertex[..., axis]
        s = s + p[..., dims]
        return (s >= 0).all(axis=1)

    return _matrix_csr(len(planes), tight, ids, dims * k * 2, inside)


def _axis_gaps(p, lo, hi):
    """Per axis, how far p lies outside [lo, hi] (0 inside), as the core computes it."""
    return np.where(p < lo, lo - p, np.where(p > hi, p - hi, 0.0))


def _squared_sum(gaps, dims):
    """Sum of squares over the last axis, in axis order (numpy's sum may pair terms differently)."""
    total = gaps[..., 0] * gaps[..., 0]
    for axis in range(1, dims):
        total = total + gaps[..., axis] * gaps[..., axis]
    return total


def nearest_hits(tight, ids, dims, points, k, max_distance):
    """For each point its k nearest boxes within max_distance, by (squared float64 distance, id)."""
    lo, hi = tight[:, :dims].astype(_F64), tight[:, dims:].astype(_F64)
    reach = float(max_distance) * float(max_distance)
    keep = min(k, len(tight))
    query_rows, proxy_rows, gaps = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    for start, stop in _chunks(len(points), len(tight) * dims):
        gap = _squared_sum(_axis_gaps(points[start:stop, None, :].astype(_F64), lo, hi), dims)
        # A stable sort keeps rows, which are in id order, in id order among equal distances.
        order = np.argsort(gap, axis=1, kind="stable")[:, :keep]
        nearest = np.take_along_axis(gap, order, axis=1)
        qi, rank = np.nonzero(nearest <= reach)
        query_rows.append(qi + start)
        proxy_rows.append(order[qi, rank])
        gaps.append(nearest[qi, rank])
    offsets, hits = _csr(len(points), np.concatenate(query_rows), ids[np.concatenate(proxy_rows)])
    return offsets, hits, np.sqrt(np.concatenate(gaps)).astype(np.float32)


def _sweep_slab(tight, dims, lower, upper, radius, delta):
    """(q, n) [enter, leave] within [0, 1] of the slab test of each moving shape's box (a ball's:
    its centre grown by r) against each box; enter is +inf where they never overlap."""
    lo = (tight[None, :, :dims].astype(_F64) - upper[:, None, :]) - radius[:, None, None]
    hi = (tight[None, :, dims:].astype(_F64) - lower[:, None, :]) + radius[:, None, None]
    d = delta[:, None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        t1, t2 = lo / d, hi / d
    still = d == 0
    apart = (lo > 0) | (hi < 0)
    near = np.where(still, np.where(apart, np.inf, -np.inf), np.minimum(t1, t2)).max(axis=2)
    far = np.where(still, np.where(apart, -np.inf, np.inf), np.maximum(t1, t2)).min(axis=2)
    hit = (near <= far) & (far >= 0.0) & (near <= 1.0)
    return np.where(hit, np.maximum(near, 0.0), np.inf), np.minimum(far, 1.0)


def _ball_gap(lo, hi, centre, delta, t, dims):
    return _squared_sum(_axis_gaps(centre + t[:, None] * delta, lo, hi), dims)


def _piece_touch(lo, hi, centre, delta, radius_sq, a, b, dims):
    """First t in [a, b] where the ball touches the box on a piece of the path along which each axis is
    below, inside or above the box throughout: the smaller root of one quadratic."""
    m = 0.5 * (a + b)
    qa, qb, qc = np.zeros(len(a)), np.zeros(len(a)), np.zeros(len(a))
    for i in range(dims):
        p = centre[:, i] + m * delta[:, i]
        below, above = p < lo[:, i], p > hi[:, i]
        alpha = np.where(below, lo[:, i] - centre[:, i], centre[:, i] - hi[:, i])
        beta = np.where(below, -delta[:, i], delta[:, i])
        active = below | above
        qa = np.where(active, qa + beta * beta, qa)
        qb = np.where(active, qb + alpha * beta, qb)
        qc = np.where(active, qc + alpha * alpha, qc)
    qb = 2.0 * qb
    qc = qc - radius_sq
    disc = qb * qb - 4.0 * qa * qc
    root = np.sqrt(np.maximum(disc, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        rising = qb <= 0.0
        large = np.where(rising, (root - qb) / (2.0 * qa), (2.0 * qc) / (-qb - root))
        small = np.where(rising, np.where(root - qb > 0.0, (2.0 * qc) / (root - qb), 0.0), (-qb - root) / (2.0 * qa))
    flat = qa == 0.0
    touch = np.where(flat, qc <= 0.0, (disc >= 0.0) & ~(small > b) & ~(large < a))
    return touch, np.where(flat | ~(small > a), a, small)


def _ball_first_touch(lo, hi, centre, delta, radius_sq, enter, leave, dims):
    """(touches, t) per candidate pair: the first t in [enter, leave] at which the ball touches the box.
    The squared distance along the path is convex and piecewise quadratic, cut where the centre crosses
    a plane of the box; the first touch is at enter, or in the first piece that reaches r^2."""
    found = _ball_gap(lo, hi, centre, delta, enter, dims) <= radius_sq
    t = enter.copy()
    cuts = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(dims):
            for bound in (lo[:, i], hi[:, i]):
                x = (bound - centre[:, i]) / delta[:, i]
                cuts.append(np.where((delta[:, i] != 0.0) & (enter < x) & (x < leave), x, np.inf))
    ends = np.sort(np.stack(cuts, axis=1), axis=1) if cuts else np.zeros((len(enter), 0))
    ends = np.concatenate([ends, leave[:, None]], axis=1)
    ends = np.where(np.isinf(ends), leave[:, None], ends)
    starts = np.concatenate([enter[:, None], ends[:, :-1]], axis=1)
    for j in range(ends.shape[1]):
        a, b = starts[:, j], ends[:, j]
        touch, at = _piece_touch(lo, hi, centre, delta, radius_sq, a, b, dims)
        touch &= (a < b) & ~found
        t = np.where(touch, at, t)
        found |= touch
    return found, t


def sweep_hits(tight, ids, dims, shapes, radii, displacements, first_hit):
    """Box casts (radii None, shapes are boxes) or ball casts (shapes are centres): (offsets, hits,
    fractions), the first t each shape touches each box, ordered by t then id."""
    q = len(shapes)
    lower = shapes[:, :dims].astype(_F64)
    upper = lower if radii is not None else shapes[:, dims:].astype(_F64)
    radius = radii.astype(_F64) if radii is not None else np.zeros(q)
    delta = displacements.astype(_F64)
    query_rows, proxy_rows, fractions = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    for start, stop in _chunks(q, len(tight) * dims * 6):
        part = slice(start, stop)
        enter, leave = _sweep_slab(tight, dims, lower[part], upper[part], radius[part], delta[part])
        qi, pi = np.nonzero(enter != np.inf)
        t = enter[qi, pi]
        if radii is not None:
            box = tight[pi].astype(_F64)
            touch, t = _ball_first_touch(box[:, :dims], box[:, dims:], lower[part][qi], delta[part][qi],
                                         radius[part][qi] * radius[part][qi], t, leave[qi, pi], dims)
            qi, pi, t = qi[touch], pi[touch], t[touch]
        query_rows.append(qi + start)
        proxy_rows.append(pi)
        fractions.append(t)
    return _fraction_csr(q, query_rows, proxy_rows, fractions, ids, first_hit)


def crossing_rows(tight_a, tight_b, dims):
    """Row pairs (i in a, j in b) of overlapping boxes, all against all, a few rows of a at a time."""
    found_a, found_b = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for start, stop in _chunks(len(tight_a), len(tight_b) * dims):
        a = tight_a[start:stop, None, :]
        i, j = np.nonzero(((a[..., :dims] <= tight_b[None, :, dims:]) & (tight_b[None, :, :dims] <= a[..., dims:])).all(2))
        found_a.append(i + start)
        found_b.append(j)
    return np.concatenate(found_a), np.concatenate(found_b)


def overlapping_rows(tight, dims):
    """Row pairs (a, b) of all overlapping boxes, each unordered pair once.

    A sweep along axis 0 only chooses candidates (every box whose min lies in another's [min, max]);
    each candidate then gets the full closed-interval test on all axes.
    """
    n = len(tight)
    order = np.argsort(tight[:, 0], kind="stable")
    lo0 = tight[order, 0]
    end = np.searchsorted(lo0, tight[order, dims], side="right")
    count = np.maximum(end - np.arange(1, n + 1), 0)
    total = np.cumsum(count)
    found_a, found_b = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    start = 0
    while start < n:
        done = total[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(total, done + _SCRATCH, side="right")))
        block = count[start:stop]
        src = np.repeat(np.arange(start, stop), block)
        dst = src + 1 + np.arange(len(src)) - np.repeat(np.cumsum(block) - block, block)
        a, b = order[src], order[dst]
        ok = ((tight[a, :dims] <= tight[b, dims:]) & (tight[b, :dims] <= tight[a, dims:])).all(axis=1)
        found_a.append(a[ok])
        found_b.append(b[ok])
        start = stop
    return np.concatenate(found_a), np.concatenate(found_b)


def pair_rows(ids, a, b):
    """(m, 2) uint64 id pairs, each row (low, high), rows sorted."""
    x, y = ids[a], ids[b]
    rows = np.stack([np.minimum(x, y), np.maximum(x, y)], axis=1).astype(np.uint64)
    return np.ascontiguousarray(rows[np.lexsort((rows[:, 1], rows[:, 0]))])


class _Proxies:
    """Per-proxy columns kept sorted by id."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.ids = np.zeros(0, np.uint64)
        self.columns = columns

    def __len__(self):
        return len(self.ids)

    def find(self, ids: np.ndarray) -> np.ndarray:
        """Row of each id, -1 where absent."""
        if not len(self.ids):
            return np.full(len(ids), -1, np.int64)
        pos = np.searchsorted(self.ids, ids)
        clipped = np.minimum(pos, len(self.ids) - 1)
        return np.where(self.ids[clipped] == ids, clipped, -1).astype(np.int64)

    def check_new(self, ids: np.ndarray) -> None:
        _raise_first_problem(ids, self.find(ids) >= 0, v.already_present)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        rows = self.find(ids)
        _raise_first_problem(ids, rows < 0, v.unknown_id)
        return rows

    def add(self, ids: np.ndarray, **values: np.ndarray) -> None:
        merged = np.concatenate([self.ids, ids])
        order = np.argsort(merged, kind="stable")
        self.ids = merged[order]
        for name, column in self.columns.items():
            self.columns[name] = np.concatenate([column, values[name]])[order]

    def delete(self, rows: np.ndarray) -> None:
        keep = np.ones(len(self.ids), bool)
        keep[rows] = False
        self.ids = self.ids[keep]
        for name, column in self.columns.items():
            self.columns[name] = column[keep]

    def dump(self) -> dict[str, np.ndarray]:
        return {"ids": self.ids, **self.columns}

    def load(self, arrays) -> None:
        self.ids = np.asarray(arrays["ids"], np.uint64)
        for name, column in self.columns.items():
            self.columns[name] = np.asarray(arrays[name], column.dtype)

    def check(self, dims: int) -> None:
        if len(self.ids) > 1 and not (self.ids[1:] > self.ids[:-1]).all():
            raise RuntimeError("ids are not strictly ascending")
        for name, column in self.columns.items():
            if len(column) != len(self.ids):
                raise RuntimeError(f"column {name} has {len(column)} rows for {len(self.ids)} ids")
        tight = self.columns["tight"]
        if not np.isfinite(tight).all() or (tight[:, :dims] > tight[:, dims:]).any():
            raise RuntimeError("a tight box is not finite or is inverted")


def _raise_first_problem(ids: np.ndarray, wrong: np.ndarray, error) -> None:
    """Report the first row that either repeats an earlier row or is `wrong` (present or unknown)."""
    duplicate = v.first_duplicate(ids)
    flagged = np.flatnonzero(wrong)
    first_wrong = int(flagged[0]) if flagged.size else -1
    if duplicate >= 0 and (first_wrong < 0 or duplicate < first_wrong):
        raise v.duplicate_id(duplicate, ids[duplicate])
    if first_wrong >= 0:
        raise error(first_wrong, ids[first_wrong])


def _load_arrays(data: bytes, kind: str, keys) -> dict[str, np.ndarray]:
    data = memoryview(data)  # TypeError for anything not bytes-like, as the core
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except Exception as exc:
        raise ValueError(f"not a serialized reference {kind}: {exc}") from None
    if arrays.get("kind") is None or str(arrays["kind"]) != kind or not set(keys) <= set(arrays):
        raise ValueError(f"not a serialized reference {kind}")
    return arrays


def _save_arrays(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


class _Structure:
    """What Tree and Broadphase share: tight boxes by id, the four queries, and fat boxes, modelled only
    so that `update`/`move` return the same kind of count (moves that left their fat box). The core
    also stretches a new fat box along the move, so its counts are often lower than this twin's."""

    _kind = ""

    def __init__(self, dims: int, margin: float, **columns: np.ndarray):
        self._dims = v.check_dims(dims)
        # The core keeps the margin as a float32; so does this twin, so both fatten by the same amount.
        self._margin = float(np.float32(v.check_margin(margin)))
        width = 2 * self._dims
        self._proxies = _Proxies({"tight": np.zeros((0, width), np.float32),
                                  "fat": np.zeros((0, width), np.float32), **columns})

    def _fatten(self, boxes: np.ndarray) -> np.ndarray:
        grow = np.float32(self._margin)
        with np.errstate(over="ignore"):  # near float32's limits a fat box may reach infinity: still a bound
            return np.concatenate([boxes[:, :self._dims] - grow, boxes[:, self._dims:] + grow], axis=1)

    def _retarget(self, ids, boxes) -> int:
        """New tight boxes; a row whose box left its fat box gets a new fat box. Returns how many did."""
        ids = v.as_ids(ids)
        boxes = v.as_boxes(boxes, self._dims, len(ids))
        rows = self._proxies.rows_of(ids)
        columns, d = self._proxies.columns, self._dims
        fat = columns["fat"][rows]
        escaped = ~((fat[:, :d] <= boxes[:, :d]) & (boxes[:, d:] <= fat[:, d:])).all(axis=1)
        columns["tight"][rows] = boxes
        columns["fat"][rows[escaped]] = self._fatten(boxes[escaped])
        return int(escaped.sum())

    def validate(self) -> None:
        self._proxies.check(self._dims)
        tight, fat, d = self._proxies.columns["tight"], self._proxies.columns["fat"], self._dims
        if not ((fat[:, :d] <= tight[:, :d]) & (tight[:, d:] <= fat[:, d:])).all():
            raise RuntimeError("a fat box does not contain its tight box")

    @property
    def dims(self) -> int:
        return self._dims

    @property
    def margin(self) -> float:
        return self._margin

    def __len__(self) -> int:
        return len(self._proxies)

    def __repr__(self) -> str:
        return f"dbvt.reference.{self._kind}(dims={self._dims}, margin={self._margin!r}) with {len(self)} proxies"

    def __contains__(self, id_) -> bool:
        try:
            value = operator.index(id_)  # an integer, never a float that happens to be whole
        except TypeError:
            return False
        if not 0 <= value < 2**64:
            return False
        return bool(self._proxies.find(np.array([value], np.uint64))[0] >= 0)

    def get(self, ids) -> np.ndarray:
        ids = v.as_ids(ids)
        rows = self._proxies.rows_of(ids)
        return self._proxies.columns["tight"][rows].copy()

    def rebuild(self) -> None:
        """Nothing to rebuild: brute force has no hierarchy."""

    def stats(self) -> dict:
        n = len(self._proxies)
        memory = self._proxies.ids.nbytes + sum(c.nbytes for c in self._proxies.columns.values())
        return {"proxies": n, "nodes": n, "height": 0, "area_ratio": 1.0, "memory_bytes": int(memory),
                "dims": self._dims, "margin": self._margin}

    def _visible(self, mask, include_sensors: bool) -> np.ndarray:
        return np.ones(len(self._proxies), bool)

    def _query_set(self, mask, include_sensors: bool):
        keep = self._visible(mask, include_sensors)
        return self._proxies.columns["tight"][keep], self._proxies.ids[keep]

    def _aabb(self, boxes, mask=None, include_sensors=False):
        queries = v.as_boxes(boxes, self._dims)
        return box_hits(*self._query_set(v.as_mask(mask), include_sensors), self._dims, queries)

    def _sphere(self, centers, radii, mask=None, include_sensors=False):
        centers = v.as_points(centers, self._dims, "centers")
        radii = v.as_radii(radii, len(centers))
        return sphere_hits(*self._query_set(v.as_mask(mask), include_sensors), self._dims, centers, radii)

    def _ray(self, segments, first_hit=False, mask=None, include_sensors=False):
        segments = v.as_segments(segments, self._dims)
        return ray_hits(*self._query_set(v.as_mask(mask), include_sensors), self._dims, segments, bool(first_hit))

    def _frustum(self, planes, mask=None, include_sensors=False):
        planes = v.as_planes(planes, self._dims)
        return frustum_hits(*self._query_set(v.as_mask(mask), include_sensors), self._dims, planes)

    def _nearest(self, points, k, max_distance, mask=None, include_sensors=False):
        points = v.as_points(points, self._dims, "points")
        k, max_distance = v.as_count(k), v.as_distance(max_distance)
        return nearest_hits(*self._query_set(v.as_mask(mask), include_sensors), self._dims, points, k, max_distance)

    def _cast_box(self, boxes, displacements, first_hit=False, mask=None, include_sensors=False):
        boxes = v.as_boxes(boxes, self._dims)
        displacements = v.as_displacements(displacements, self._dims, len(boxes), "boxes")
        return sweep_hits(*self._query_set(v.as_mask(mask), include_sensors), self._dims, boxes, None, displacements,
                          bool(first_hit))

    def _cast_sphere(self, centers, radii, displacements, first_hit=False, mask=None, include_sensors=False):
        centers = v.as_points(centers, self._dims, "centers")
        radii = v.as_radii(radii, len(centers))
        displacements = v.as_displacements(displacements, self._dims, len(centers), "centers")
        return sweep_hits(*self._query_set(v.as_mask(mask), include_sensors), self._dims, centers, radii,
                          displacements, bool(first_hit))

    def _dump(self, **extra) -> bytes:
        return _save_arrays(kind=np.array(self._kind), dims=np.array(self._dims),
                            margin=np.array(self._margin), **self._proxies.dump(), **extra)

    @classmethod
    def _restore(cls, data: bytes, keys):
        arrays = _load_arrays(data, cls._kind, ("dims", "margin", "ids", "tight", "fat", *keys))
        made = cls(dims=int(arrays["dims"]), margin=float(arrays["margin"]))
        made._proxies.load(arrays)
        return made, arrays


class Tree(_Structure):
    """Brute-force `dbvt.Tree`."""

    _kind = "Tree"

    def __init__(self, dims: int = 3, margin: float = 0.0, *, threads: int = 1):
        super().__init__(dims, margin)
        self.threads = v.check_threads(threads)     # taken as dbvt.Tree takes it; brute force uses one

    def insert(self, ids, boxes) -> None:
        ids = v.as_ids(ids)
        boxes = v.as_boxes(boxes, self._dims, len(ids))
        self._proxies.check_new(ids)
        self._proxies.add(ids, tight=boxes, fat=self._fatten(boxes))

    def update(self, ids, boxes) -> int:
        return self._retarget(ids, boxes)

    def remove(self, ids) -> None:
        ids = v.as_ids(ids)
        self._proxies.delete(self._proxies.rows_of(ids))

    def query_aabb(self, boxes):
        return self._aabb(boxes)

    def query_sphere(self, centers, radii):
        return self._sphere(centers, radii)

    def raycast(self, segments, first_hit=False):
        return self._ray(segments, first_hit)

    def query_frustum(self, planes):
        return self._frustum(planes)

    def query_nearest(self, points, k, max_distance=np.inf):
        return self._nearest(points, k, max_distance)

    def cast_box(self, boxes, displacements, first_hit=False):
        return self._cast_box(boxes, displacements, first_hit)

    def cast_sphere(self, centers, radii, displacements, first_hit=False):
        return self._cast_sphere(centers, radii, displacements, first_hit)

    def pairs(self) -> np.ndarray:
        a, b = overlapping_rows(self._proxies.columns["tight"], self._dims)
        return pair_rows(self._proxies.ids, a, b)

    def to_bytes(self) -> bytes:
        return self._dump()

    @classmethod
    def from_bytes(cls, data, *, threads: int = 1) -> "Tree":
        made = cls._restore(data, ())[0]
        made.validate()
        made.threads = v.check_threads(threads)
        return made


class Broadphase(_Structure):
    """Brute-force `dbvt.Broadphase`: `update()` diffs the whole pair set against the previous one,
    and recomputes every sensor pair from the rule itself. With `track_pairs=False` it reports
    nothing; `pairs()` is computed on demand either way."""

    _kind = "Broadphase"

    def __init__(self, dims: int = 3, margin: float = 0.05, track_pairs: bool = True, sensor_margin: float = 0.0,
                 *, threads: int = 1):
        super().__init__(dims, margin, static=np.zeros(0, np.uint8), group=np.zeros(0, np.uint32),
                         mask=np.zeros(0, np.uint32), sensor=np.zeros(0, np.uint8))
        self.threads = v.check_threads(threads)     # taken as dbvt.Broadphase takes it; brute force uses one
        self._track_pairs = bool(track_pairs)
        self._reported = np.zeros((0, 2), np.uint64)
        self.sensor_margin = v.check_sensor_margin(sensor_margin)
        # [sensor id, proxy id] inside as of the last update() (less destroyed proxies), those the
        # destroys since took out, and the last update()'s events.
        self._inside: set[tuple[int, int]] = set()
        self._leaving: set[tuple[int, int]] = set()
        self._events = (_sorted_pairs(set()), _sorted_pairs(set()))

    @property
    def track_pairs(self) -> bool:
        return self._track_pairs

    def __repr__(self) -> str:
        tracking = "" if self._track_pairs else ", track_pairs=False"
        return (f"dbvt.reference.Broadphase(dims={self._dims}, margin={self._margin!r}{tracking}) "
                f"with {len(self)} proxies")

    def stats(self) -> dict:
        return {**super().stats(), "track_pairs": self._track_pairs}

    def create(self, ids, boxes, static=False, group=1, mask=v.UINT32_MAX, sensor=None) -> None:
        ids = v.as_ids(ids)
        boxes = v.as_boxes(boxes, self._dims, len(ids))
        static = v.as_flags(static, len(ids), "static")
        group = v.as_uint32(group, len(ids), "group")
        mask = v.as_uint32(mask, len(ids), "mask")
        sensor = v.as_sensor_kinds(sensor, len(ids))
        if not self._track_pairs and sensor.any():
            raise ValueError("sensors need pair tracking: this broadphase has track_pairs=False")
        self._proxies.check_new(ids)
        self._proxies.add(ids, tight=boxes, fat=self._fatten(boxes), static=static, group=group, mask=mask,
                          sensor=sensor)

    def settings(self, ids):
        rows = self._proxies.rows_of(v.as_ids(ids))
        columns = self._proxies.columns
        return (columns["static"][rows].copy(), columns["group"][rows].copy(), columns["mask"][rows].copy(),
                columns["sensor"][rows].copy())

    def move(self, ids, boxes) -> int:
        return self._retarget(ids, boxes)

    def destroy(self, ids) -> None:
        ids = v.as_ids(ids)
        self._proxies.delete(self._proxies.rows_of(ids))
        gone = set(ids.tolist())
        taken = {pair for pair in self._inside if pair[0] in gone or pair[1] in gone}
        self._inside -= taken
        self._leaving |= taken

    def _allowed(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        group, mask, static = (self._proxies.columns[name] for name in ("group", "mask", "static"))
        filtered = ((group[a] & mask[b]) != 0) & ((group[b] & mask[a]) != 0)
        return filtered & ~((static[a] != 0) & (static[b] != 0))

    def pairs(self) -> np.ndarray:
        columns = self._proxies.columns
        a, b = overlapping_rows(columns["tight"], self._dims)
        sensor = columns["sensor"]
        allowed = self._allowed(a, b) & (sensor[a] == 0) & (sensor[b] == 0)
        return pair_rows(self._proxies.ids, a[allowed], b[allowed])

    def update(self):
        if not self._track_pairs:
            return np.zeros((0, 2), np.uint64), np.zeros((0, 2), np.uint64)
        current = self.pairs()
        now, before = set(map(tuple, current.tolist())), set(map(tuple, self._reported.tolist()))
        self._reported = current
        self._update_sensors()
        return _sorted_pairs(now - before), _sorted_pairs(before - now)

    def _update_sensors(self) -> None:
        """The rule, for every sensor and proxy: one outside enters when it touches the shape; one
        inside stays while it touches the shape grown by sensor_margin."""
        ids, columns = self._proxies.ids, self._proxies.columns
        sensors = np.flatnonzero(columns["sensor"])
        others = np.flatnonzero(columns["sensor"] == 0)
        inside = set()
        if len(sensors) and len(others):
            s_rows, p_rows = (grid.ravel() for grid in np.meshgrid(sensors, others, indexing="ij"))
            keep = self._allowed(s_rows, p_rows)
            s_rows, p_rows = s_rows[keep], p_rows[keep]
            pair_ids = list(zip(ids[s_rows].tolist(), ids[p_rows].tolist()))
            was = np.array([pair in self._inside for pair in pair_ids], bool)
            grow = np.where(was, self.sensor_margin, 0.0)
            touches = sensor_touches(columns["tight"][s_rows], columns["sensor"][s_rows],
                                     columns["tight"][p_rows], self._dims, grow)
            inside = {pair for pair, now in zip(pair_ids, touches) if now}
        before = self._inside | self._leaving
        self._events = (_sorted_pairs(inside - before), _sorted_pairs(before - inside))
        self._inside, self._leaving = inside, set()

    def sensor_events(self):
        return self._events[0].copy(), self._events[1].copy()

    def sensor_pairs(self) -> np.ndarray:
        return _sorted_pairs(self._inside)

    @property
    def sensor_pair_count(self) -> int:
        return len(self._inside)

    def set_sensor_pairs(self, rows, inside) -> None:
        rows = np.asarray(rows, np.uint64).reshape(-1, 2)
        for pair, flag in zip(map(tuple, rows.tolist()), v.as_flags(inside, len(rows), "inside")):
            (self._inside.add if flag else self._inside.discard)(pair)

    def _visible(self, mask, include_sensors: bool) -> np.ndarray:
        columns = self._proxies.columns
        keep = np.ones(len(self._proxies), bool) if mask is None else (columns["group"] & np.uint32(mask)) != 0
        return keep if include_sensors else keep & (columns["sensor"] == 0)

    def query_aabb(self, boxes, mask=None, include_sensors=False):
        return self._aabb(boxes, mask, include_sensors)

    def query_sphere(self, centers, radii, mask=None, include_sensors=False):
        return self._sphere(centers, radii, mask, include_sensors)

    def raycast(self, segments, first_hit=False, mask=None, include_sensors=False):
        return self._ray(segments, first_hit, mask, include_sensors)

    def query_frustum(self, planes, mask=None, include_sensors=False):
        return self._frustum(planes, mask, include_sensors)

    def query_nearest(self, points, k, max_distance=np.inf, mask=None, include_sensors=False):
        return self._nearest(points, k, max_distance, mask, include_sensors)

    def cast_box(self, boxes, displacements, first_hit=False, mask=None, include_sensors=False):
        return self._cast_box(boxes, displacements, first_hit, mask, include_sensors)

    def cast_sphere(self, centers, radii, displacements, first_hit=False, mask=None, include_sensors=False):
        return self._cast_sphere(centers, radii, displacements, first_hit, mask, include_sensors)

    def validate(self) -> None:
        super().validate()
        reported = self._reported
        if reported.ndim != 2 or reported.shape[1] != 2 or (reported[:, 0] >= reported[:, 1]).any():
            raise RuntimeError("the pair set reported by the last update() is malformed")

    def to_bytes(self) -> bytes:
        return self._dump(reported=self._reported, track_pairs=np.array(self._track_pairs),
                          sensor_margin=np.array(self.sensor_margin), inside=_sorted_pairs(self._inside),
                          leaving=_sorted_pairs(self._leaving))

    @classmethod
    def from_bytes(cls, data, *, threads: int = 1) -> "Broadphase":
        made, arrays = cls._restore(data, ("static", "group", "mask", "sensor", "reported", "track_pairs",
                                           "sensor_margin", "inside", "leaving"))
        made.threads = v.check_threads(threads)
        made._reported = np.asarray(arrays["reported"], np.uint64).reshape(-1, 2)
        made._track_pairs = bool(arrays["track_pairs"])
        made.sensor_margin = v.check_sensor_margin(float(arrays["sensor_margin"]))
        made._inside = set(map(tuple, np.asarray(arrays["inside"], np.uint64).reshape(-1, 2).tolist()))
        made._leaving = set(map(tuple, np.asarray(arrays["leaving"], np.uint64).reshape(-1, 2).tolist()))
        made.validate()
        return made


def sensor_touches(shapes: np.ndarray, kinds: np.ndarray, boxes: np.ndarray, dims: int, grow) -> np.ndarray:
    """Whether each box touches its sensor's shape grown by `grow` (closed), in float64 with the
    core's operations: a box sensor's tight box grown on every side; a sphere sensor's largest
    inner ball (centre the box's, radius half its smallest side) with radius + grow."""
    s, b = shapes.astype(np.float64), boxes.astype(np.float64)
    grow = np.broadcast_to(np.asarray(grow, np.float64), (len(s),))
    box_touch = np.ones(len(s), bool)
    for i in range(dims):
        box_touch &= ~((b[:, i] > s[:, i + dims] + grow) | (b[:, i + dims] < s[:, i] - grow))
    radius = 0.5 * (s[:, dims] - s[:, 0])
    distance_sq = np.zeros(len(s))
    for i in range(dims):
        if i:
            radius = np.minimum(radius, 0.5 * (s[:, i + dims] - s[:, i]))
    for i in range(dims):
        centre = 0.5 * (s[:, i] + s[:, i + dims])
        gap = np.maximum(np.maximum(b[:, i] - centre, centre - b[:, i + dims]), 0.0)
        distance_sq = distance_sq + gap * gap
    radius = radius + grow
    return np.where(kinds == 1, box_touch, distance_sq <= radius * radius)


def overlap(a, b, mask_a=None, mask_b=None, max_pairs=None, include_sensors=False) -> np.ndarray:
    """Brute-force `dbvt.overlap`: `(m, 2)` uint64 rows [id in a, id in b] of overlapping tight boxes
    (sensors left out unless `include_sensors`)."""
    for name, structure in (("a", a), ("b", b)):
        if not isinstance(structure, _Structure):
            raise TypeError(f"overlap: {name} must be a dbvt.Tree or dbvt.Broadphase, not {type(structure).__name__}")
    mask_a, mask_b, limit = v.check_overlap(a, b, mask_a, mask_b, max_pairs, lambda s: isinstance(s, Broadphase))
    tight_a, ids_a = a._query_set(mask_a, include_sensors)
    tight_b, ids_b = b._query_set(mask_b, include_sensors)
    i, j = crossing_rows(tight_a, tight_b, a.dims)
    if 0 <= limit < len(i):
        raise v.HitLimit(f"the overlap found more than {limit} pairs (max_pairs)")
    rows = np.stack([ids_a[i], ids_b[j]], axis=1).astype(np.uint64).reshape(-1, 2)
    return np.ascontiguousarray(rows[np.lexsort((rows[:, 1], rows[:, 0]))])


def _sorted_pairs(pairs: set) -> np.ndarray:
    rows = np.array(sorted(pairs), dtype=np.uint64).reshape(-1, 2)
    return np.ascontiguousarray(rows)
