# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The scan behind dbvt.validation's row checks: one pass over a batch's floats, without the
temporary arrays numpy's isfinite and comparisons would make (a million boxes: 12 ms in numpy,
about 1 ms here). validation.py turns what it finds into the message."""
from libc.float cimport FLT_MAX
from libc.math cimport fabsf
from libc.stdint cimport int64_t, uint32_t

from dbvt._parallel cimport BATCH_ON_THREADS_FROM, run_parts

cdef enum:
    BLOCK_ROWS = 256            # rows tested branch-free together; only a block with a bad row is looked into
    MAX_PARTS = 64

cdef uint32_t EXPONENT = 0x7F800000         # a float32's exponent bits
cdef uint32_t EXPONENT_LOW = 0x00800000     # the lowest of them


cdef inline uint32_t block_bad(const float *values, int64_t start, int64_t end, int width,
                               int dims) noexcept nogil:
    """Nonzero if a value of rows [start, end) is not finite, or (with dims) a row's min > max. On
    the values' bits: an exponent of all ones (inf or NaN) carries into bit 31, in a loop the
    compiler turns into vector instructions."""
    cdef const uint32_t *bits = <const uint32_t *>values
    cdef uint32_t bad = 0
    cdef int64_t i
    cdef int k
    for i in range(start * width, end * width):
        bad |= (bits[i] & EXPONENT) + EXPONENT_LOW
    bad >>= 31
    if dims == 3:
        for i in range(start, end):
            bad |= ((values[i * 6] > values[i * 6 + 3]) | (values[i * 6 + 1] > values[i * 6 + 4])
                    | (values[i * 6 + 2] > values[i * 6 + 5]))
    elif dims:
        for i in range(start, end):
            for k in range(dims):
                bad |= values[i * width + k] > values[i * width + dims + k]
    return bad


cdef inline bint row_finite(const float *row, int width) noexcept nogil:
    cdef int k
    for k in range(width):
        if not (fabsf(row[k]) <= FLT_MAX):
            return False
    return True


cdef inline bint row_inverted(const float *row, int dims) noexcept nogil:
    cdef int k
    for k in range(dims):
        if row[k] > row[dims + k]:
            return True
    return False


ctypedef struct RowScan:            # the rows cut into parts, each part's first bad row apart
    const float *values
    int64_t n
    int width
    int dims
    int parts
    int64_t *found                  # [part]: its first bad row, -1 for none...
    bint *finite                    # ...and whether that row is finite (so only inverted)


cdef void scan_part(void *context, int part) noexcept nogil:
    """A part's first row with a NaN or an infinity, else its first inverted row."""
    cdef RowScan *r = <RowScan *>context
    cdef int64_t start = r.n * part // r.parts, stop = r.n * (part + 1) // r.parts, end, i
    cdef int64_t found = -1
    cdef bint finite = True
    while start < stop and finite:
        end = min(start + BLOCK_ROWS, stop)
        if block_bad(r.values, start, end, r.width, r.dims):
            for i in range(start, end):
                if not row_finite(r.values + i * r.width, r.width):
                    found, finite = i, False
                    break
                if found < 0 and r.dims and row_inverted(r.values + i * r.width, r.dims):
                    found = i
        start = end
    r.found[part], r.finite[part] = found, finite


def first_bad_row(const float[:, ::1] rows, int dims, int threads=1):
    """(row, finite) of the row a check names, or (-1, True) when all pass: the first row holding a
    NaN or an infinity, else (with dims > 0, rows being [min..., max...]) the first with min > max.
    Large batches are scanned on `threads` threads."""
    cdef RowScan r
    cdef int64_t found_at[MAX_PARTS]
    cdef bint finite_at[MAX_PARTS]
    cdef int part
    r.n, r.width, r.dims = rows.shape[0], rows.shape[1], dims
    if r.n == 0 or r.width == 0:
        return -1, True
    r.values = &rows[0, 0]
    r.parts = min(threads, MAX_PARTS) if r.n >= BATCH_ON_THREADS_FROM else 1
    r.found, r.finite = found_at, finite_at
    with nogil:
        run_parts(scan_part, &r, r.parts)
    # A NaN anywhere is named before an inverted row anywhere; each part stopped at its first NaN.
    for part in range(r.parts):
        if not r.finite[part]:
            return r.found[part], False
    for part in range(r.parts):
        if r.found[part] >= 0:
            return r.found[part], True
    return -1, True
