# A sensor's shape and the rule of docs/sensors.md, decided once per pair in float64 with the operations
# dbvt.reference uses; and how far the boxes may move before a decision can change, which lets the
# broadphase skip re-testing a pair until they have.
#
# A box moved by a displacement of at most e_i on axis i (either side's bound) changes its gap to a
# sensor's shape by at most |e| (the Euclidean norm), and a sphere sensor's centre and radius moving
# by |dc| and dr change it by at most |dc| + |dr|. So a pair found at distance `slack` from its next
# threshold keeps its decision while the sum of both sides' such drifts stays below the slack.
from libc.math cimport sqrt
from libc.stdint cimport int32_t, int64_t

from dbvt._core cimport PROXY_SENSOR_BOX, PROXY_SENSOR_SPHERE, Hits, TreeCore


cdef enum:
    AROUND = 2                      # Shape arrays: [0] the bare shape (entering), [1] it grown (leaving)

cdef extern from *:
    """
    #define DBVT_SENSOR_ROUNDING 1e-9
    """
    # The decisions round: a slack is trusted only beyond this share of the magnitudes they round at,
    # some 10^6 times the float64 rounding errors of the test and of the drift sums.
    const double ROUNDING "DBVT_SENSOR_ROUNDING"

ctypedef struct Shape:              # a sensor's shape, ready for testing many boxes against it
    bint sphere
    int dims
    double centre[3]                # sphere: the tight box's centre...
    double limit[AROUND]            # ...and its radius, and that plus the sensor margin; box: 0 and the margin
    double limit_sq[AROUND]         # sphere: each limit squared, as dbvt.reference squares it
    double low[AROUND][3]           # box only: its bounds grown by 0 and by the sensor margin
    double high[AROUND][3]
    double scale                    # the magnitude of its coordinates, for ROUNDING


cdef inline void shape_of(Shape *s, const float *tight, unsigned int flags, int dims, double margin) noexcept nogil:
    cdef double radius, grow
    cdef int i, k
    s.sphere = (flags & PROXY_SENSOR_SPHERE) != 0
    s.dims = dims
    s.scale = margin
    radius = 0.5 * (<double>tight[3] - <double>tight[0])
    for i in range(1, dims):
        radius = min(radius, 0.5 * (<double>tight[i + 3] - <double>tight[i]))
    for i in range(dims):
        s.centre[i] = 0.5 * (<double>tight[i] + <double>tight[i + 3])
        s.scale += max(-<double>tight[i], <double>tight[i + 3])
    for k in range(AROUND):
        grow = margin if k else 0.0
        if s.sphere:
            s.limit[k] = radius + grow
            s.limit_sq[k] = s.limit[k] * s.limit[k]
            continue
        s.limit[k] = grow
        for i in range(dims):
            s.low[k][i] = <double>tight[i] - grow
            s.high[k][i] = <double>tight[i + 3] + grow


cdef inline bint shape_touches(const Shape *s, const float *b, bint inside, double *slack) noexcept nogil:
    """Whether box `b` touches the shape (not `inside`) or the shape grown by the margin (`inside`):
    the rule of docs/sensors.md, bit for bit as dbvt.reference decides it. When `slack` is not NULL,
    it gets how far the boxes must move, in sum, before the next decision can differ from this one
    (less the rounding allowance; it may be negative)."""
    cdef int k = 1 if inside else 0
    cdef int i
    cdef double gap, distance_sq = 0.0, distance
    cdef bint now
    if s.sphere:
        for i in range(s.dims):
            gap = max(<double>b[i] - s.centre[i], s.centre[i] - <double>b[i + 3], 0.0)
            distance_sq += gap * gap
        now = distance_sq <= s.limit_sq[k]
        if slack != NULL:
            distance = sqrt(distance_sq)
            slack[0] = (s.limit[1] - distance if now else distance - s.limit[0]) - ROUNDING * (s.scale + distance)
        return now
    now = True
    for i in range(s.dims):
        if <double>b[i] > s.high[k][i] or <double>b[i + 3] < s.low[k][i]:
            now = False
    if slack != NULL:
        # The largest gap between the box and the bare shape along an axis: touching within `grow`
        # means every gap is at most `grow`.
        distance = -1e300
        for i in range(s.dims):
            gap = max(<double>b[i] - s.high[0][i], s.low[0][i] - <double>b[i + 3])
            distance = max(distance, gap)
        slack[0] = (s.limit[1] - distance if now else distance) - ROUNDING * (s.scale + abs(distance))
    return now


cdef inline double move_drift(const float *before, const float *after, unsigned int flags, int dims) noexcept nogil:
    """An upper bound of how far a move can have brought a proxy nearer a threshold of any sensor pair
    it is in: |e| for a box, |dc| + |dr| for a sphere sensor (see the top)."""
    cdef double low, high, centre = 0.0, half = 0.0, norm = 0.0
    cdef int i
    for i in range(dims):
        low = <double>after[i] - <double>before[i]
        high = <double>after[i + 3] - <double>before[i + 3]
        if flags & PROXY_SENSOR_SPHERE:
            centre += (0.5 * (low + high)) * (0.5 * (low + high))
            half = max(half, abs(0.5 * (high - low)))
        else:
            norm += max(abs(low), abs(high)) * max(abs(low), abs(high))
    if flags & PROXY_SENSOR_SPHERE:
        return (sqrt(centre) + half) * (1.0 + ROUNDING)
    return sqrt(norm) * (1.0 + ROUNDING)


# Which sensors' fat boxes a proxy's new fat box overlaps. The sensors' subtree answers that poorly:
# their boxes are large and overlap each other heavily, so a walk opens some hundred nodes for the
# few sensors it finds, and every partner refresh of a proxy needs one. A hash grid of cells as large
# as a sensor's fat box on average finds them among the few sensors of the one to eight cells the box
# spans. It is built afresh, in one pass, whenever a sensor's fat box changed before an update.
ctypedef struct GridEntry:          # a sensor in one of its cells: 32 bytes
    float fat[6]                    # its fat box, copied: a lookup reads its cells' entries in a row
    int32_t sensor
    int32_t unused

ctypedef struct SensorGrid:
    double cell                     # a cell's side; 0 while there are no sensors
    int64_t mask                    # buckets - 1 (a power of two)
    int32_t *starts                 # per bucket, its first entry; starts[buckets] = the entry count
    int64_t start_capacity
    GridEntry *entries              # the sensors, bucket by bucket, one entry per cell of theirs
    int64_t entry_capacity
    int32_t *sensors                # every live sensor: those in no cell (spanning too many) first
    int64_t sensor_count
    int64_t wide_count              # how many of them span too many cells: every lookup tests those
    int64_t sensor_capacity


cdef void grid_init(SensorGrid *g) noexcept nogil
cdef void grid_free(SensorGrid *g) noexcept nogil
cdef int grid_list_sensors(SensorGrid *g, const TreeCore *t) noexcept nogil
cdef int grid_build(SensorGrid *g, const TreeCore *t) noexcept nogil
cdef int grid_find(const SensorGrid *g, const TreeCore *t, const float *box, Hits *hits) noexcept nogil
