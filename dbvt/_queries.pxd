# The queries that walk the tree their own way: the k nearest proxies (best first, with a heap), box
# and ball casts (a stack walk that sweeps), and the overlap of two trees (one stack of node pairs).
#
# Exception contract as in _core.pxd: these return 0 on success, -1 when memory ran out, or HIT_LIMIT
# when a batch passed its Batch.max_hits (the overlap: its max_pairs); the caller raises after leaving
# nogil. No function here touches Python objects.
from libc.stdint cimport int64_t, uint32_t

from dbvt._core cimport Batch, PairBuffer, TreeCore


# `skip` (a Proxy.flags mask: the sensors) leaves out the leaves with any of those flags, as Query.skip_flags.
cdef int run_nearest(const TreeCore *t, const float *points, int64_t n, int64_t k, double max_distance,
                     uint32_t mask, const uint32_t *groups, uint32_t skip, int64_t *offsets, Batch *b) noexcept nogil
cdef int run_box_casts(const TreeCore *t, const float *boxes, const float *displacements, int64_t n,
                       bint first_hit, uint32_t mask, const uint32_t *groups, uint32_t skip, int64_t *offsets,
                       Batch *b) noexcept nogil
cdef int run_ball_casts(const TreeCore *t, const float *centers, const float *radii, const float *displacements,
                        int64_t n, bint first_hit, uint32_t mask, const uint32_t *groups, uint32_t skip,
                        int64_t *offsets, Batch *b) noexcept nogil
cdef int trees_overlap(const TreeCore *a, const TreeCore *b, uint32_t mask_a, const uint32_t *groups_a,
                       uint32_t mask_b, const uint32_t *groups_b, uint32_t skip, int64_t max_pairs,
                       PairBuffer *out) noexcept nogil
