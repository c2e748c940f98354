# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Finding what an update must change (see _finding.pxd). Every proxy's answer depends on the world and
the proxy alone, and comes out in order, so the answers found on several threads are one thread's."""
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memset

from dbvt._core cimport PREFETCH_AHEAD, PROXY_MOVED, PROXY_SEEN, PROXY_SENSOR, hits_free, prefetch, stack_free
from dbvt._parallel cimport counter_get, counter_set, counter_take, dbvt_counter, run_parts
from dbvt._partners cimport TOUCHING, items_of, tight_overlap


ctypedef struct FindJob:
    const Finder *f
    const Partners *partners        # the lists, to tell which found the partners they hold
    const int32_t *proxies
    int64_t n
    Found *out
    dbvt_counter next               # the next chunk to take
    dbvt_counter failed


cdef inline bint same_partners(const Partners *p, const int32_t *found, int64_t count) noexcept nogil:
    cdef const int32_t *items = items_of(p)
    cdef int64_t k
    if count != p.count:
        return False
    for k in range(count):
        if (items[k] >> 1) != found[k]:
            return False
    return True


cdef void find_worker(void *context, int worker) noexcept nogil:
    """Take chunks until none is left. The thread's stack and hits are its own locals while it works,
    and go to `out` at the end: side by side in one array, the two threads' counters would share a
    cache line that both write at every hit (measured: twice the CPU time of one thread)."""
    cdef FindJob *job = <FindJob *>context
    cdef Stack stack
    cdef Hits hits
    cdef int64_t start, i
    memset(&stack, 0, sizeof(Stack))
    memset(&hits, 0, sizeof(Hits))
    while not counter_get(&job.failed):
        start = <int64_t>counter_take(&job.next) * FIND_CHUNK
        if start >= job.n:
            break
        for i in range(start, min(start + FIND_CHUNK, job.n)):
            job.out.first[i] = hits.count
            job.out.worker[i] = worker
            if find_partners(job.f, job.proxies[i], &stack, &hits) != 0:
                counter_set(&job.failed, 1)
                break
            job.out.count[i] = <int32_t>(hits.count - job.out.first[i])
            # In a dense scene most refreshed lists come out as they were: the merge can skip them.
            if same_partners(&job.partners[job.proxies[i]], hits.proxies + job.out.first[i], job.out.count[i]):
                hits.count = job.out.first[i]
                job.out.count[i] = UNCHANGED
    stack_free(&stack)
    job.out.hits[worker] = hits


cdef int find_all(const Finder *f, const Partners *partners, const int32_t *proxies, int64_t n, int threads,
                  Found *out) noexcept nogil:
    """The partners of each of `proxies` into `out` (empty), on up to `threads` threads, in chunks of
    FIND_CHUNK proxies that the threads take in turn (a thread slowed by other work takes fewer); a
    proxy whose list holds them already gets the count UNCHANGED, and no partners."""
    cdef FindJob job
    out.workers = <int>max(1, min(<int64_t>threads, n // FIND_CHUNK))
    out.hits = <Hits *>calloc(out.workers, sizeof(Hits))
    out.first = <int64_t *>malloc(max(n, 1) * sizeof(int64_t))
    out.count = <int32_t *>malloc(max(n, 1) * sizeof(int32_t))
    out.worker = <int32_t *>malloc(max(n, 1) * sizeof(int32_t))
    if out.hits == NULL or out.first == NULL or out.count == NULL or out.worker == NULL:
        return -1
    job.f = f
    job.partners = partners
    job.proxies = proxies
    job.n = n
    job.out = out
    counter_set(&job.next, 0)
    counter_set(&job.failed, 0)
    run_parts(find_worker, &job, out.workers)
    return -1 if counter_get(&job.failed) else 0


cdef void found_free(Found *found) noexcept nogil:
    cdef int i
    if found.hits != NULL:
        for i in range(found.workers):
            hits_free(&found.hits[i])
    free(found.hits)
    free(found.first)
    free(found.count)
    free(found.worker)
    memset(found, 0, sizeof(Found))


ctypedef struct RetestJob:
    const TreeCore *t
    const Partners *partners
    const int32_t *moved
    int64_t n
    Retests *out
    dbvt_counter next
    dbvt_counter failed


ctypedef struct Changes:            # a thread's changes while it works: its own, not in a shared array
    Retest *items
    int64_t count
    int64_t capacity


cdef int change_push(Changes *changes, int32_t proxy, int32_t entry, int32_t visit) noexcept nogil:
    cdef int64_t capacity
    cdef Retest *grown
    if changes.count == changes.capacity:
        capacity = max(<int64_t>256, 2 * changes.capacity)
        grown = <Retest *>realloc(changes.items, capacity * sizeof(Retest))
        if grown == NULL:
            return -1
        changes.items = grown
        changes.capacity = capacity
    changes.items[changes.count].proxy = proxy
    changes.items[changes.count].entry = entry
    changes.items[changes.count].visit = visit
    changes.count += 1
    return 0


cdef int retest_one(const RetestJob *job, Changes *changes, int32_t proxy) noexcept nogil:
    """A moved proxy's partners, as _broadphase's _retest takes them on one thread: a pair of two moved
    proxies is tested by the lower-numbered (the one that thread takes first), and a moved sensor has
    decided its own pairs already (PROXY_SEEN)."""
    cdef const TreeCore *t = job.t
    cdef const Partners *mine = &job.partners[proxy]
    cdef const int32_t *items = items_of(mine)
    cdef int32_t k, other
    cdef uint32_t flags
    for k in range(mine.count):
        if k + PREFETCH_AHEAD < mine.count:
            prefetch(&t.proxies[items[k + PREFETCH_AHEAD] >> 1])
        other = items[k] >> 1
        flags = t.proxies[other].flags
        if flags & PROXY_SENSOR:
            if not (flags & PROXY_SEEN) and change_push(changes, proxy, k, 1) != 0:
                return -1
        elif flags & PROXY_MOVED and other < proxy:
            continue
        elif tight_overlap(t, proxy, other) != (items[k] & TOUCHING) and change_push(changes, proxy, k, 0) != 0:
            return -1
    return 0


cdef void retest_worker(void *context, int worker) noexcept nogil:
    """Take chunks until none is left, the changes in a buffer of the thread's own (see find_worker)."""
    cdef RetestJob *job = <RetestJob *>context
    cdef Retests *out = job.out
    cdef Changes changes
    cdef int64_t chunk, i
    memset(&changes, 0, sizeof(Changes))
    while not counter_get(&job.failed):
        chunk = counter_take(&job.next)
        if chunk >= out.chunks:
            break
        out.chunk_worker[chunk] = worker
        out.chunk_first[chunk] = changes.count
        for i in range(chunk * FIND_CHUNK, min((chunk + 1) * FIND_CHUNK, job.n)):
            if i + PREFETCH_AHEAD < job.n:
                prefetch(&job.partners[job.moved[i + PREFETCH_AHEAD]])
            if retest_one(job, &changes, job.moved[i]) != 0:
                counter_set(&job.failed, 1)
                break
        out.chunk_count[chunk] = changes.count - out.chunk_first[chunk]
    out.found[worker] = changes.items
    out.found_count[worker] = changes.count


cdef int retest_all(const TreeCore *t, const Partners *partners, const int32_t *moved, int64_t n, int threads,
                    Retests *out) noexcept nogil:
    """Stage 2's changes for `moved` (live proxies that are no sensors, ascending, each once) into `out`
    (empty), chunk by chunk: flips and sensors' pairs to re-test, in the order one thread meets them."""
    cdef RetestJob job
    out.chunks = (n + FIND_CHUNK - 1) // FIND_CHUNK
    out.workers = <int>max(1, min(<int64_t>threads, out.chunks))
    out.found = <Retest **>calloc(out.workers, sizeof(Retest *))
    out.found_count = <int64_t *>calloc(out.workers, sizeof(int64_t))
    out.chunk_first = <int64_t *>malloc(max(out.chunks, 1) * sizeof(int64_t))
    out.chunk_count = <int64_t *>malloc(max(out.chunks, 1) * sizeof(int64_t))
    out.chunk_worker = <int32_t *>malloc(max(out.chunks, 1) * sizeof(int32_t))
    if (out.found == NULL or out.found_count == NULL or out.chunk_first == NULL or out.chunk_count == NULL
            or out.chunk_worker == NULL):
        return -1
    job.t = t
    job.partners = partners
    job.moved = moved
    job.n = n
    job.out = out
    counter_set(&job.next, 0)
    counter_set(&job.failed, 0)
    run_parts(retest_worker, &job, out.workers)
    return -1 if counter_get(&job.failed) else 0


cdef void retests_free(Retests *retests) noexcept nogil:
    cdef int i
    if retests.found != NULL:
        for i in range(retests.workers):
            free(retests.found[i])
    free(retests.found)
    free(retests.found_count)
    free(retests.chunk_first)
    free(retests.chunk_count)
    free(retests.chunk_worker)
    memset(retests, 0, sizeof(Retests))
