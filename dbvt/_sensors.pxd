# A sensor's shape and the rule of docs/sensors.md, decided once per pair in float64 with the operations
# dbvt.reference uses; and how far the boxes may move before a decision can change, which lets the
# broadphase skip re-testing a pair until they have.
#
# A box moved by a displacement of at most e_i on axis i (either side's bound) changes its gap to a
# sensor's shape by at most |e| (the Euclidean norm), and a sphere sensor's centre and radius moving
# by |dc| and dr change it by at most |dc| + |dr|. So a pair found at distance `slack` from its next
# threshold keeps its decision while the sum of both sides' such drifts stays below the slack.
from libc.float cimport FLT_EPSILON, FLT_MAX
from libc.math cimport INFINITY, nextafterf, sqrt
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

from dbvt._core cimport (
    PROXY_SENSOR_BOX, PROXY_SENSOR_SPHERE, Hits, TreeCore, above, ball_gap_sq, boxes_overlap, clamp_finite,
)


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
    # Branch-free throughout: which side of a sensor a partner lies on, and whether it is inside, are
    # coin tosses over a sensor's list, and a missed guess costs more than the whole test.
    if s.sphere:
        for i in range(s.dims):
            gap = above(above(<double>b[i] - s.centre[i], s.centre[i] - <double>b[i + 3]), 0.0)
            distance_sq += gap * gap
        now = distance_sq <= s.limit_sq[k]
        if slack != NULL:
            # Inside, the distance to the grown shape's edge; outside, to the bare shape's.
            distance = sqrt(distance_sq)
            slack[0] = (s.limit[<int>now] - distance) * <double>(2 * <int>now - 1) \
                - ROUNDING * (s.scale + distance)
        return now
    now = True
    for i in range(s.dims):
        now &= (<double>b[i] <= s.high[k][i]) & (<double>b[i + 3] >= s.low[k][i])
    if slack != NULL:
        # The largest gap between the box and the bare shape along an axis: touching within `grow`
        # means every gap is at most `grow`.
        distance = -1e300
        for i in range(s.dims):
            distance = above(distance, above(<double>b[i] - s.high[0][i], s.low[0][i] - <double>b[i + 3]))
        slack[0] = (s.limit[1] * <double>now - distance) * <double>(2 * <int>now - 1) \
            - ROUNDING * (s.scale + abs(distance))
    return now


cdef extern from *:
    """
    /* shape_touches for a sphere, two boxes at once: the same operations in the same order, one box a
       lane, so each decision and slack is the scalar one bit for bit. Over a moved sensor's due
       partners the scalar test's chain (gaps, sum, square root, slack) set the pace, not its loads. */
    #if defined(__SSE2__) || defined(_M_X64)
    #include <emmintrin.h>
    #define DBVT_SPHERE_TWO 1
    static inline void dbvt_sphere_two(const double *centre, const double *limit, const double *limit_sq,
                                       double scale, int dims, const float *a, const float *b,
                                       const int *inside, int *now, double *slack) {
        __m128d sum = _mm_setzero_pd(), zero = _mm_setzero_pd();
        for (int i = 0; i < dims; i++) {
            __m128d c = _mm_set1_pd(centre[i]);
            __m128d low = _mm_set_pd((double)b[i], (double)a[i]);
            __m128d high = _mm_set_pd((double)b[i + 3], (double)a[i + 3]);
            __m128d gap = _mm_max_pd(_mm_max_pd(_mm_sub_pd(low, c), _mm_sub_pd(c, high)), zero);
            sum = _mm_add_pd(sum, _mm_mul_pd(gap, gap));
        }
        int touching = _mm_movemask_pd(_mm_cmple_pd(sum, _mm_set_pd(limit_sq[inside[1]], limit_sq[inside[0]])));
        now[0] = touching & 1;
        now[1] = touching >> 1;
        __m128d distance = _mm_sqrt_pd(sum);
        __m128d reach = _mm_sub_pd(_mm_set_pd(limit[now[1]], limit[now[0]]), distance);
        __m128d side = _mm_set_pd((double)(2 * now[1] - 1), (double)(2 * now[0] - 1));
        __m128d rounding = _mm_mul_pd(_mm_set1_pd(DBVT_SENSOR_ROUNDING), _mm_add_pd(_mm_set1_pd(scale), distance));
        _mm_storeu_pd(slack, _mm_sub_pd(_mm_mul_pd(reach, side), rounding));
    }
    #else
    #define DBVT_SPHERE_TWO 0
    static inline void dbvt_sphere_two(const double *centre, const double *limit, const double *limit_sq,
                                       double scale, int dims, const float *a, const float *b,
                                       const int *inside, int *now, double *slack) {}
    #endif
    """
    # Whether sphere_two exists here (SSE2: every x86-64); else shape_touches does each box alone.
    const bint SPHERE_TWO "DBVT_SPHERE_TWO"
    void sphere_two_lanes "dbvt_sphere_two"(const double *centre, const double *limit, const double *limit_sq,
                                            double scale, int dims, const float *a, const float *b,
                                            const int *inside, int *now, double *slack) noexcept nogil


cdef inline void sphere_two(const Shape *s, const float *a, const float *b, const int *inside, int *now,
                            double *slack) noexcept nogil:
    """shape_touches(s, a, inside[0], &slack[0]) and the same for b, for a sphere's shape `s`, when
    SPHERE_TWO."""
    sphere_two_lanes(s.centre, s.limit, s.limit_sq, s.scale, s.dims, a, b, inside, now, slack)


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


cdef inline void grow_outward(const float *box, float *out, double grow, int32_t dims) noexcept nogil:
    """`box` grown by `grow` on every side, rounded outward so that it holds the exact grown box, and
    kept within float32's range (no proxy reaches beyond it)."""
    cdef int i
    cdef float low, high
    memcpy(out, box, 6 * sizeof(float))
    for i in range(dims):
        low = <float>(<double>box[i] - grow)
        high = <float>(<double>box[i + 3] + grow)
        if <double>low > <double>box[i] - grow:
            low = nextafterf(low, -INFINITY)
        if <double>high < <double>box[i + 3] + grow:
            high = nextafterf(high, INFINITY)
        out[i] = clamp_finite(low)
        out[i + 3] = clamp_finite(high)


cdef inline double next_up(double x) noexcept nogil:
    """nextafter(x, INFINITY) for x >= +0, inline: each move of a world with sensors rounds its drift
    up, and the library call showed in the step's profile. Above +0 the next double up is the next
    bit pattern."""
    cdef uint64_t bits
    if not (x < INFINITY):
        return x
    memcpy(&bits, &x, sizeof(bits))
    bits += 1
    memcpy(&x, &bits, sizeof(bits))
    return x


cdef inline double budget(double slack, double sensor_drift, double partner_drift) noexcept nogil:
    """What the two drifts may sum to before a pair's decision can change: their sum now and the slack,
    less the roundings of these sums and of the comparison (a slack at or below that never skips)."""
    return slack + sensor_drift + partner_drift - ROUNDING * (sensor_drift + partner_drift)


# A sphere sensor's reach is a ball: its fat box is a cube around the ball that its shape, grown by
# the margin, may cover in its next moves, and its partners are the proxies whose fat boxes touch the
# ball inside that cube, not every proxy in the cube's corners: some 30 % fewer, so its budgets pass
# over fewer entries and proxies list fewer sensors. At the limits of float32, where such a cube
# cannot be held, the fat box itself is the reach, as for a box sensor.

cdef inline bint reach_ball(const float *fat, int dims, double *centre, double *radius) noexcept nogil:
    """The ball inside a sphere sensor's fat box (centre, and radius half its smallest side), or False
    when the box meets the limits of float32 and is the reach itself."""
    cdef int i
    radius[0] = INFINITY
    for i in range(dims):
        if fat[i] <= -FLT_MAX or fat[i + 3] >= FLT_MAX:
            return False
        centre[i] = 0.5 * (<double>fat[i] + <double>fat[i + 3])
        radius[0] = min(radius[0], 0.5 * (<double>fat[i + 3] - <double>fat[i]))
    return True


cdef inline bint ball_touches(const double *centre, double radius, const float *box, int dims) noexcept nogil:
    return ball_gap_sq(centre, box, dims) <= radius * radius


cdef inline bint within_reach(const float *fat, unsigned int flags, const float *box, int dims) noexcept nogil:
    """Whether a proxy with fat box `box` is within reach of a sensor with fat box `fat`, so that the
    two are partners: the boxes overlap and, for a sphere sensor, `box` touches its reach's ball."""
    cdef double centre[3]
    cdef double radius
    if not boxes_overlap(fat, box):
        return False
    if not (flags & PROXY_SENSOR_SPHERE) or not reach_ball(fat, dims, centre, &radius):
        return True
    return ball_touches(centre, radius, box, dims)


cdef inline int ball_holds(const float *fat, const float *tight, int dims, double margin) noexcept nogil:
    """Whether a sphere sensor's reach holds its shape grown by the margin: 1 or 0, or -1 when its fat
    box is the reach (see reach_ball), which must then hold the tight box grown by the margin. A
    proxy whose tight box touches the grown shape then has a fat box within reach (within_reach)."""
    cdef Shape shape
    cdef double centre[3]
    cdef double radius, offset = 0.0, scale = margin
    cdef int i
    if not reach_ball(fat, dims, centre, &radius):
        return -1
    shape_of(&shape, tight, PROXY_SENSOR_SPHERE, dims, margin)
    for i in range(dims):
        offset += (shape.centre[i] - centre[i]) * (shape.centre[i] - centre[i])
        scale += max(-<double>fat[i], <double>fat[i + 3])
    return sqrt(offset) + shape.limit[1] <= radius - ROUNDING * scale


cdef inline bint reach_cube(const float *tight, const float *before, int dims, double margin, double grow,
                            double prediction, float *fat) noexcept nogil:
    """A sphere sensor's fat box after a move from `before` to `tight`: the cube around the ball that
    holds its shape grown by `margin` and `grow` over `prediction` more moves like this one (never
    more than its diameter: a teleport must not leave a huge box behind), and its tight box. False
    when the cube would leave float32's range."""
    cdef Shape now, last
    cdef double step[3]
    cdef double length = 0.0, ahead, radius, pad, magnitude = 0.0, low, high
    cdef int i
    shape_of(&now, tight, PROXY_SENSOR_SPHERE, dims, margin)
    shape_of(&last, before, PROXY_SENSOR_SPHERE, dims, margin)
    for i in range(dims):
        step[i] = now.centre[i] - last.centre[i]
        length += step[i] * step[i]
    length = sqrt(length)
    ahead = 0.5 * prediction
    if length * ahead > 2.0 * now.limit[0]:
        ahead = 2.0 * now.limit[0] / length
    radius = now.limit[1] + grow + ahead * length
    for i in range(dims):
        # A fat box holds its tight box too, which is longer than the ball on some axes when it is
        # not a cube: the cube grows to hold it.
        radius = max(radius, now.centre[i] + ahead * step[i] - <double>tight[i],
                     <double>tight[i + 3] - (now.centre[i] + ahead * step[i]))
        magnitude = max(magnitude, abs(now.centre[i] + ahead * step[i]))
    # The cube's float32 bounds round outward, which may shift its centre by half a float32 step,
    # and ball_holds keeps a rounding allowance: a few of each on the radius keep the ball inside.
    pad = (8.0 * FLT_EPSILON + 4.0 * ROUNDING) * (magnitude + radius + margin)
    memcpy(fat, tight, 6 * sizeof(float))
    for i in range(dims):
        low = now.centre[i] + ahead * step[i] - radius - pad
        high = now.centre[i] + ahead * step[i] + radius + pad
        if not (-FLT_MAX < low and high < FLT_MAX):
            return False
        fat[i] = <float>low
        fat[i + 3] = <float>high
        if <double>fat[i] > low:
            fat[i] = nextafterf(fat[i], -INFINITY)
        if <double>fat[i + 3] < high:
            fat[i + 3] = nextafterf(fat[i + 3], INFINITY)
        if not (-FLT_MAX <= fat[i] and fat[i + 3] <= FLT_MAX):
            return False
    return True


cdef extern from *:
    """
    /* Which of four balls a box may meet: a block of the grid's entries, [x0..x3, y0..y3, z0..z3,
       r0*r0..r3*r3] in float32 (each radius rounded outward enough to hold every rounding of this
       test; see ball_around), one ball a lane. Bit i of the answer is set when the squared distance
       from centre i to the box's closest point, summed over the axes in order, is at most r_i*r_i.
       Over a grid cell's entries passing is a coin toss, so there is no branch; and a lane each
       tests four entries in the instructions one took with a ball in one register. */
    #if defined(__SSE__) || defined(_M_X64)
    #include <xmmintrin.h>
    static inline int dbvt_near_four(const float *block, const float *box) {
        __m128 sum = _mm_setzero_ps();
        for (int i = 0; i < 3; i++) {
            __m128 c = _mm_loadu_ps(block + 4 * i);
            __m128 gap = _mm_max_ps(_mm_max_ps(_mm_sub_ps(_mm_set1_ps(box[i]), c),
                                               _mm_sub_ps(c, _mm_set1_ps(box[i + 3]))), _mm_setzero_ps());
            sum = _mm_add_ps(sum, _mm_mul_ps(gap, gap));
        }
        return _mm_movemask_ps(_mm_cmple_ps(sum, _mm_loadu_ps(block + 12)));
    }
    #else
    static inline int dbvt_near_four(const float *block, const float *box) {
        int lane, i, near = 0;
        for (lane = 0; lane < 4; lane++) {
            float sum = 0.0f, low, high, gap;
            for (i = 0; i < 3; i++) {
                low = box[i] - block[4 * i + lane];
                high = block[4 * i + lane] - box[i + 3];
                gap = low > high ? low : high;
                gap = gap > 0.0f ? gap : 0.0f;
                sum += gap * gap;
            }
            near |= (sum <= block[12 + lane]) << lane;
        }
        return near;
    }
    #endif
    """
    int near_four "dbvt_near_four"(const float *block, const float *box) noexcept nogil


# Which sensors a proxy's new fat box is within reach of. The sensors' subtree answers that poorly:
# their boxes are large and overlap each other heavily, so a walk opens some hundred nodes for the
# few sensors it finds, and every partner refresh of a proxy needs one. A hash grid of cells as large
# as a sensor's fat box on average finds them among the few sensors of the one to eight cells the box
# spans. An entry is a ball around what its sensor reached when the grid was built, and the sensor:
# 20 bytes, read in a row. Those whose ball the box may meet are tested exactly on their sensor's fat
# box as it is now, so an entry whose sensor has moved since (stale) is still answered right, and a
# sensor that moved is found wherever it is now by the recent grid (SensorIndex).
ctypedef struct SensorGrid:
    double cell                     # a cell's side; 0 while there are no sensors
    double per_cell                 # 1 / cell
    int64_t mask                    # buckets - 1 (a power of two)
    int32_t *starts                 # per bucket, its first entry (a multiple of 4); starts[buckets] = the entry count
    int64_t start_capacity
    float *balls                    # per entry, bucket by bucket (one entry per cell of a sensor's), in
    int64_t ball_capacity           #   blocks of four: [x0..x3, y0..y3, z0..z3, r*r 0..3] (near_four)
    int32_t *owners                 # per entry: its sensor; -1 for the padding that fills a bucket's last block
    int64_t owner_capacity
    int32_t *sensors                # every live sensor: those in no cell (spanning too many) first
    int64_t sensor_count
    int64_t wide_count              # how many of them span too many cells: every lookup tests those
    int64_t sensor_capacity


# Sensors refresh their fat boxes at different steps (a sensor that turns leaves its box early), so
# some change before most updates, and cutting every sensor into cells again each time cost more
# than the lookups. The grid of every sensor is rebuilt only when sensors come or go or many have
# changed; meanwhile the few that changed since are in a second grid, small and built afresh at
# each update, and lookups read both.
ctypedef struct SensorIndex:
    SensorGrid settled              # every sensor, as its fat box was at the last full build...
    SensorGrid recent               # ...and those whose fat boxes changed since; its `sensors` gathers
                                    # them as they do (a sensor perhaps more than once) until update()
    bint recent_stale               # some were gathered since `recent` was built
    bint settled_stale              # as many as there are sensors were: rebuild both


cdef void index_init(SensorIndex *x) noexcept nogil
cdef void index_free(SensorIndex *x) noexcept nogil
cdef int64_t index_bytes(const SensorIndex *x) noexcept nogil
cdef int index_note_room(SensorIndex *x, int64_t n) noexcept nogil
cdef void index_note(SensorIndex *x, int32_t sensor) noexcept nogil
cdef int index_update(SensorIndex *x, const TreeCore *t, bint sensors_changed) noexcept nogil
cdef int index_find(const SensorIndex *x, const TreeCore *t, const float *box, Hits *hits) noexcept nogil
