# The tree's 4-wide query view (Wide, in _core.pxd): built from the binary tree when a batch of box or
# segment queries needs it, and walked by them. Exception contract as in _core.pxd: wide_refresh and
# wide_walk return 0, or -1 when memory ran out.
from libc.stdint cimport int64_t

from dbvt._core cimport Hits, Query, Stack, TreeCore


cdef bint wide_worth(const TreeCore *t, int64_t queries) noexcept nogil
cdef int wide_refresh(TreeCore *t) noexcept nogil
cdef bint wide_serves(const TreeCore *t, const Query *q) noexcept nogil
cdef int wide_walk(const TreeCore *t, Query *q, Stack *stack, Hits *hits) noexcept nogil
