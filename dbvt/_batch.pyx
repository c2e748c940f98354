# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Batches of queries: one walk per query, its hits sorted into the order the API promises and
appended to one growing CSR output; and the sorting they share with the broadphase."""
from libc.math cimport INFINITY
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset

from dbvt._core cimport (
    HIT_LIMIT, PROXY_LIVE, QUERY_BOX, QUERY_FAT_BOX, QUERY_FRUSTUM, QUERY_RAY, QUERY_SPHERE, Batch, Hits, IdPair,
    PairBuffer, Query, QueryKind, RayHit, Stack, TreeCore, hits_free, load_box, pair_allowed, stack_free, walk,
)
from dbvt._parallel cimport run_parts
from dbvt._wide cimport wide_serves, wide_walk


# ---------------------------------------------------------------------------------------------
# Sorting the results: ids ascending, ray hits by (fraction, id), pairs lexicographically.

cdef enum:
    MERGE_FROM = 64     # from this many items, a short unsorted prefix before a sorted run is merged in
    # From this many pairs, a radix sort, whose passes cover only the bits in which the ids differ:
    # quicksort's comparisons are coin tosses (a dense step's 5,000 pair changes took 7 % of it; an
    # overlap's crossings, 9 ms of 32; 2,000 moving sensors taken by id, 3 % of a step).
    RADIX_FROM = 256
    RADIX_BITS = 11     # a radix pass's widest digit: 2,048 counters stay in L1
    RANK_SORT_UP_TO = 64  # up to this many int32s, sort_few_int32 ranks them
    # From this many int32s (a sphere sensor's partners, some 200), a radix sort: quicksort's
    # comparisons on them are coin tosses, a missed guess each other item.
    RADIX_INT32_FROM = 128
    MAX_RADIX_PASSES = 12   # a pair's two 64-bit ids in digits of at least 11 bits
    # From this many begun and ended pairs, threads sort the two side by side; a dense world's step
    # has tens of thousands of each, a sparse one's a few thousand (a sort of 50,000 takes ~2 ms).
    SORT_ON_THREADS_FROM = 16384

ctypedef fused Sortable:
    int32_t
    uint64_t
    RayHit
    IdPair


cdef inline bint before(const Sortable *x, const Sortable *y) noexcept nogil:
    if Sortable is RayHit:
        return x.fraction < y.fraction or (x.fraction == y.fraction and x.id < y.id)
    elif Sortable is IdPair:
        return x.a < y.a or (x.a == y.a and x.b < y.b)
    else:
        return x[0] < y[0]


cdef void sort_items(Sortable *items, int64_t n) noexcept nogil:
    """Sorted in place. What the broadphase sorts is often sorted already, or a few items followed by a
    sorted run (the pairs an update ends while refreshing partner lists, then those its re-tests
    find, in proxy order): those take a scan and a merge instead of a sort."""
    cdef int64_t start = n - 1, end = 1
    cdef Sortable *part
    while start > 0 and not before(&items[start], &items[start - 1]):
        start -= 1
    if start <= 0:
        return
    # Below MERGE_FROM items, insertion sort does as well on such input, with no allocation.
    if n >= MERGE_FROM and start <= n // 4:
        part = <Sortable *>malloc(start * sizeof(Sortable))
        if part != NULL:
            quicksort_items(items, start)
            memcpy(part, items, start * sizeof(Sortable))
            merge_front(items, part, start, n)
            free(part)
            return
    # Or a sorted run followed by a few items (the sensor events a sensor's pass finds, sensor by
    # sensor, then those its moved partners find).
    while end < n and not before(&items[end], &items[end - 1]):
        end += 1
    if n >= MERGE_FROM and n - end <= n // 4:
        part = <Sortable *>malloc((n - end) * sizeof(Sortable))
        if part != NULL:
            quicksort_items(items + end, n - end)
            memcpy(part, items + end, (n - end) * sizeof(Sortable))
            merge_back(items, part, end, n)
            free(part)
            return
    if Sortable is IdPair:
        if n >= RADIX_FROM and radix_pairs(items, n) == 0:
            return
    if Sortable is int32_t:
        if n >= RADIX_INT32_FROM and radix_int32(items, n) == 0:
            return
    quicksort_items(items, n)


ctypedef fused Radixed:
    int32_t
    IdPair


cdef inline uint64_t digit_of(const Radixed *item, bint by_a, int shift, uint64_t mask) noexcept nogil:
    """The digit at `shift` of an int32, or of a pair's `a` (`by_a`) or `b`."""
    if Radixed is int32_t:
        return (<uint32_t>item[0] >> shift) & mask
    else:
        return ((item.a if by_a else item.b) >> shift) & mask


cdef void radix_pass(const Radixed *source, Radixed *target, int64_t n, bint by_a, int shift,
                     uint64_t mask) noexcept nogil:
    """One stable pass of a least-significant-digit radix sort: `source` into `target` by the digit at
    `shift` (of at most RADIX_BITS bits: `mask`)."""
    cdef int64_t counts[1 << RADIX_BITS]
    cdef int64_t i, total = 0, count
    cdef uint64_t digit
    memset(counts, 0, (mask + 1) * sizeof(int64_t))
    for i in range(n):
        counts[digit_of(&source[i], by_a, shift, mask)] += 1
    for digit in range(mask + 1):
        count = counts[digit]
        counts[digit] = total
        total += count
    for i in range(n):
        digit = digit_of(&source[i], by_a, shift, mask)
        target[counts[digit]] = source[i]
        counts[digit] += 1


ctypedef struct RadixPlan:          # a radix sort's passes, least significant first
    int count
    bint by_a[MAX_RADIX_PASSES]     # a pair's `a`, or else its `b` (an int32's own bits)
    int shift[MAX_RADIX_PASSES]
    int width[MAX_RADIX_PASSES]     # at most RADIX_BITS


cdef inline void plan_passes(RadixPlan *plan, uint64_t varying, bint by_a) noexcept nogil:
    """Passes over the bits up to the highest that differs between the keys (`varying`), as few as
    digits of at most RADIX_BITS allow, equally wide: above it every key is the same."""
    cdef int bits = 0, passes, width, k
    while bits < 64 and (varying >> bits) != 0:
        bits += 1
    passes = (bits + RADIX_BITS - 1) // RADIX_BITS
    width = (bits + passes - 1) // passes if passes else 0
    for k in range(passes):
        plan.by_a[plan.count] = by_a
        plan.shift[plan.count] = k * width
        plan.width[plan.count] = width
        plan.count += 1


cdef int radix_sort(Radixed *items, int64_t n, const RadixPlan *plan) noexcept nogil:
    """`items` sorted by the plan's passes, through a spare array of n; -1, untouched, when memory
    ran out."""
    cdef Radixed *spare
    cdef Radixed *source = items
    cdef Radixed *target
    cdef Radixed *swap
    cdef int k
    if plan.count == 0:
        return 0
    spare = <Radixed *>malloc(n * sizeof(Radixed))
    if spare == NULL:
        return -1
    target = spare
    for k in range(plan.count):
        radix_pass(source, target, n, plan.by_a[k], plan.shift[k], (<uint64_t>1 << plan.width[k]) - 1)
        swap = source
        source = target
        target = swap
    if source != items:
        memcpy(items, source, n * sizeof(Radixed))
    free(spare)
    return 0


cdef int radix_int32(int32_t *items, int64_t n) noexcept nogil:
    """Non-negative int32s sorted with a least-significant-digit radix sort, in as few passes of at
    most RADIX_BITS as the bits in which they differ need (two for proxy numbers under 2^22). -1,
    untouched, when one is negative or memory ran out."""
    cdef RadixPlan plan
    cdef uint32_t used = 0, varying = 0
    cdef int64_t i
    if n == 0:
        return 0
    for i in range(n):
        used |= <uint32_t>items[i]
        varying |= <uint32_t>(items[i] ^ items[0])
    if used >> 31:
        return -1
    plan.count = 0
    plan_passes(&plan, varying, False)
    return radix_sort(items, n, &plan)


cdef int radix_pairs(IdPair *pairs, int64_t n) noexcept nogil:
    """Pairs sorted by (a, b) with a least-significant-digit radix sort over the bits in which the ids
    differ (two passes a key for ids under 2^22): a few passes over the pairs instead of n log n
    comparisons. -1, untouched, when memory ran out."""
    cdef RadixPlan plan
    cdef uint64_t varying_a = 0, varying_b = 0
    cdef int64_t i
    if n == 0:
        return 0
    for i in range(n):
        varying_a |= pairs[i].a ^ pairs[0].a
        varying_b |= pairs[i].b ^ pairs[0].b
    plan.count = 0
    plan_passes(&plan, varying_b, False)    # b first: each pass keeps the order of the one before
    plan_passes(&plan, varying_a, True)
    return radix_sort(pairs, n, &plan)


cdef void merge_front(Sortable *items, const Sortable *prefix, int64_t count, int64_t n) noexcept nogil:
    """items[count:n] (sorted) merged with `prefix` (sorted, the `count` items that stood before it)
    into items[0:n]: writing never overtakes the unread run, since it trails it by what is left of
    the prefix."""
    cdef int64_t i = 0, j = count, out = 0
    while i < count:
        if j < n and before(&items[j], &prefix[i]):
            items[out] = items[j]
            j += 1
        else:
            items[out] = prefix[i]
            i += 1
        out += 1


cdef void merge_back(Sortable *items, const Sortable *suffix, int64_t count, int64_t n) noexcept nogil:
    """items[0:count] (sorted) merged with `suffix` (sorted, the items that stood after it) into
    items[0:n], from the back: writing never overtakes the unread run, as in merge_front."""
    cdef int64_t i = n - count - 1, j = count - 1, out = n - 1
    while i >= 0:
        if j >= 0 and before(&suffix[i], &items[j]):
            items[out] = items[j]
            j -= 1
        else:
            items[out] = suffix[i]
            i -= 1
        out -= 1


cdef void quicksort_items(Sortable *items, int64_t n) noexcept nogil:
    """Quicksort (median-of-three Hoare partition, recursing into the smaller side) finished by
    insertion sort; results are usually short and often nearly sorted."""
    cdef int64_t lo = 0, hi = n, i, j, mid
    cdef Sortable pivot, tmp
    while hi - lo > 16:
        mid = lo + (hi - lo - 1) // 2
        if before(&items[mid], &items[lo]):
            items[mid], items[lo] = items[lo], items[mid]
        if before(&items[hi - 1], &items[mid]):
            items[mid], items[hi - 1] = items[hi - 1], items[mid]
            if before(&items[mid], &items[lo]):
                items[mid], items[lo] = items[lo], items[mid]
        pivot = items[mid]
        i = lo - 1
        j = hi
        while True:
            i += 1
            while before(&items[i], &pivot):
                i += 1
            j -= 1
            while before(&pivot, &items[j]):
                j -= 1
            if i >= j:
                break
            items[i], items[j] = items[j], items[i]
        if j + 1 - lo < hi - (j + 1):
            quicksort_items(items + lo, j + 1 - lo)
            lo = j + 1
        else:
            quicksort_items(items + j + 1, hi - (j + 1))
            hi = j + 1
    for i in range(lo + 1, hi):
        tmp = items[i]
        j = i - 1
        while j >= lo and before(&tmp, &items[j]):
            items[j + 1] = items[j]
            j -= 1
        items[j + 1] = tmp


cdef void sort_int32(int32_t *items, int64_t n) noexcept nogil:
    sort_items(items, n)


cdef inline int32_t count_below(const int32_t *items, int32_t count, int32_t value) noexcept nogil:
    cdef int32_t j, below = 0
    for j in range(count):
        below += items[j] < value
    return below


cdef inline int32_t count_equal(const int32_t *items, int32_t count, int32_t value) noexcept nogil:
    cdef int32_t j, equal = 0
    for j in range(count):
        equal += items[j] == value
    return equal


cdef void sort_few_int32(int32_t *items, int64_t n, bint repeats) noexcept nogil:
    """sort_int32 for a refreshed proxy's partners. A few (n <= RANK_SORT_UP_TO) go each where the
    count of those below it (and, when some may `repeat`, of its equals before it) says: n * n
    comparisons the compiler makes four at a time, without a branch. The partners come from a walk
    in the tree's order, each once, and then, with sensors, from a grid that finds some in several
    cells: sorting them by insertion missed a guess at nearly every item."""
    cdef int32_t copy[RANK_SORT_UP_TO]
    cdef int32_t i, count = <int32_t>n
    if n > RANK_SORT_UP_TO:
        sort_items(items, n)
        return
    memcpy(copy, items, n * sizeof(int32_t))
    if not repeats:
        for i in range(count):
            items[count_below(copy, count, copy[i])] = copy[i]
        return
    for i in range(count):
        items[count_below(copy, count, copy[i]) + count_equal(copy, i, copy[i])] = copy[i]


cdef int64_t drop_repeats(int32_t *items, int64_t n) noexcept nogil:
    """Keep one of each run of equal items (sorted ones: each value once), in place; returns how many."""
    cdef int64_t i, kept = 0
    for i in range(n):
        if kept == 0 or items[i] != items[kept - 1]:
            items[kept] = items[i]
            kept += 1
    return kept


cdef void sort_pairs(IdPair *pairs, int64_t n) noexcept nogil:
    sort_items(pairs, n)


cdef int pairs_push(PairBuffer *buffer, uint64_t a, uint64_t b) noexcept nogil:
    """Append the pair as (smaller id, larger id)."""
    if a < b:
        return rows_push(buffer, a, b)
    return rows_push(buffer, b, a)


cdef int rows_push(PairBuffer *buffer, uint64_t a, uint64_t b) noexcept nogil:
    """Append the row (a, b) as it is: a sensor row is [sensor, proxy]."""
    cdef int64_t capacity
    cdef IdPair *pairs
    if buffer.count == buffer.capacity:
        capacity = 2 * buffer.capacity if buffer.capacity else 256
        pairs = <IdPair *>realloc(buffer.pairs, capacity * sizeof(IdPair))
        if pairs == NULL:
            return -1
        buffer.pairs = pairs
        buffer.capacity = capacity
    buffer.pairs[buffer.count].a = a
    buffer.pairs[buffer.count].b = b
    buffer.count += 1
    return 0


cdef int pairs_extend(PairBuffer *buffer, const PairBuffer *more) noexcept nogil:
    """Append another buffer's rows."""
    cdef int64_t capacity = max(buffer.capacity, <int64_t>256)
    cdef IdPair *pairs
    if buffer.count + more.count > buffer.capacity:
        while capacity < buffer.count + more.count:
            capacity *= 2
        pairs = <IdPair *>realloc(buffer.pairs, capacity * sizeof(IdPair))
        if pairs == NULL:
            return -1
        buffer.pairs = pairs
        buffer.capacity = capacity
    if more.count:
        memcpy(buffer.pairs + buffer.count, more.pairs, more.count * sizeof(IdPair))
    buffer.count += more.count
    return 0


cdef void pairs_free(PairBuffer *buffer) noexcept nogil:
    free(buffer.pairs)
    buffer.pairs = NULL
    buffer.count = buffer.capacity = 0


cdef void sort_one_of_two(void *context, int part) noexcept nogil:
    cdef PairBuffer *buffer = (<PairBuffer **>context)[part]
    sort_pairs(buffer.pairs, buffer.count)


cdef void cancel_common(PairBuffer *begun, PairBuffer *ended, int threads, bint destroyed) noexcept nogil:
    """Sort both, then drop pairs reported both begun and ended (a proxy destroyed and re-created under
    the same id meets the same partner): across the update, that pair did not change. Only a pair a
    destroy ended can be both, so without `destroyed` (ended held no pair before the update) the
    walk is skipped. With threads, each is sorted on a thread of its own: on a dense world they hold
    tens of thousands each."""
    cdef int64_t i = 0, j = 0, kb = 0, ke = 0
    cdef PairBuffer *both[2]
    both[0] = begun
    both[1] = ended
    if threads > 1 and begun.count + ended.count >= SORT_ON_THREADS_FROM:
        run_parts(sort_one_of_two, both, 2)
    else:
        sort_one_of_two(both, 0)
        sort_one_of_two(both, 1)
    if not destroyed:
        return
    while i < begun.count or j < ended.count:
        if j == ended.count or (i < begun.count and (
                begun.pairs[i].a < ended.pairs[j].a
                or (begun.pairs[i].a == ended.pairs[j].a and begun.pairs[i].b < ended.pairs[j].b))):
            begun.pairs[kb] = begun.pairs[i]
            kb += 1
            i += 1
        elif i == begun.count or (ended.pairs[j].a < begun.pairs[i].a
                or (ended.pairs[j].a == begun.pairs[i].a and ended.pairs[j].b < begun.pairs[i].b)):
            ended.pairs[ke] = ended.pairs[j]
            ke += 1
            j += 1
        else:
            i += 1
            j += 1
    begun.count = kb
    ended.count = ke


# ---------------------------------------------------------------------------------------------
# Batches of queries: one walk per query, its hits appended to one growing CSR output.

cdef int batch_reserve(Batch *b, int64_t extra) noexcept nogil:
    cdef int64_t capacity
    cdef uint64_t *ids
    cdef double *fractions
    if b.count + extra <= b.capacity:
        return 0
    capacity = max(b.count + extra, 2 * b.capacity, 1024)
    ids = <uint64_t *>realloc(b.ids, capacity * sizeof(uint64_t))
    if ids == NULL:
        return -1
    b.ids = ids
    fractions = <double *>realloc(b.fractions, capacity * sizeof(double))
    if fractions == NULL:
        return -1
    b.fractions = fractions
    b.capacity = capacity
    return 0


cdef void batch_free(Batch *b) noexcept nogil:
    free(b.ids)
    free(b.fractions)
    free(b.ray_hits)
    stack_free(&b.stack)
    hits_free(&b.hits)
    b.ids = NULL
    b.fractions = NULL
    b.ray_hits = NULL
    b.count = b.capacity = b.ray_capacity = 0


cdef inline uint64_t hit_id(const TreeCore *t, int32_t hit, bint wide) noexcept nogil:
    """The id of a hit: a walk of the tree names a proxy, a walk of its wide view (_wide) a leaf."""
    return t.wide.ids[hit] if wide else t.proxies[hit].id


cdef int finish_query(const TreeCore *t, const Query *q, Batch *b, bint wide) noexcept nogil:
    """Append the walk's hits to the output in the order the API promises."""
    cdef int64_t n = b.hits.count, i
    cdef uint64_t *ids
    if q.kind == QUERY_RAY:
        return append_by_fraction(t, b, q.first_hit, wide)
    if batch_reserve(b, n) != 0:
        return -1
    ids = b.ids + b.count
    for i in range(n):
        ids[i] = hit_id(t, b.hits.proxies[i], wide)
    sort_items(ids, n)
    b.count += n
    return 0


cdef int append_by_fraction(const TreeCore *t, Batch *b, bint first_hit, bint wide) noexcept nogil:
    """Append the hits with their fractions, ordered by fraction then id; with `first_hit`, only the
    first of them. `wide`: the hits name leaves of the wide view, not proxies."""
    cdef int64_t n = b.hits.count, i
    cdef RayHit *ray_hits
    cdef uint64_t *ids
    if batch_reserve(b, n) != 0:
        return -1
    ids = b.ids + b.count
    if n > b.ray_capacity:
        ray_hits = <RayHit *>realloc(b.ray_hits, n * sizeof(RayHit))
        if ray_hits == NULL:
            return -1
        b.ray_hits = ray_hits
        b.ray_capacity = n
    for i in range(n):
        b.ray_hits[i].fraction = b.hits.fractions[i]
        b.ray_hits[i].id = hit_id(t, b.hits.proxies[i], wide)
    sort_items(b.ray_hits, n)
    if first_hit and n > 1:
        n = 1
    for i in range(n):
        ids[i] = b.ray_hits[i].id
        b.fractions[b.count + i] = b.ray_hits[i].fraction
    b.count += n
    return 0


cdef int run_one(const TreeCore *t, Query *q, Batch *b) noexcept nogil:
    """One query's hits appended to the batch: 0, -1 when memory ran out, or HIT_LIMIT when the
    batch's hits passed b.max_hits (checked per query: one query holds at most every proxy)."""
    cdef bint wide = wide_serves(t, q)
    b.hits.count = 0
    if (wide_walk(t, q, &b.stack, &b.hits) if wide else walk(t, q, &b.stack, &b.hits)) != 0:
        return -1
    if finish_query(t, q, b, wide) != 0:
        return -1
    if 0 <= b.max_hits < b.count:
        return HIT_LIMIT
    return 0


cdef int run_boxes(const TreeCore *t, Query *q, const float *rows, int64_t n,
                   int64_t *offsets, Batch *b) noexcept nogil:
    cdef int64_t i
    cdef int status
    q.kind = QUERY_BOX
    for i in range(n):
        offsets[i] = b.count
        load_box(rows + 2 * t.dims * i, t.dims, q.box)
        status = run_one(t, q, b)
        if status != 0:
            return status
    offsets[n] = b.count
    return 0


cdef int run_spheres(const TreeCore *t, Query *q, const float *centers, const float *radii,
                     int64_t n, int64_t *offsets, Batch *b) noexcept nogil:
    cdef int64_t i
    cdef int status
    cdef int k
    q.kind = QUERY_SPHERE
    for i in range(n):
        offsets[i] = b.count
        q.center[2] = 0.0
        for k in range(t.dims):
            q.center[k] = centers[t.dims * i + k]
        q.radius_sq = <double>radii[i] * <double>radii[i]
        status = run_one(t, q, b)
        if status != 0:
            return status
    offsets[n] = b.count
    return 0


cdef int run_segments(const TreeCore *t, Query *q, const float *rows, int64_t n,
                      int64_t *offsets, Batch *b) noexcept nogil:
    cdef int64_t i
    cdef int status
    cdef int k
    cdef const float *row
    q.kind = QUERY_RAY
    for i in range(n):
        offsets[i] = b.count
        row = rows + 2 * t.dims * i
        for k in range(3):
            q.origin[k] = 0.0
            q.delta[k] = 0.0
            q.inv_delta[k] = 0.0
        for k in range(t.dims):
            q.origin[k] = row[k]
            q.delta[k] = <double>row[t.dims + k] - <double>row[k]
            if q.delta[k] != 0.0:
                q.inv_delta[k] = 1.0 / q.delta[k]
        q.best_fraction = INFINITY
        status = run_one(t, q, b)
        if status != 0:
            return status
    offsets[n] = b.count
    return 0


cdef int run_frusta(const TreeCore *t, Query *q, const float *planes, int64_t n, int32_t k,
                    int64_t *offsets, Batch *b) noexcept nogil:
    cdef int64_t i
    cdef int status
    cdef int j
    cdef const float *plane
    q.kind = QUERY_FRUSTUM
    q.plane_count = k
    for i in range(n):
        offsets[i] = b.count
        for j in range(k):
            plane = planes + (t.dims + 1) * (i * k + j)
            q.planes[j][0] = plane[0]
            q.planes[j][1] = plane[1]
            q.planes[j][2] = plane[2] if t.dims == 3 else 0.0
            q.planes[j][3] = plane[t.dims]
        status = run_one(t, q, b)
        if status != 0:
            return status
    offsets[n] = b.count
    return 0


cdef int each_overlap(const TreeCore *t, QueryKind kind, OverlapVisit visit, void *context) noexcept nogil:
    """visit(context, p, q) for every live proxy p and each proxy q > p whose box meets p's: their
    tight boxes with kind QUERY_BOX, their fat boxes with QUERY_FAT_BOX. One walk per proxy. -1 when
    memory ran out or a visit failed, else 0."""
    cdef Query q
    cdef Stack stack
    cdef Hits hits
    cdef int32_t p
    cdef int64_t i
    cdef int status = 0
    memset(&stack, 0, sizeof(Stack))
    memset(&hits, 0, sizeof(Hits))
    q.kind = kind
    q.groups = NULL
    q.skip_flags = 0
    q.first_hit = False
    for p in range(t.proxy_capacity):
        if not (t.proxies[p].flags & PROXY_LIVE):
            continue
        if kind == QUERY_FAT_BOX:
            memcpy(q.box, t.proxies[p].fat, sizeof(q.box))
        else:
            memcpy(q.box, t.proxies[p].tight, sizeof(q.box))
        hits.count = 0
        status = walk(t, &q, &stack, &hits)
        for i in range(hits.count):
            if status == 0 and hits.proxies[i] > p:
                status = visit(context, p, hits.proxies[i])
        if status != 0:
            break
    stack_free(&stack)
    hits_free(&hits)
    return -1 if status != 0 else 0


ctypedef struct PairFilter:         # self_pairs' visit: where the pairs go, and the broadphase's filter
    const TreeCore *t
    PairBuffer *out
    const uint32_t *groups
    const uint32_t *masks


cdef int push_allowed(void *context, int32_t a, int32_t b) noexcept nogil:
    cdef PairFilter *f = <PairFilter *>context
    if f.groups != NULL and not pair_allowed(f.t, f.groups, f.masks, a, b):
        return 0
    return pairs_push(f.out, f.t.proxies[a].id, f.t.proxies[b].id)


cdef int self_pairs(const TreeCore *t, PairBuffer *out, const uint32_t *groups,
                    const uint32_t *masks) noexcept nogil:
    """Every overlapping pair of tight boxes (that the broadphase's filter allows, when `groups`
    and `masks` are given), sorted."""
    cdef PairFilter f
    f.t, f.out, f.groups, f.masks = t, out, groups, masks
    if each_overlap(t, QUERY_BOX, push_allowed, &f) != 0:
        return -1
    sort_items(out.pairs, out.count)
    return 0
