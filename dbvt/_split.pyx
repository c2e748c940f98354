# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""A batch of queries cut into contiguous runs of rows, one a thread, whose outputs are stitched back
in row order: the answer is byte for byte the one a single thread gives.

Each run has its own Query, Batch (stack, hits, output) and offsets; the tree is only read. Every
query's answer depends on its row and the tree alone, so the runs' outputs, laid end to end with the
offsets shifted, are the serial output. The hit limit is judged as the serial loop judges it: that
loop checks the running total after each row, so it stops exactly when the total of the rows before
some point passes max_hits; each run stops once its own count passes it, and the stitching adds the
runs' counts in row order (see combine()).
"""
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from dbvt._batch cimport batch_free, batch_reserve, run_boxes, run_frusta, run_segments, run_spheres
from dbvt._core cimport HIT_LIMIT, Batch, Query, TreeCore
from dbvt._parallel cimport run_parts
from dbvt._queries cimport run_ball_casts, run_box_casts, run_nearest


cdef int run_range(const TreeCore *t, const Rows *r, int64_t start, int64_t end, int64_t *offsets,
                   Batch *b) noexcept nogil:
    """Rows start..end-1 into b, their offsets into offsets[0..end-start]."""
    cdef Query q
    cdef int64_t n = end - start
    cdef int dims = t.dims
    q.mask = r.mask
    q.groups = r.groups
    q.skip_flags = r.skip
    q.first_hit = r.first_hit
    if r.kind == ROWS_BOXES:
        return run_boxes(t, &q, r.shapes + 2 * dims * start, n, offsets, b)
    if r.kind == ROWS_SPHERES:
        return run_spheres(t, &q, r.shapes + dims * start, r.radii + start, n, offsets, b)
    if r.kind == ROWS_SEGMENTS:
        return run_segments(t, &q, r.shapes + 2 * dims * start, n, offsets, b)
    if r.kind == ROWS_FRUSTA:
        return run_frusta(t, &q, r.shapes + (dims + 1) * r.planes * start, n, r.planes, offsets, b)
    if r.kind == ROWS_NEAREST:
        return run_nearest(t, r.shapes + dims * start, n, r.k, r.reach, r.mask, r.groups, r.skip, offsets, b)
    if r.kind == ROWS_BOX_CASTS:
        return run_box_casts(t, r.shapes + 2 * dims * start, r.moves + dims * start, n, r.first_hit, r.mask,
                             r.groups, r.skip, offsets, b)
    return run_ball_casts(t, r.shapes + dims * start, r.radii + start, r.moves + dims * start, n, r.first_hit,
                          r.mask, r.groups, r.skip, offsets, b)


ctypedef struct Part:               # one thread's run of rows
    int64_t start
    int64_t end
    int64_t *offsets                # its own end - start + 1 offsets, counted from its own output
    Batch *batch                    # the caller's batch for part 0, else `own`
    Batch own
    int status


ctypedef struct Job:
    const TreeCore *t
    const Rows *rows
    Part *parts


cdef void run_part(void *context, int i) noexcept nogil:
    cdef Job *job = <Job *>context
    cdef Part *p = &job.parts[i]
    p.status = run_range(job.t, job.rows, p.start, p.end, p.offsets, p.batch)


cdef int combine(Part *parts, int count, int64_t max_hits) noexcept nogil:
    """The status the serial loop would have returned. It reaches a run's rows only when the runs before
    hold no more than max_hits, and stops within the run once the total passes it: before a row that
    ran out of memory, if that row comes later. A run that stopped at the limit (its own count past
    it) fails the total too."""
    cdef int64_t total = 0
    cdef int i
    for i in range(count):
        total += parts[i].batch.count
        if 0 <= max_hits < total:
            return HIT_LIMIT
        if parts[i].status != 0:
            return parts[i].status
    return 0


cdef int stitch(Part *parts, int count, const Rows *r, int64_t n, int64_t *offsets, Batch *b) noexcept nogil:
    """Append every later part's output to part 0's (b), with the offsets shifted, in row order."""
    cdef bint fractions = r.kind != ROWS_BOXES and r.kind != ROWS_SPHERES and r.kind != ROWS_FRUSTA
    cdef int64_t total = 0, base, j
    cdef Batch *own
    cdef int i
    for i in range(count):
        total += parts[i].batch.count
    if batch_reserve(b, total - b.count) != 0:
        return -1
    for i in range(1, count):
        own = parts[i].batch
        base = b.count
        for j in range(parts[i].end - parts[i].start):
            offsets[parts[i].start + j] = base + parts[i].offsets[j]
        if own.count:
            memcpy(b.ids + base, own.ids, own.count * sizeof(b.ids[0]))
            if fractions:
                memcpy(b.fractions + base, own.fractions, own.count * sizeof(b.fractions[0]))
        b.count += own.count
    offsets[n] = b.count
    return 0


cdef int run_rows(const TreeCore *t, const Rows *rows, int64_t n, int threads, int64_t *offsets,
                  Batch *b) noexcept nogil:
    """The n rows' hits into b and their offsets into offsets[0..n], on up to `threads` threads (one
    for every ROWS_PER_PART rows). b.max_hits is the limit of the whole batch."""
    cdef int count = <int>min(<int64_t>threads, n // ROWS_PER_PART), i, status
    cdef Part *parts
    cdef int64_t *scratch
    cdef Job job
    if count < 2:
        return run_range(t, rows, 0, n, offsets, b)
    parts = <Part *>malloc(count * sizeof(Part))
    # The later parts' offsets, each with room for its closing offset (which would be the next part's
    # first) so that no two threads write the same word.
    scratch = <int64_t *>malloc((n + count) * sizeof(int64_t))
    if parts == NULL or scratch == NULL:
        free(parts)
        free(scratch)
        return run_range(t, rows, 0, n, offsets, b)
    for i in range(count):
        parts[i].start = n * i // count
        parts[i].end = n * (i + 1) // count
        parts[i].status = 0
        memset(&parts[i].own, 0, sizeof(Batch))
        parts[i].own.max_hits = b.max_hits
        parts[i].batch = b if i == 0 else &parts[i].own
        parts[i].offsets = offsets if i == 0 else scratch + parts[i].start + i
    job.t = t
    job.rows = rows
    job.parts = parts
    run_parts(run_part, &job, count)
    status = combine(parts, count, b.max_hits)
    if status == 0:
        status = stitch(parts, count, rows, n, offsets, b)
    for i in range(1, count):
        batch_free(&parts[i].own)
    free(parts)
    free(scratch)
    return status
