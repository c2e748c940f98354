# The Python-facing base of Tree and Broadphase: one TreeCore and the glue every public call shares
# (argument checks against the id table, batch queries into numpy CSR arrays, serialisation).
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from dbvt._core cimport Batch, PairBuffer, TreeCore
from dbvt._split cimport Rows


cdef object pair_array(PairBuffer *buffer)


cdef class TreeBase:
    cdef TreeCore core
    # Past this many hits in one call, a query call stops and raises HitLimit; -1: no limit.
    cdef public int64_t max_hits
    # Threads a large batch of queries is cut over (dbvt._split); a runtime setting, not serialised.
    cdef readonly int threads

    cdef void _refresh_wide(self, int64_t queries)
    cdef object _existing(self, object ids, bint distinct=*)
    cdef tuple _in_edit_order(self, object ids)
    cdef object _check_new(self, object ids)
    cdef object _add(self, object ids, object boxes)
    cdef object _answer(self, Batch *batch, const Rows *rows, Py_ssize_t n, bint with_fractions)
    cdef object _query_aabb(self, object boxes, uint32_t mask, const uint32_t *groups, uint32_t skip)
    cdef object _query_sphere(self, object centers, object radii, uint32_t mask, const uint32_t *groups,
                              uint32_t skip)
    cdef object _raycast(self, object segments, bint first_hit, uint32_t mask, const uint32_t *groups,
                         uint32_t skip)
    cdef object _query_frustum(self, object planes, uint32_t mask, const uint32_t *groups, uint32_t skip)
    cdef object _query_nearest(self, object points, object k, object max_distance, uint32_t mask,
                               const uint32_t *groups, uint32_t skip)
    cdef object _cast_box(self, object boxes, object displacements, bint first_hit, uint32_t mask,
                          const uint32_t *groups, uint32_t skip)
    cdef object _cast_sphere(self, object centers, object radii, object displacements, bint first_hit,
                             uint32_t mask, const uint32_t *groups, uint32_t skip)
    cdef const uint32_t *_groups(self) noexcept
    cdef bytes _tree_bytes(self)
    cdef Py_ssize_t _load_tree(self, const unsigned char[::1] data) except -1
    cdef void _after_change(self)
