# The bulk build (binned SAH over Morton clusters), on `threads` threads with the same tree. Return
# 0, or -1 when memory ran out (the tree then unchanged).
from libc.stdint cimport int32_t, int64_t, uint64_t

from dbvt._core cimport TreeCore


cdef int core_rebuild(TreeCore *t, int threads) noexcept nogil
cdef int core_bulk_insert(TreeCore *t, const uint64_t *ids, const float *rows, int64_t n,
                          int32_t *row_proxies, int threads) noexcept nogil


cdef enum:
    MAX_DIGIT_BITS = 11             # radix_sort's widest digit: 2,048 counters stay in L1

# Sorting (key << 32 | index) keys with LSD radix passes over threads: also the order of a batch's
# edits (_tree.proxy_order). Cannot fail.
cdef uint64_t *radix_sort(uint64_t *keys, uint64_t *scratch, int64_t n, int shift, int passes, int bits,
                          int parts) noexcept nogil
