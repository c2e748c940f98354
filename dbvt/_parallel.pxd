# A fork-join on POSIX threads, for cutting one call's work into parts. No OpenMP: the wheels and the
# container image would then need its runtime.
from libc.stdint cimport int64_t, uint32_t

# One part of the work: it must touch no Python object, and may not fail (it keeps its own status).
ctypedef void (*PartTask)(void *context, int part) noexcept nogil


cdef void run_parts(PartTask task, void *context, int parts) noexcept nogil
# How many of `wanted` threads a call could have now: its own and the workers the thread budget has
# room for. A glance, not a claim (another call may take them first): it picks a call's stages.
cdef int threads_free(int wanted) noexcept nogil

cdef enum:
    # A batch of this many ids or boxes has its checks and look-ups cut over the threads; a smaller
    # one takes a fraction of a millisecond, less than the threads cost to start.
    BATCH_ON_THREADS_FROM = 65536
    MAX_THREADS = 1024              # as dbvt.validation allows


# A counter threads take work from in turn (C11 atomics, relaxed: it hands out indices, nothing more).
cdef extern from *:
    """
    #include <stdatomic.h>
    #include <stdint.h>
    typedef atomic_int dbvt_counter;
    static inline int dbvt_counter_take(dbvt_counter *c) {
        return atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
    }
    static inline int dbvt_counter_get(dbvt_counter *c) { return atomic_load_explicit(c, memory_order_relaxed); }
    static inline void dbvt_counter_set(dbvt_counter *c, int value) {
        atomic_store_explicit(c, value, memory_order_relaxed);
    }
    /* Set bits of a plain word that other threads may set too; returns the word before. */
    static inline uint32_t dbvt_fetch_or(uint32_t *word, uint32_t bits) {
        return __atomic_fetch_or(word, bits, __ATOMIC_RELAXED);
    }
    /* Add to a plain 64-bit count that other threads add to too; returns the sum after. */
    static inline int64_t dbvt_add_fetch(int64_t *count, int64_t value) {
        return __atomic_add_fetch(count, value, __ATOMIC_RELAXED);
    }
    /* A 64-bit count that other threads change, read or set whole. */
    static inline int64_t dbvt_load64(int64_t *count) { return __atomic_load_n(count, __ATOMIC_RELAXED); }
    static inline void dbvt_store64(int64_t *count, int64_t value) {
        __atomic_store_n(count, value, __ATOMIC_RELAXED);
    }
    /* Set a 64-bit count to `desired` if it still holds *expected; else *expected is what it holds. */
    static inline int dbvt_compare_swap(int64_t *count, int64_t *expected, int64_t desired) {
        return __atomic_compare_exchange_n(count, expected, desired, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    }
    /* A byte one thread sets and others may read meanwhile. */
    static inline unsigned char dbvt_byte_get(unsigned char *byte) {
        return __atomic_load_n(byte, __ATOMIC_RELAXED);
    }
    static inline void dbvt_byte_set(unsigned char *byte, unsigned char value) {
        __atomic_store_n(byte, value, __ATOMIC_RELAXED);
    }
    """
    ctypedef int dbvt_counter
    int counter_take "dbvt_counter_take"(dbvt_counter *c) noexcept nogil
    int counter_get "dbvt_counter_get"(dbvt_counter *c) noexcept nogil
    void counter_set "dbvt_counter_set"(dbvt_counter *c, int value) noexcept nogil
    uint32_t fetch_or "dbvt_fetch_or"(uint32_t *word, uint32_t bits) noexcept nogil
    int64_t add_fetch "dbvt_add_fetch"(int64_t *count, int64_t value) noexcept nogil
    int64_t load64 "dbvt_load64"(int64_t *count) noexcept nogil
    void store64 "dbvt_store64"(int64_t *count, int64_t value) noexcept nogil
    bint compare_swap "dbvt_compare_swap"(int64_t *count, int64_t *expected, int64_t desired) noexcept nogil
    unsigned char byte_get "dbvt_byte_get"(unsigned char *byte) noexcept nogil
    void byte_set "dbvt_byte_set"(unsigned char *byte, unsigned char value) noexcept nogil


cdef enum:
    MAX_RUNS = 64                   # runs of work: one a thread, up to this many (see Runs)
    COUNTER_STRIDE = 16             # a run's counter every 64 bytes, so that threads share no line


# Work items (chunks of proxies) cut into one run a thread, in order, each thread taking its
# own run's items first and then what is left of the others'. Work that follows is often cut by
# ranges in the same order (a range of proxy slots a thread), so each core mostly writes what it wrote
# last instead of fetching it from the other core's cache. Who takes an item must change no answer.
ctypedef struct Runs:
    dbvt_counter taken[MAX_RUNS * COUNTER_STRIDE]   # per run, at [COUNTER_STRIDE * run]: items taken
    int64_t first[MAX_RUNS + 1]     # run r holds items first[r] to first[r + 1] - 1
    int runs

cdef void runs_init(Runs *r, int64_t items, int threads) noexcept nogil
cdef bint runs_take(Runs *r, int worker, int64_t *item) noexcept nogil
