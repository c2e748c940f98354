# Batches of queries into CSR output, and the sorting shared with the broadphase. Functions
# returning `int` return 0, or -1 when memory ran out (the caller raises MemoryError).
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from dbvt._core cimport Batch, IdPair, PairBuffer, Query, QueryKind, TreeCore


cdef void sort_int32(int32_t *items, int64_t n) noexcept nogil
cdef void sort_few_int32(int32_t *items, int64_t n, bint repeats) noexcept nogil
cdef int64_t drop_repeats(int32_t *items, int64_t n) noexcept nogil
cdef void sort_pairs(IdPair *pairs, int64_t n) noexcept nogil
cdef int pairs_push(PairBuffer *buffer, uint64_t a, uint64_t b) noexcept nogil
cdef int rows_push(PairBuffer *buffer, uint64_t a, uint64_t b) noexcept nogil
cdef int pairs_extend(PairBuffer *buffer, const PairBuffer *more) noexcept nogil
cdef void pairs_free(PairBuffer *buffer) noexcept nogil
cdef void cancel_common(PairBuffer *begun, PairBuffer *ended, int threads, bint destroyed) noexcept nogil
cdef void batch_free(Batch *b) noexcept nogil
cdef int batch_reserve(Batch *b, int64_t extra) noexcept nogil
cdef int append_by_fraction(const TreeCore *t, Batch *b, bint first_hit, bint wide) noexcept nogil
cdef int run_boxes(const TreeCore *t, Query *q, const float *rows, int64_t n,
                   int64_t *offsets, Batch *b) noexcept nogil
cdef int run_spheres(const TreeCore *t, Query *q, const float *centers, const float *radii,
                     int64_t n, int64_t *offsets, Batch *b) noexcept nogil
cdef int run_segments(const TreeCore *t, Query *q, const float *rows, int64_t n,
                      int64_t *offsets, Batch *b) noexcept nogil
cdef int run_frusta(const TreeCore *t, Query *q, const float *planes, int64_t n, int32_t k,
                    int64_t *offsets, Batch *b) noexcept nogil
# Called for each pair of overlapping proxies (a, b), a < b; a non-zero return stops the walk.
ctypedef int (*OverlapVisit)(void *context, int32_t a, int32_t b) noexcept nogil
cdef int each_overlap(const TreeCore *t, QueryKind kind, OverlapVisit visit, void *context) noexcept nogil
cdef int self_pairs(const TreeCore *t, PairBuffer *out, const uint32_t *groups,
                    const uint32_t *masks) noexcept nogil
