# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""A batch of queries cut into contiguous chunks of rows, which threads take in turn, and whose outputs
are stitched back in row order: the answer is byte for byte the one a single thread gives.

Each thread has its own Batch (stack, hits, output), each chunk its own Query and offsets; the tree is
only read. Every query's answer depends on its row and the tree alone, so the chunks' outputs, laid
end to end with the offsets shifted, are the serial output. The hit limit is judged as the serial loop
judges it: that loop checks the running total after each row, so it stops exactly when the total of
the rows before some point passes max_hits; each chunk stops once its own count passes it, and the
stitching adds the chunks' counts in row order (see combine()).

Chunks, several a thread, rather than one run a thread: a thread that shares its core with another
process, or whose rows cost more, takes fewer of them, where with one run each the call would wait
for the slowest. On 2 cores with one busy with another process, W1's box queries on 2 threads took as
long as on one with a run a thread.
"""
from libc.stdint cimport INT64_MAX, int64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

from dbvt._batch cimport batch_free, batch_reserve, run_boxes, run_frusta, run_segments, run_spheres
from dbvt._core cimport HIT_LIMIT, Batch, Query, TreeCore
from dbvt._parallel cimport counter_get, counter_set, counter_take, dbvt_counter, run_parts
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




ctypedef struct Chunk:              # a run of rows, and where its output went
    int64_t start
    int64_t end
    int worker                      # the thread that ran it
    int status
    int64_t first                   # its first hit in that thread's output
    int64_t count                   # its hits (of the rows it finished)


ctypedef struct Job:
    const TreeCore *t
    const Rows *rows
    Chunk *chunks
    int chunk_count
    Batch *batches                  # one a thread: its working memory, and its chunks' outputs in turn
    int64_t *scratch                # chunk c's offsets at start + c: no two chunks share a word
    int64_t max_hits
    dbvt_counter next               # the next chunk to take
    dbvt_counter failed             # a chunk failed: take no more


cdef inline int64_t limit_after(int64_t max_hits, int64_t count) noexcept nogil:
    """The Batch.max_hits that stops a chunk appended after `count` hits once the chunk alone passes
    max_hits (-1: none; so large a limit cannot be passed anyway)."""
    if max_hits < 0 or max_hits > INT64_MAX - count:
        return -1
    return max_hits + count


cdef void run_worker(void *context, int worker) noexcept nogil:
    """Take chunks in row order until none is left, or one has failed. Every chunk taken is run, so
    those run are the first ones: combine() needs no chunk it does not have. The thread's Batch is a
    local while it works: side by side in one array, two threads' Batches share a cache line, which
    both would write at every hit."""
    cdef Job *job = <Job *>context
    cdef Batch b = job.batches[worker]
    cdef Chunk *chunk
    cdef int c
    while not counter_get(&job.failed):
        c = counter_take(&job.next)
        if c >= job.chunk_count:
            break
        chunk = &job.chunks[c]
        chunk.worker = worker
        chunk.first = b.count
        b.max_hits = limit_after(job.max_hits, b.count)
        chunk.status = run_range(job.t, job.rows, chunk.start, chunk.end, job.scratch + chunk.start + c, &b)
        chunk.count = b.count - chunk.first
        if chunk.status != 0:
            counter_set(&job.failed, 1)
            break
    job.batches[worker] = b


cdef int combine(const Job *job) noexcept nogil:
    """The status the serial loop would have returned. It reaches a chunk's rows only when the chunks
    before hold no more than max_hits, and stops within the chunk once the total passes it: before a
    row that ran out of memory, if that row comes later. A chunk that stopped at the limit (its own
    count past it) fails the total too. The chunks before a failed one were all run (run_worker)."""
    cdef int64_t total = 0
    cdef int c
    for c in range(job.chunk_count):
        total += job.chunks[c].count
        if 0 <= job.max_hits < total:
            return HIT_LIMIT
        if job.chunks[c].status != 0:
            return job.chunks[c].status
    return 0


cdef int stitch(const Job *job, int64_t n, int64_t *offsets, Batch *b) noexcept nogil:
    """Every chunk's output appended to b in row order, with its offsets shifted."""
    cdef RowsKind kind = job.rows.kind
    cdef bint fractions = kind != ROWS_BOXES and kind != ROWS_SPHERES and kind != ROWS_FRUSTA
    cdef int64_t total = 0, shift, j
    cdef const Chunk *chunk
    cdef const Batch *own
    cdef const int64_t *local
    cdef int c
    for c in range(job.chunk_count):
        total += job.chunks[c].count
    if batch_reserve(b, total) != 0:
        return -1
    for c in range(job.chunk_count):
        chunk = &job.chunks[c]
        own = &job.batches[chunk.worker]
        local = job.scratch + chunk.start + c
        shift = b.count - chunk.first
        for j in range(chunk.end - chunk.start):
            offsets[chunk.start + j] = local[j] + shift
        if chunk.count:
            memcpy(b.ids + b.count, own.ids + chunk.first, chunk.count * sizeof(b.ids[0]))
            if fractions:
                memcpy(b.fractions + b.count, own.fractions + chunk.first, chunk.count * sizeof(b.fractions[0]))
        b.count += chunk.count
    offsets[n] = b.count
    return 0


cdef int run_rows(const TreeCore *t, const Rows *rows, int64_t n, int threads, int64_t *offsets,
                  Batch *b) noexcept nogil:
    """The n rows' hits into b (empty) and their offsets into offsets[0..n], on up to `threads` threads
    (one for every ROWS_PER_PART rows). b.max_hits is the limit of the whole batch."""
    cdef int workers = <int>min(<int64_t>threads, n // ROWS_PER_PART), i, status
    cdef Job job
    if workers < 2:
        return run_range(t, rows, 0, n, offsets, b)
    job.chunk_count = workers * CHUNKS_PER_THREAD
    job.chunks = <Chunk *>malloc(job.chunk_count * sizeof(Chunk))
    job.batches = <Batch *>calloc(workers, sizeof(Batch))
    job.scratch = <int64_t *>malloc((n + job.chunk_count) * sizeof(int64_t))
    if job.chunks == NULL or job.batches == NULL or job.scratch == NULL:
        free(job.chunks)
        free(job.batches)
        free(job.scratch)
        return run_range(t, rows, 0, n, offsets, b)
    for i in range(job.chunk_count):
        job.chunks[i].start = n * i // job.chunk_count
        job.chunks[i].end = n * (i + 1) // job.chunk_count
        job.chunks[i].status = 0
        job.chunks[i].count = 0
    job.t = t
    job.rows = rows
    job.max_hits = b.max_hits
    counter_set(&job.next, 0)
    counter_set(&job.failed, 0)
    run_parts(run_worker, &job, workers)
    status = combine(&job)
    if status == 0:
        status = stitch(&job, n, offsets, b)
    for i in range(workers):
        batch_free(&job.batches[i])
    free(job.chunks)
    free(job.batches)
    free(job.scratch)
    return status
