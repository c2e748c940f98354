# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Growing and changing one partner list (see _partners.pxd): the broadphase's changes on one thread,
and each list's owner on threads (_finding.pyx), call the same three."""
from libc.math cimport INFINITY
from libc.stdint cimport int32_t
from libc.stdlib cimport malloc, realloc
from libc.string cimport memcpy, memmove


cdef int partners_reserve(Partners *p, int32_t capacity, bint sensor) noexcept nogil:
    """Room for `capacity` entries (and, for a sensor's list, their budgets; new ones are unknown)."""
    cdef int32_t *items
    cdef double *budgets
    cdef size_t width = sizeof(int32_t) + (sizeof(double) if sensor else 0)
    cdef int32_t k
    if capacity <= p.capacity:
        return 0
    if capacity < 2 * INLINE_PARTNERS:
        capacity = 2 * INLINE_PARTNERS
    if sensor:
        capacity += capacity & 1        # the budgets follow the entries: keep them 8-byte aligned
    if p.capacity == INLINE_PARTNERS:
        items = <int32_t *>malloc(capacity * width)
        if items == NULL:
            return -1
        memcpy(items, p.entries.local, p.count * sizeof(int32_t))
        if sensor:
            budgets = <double *>(items + capacity)
            for k in range(p.count):
                budgets[k] = -INFINITY
    else:
        items = <int32_t *>realloc(p.entries.heap, capacity * width)
        if items == NULL:
            return -1
        if sensor:
            memmove(items + capacity, items + p.capacity, p.count * sizeof(double))
    p.entries.heap = items
    p.capacity = capacity
    return 0


cdef int partners_insert(Partners *p, int32_t other, bint sensor) noexcept nogil:
    """Add `other`, not touching (and, on a sensor's list, not yet tested), keeping the list sorted."""
    cdef int32_t i
    cdef int32_t *items
    cdef double *budgets
    if p.count == p.capacity and partners_reserve(p, 2 * p.capacity, sensor) != 0:
        return -1
    items = items_of(p)
    budgets = budgets_of(p) if sensor else NULL
    if budgets != NULL:
        # A sensor's list is long (every proxy within its reach): the entries after the new one, and
        # their budgets, move in two blocks rather than one by one.
        i = partners_place(items, p.count, other)
        memmove(items + i + 1, items + i, (p.count - i) * sizeof(int32_t))
        memmove(budgets + i + 1, budgets + i, (p.count - i) * sizeof(double))
    else:
        i = p.count
        while i > 0 and (items[i - 1] >> 1) > other:
            items[i] = items[i - 1]
            i -= 1
    items[i] = other << 1
    if budgets != NULL:
        budgets[i] = -INFINITY
    p.count += 1
    return 0


cdef void partners_erase(Partners *p, int32_t other, bint sensor) noexcept nogil:
    cdef int32_t *items = items_of(p)
    cdef double *budgets = budgets_of(p) if sensor else NULL
    cdef int32_t *entry = partners_find(p, other)
    cdef int32_t i
    if entry == NULL:
        return
    i = <int32_t>(entry - items)
    p.count -= 1
    if budgets != NULL:
        # As in partners_insert: a sensor's list moves its tail in two blocks.
        memmove(items + i, items + i + 1, (p.count - i) * sizeof(int32_t))
        memmove(budgets + i, budgets + i + 1, (p.count - i) * sizeof(double))
        return
    while i < p.count:
        items[i] = items[i + 1]
        i += 1
