# A batch of queries of any kind, run on one thread or cut into runs of rows over several. Exception
# contract as in _queries.pxd: 0, -1 when memory ran out, or HIT_LIMIT; the caller raises.
from libc.stdint cimport int32_t, int64_t, uint32_t

from dbvt._core cimport Batch, TreeCore

cdef enum:
    ROWS_PER_PART = 64              # a thread is started for no fewer rows than this
    CHUNKS_PER_THREAD = 8           # the rows are cut into this many chunks a thread, taken in turn

cdef enum RowsKind:
    ROWS_BOXES
    ROWS_SPHERES
    ROWS_SEGMENTS
    ROWS_FRUSTA
    ROWS_NEAREST
    ROWS_BOX_CASTS
    ROWS_BALL_CASTS

ctypedef struct Rows:               # a batch's queries, row after row, and what filters their hits
    RowsKind kind
    const float *shapes             # boxes, centres, segments, frustum planes or points
    const float *radii              # spheres and ball casts: one a row
    const float *moves              # casts: one displacement a row
    int32_t planes                  # frusta: planes a row
    int64_t k                       # nearest: how many a point
    double reach                    # nearest: max_distance
    bint first_hit                  # segments and casts: only the first hit of each
    uint32_t mask                   # proxies whose group has no bit of mask are skipped...
    const uint32_t *groups          # ...when groups (indexed by proxy) is not NULL
    uint32_t skip                   # leaves with any of these Proxy.flags are skipped (sensors)


cdef int run_rows(const TreeCore *t, const Rows *rows, int64_t n, int threads, int64_t *offsets,
                  Batch *b) noexcept nogil
