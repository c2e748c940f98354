# The tree's invariants and measures (see _check.pyx). No function here touches Python objects.
from libc.stdint cimport int32_t, int64_t

from dbvt._core cimport TreeCore


cdef const char *core_check(const TreeCore *t, bint sensors_apart) noexcept nogil
cdef double core_area_ratio(const TreeCore *t) noexcept nogil
cdef int32_t core_height(const TreeCore *t) noexcept nogil
cdef int64_t core_memory(const TreeCore *t) noexcept nogil
