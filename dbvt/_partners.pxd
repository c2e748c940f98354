# A proxy's partner list: the proxies whose fat boxes overlap its own (within reach, for a sensor's
# pairs), each entry marking whether the pair touches. The broadphase keeps one per proxy slot and
# changes them (_broadphase.pyx); on threads, an update reads them, and each list's owner changes it
# (_finding.pyx).
from libc.stdint cimport int32_t, int64_t

from dbvt._core cimport PREFETCH_AHEAD, TreeCore, meet, prefetch, prefetch_l2

cdef enum:
    TOUCHING = 1                    # the tight boxes overlap: the pair exists for the user
    INLINE_PARTNERS = 2


# A proxy's partners are entries (partner proxy << 1) | TOUCHING, ascending by partner. Most proxies
# have at most two (W1: 90%), so up to INLINE_PARTNERS entries live in the list's header itself,
# where a heap list's pointer would be: no allocation, and one cache miss fewer per list read.
ctypedef union PartnerEntries:      # 8 bytes
    int32_t *heap                   # capacity > INLINE_PARTNERS: the entries, malloc'd
    int32_t local[INLINE_PARTNERS]  # capacity == INLINE_PARTNERS: the entries themselves

ctypedef struct Partners:           # one proxy's fat-box partners: 16 bytes
    PartnerEntries entries          # 8
    int32_t count                   # 4
    int32_t capacity                # 4: INLINE_PARTNERS while the entries are in `entries.local`


cdef inline int32_t *items_of(const Partners *p) noexcept nogil:
    """A list's entries. Inline ones are inside the Partners array: this pointer is stale once that
    array grows (_reserve) or the list outgrows its header (partners_reserve)."""
    if p.capacity == INLINE_PARTNERS:
        return <int32_t *>p.entries.local
    return p.entries.heap


cdef inline bint tight_overlap(const TreeCore *t, int32_t a, int32_t b) noexcept nogil:
    """Without a branch (meet): whether a re-tested pair touches is often a coin toss in a dense
    scene, and a missed guess costs more than the whole test. A Proxy's id follows its tight box, so
    meet's fourth float of the upper half is read within the struct (and ignored)."""
    return meet(t.proxies[a].tight, t.proxies[b].tight)


cdef inline int32_t partners_place(const int32_t *items, int32_t count, int32_t other) noexcept nogil:
    """Where `other`'s entry is or would go in a sorted list (binary search). The halving takes no
    branch: which half holds a partner is a coin toss, a missed guess at every step."""
    cdef int32_t base = 0, half
    if count == 0:
        return 0
    while count > 1:
        half = count >> 1
        base += half * ((items[base + half] >> 1) < other)
        count -= half
    return base + ((items[base] >> 1) < other)


cdef inline int32_t *partners_find(const Partners *p, int32_t other) noexcept nogil:
    """The entry for `other`, or NULL."""
    cdef int32_t *items = items_of(p)
    cdef int32_t lo = partners_place(items, p.count, other)
    if lo < p.count and (items[lo] >> 1) == other:
        return &items[lo]
    return NULL


cdef inline double *budgets_of(const Partners *p) noexcept nogil:
    """A sensor's heap list keeps, after its `capacity` entries, a budget per entry: while the
    sensor's drift plus the partner's stays below it, the pair's decision cannot change (see
    Broadphase._pass_sensors). Only for a sensor's list; an inline one has none (NULL)."""
    if p.capacity == INLINE_PARTNERS:
        return NULL
    return <double *>(p.entries.heap + p.capacity)


cdef inline void prefetch_partners(const TreeCore *t, const Partners *partners, const int32_t *moved,
                                   int64_t m, int64_t count) noexcept nogil:
    """Before re-testing moved[m]: fetch, for moves further on, a partner list's header, then a heap
    list's entries, then the partners' proxies (misses in a row, each waiting for the one before)."""
    cdef const Partners *p
    cdef const int32_t *items
    cdef int32_t k
    if m + 3 * PREFETCH_AHEAD < count:
        prefetch(&partners[moved[m + 3 * PREFETCH_AHEAD]])
    if m + 2 * PREFETCH_AHEAD < count:
        p = &partners[moved[m + 2 * PREFETCH_AHEAD]]
        if p.capacity != INLINE_PARTNERS:
            prefetch(p.entries.heap)
    if m + PREFETCH_AHEAD < count:
        p = &partners[moved[m + PREFETCH_AHEAD]]
        items = items_of(p)
        for k in range(min(p.count, 4)):
            prefetch(&t.proxies[items[k] >> 1])


cdef inline void prefetch_sensor_list(const Partners *p) noexcept nogil:
    """Fetch a sensor's whole list ahead, entries and budgets, while the one before it is re-tested:
    the sensors' lists together are larger than the cache, and each re-test passes over all of one.
    Into L2 only: `perf` put the time of the fetches (some 40 lines a list, back to back) on the
    fetch instructions themselves, and in W1's sensor benchmark the step took 0.99 of its time with
    the L2 fetch (0.963-1.004 over 16 paired runs; a fetch that bypasses the caches took 1.05)."""
    cdef const char *items = <const char *>items_of(p)
    cdef const char *budgets = <const char *>budgets_of(p)
    cdef int64_t offset
    if budgets == NULL:
        return
    for offset in range(0, p.count * <int64_t>sizeof(int32_t), 64):
        prefetch_l2(items + offset)
    for offset in range(0, p.count * <int64_t>sizeof(double), 64):
        prefetch_l2(budgets + offset)


# Changing one list (_partners.pyx): -1 when memory ran out. Pass `sensor` for a sensor's list,
# whose entries carry budgets.
cdef int partners_reserve(Partners *p, int32_t capacity, bint sensor) noexcept nogil
cdef int partners_insert(Partners *p, int32_t other, bint sensor) noexcept nogil
cdef void partners_erase(Partners *p, int32_t other, bint sensor) noexcept nogil
