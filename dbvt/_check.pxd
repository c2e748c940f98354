# The tree's invariants and measures, and the partner lists' invariants (see _check.pyx). No function
# here touches Python objects.
from libc.stdint cimport int32_t, int64_t, uint32_t

from dbvt._core cimport TreeCore
from dbvt._partners cimport Partners


cdef const char *core_check(const TreeCore *t, bint sensors_apart) noexcept nogil
cdef double core_area_ratio(const TreeCore *t) noexcept nogil
cdef int32_t core_height(const TreeCore *t) noexcept nogil
cdef int64_t core_memory(const TreeCore *t) noexcept nogil


ctypedef struct ListCounts:         # what partners_check counted, for the broadphase to compare with its own
    int64_t listed                  # entries of all lists
    int64_t touching                # entries of touching pairs without a sensor (each pair twice)
    int64_t inside                  # sensors' entries marked inside (each sensor pair once)
    int64_t sensor_entries          # entries of sensor pairs, on both sides
    int64_t sensors                 # live sensors

cdef const char *partners_check(const TreeCore *t, const Partners *partners, int32_t slots, const uint32_t *groups,
                                const uint32_t *masks, const double *drift, double sensor_margin, bint settled,
                                ListCounts *counts) noexcept nogil
cdef int64_t fat_pairs_count(const TreeCore *t, const uint32_t *groups, const uint32_t *masks) noexcept nogil
