# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""`dbvt.Tree`: the dynamic AABB tree as a Python class. Arguments are converted and checked once
(`dbvt.validation`, then the id table), after which each batch runs in one nogil loop."""
from libc.math cimport INFINITY
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset

import math
import struct

import numpy as np

from dbvt import validation

from dbvt._batch cimport batch_free, pairs_free, self_pairs
from dbvt._queries cimport trees_overlap
from dbvt._split cimport (
    ROWS_BALL_CASTS, ROWS_BOX_CASTS, ROWS_BOXES, ROWS_FRUSTA, ROWS_NEAREST, ROWS_SEGMENTS, ROWS_SPHERES, Rows,
    RowsKind, run_rows,
)
from dbvt._core cimport (
    HIT_LIMIT, PREDICTION_STEPS, PREFETCH_AHEAD, PROXY_FLAGS, PROXY_LIVE, PROXY_SEEN, PROXY_SENSOR, Batch, IdPair,
    Node, PairBuffer, Proxy, Query, TreeCore,
    cache_costs, core_add, core_find, core_free, core_init, core_move, core_prefetch_find, mix64, prefetch,
    core_remove, core_reserve, core_split_sensors, load_box, prefetch_move, rehash, spread_by_one, spread_by_two,
    wide_stale,
)
from dbvt._build cimport MAX_DIGIT_BITS, core_bulk_insert, core_rebuild, radix_sort
from dbvt._check cimport core_area_ratio, core_check, core_height, core_memory
from dbvt._parallel cimport (
    BATCH_ON_THREADS_FROM, MAX_THREADS, counter_get, counter_set, counter_take, dbvt_counter, fetch_or, run_parts,
)
from dbvt._wide cimport wide_refresh, wide_worth

cdef extern from *:
    """
    #ifndef DBVT_DEBUG_CHECKS
    #define DBVT_DEBUG_CHECKS 0
    #endif
    """
    bint DBVT_DEBUG_CHECKS

FORMAT_VERSION = 1
# magic, version, byte-order mark, dims, margin, node capacity, node count, free node,
# proxy capacity, proxy count, free proxy, root
_HEADER = struct.Struct("<4sIIif7i")
_BYTE_ORDER_MARK = 0x01020304


# Raised by the reference too, so it is defined with the other shared errors.
HitLimit = validation.HitLimit


cdef inline void start_batch(Batch *b, Rows *r, RowsKind kind, uint32_t mask, const uint32_t *groups,
                             bint first_hit, int64_t max_hits, uint32_t skip_flags):
    memset(b, 0, sizeof(Batch))
    b.max_hits = max_hits
    memset(r, 0, sizeof(Rows))
    r.kind = kind
    r.mask = mask
    r.groups = groups
    r.skip = skip_flags
    r.first_hit = first_hit


cdef object csr(Batch *b, int status, object offsets, bint with_fractions):
    """Hand a batch's output to numpy (one copy) and free it; status -1 means memory ran out."""
    if status != 0:
        limit = b.max_hits
        batch_free(b)
        if status == HIT_LIMIT:
            raise HitLimit(f"the queries hit more than {limit} proxies (max_hits)")
        raise MemoryError()
    hits = np.empty(b.count, np.uint64)
    cdef uint64_t[::1] hit_view = hits
    cdef double[::1] fraction_view
    if b.count:
        memcpy(&hit_view[0], b.ids, b.count * sizeof(uint64_t))
    if not with_fractions:
        batch_free(b)
        return offsets, hits
    fractions = np.empty(b.count, np.float64)
    fraction_view = fractions
    if b.count:
        memcpy(&fraction_view[0], b.fractions, b.count * sizeof(double))
    batch_free(b)
    return offsets, hits, fractions


cdef object pair_array(PairBuffer *buffer):
    pairs = np.empty((buffer.count, 2), np.uint64)
    cdef uint64_t[:, ::1] view = pairs
    if buffer.count:
        memcpy(&view[0, 0], buffer.pairs, buffer.count * sizeof(IdPair))
    pairs_free(buffer)
    return pairs


# Batches of at least this many proxies are inserted along a Morton curve (see TreeBase._add).
SPATIAL_ORDER_FROM = 256


cdef object proxy_order(const int32_t[::1] proxies, int32_t capacity, int threads, bint *repeated):
    """The rows of a batch in the order of their proxies (indices below `capacity`): what a stable
    np.argsort gives, by radix passes over (proxy << 32 | row), two for a million proxies, cut over
    the threads from BATCH_ON_THREADS_FROM rows. A batch's edits take this order; numpy's sort of
    100,000 rows took 1.6 ms. `repeated` tells whether a proxy is in the batch twice: side by side
    in this order, it costs nothing to see."""
    cdef Py_ssize_t n = proxies.shape[0], i
    cdef int bits = 0
    cdef bint twice = False
    cdef uint64_t *keys
    cdef uint64_t *spare
    cdef uint64_t *ordered
    order = np.empty(n, np.int64)
    cdef int64_t[::1] out = order
    repeated[0] = False
    if n == 0:
        return order
    while bits < 31 and (<int64_t>1 << bits) < capacity:
        bits += 1
    keys = <uint64_t *>malloc(n * sizeof(uint64_t))
    spare = <uint64_t *>malloc(n * sizeof(uint64_t))
    if keys == NULL or spare == NULL:
        free(keys)
        free(spare)
        raise MemoryError()
    with nogil:
        for i in range(n):
            keys[i] = (<uint64_t>proxies[i]) << 32 | <uint64_t>i
        ordered = radix_sort(keys, spare, n, 32, (bits + MAX_DIGIT_BITS - 1) // MAX_DIGIT_BITS, MAX_DIGIT_BITS,
                             threads if n >= BATCH_ON_THREADS_FROM else 1)
        for i in range(n):
            out[i] = <int64_t><uint32_t>ordered[i]
            twice |= i > 0 and (ordered[i] >> 32) == (ordered[i - 1] >> 32)
    free(keys)
    free(spare)
    repeated[0] = twice
    return order


def spatial_order(const float[:, ::1] boxes, int dims):
    """Rows of `boxes` in the order of their centres along a Morton (Z-order) curve over the
    centres' bounds (21 bits an axis in 3-D, 32 in 2-D)."""
    cdef Py_ssize_t n = boxes.shape[0], i
    cdef int k
    cdef double low[3]
    cdef double scale[3]
    cdef double high, centre
    cdef uint64_t cell
    cdef double top = 2097151.0 if dims == 3 else 4294967295.0
    codes = np.zeros(n, np.uint64)
    cdef uint64_t[::1] out = codes
    if n == 0:
        return np.zeros(0, np.int64)
    with nogil:
        for k in range(dims):
            low[k] = INFINITY
            high = -INFINITY
            for i in range(n):
                centre = (<double>boxes[i, k] + boxes[i, dims + k]) * 0.5
                low[k] = min(low[k], centre)
                high = max(high, centre)
            scale[k] = top / (high - low[k]) if high > low[k] else 0.0
        for i in range(n):
            for k in range(dims):
                centre = (<double>boxes[i, k] + boxes[i, dims + k]) * 0.5
                cell = <uint64_t>((centre - low[k]) * scale[k])
                out[i] |= (spread_by_two(cell) << k) if dims == 3 else (spread_by_one(cell) << k)
    return np.argsort(codes)


# Looking up a batch's ids, a run of rows a part. Each row claims its proxy by setting PROXY_SEEN (on
# threads, with an atomic OR); an absent id, or a proxy claimed already, stops the part. The claims are
# cleared once every part is done (not before: a later claim of the same proxy must still see the
# flag). With one part the row that stopped it is the first bad row; a lookup on threads that fails
# runs again as one part to name it. A batch that is put in its proxies' order anyway (proxy_order)
# finds its repeats there, and looks up without claims: on threads each claim was an atomic OR, and
# clearing them a second pass of cache misses, about a fifth of W2's moves on two threads. Without
# claims the threads take chunks of rows in turn: ids inserted late probe further in the table, and
# W2's moves, in id order, left the thread with the second half a millisecond behind.
cdef enum:
    LOOKUP_CHUNK = 4096             # rows a thread takes at a time, without claims

ctypedef struct Lookup:
    TreeCore *t
    const uint64_t *ids
    int32_t *out
    int64_t n
    int parts
    bint claim                      # claim each proxy, to find repeated ids
    int64_t claimed[MAX_THREADS]    # [part]: the end of its run of claimed rows
    dbvt_counter next               # without claims: the next chunk of LOOKUP_CHUNK rows to take
    dbvt_counter failed             # nonzero once a part met a bad row


cdef int64_t look_up(Lookup *look, int64_t i, int64_t last) noexcept nogil:
    """Rows i to last - 1 (claiming their proxies, with `claim`): where the run stopped, at an absent
    id or a proxy claimed already; `last` when none did."""
    # In locals: the stores to the flags could alias the Lookup, which the loop would then re-read.
    cdef const TreeCore *t = look.t
    cdef const uint64_t *ids = look.ids
    cdef int32_t *out = look.out
    cdef bint alone = look.parts == 1, claim = look.claim
    cdef int32_t proxy
    cdef uint32_t *flags
    cdef uint32_t before
    while i < last:
        if i + 2 * PREFETCH_AHEAD < last:
            core_prefetch_find(t, ids[i + 2 * PREFETCH_AHEAD], False)
        if i + PREFETCH_AHEAD < last:
            core_prefetch_find(t, ids[i + PREFETCH_AHEAD], True)
        proxy = core_find(t, ids[i])
        if proxy < 0:
            break
        if claim:
            flags = &t.proxies[proxy].flags
            if alone:
                before = flags[0]
                flags[0] = before | PROXY_SEEN
            else:
                before = fetch_or(flags, PROXY_SEEN)
            if before & PROXY_SEEN:
                break
        out[i] = proxy
        i += 1
    return i


cdef void lookup_part(void *context, int part) noexcept nogil:
    cdef Lookup *look = <Lookup *>context
    cdef int64_t first, last, chunk
    if look.claim:
        first, last = look.n * part // look.parts, look.n * (part + 1) // look.parts
        look.claimed[part] = look_up(look, first, last)
        if look.claimed[part] < last:
            counter_set(&look.failed, 1)
        return
    chunk = counter_take(&look.next)
    while chunk * LOOKUP_CHUNK < look.n and not counter_get(&look.failed):
        last = min(look.n, (chunk + 1) * LOOKUP_CHUNK)
        if look_up(look, chunk * LOOKUP_CHUNK, last) < last:
            counter_set(&look.failed, 1)
        chunk = counter_take(&look.next)


cdef void unclaim_part(void *context, int part) noexcept nogil:
    cdef Lookup *look = <Lookup *>context
    cdef int64_t i
    for i in range(look.n * part // look.parts, look.claimed[part]):
        look.t.proxies[look.out[i]].flags &= ~PROXY_SEEN


cdef bint lookup_ids(Lookup *look) noexcept nogil:
    """Whether every id was found, once (the proxies in look.out); with one part, a failed lookup's
    first bad row is look.claimed[0]."""
    counter_set(&look.failed, 0)
    counter_set(&look.next, 0)
    run_parts(lookup_part, look, look.parts)
    if look.claim:
        run_parts(unclaim_part, look, look.parts)
    return not counter_get(&look.failed)


# Checking a batch's new ids. On threads, each part takes the ids whose hash picks it (an id and its
# repeats pick the same part), with its own set, in row order, and the first bad row of all the parts
# is the one a single pass in row order would find. 1M ids: about 20 ms on one thread.

ctypedef struct IdsPart:            # one part's answer, written once at its end
    int64_t bad                     # its first row that repeats an earlier one or is present; n: none
    bint duplicate                  # a repeat, else present in the tree
    int status                      # -1: no memory for its set

ctypedef struct NewIds:
    const uint64_t *ids
    int64_t n
    const TreeCore *t
    int parts
    IdsPart *results


cdef inline int id_part(uint64_t mixed, int parts) noexcept nogil:
    """The part an id's hash picks: its high bits scaled to the parts (no division)."""
    return <int>(((mixed >> 32) * <uint64_t>parts) >> 32)


cdef int64_t *own_rows(const NewIds *c, int part, int64_t *count) noexcept nogil:
    """The rows of the ids this part takes, ascending; NULL when memory ran out. Gathered without a
    branch: which part an id picks is a coin toss, and a guess missed on every other row cost more
    than the set's probes."""
    cdef int64_t i, taken = 0
    cdef int64_t *rows = <int64_t *>malloc(max(c.n, 1) * sizeof(int64_t))
    if rows != NULL:
        for i in range(c.n):
            rows[taken] = i
            taken += id_part(mix64(c.ids[i]), c.parts) == part
    count[0] = taken
    return rows


cdef void check_part(void *context, int part) noexcept nogil:
    """One part's ids in row order, into a set of ids where 0 marks an empty slot (so a probe touches
    one cache line, not a flag's and a key's), id 0 kept aside; the slots fetched a few rows ahead."""
    cdef NewIds *c = <NewIds *>context
    cdef IdsPart *out = &c.results[part]
    cdef int64_t i, count = c.n, size = 16, slot
    cdef int64_t *rows = NULL
    cdef uint64_t mixed, id_
    cdef uint64_t *keys = NULL
    cdef bint zero_seen = False, repeat
    out.bad = c.n
    out.status = -1
    if c.parts > 1:
        rows = own_rows(c, part, &count)
        if rows == NULL:
            return
    while size < 2 * count:
        size *= 2
    keys = <uint64_t *>calloc(size, sizeof(uint64_t))
    out.status = -1 if keys == NULL else 0
    i = 0
    while out.status == 0 and i < count:
        if i + PREFETCH_AHEAD < count:
            id_ = c.ids[rows[i + PREFETCH_AHEAD] if rows != NULL else i + PREFETCH_AHEAD]
            prefetch(&keys[mix64(id_) & <uint64_t>(size - 1)])
        id_ = c.ids[rows[i] if rows != NULL else i]
        mixed = mix64(id_)
        if id_ == 0:
            repeat = zero_seen
            zero_seen = True
        else:
            slot = <int64_t>(mixed & <uint64_t>(size - 1))
            while keys[slot] != 0 and keys[slot] != id_:
                slot = (slot + 1) & (size - 1)
            repeat = keys[slot] == id_
            keys[slot] = id_
        if repeat or core_find(c.t, id_) >= 0:
            out.bad = rows[i] if rows != NULL else i
            out.duplicate = repeat
            break
        i += 1
    free(keys)
    free(rows)


cdef class TreeBase:
    def __cinit__(self, *args, **kwargs):
        core_init(&self.core, 3, 0.0)
        self.max_hits = -1
        self.threads = 1

    def __dealloc__(self):
        core_free(&self.core)

    def __len__(self):
        return self.core.proxy_count

    def __contains__(self, id_):
        if not isinstance(id_, (int, np.integer)) or not 0 <= id_ < 2 ** 64:
            return False
        return core_find(&self.core, <uint64_t>id_) >= 0

    @property
    def dims(self):
        return self.core.dims

    @property
    def margin(self):
        return self.core.margin

    cdef void _after_change(self):
        # A Broadphase also writes tight boxes itself (a sensor moving inside its fat box).
        wide_stale(&self.core)
        if DBVT_DEBUG_CHECKS:
            self.validate()

    cdef void _refresh_wide(self, int64_t queries):
        """Before a batch of box or segment queries: rebuild the tree's wide view (dbvt._wide) when it is
        stale and the batch pays for it; if memory runs out the view stays stale and the batch walks the
        tree itself."""
        if wide_worth(&self.core, queries):
            with nogil:
                wide_refresh(&self.core)

    cdef object _existing(self, object ids, bint distinct=True):
        """Proxy indices of `ids`, which must be present, and distinct unless `distinct` is False (the
        caller then finds repeats itself, and asks again to raise the error)."""
        cdef const uint64_t[::1] id_view = ids
        cdef Lookup look
        cdef bint found
        cdef Py_ssize_t bad
        proxies = np.empty(ids.shape[0], np.int32)
        cdef int32_t[::1] out = proxies
        look.t, look.n = &self.core, id_view.shape[0]
        if look.n == 0:
            return proxies
        look.ids, look.out = &id_view[0], &out[0]
        look.parts = self.threads if look.n >= BATCH_ON_THREADS_FROM else 1
        look.claim = distinct
        with nogil:
            found = lookup_ids(&look)
            if not found and (look.parts > 1 or not look.claim):
                look.parts = 1
                look.claim = True
                found = lookup_ids(&look)
        if not found:
            bad = look.claimed[0]
            if core_find(&self.core, id_view[bad]) >= 0:
                raise validation.duplicate_id(bad, id_view[bad])
            raise validation.unknown_id(bad, id_view[bad])
        return proxies

    cdef tuple _in_edit_order(self, object ids):
        """Proxy indices of `ids`, which must be present and distinct, and the rows in their proxies'
        order, which follows the tree's after a build, so that neighbouring edits share paths. A
        repeated id lies beside its first in that order: the ids are looked up without claims, and
        again with them only to name the first repeat."""
        cdef bint repeated
        proxy_arr = self._existing(ids, False)
        order = proxy_order(proxy_arr, self.core.proxy_capacity, self.threads, &repeated)
        if repeated:
            self._existing(ids)
        return proxy_arr, order

    cdef object _check_new(self, object ids):
        """Raise unless `ids` are distinct and all absent: the first row (in row order) that repeats
        an earlier one or is present names the problem."""
        cdef const uint64_t[::1] id_view = ids
        cdef NewIds check
        cdef Py_ssize_t bad
        cdef int part
        cdef bint duplicate = False
        check.ids = &id_view[0] if id_view.shape[0] else NULL
        check.n = id_view.shape[0]
        check.t = &self.core
        check.parts = self.threads if check.n >= BATCH_ON_THREADS_FROM else 1
        check.results = <IdsPart *>calloc(check.parts, sizeof(IdsPart))
        if check.results == NULL:
            raise MemoryError()
        with nogil:
            run_parts(check_part, &check, check.parts)
        bad = check.n
        for part in range(check.parts):
            if check.results[part].status != 0:
                free(check.results)
                raise MemoryError()
            if check.results[part].bad < bad:
                bad, duplicate = check.results[part].bad, check.results[part].duplicate
        free(check.results)
        if bad < check.n:
            if duplicate:
                raise validation.duplicate_id(bad, id_view[bad])
            raise validation.already_present(bad, id_view[bad])

    cdef object _add(self, object ids, object boxes):
        """Insert checked proxies; into an empty tree, by one binned-SAH build. Returns their indices."""
        cdef const uint64_t[::1] id_view = ids
        cdef const float[:, ::1] rows = boxes
        cdef Py_ssize_t n = id_view.shape[0], i
        cdef bint bulk = self.core.proxy_count == 0 and n > 1
        cdef float box[6]
        cdef int status = 0
        proxies = np.empty(n, np.int32)
        cdef int32_t[::1] out = proxies
        if n == 0:
            return proxies
        if core_reserve(&self.core, n, self.threads) != 0:
            raise MemoryError()
        if bulk:
            with nogil:
                status = core_bulk_insert(&self.core, &id_view[0], &rows[0, 0], n, &out[0], self.threads)
            if status != 0:
                raise MemoryError()
            return proxies
        # One at a time, in the order of the boxes along a Morton curve: consecutive insertions
        # descend the same, cache-warm paths, which a large tree in random order would miss at
        # every level. The proxies' slots follow the same order, so later moves share paths too.
        # A few proxies are not worth the sort.
        cdef int64_t[::1] order = (spatial_order(boxes, self.core.dims) if n >= SPATIAL_ORDER_FROM
                                   else np.arange(n, dtype=np.int64))
        cdef Py_ssize_t row
        with nogil:
            for i in range(n):
                row = order[i]
                if i + PREFETCH_AHEAD < n:
                    core_prefetch_find(&self.core, id_view[order[i + PREFETCH_AHEAD]], False)
                load_box(&rows[row, 0], self.core.dims, box)
                out[row] = core_add(&self.core, id_view[row], box)
        return proxies

    def get(self, ids):
        """The tight boxes of `ids`, as given."""
        id_arr = validation.as_ids(ids)
        cdef int32_t[::1] proxies = self._existing(id_arr)
        cdef Py_ssize_t n = proxies.shape[0], i, k
        cdef int32_t dims = self.core.dims
        boxes = np.empty((n, 2 * dims), np.float32)
        cdef float[:, ::1] out = boxes
        for i in range(n):
            for k in range(dims):
                out[i, k] = self.core.proxies[proxies[i]].tight[k]
                out[i, dims + k] = self.core.proxies[proxies[i]].tight[3 + k]
        return boxes

    cdef object _answer(self, Batch *batch, const Rows *rows, Py_ssize_t n, bint with_fractions):
        """The CSR answer to `n` rows of one query kind, set up by start_batch: every kind runs through
        the same walker (dbvt._split.run_rows), on the structure's threads, without the GIL."""
        offsets = np.empty(n + 1, np.int64)
        cdef int64_t[::1] off = offsets
        cdef int status
        with nogil:
            status = run_rows(&self.core, rows, n, self.threads, &off[0], batch)
        return csr(batch, status, offsets, with_fractions)

    cdef object _query_aabb(self, object boxes, uint32_t mask, const uint32_t *groups,
                            uint32_t skip):
        cdef const float[:, ::1] rows = validation.as_boxes(boxes, self.core.dims)
        cdef Py_ssize_t n = rows.shape[0]
        cdef Batch batch
        cdef Rows r
        start_batch(&batch, &r, ROWS_BOXES, mask, groups, False, self.max_hits, skip)
        r.shapes = &rows[0, 0] if n else NULL
        self._refresh_wide(n)
        return self._answer(&batch, &r, n, False)

    cdef object _query_sphere(self, object centers, object radii, uint32_t mask, const uint32_t *groups,
                            uint32_t skip):
        cdef const float[:, ::1] points = validation.as_points(centers, self.core.dims, "centers")
        cdef Py_ssize_t n = points.shape[0]
        cdef const float[::1] r = validation.as_radii(radii, n)
        cdef Batch batch
        cdef Rows spheres
        start_batch(&batch, &spheres, ROWS_SPHERES, mask, groups, False, self.max_hits, skip)
        spheres.shapes = &points[0, 0] if n else NULL
        spheres.radii = &r[0] if n else NULL
        return self._answer(&batch, &spheres, n, False)

    cdef object _raycast(self, object segments, bint first_hit, uint32_t mask, const uint32_t *groups,
                            uint32_t skip):
        cdef const float[:, ::1] rows = validation.as_segments(segments, self.core.dims)
        cdef Py_ssize_t n = rows.shape[0]
        cdef Batch batch
        cdef Rows r
        start_batch(&batch, &r, ROWS_SEGMENTS, mask, groups, first_hit, self.max_hits, skip)
        r.shapes = &rows[0, 0] if n else NULL
        self._refresh_wide(n)
        return self._answer(&batch, &r, n, True)

    cdef object _query_frustum(self, object planes, uint32_t mask, const uint32_t *groups,
                            uint32_t skip):
        plane_arr = validation.as_planes(planes, self.core.dims)
        cdef const float[:, :, ::1] rows = plane_arr
        cdef Py_ssize_t n = rows.shape[0]
        cdef int32_t k = <int32_t>rows.shape[1]
        cdef Batch batch
        cdef Rows r
        start_batch(&batch, &r, ROWS_FRUSTA, mask, groups, False, self.max_hits, skip)
        r.shapes = &rows[0, 0, 0] if n else NULL
        r.planes = k
        return self._answer(&batch, &r, n, False)

    cdef object _query_nearest(self, object points, object k, object max_distance, uint32_t mask,
                               const uint32_t *groups, uint32_t skip):
        cdef const float[:, ::1] rows = validation.as_points(points, self.core.dims, "points")
        cdef int64_t count = validation.as_count(k)
        cdef double reach = validation.as_distance(max_distance)
        cdef Py_ssize_t n = rows.shape[0]
        cdef Batch batch
        cdef Rows r
        start_batch(&batch, &r, ROWS_NEAREST, mask, groups, False, self.max_hits, skip)
        r.shapes = &rows[0, 0] if n else NULL
        r.k = count
        r.reach = reach
        offsets, hits, distances = self._answer(&batch, &r, n, True)
        return offsets, hits, distances.astype(np.float32)

    cdef object _cast_box(self, object boxes, object displacements, bint first_hit, uint32_t mask,
                          const uint32_t *groups, uint32_t skip):
        cdef const float[:, ::1] rows = validation.as_boxes(boxes, self.core.dims)
        cdef Py_ssize_t n = rows.shape[0]
        cdef const float[:, ::1] moves = validation.as_displacements(displacements, self.core.dims, n, "boxes")
        cdef Batch batch
        cdef Rows r
        start_batch(&batch, &r, ROWS_BOX_CASTS, mask, groups, first_hit, self.max_hits, skip)
        r.shapes = &rows[0, 0] if n else NULL
        r.moves = &moves[0, 0] if n else NULL
        return self._answer(&batch, &r, n, True)

    cdef object _cast_sphere(self, object centers, object radii, object displacements, bint first_hit,
                             uint32_t mask, const uint32_t *groups, uint32_t skip):
        cdef const float[:, ::1] points = validation.as_points(centers, self.core.dims, "centers")
        cdef Py_ssize_t n = points.shape[0]
        cdef const float[::1] r = validation.as_radii(radii, n)
        cdef const float[:, ::1] moves = validation.as_displacements(displacements, self.core.dims, n, "centers")
        cdef Batch batch
        cdef Rows balls
        start_batch(&batch, &balls, ROWS_BALL_CASTS, mask, groups, first_hit, self.max_hits, skip)
        balls.shapes = &points[0, 0] if n else NULL
        balls.radii = &r[0] if n else NULL
        balls.moves = &moves[0, 0] if n else NULL
        return self._answer(&batch, &balls, n, True)

    cdef const uint32_t *_groups(self) noexcept:
        """Per-proxy groups for masks to filter: a Tree has none."""
        return NULL

    def rebuild(self):
        """Rebuild the whole tree top down with the binned surface-area heuristic."""
        cdef int status
        with nogil:
            status = core_rebuild(&self.core, self.threads)
        if status != 0:
            raise MemoryError()
        self._after_change()

    def validate(self):
        """Raise RuntimeError naming the first broken invariant."""
        cdef const char *problem
        with nogil:
            problem = core_check(&self.core, True)
        if problem != NULL:
            raise RuntimeError(f"dbvt invariant broken: {problem.decode()}")

    def stats(self):
        """Size and quality: `area_ratio` is the summed surface area (2-D: perimeter) of the
        internal nodes over the root's, lower is better."""
        return {
            "proxies": self.core.proxy_count,
            "nodes": self.core.node_count + self.core.proxy_count,
            "internal_nodes": self.core.node_count,
            "height": core_height(&self.core),
            "area_ratio": core_area_ratio(&self.core),
            "memory_bytes": core_memory(&self.core),
            "quads": self.core.wide.quad_count if self.core.wide.fresh else 0,
            "dims": self.core.dims,
            "margin": self.core.margin,
        }

    cdef bytes _tree_bytes(self):
        cdef TreeCore *t = &self.core
        header = _HEADER.pack(b"DBVT", FORMAT_VERSION, _BYTE_ORDER_MARK, t.dims, t.margin,
                              t.node_capacity, t.node_count, t.free_node,
                              t.proxy_capacity, t.proxy_count, t.free_proxy, t.root)
        if not t.node_capacity:
            nodes = b""
        else:
            nodes = ((<char *>t.nodes)[:t.node_capacity * sizeof(Node)]
                     + (<char *>t.parents)[:t.node_capacity * sizeof(int32_t)]
                     + (<char *>t.heights)[:t.node_capacity * sizeof(int32_t)])
        proxies = (<char *>t.proxies)[:t.proxy_capacity * sizeof(Proxy)] if t.proxy_capacity else b""
        return header + nodes + proxies

    cdef Py_ssize_t _load_tree(self, const unsigned char[::1] data) except -1:
        """Replace this (empty) tree by a serialised one; returns the bytes it used."""
        cdef TreeCore *t = &self.core
        cdef Py_ssize_t size = _HEADER.size, node_bytes, proxy_bytes
        cdef int64_t slots = 16
        cdef const char *problem
        cdef int32_t i
        cdef int64_t live
        if data.shape[0] < size:
            raise ValueError("data is too short for a dbvt header")
        (magic, version, mark, dims, margin, node_capacity, node_count, free_node,
         proxy_capacity, proxy_count, free_proxy, root) = _HEADER.unpack(bytes(data[:size]))
        if magic != b"DBVT":
            raise ValueError("data is not a serialised dbvt structure (bad magic)")
        if version != FORMAT_VERSION or mark != _BYTE_ORDER_MARK:
            raise ValueError(f"unsupported dbvt format version {version} or byte order")
        validation.check_dims(dims)
        validation.check_margin(margin)
        if not (0 <= node_count <= node_capacity and 0 <= proxy_count <= proxy_capacity):
            raise ValueError("corrupt dbvt data: counts out of range")
        node_bytes = node_capacity * (sizeof(Node) + 2 * sizeof(int32_t))
        proxy_bytes = proxy_capacity * sizeof(Proxy)
        if data.shape[0] < size + node_bytes + proxy_bytes:
            raise ValueError("data is too short for the dbvt pools it declares")
        core_free(t)
        core_init(t, dims, margin)
        t.nodes = <Node *>malloc(node_capacity * sizeof(Node) + 1)
        t.parents = <int32_t *>malloc(node_capacity * sizeof(int32_t) + 1)
        t.heights = <int32_t *>malloc(node_capacity * sizeof(int32_t) + 1)
        t.costs = <float *>malloc(node_capacity * sizeof(float) + 1)
        t.proxies = <Proxy *>malloc(proxy_bytes if proxy_bytes else 1)
        if t.nodes == NULL or t.parents == NULL or t.heights == NULL or t.costs == NULL or t.proxies == NULL:
            raise MemoryError()
        cdef Py_ssize_t parents_at = size + node_capacity * sizeof(Node)
        cdef Py_ssize_t heights_at = parents_at + node_capacity * sizeof(int32_t)
        if node_bytes:
            memcpy(t.nodes, &data[size], node_capacity * sizeof(Node))
            memcpy(t.parents, &data[parents_at], node_capacity * sizeof(int32_t))
            memcpy(t.heights, &data[heights_at], node_capacity * sizeof(int32_t))
        if proxy_bytes:
            memcpy(t.proxies, &data[size + node_bytes], proxy_bytes)
        t.node_capacity, t.node_count, t.free_node = node_capacity, node_count, free_node
        cache_costs(t)
        t.proxy_capacity, t.proxy_count, t.free_proxy, t.root = proxy_capacity, proxy_count, free_proxy, root
        live = 0
        for i in range(proxy_capacity):
            if t.proxies[i].flags & ~PROXY_FLAGS:
                raise ValueError("corrupt dbvt data: unknown proxy flags")
            live += t.proxies[i].flags & PROXY_LIVE
        # Sized from the flags, not the header's count, which core_check compares afterwards.
        while slots < 2 * live:
            slots *= 2
        if rehash(t, slots, proxy_capacity, self.threads) != 0:
            raise MemoryError()
        problem = core_check(t, False)
        if problem != NULL:
            core_free(t)
            core_init(t, dims, margin)
            raise ValueError(f"corrupt dbvt data: {problem.decode()}")
        if core_split_sensors(t) != 0:
            raise MemoryError()
        return size + node_bytes + proxy_bytes


cdef class Tree(TreeBase):
    """A dynamic AABB tree of user ids and boxes (Bullet's btDbvt, Box2D's b2DynamicTree).

    `dims` is 2 or 3; boxes are float32 rows `[min..., max...]`. Leaves are fattened by `margin` so
    that small moves do not reinsert them. Every query is exact on the tight boxes, closed intervals.
    With `threads` > 1, a batch of queries of at least 64 rows a thread is cut over that many threads,
    with the same answer.
    """

    def __init__(self, int dims=3, margin=0.0, *, threads=1):
        self.core.dims = validation.check_dims(dims)
        self.core.margin = validation.check_margin(margin)
        self.threads = validation.check_threads(threads)

    def __repr__(self):
        return f"dbvt.Tree(dims={self.core.dims}, margin={self.core.margin!r}) with {len(self)} proxies"

    def __reduce__(self):
        return (type(self).from_bytes, (self.to_bytes(),))

    def insert(self, ids, boxes):
        """Add proxies. Into an empty tree this is one bulk binned-SAH build."""
        id_arr = validation.as_ids(ids)
        box_arr = validation.as_boxes(boxes, self.core.dims, len(id_arr), threads=self.threads)
        self._check_new(id_arr)
        self._add(id_arr, box_arr)
        self._after_change()

    def update(self, ids, boxes):
        """Give proxies new tight boxes; returns how many left their fat box (and got a new one)."""
        id_arr = validation.as_ids(ids)
        cdef const float[:, ::1] rows = validation.as_boxes(boxes, self.core.dims, len(id_arr), threads=self.threads)
        proxy_arr, order_arr = self._in_edit_order(id_arr)
        cdef int32_t[::1] proxies = proxy_arr
        cdef int64_t[::1] order = order_arr
        cdef Py_ssize_t n = proxies.shape[0], i, row
        cdef int64_t moved = 0
        cdef float box[6]
        with nogil:
            for i in range(n):
                prefetch_move(&self.core, &proxies[0], &order[0], i, n)
                row = order[i]
                load_box(&rows[row, 0], self.core.dims, box)
                moved += core_move(&self.core, proxies[row], box, PREDICTION_STEPS)
        self._after_change()
        return moved

    def remove(self, ids):
        cdef int32_t[::1] proxies = self._existing(validation.as_ids(ids))
        cdef Py_ssize_t n = proxies.shape[0], i
        with nogil:
            for i in range(n):
                core_remove(&self.core, proxies[i])
        self._after_change()

    def query_aabb(self, boxes):
        """CSR `(offsets, hits)`: the ids whose box overlaps each query box, ascending."""
        return self._query_aabb(boxes, 0xFFFFFFFF, NULL, 0)

    def query_sphere(self, centers, radii):
        """CSR `(offsets, hits)`: the ids whose box is within `radius` of each centre."""
        return self._query_sphere(centers, radii, 0xFFFFFFFF, NULL, 0)

    def raycast(self, segments, first_hit=False):
        """`(offsets, hits, fractions)`: boxes each segment `from..., to...` touches, by entry
        fraction then id; `first_hit` keeps the first of each."""
        return self._raycast(segments, bool(first_hit), 0xFFFFFFFF, NULL, 0)

    def query_frustum(self, planes):
        """CSR `(offsets, hits)`: boxes whose p-vertex is on the inner side of every plane."""
        return self._query_frustum(planes, 0xFFFFFFFF, NULL, 0)

    def query_nearest(self, points, k, max_distance=math.inf):
        """`(offsets, hits, distances)`: for each point, up to k ids nearest to it (distance to the
        tight box, 0 inside), no farther than `max_distance`, by distance then id; distances float32."""
        return self._query_nearest(points, k, max_distance, 0xFFFFFFFF, NULL, 0)

    def cast_box(self, boxes, displacements, first_hit=False):
        """`(offsets, hits, fractions)`: the boxes each box touches when moved by t * displacement,
        t in [0, 1], with the first such t (0 when touching at the start), by t then id; `first_hit`
        keeps the first of each."""
        return self._cast_box(boxes, displacements, bool(first_hit), 0xFFFFFFFF, NULL, 0)

    def cast_sphere(self, centers, radii, displacements, first_hit=False):
        """As cast_box, for balls: a ball touches a box when its centre is within its radius of it."""
        return self._cast_sphere(centers, radii, displacements, bool(first_hit), 0xFFFFFFFF, NULL, 0)

    def pairs(self):
        """`(m, 2)` uint64: every overlapping pair of tight boxes, rows `a < b`, sorted."""
        cdef PairBuffer buffer
        cdef int status
        memset(&buffer, 0, sizeof(PairBuffer))
        with nogil:
            status = self_pairs(&self.core, &buffer, NULL, NULL)
        if status != 0:
            pairs_free(&buffer)
            raise MemoryError()
        return pair_array(&buffer)

    def to_bytes(self):
        return self._tree_bytes()

    @classmethod
    def from_bytes(cls, data, *, threads=1):
        cdef Tree tree = cls(threads=threads)
        view = memoryview(data).cast("B")
        if tree._load_tree(view) != len(view):
            raise ValueError("data holds more than a dbvt Tree (a Broadphase's bytes?)")
        return tree


def overlap(a, b, mask_a=None, mask_b=None, max_pairs=None, include_sensors=False):
    """`(m, 2)` uint64 rows `[id in a, id in b]`: every pair of a proxy of `a` and a proxy of `b` whose
    tight boxes overlap (closed), sorted. `a` and `b` are Trees or Broadphases of the same dims;
    `mask_a` keeps the proxies of `a` whose group shares a bit with it (a Broadphase's only), `mask_b`
    those of `b`; sensors are left out unless `include_sensors`. Past `max_pairs` pairs it raises
    HitLimit. Both trees are walked at once."""
    for name, structure in (("a", a), ("b", b)):
        if not isinstance(structure, TreeBase):
            raise TypeError(f"overlap: {name} must be a dbvt.Tree or dbvt.Broadphase, not {type(structure).__name__}")
    cdef TreeBase ta = a, tb = b
    mask_a, mask_b, limit = validation.check_overlap(a, b, mask_a, mask_b, max_pairs,
                                                     lambda s: not isinstance(s, Tree))
    cdef uint32_t bits_a = 0xFFFFFFFF if mask_a is None else mask_a
    cdef uint32_t bits_b = 0xFFFFFFFF if mask_b is None else mask_b
    cdef const uint32_t *groups_a = NULL if mask_a is None else ta._groups()
    cdef const uint32_t *groups_b = NULL if mask_b is None else tb._groups()
    cdef int64_t most = limit
    cdef uint32_t skip = 0 if include_sensors else PROXY_SENSOR
    cdef PairBuffer buffer
    cdef int status
    memset(&buffer, 0, sizeof(PairBuffer))
    with nogil:
        status = trees_overlap(&ta.core, &tb.core, bits_a, groups_a, bits_b, groups_b, skip, most, &buffer)
    if status != 0:
        pairs_free(&buffer)
        if status == HIT_LIMIT:
            raise HitLimit(f"the overlap found more than {most} pairs (max_pairs)")
        raise MemoryError()
    return pair_array(&buffer)
