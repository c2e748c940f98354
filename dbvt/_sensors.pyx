# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The sensors' grids (see _sensors.pxd): which sensors a fat box is within reach of.

Exact as the tree's walk is: a cell is floor(x * per_cell) on each axis (per_cell = 1 / cell: a
multiplication, not a division, each of the six a lookup takes), and a product by a positive number
and floor are monotone, so two closed boxes that share a point share that point's cell; every candidate is then
tested on its fat box with the walker's comparisons. Functions returning `int` return 0, or -1 when
memory ran out.
"""
from libc.math cimport INFINITY, floor, isfinite, nextafterf, sqrt
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

from dbvt._batch cimport drop_repeats, sort_int32
from dbvt._core cimport PROXY_LIVE, PROXY_SENSOR, PROXY_SENSOR_SPHERE, Hits, TreeCore, grow_array, hits_push

cdef enum:
    WIDE_CELLS = 64                 # a box over more cells than this is tested whole, not cell by cell
    CANDIDATES = 64                 # a lookup's entries tested at a time (find_in_entries)
    # The settled grid is rebuilt once more than this share of the sensors are in the recent one:
    # each update rebuilds the recent grid, and lookups read the settled one's stale entries.
    RECENT_SHARE = 8

# Cell coordinates are clamped here, far beyond any box a cell as large as a sensor could tile.
cdef double FARTHEST_CELL = 1099511627776.0     # 2^40


cdef inline int64_t cell_of(double x, double per_cell) noexcept nogil:
    x = floor(x * per_cell)
    return <int64_t>max(-FARTHEST_CELL, min(FARTHEST_CELL, x))


cdef inline int64_t bucket_of(const SensorGrid *g, int64_t x, int64_t y, int64_t z) noexcept nogil:
    cdef uint64_t h = (<uint64_t>x * <uint64_t>0x9E3779B97F4A7C15ULL) ^ (<uint64_t>y * <uint64_t>0xC2B2AE3D27D4EB4FULL)
    h ^= <uint64_t>z * <uint64_t>0x165667B19E3779F9ULL
    h ^= h >> 31
    return <int64_t>(h & <uint64_t>g.mask)


cdef inline bint cells_of(const SensorGrid *g, const float *box, int dims, int64_t *low, int64_t *high) noexcept nogil:
    """The cells `box` spans, axis by axis; False when they are more than WIDE_CELLS."""
    cdef int64_t count = 1
    cdef int i
    for i in range(3):
        low[i] = high[i] = 0
        if i < dims:
            low[i] = cell_of(box[i], g.per_cell)
            high[i] = cell_of(box[i + 3], g.per_cell)
            if high[i] - low[i] >= WIDE_CELLS:
                return False
            count *= high[i] - low[i] + 1
    return count <= WIDE_CELLS


cdef void grid_init(SensorGrid *g) noexcept nogil:
    memset(g, 0, sizeof(SensorGrid))


cdef void grid_free(SensorGrid *g) noexcept nogil:
    free(g.starts)
    free(g.balls)
    free(g.owners)
    free(g.sensors)
    grid_init(g)


cdef int grid_list_sensors(SensorGrid *g, const TreeCore *t) noexcept nogil:
    """Find the live sensors (after sensors were created or destroyed): a pass over every proxy."""
    cdef int32_t p
    g.sensor_count = 0
    for p in range(t.proxy_capacity):
        if (t.proxies[p].flags & (PROXY_LIVE | PROXY_SENSOR)) > PROXY_LIVE:
            if grow_array(<void **>&g.sensors, &g.sensor_capacity, g.sensor_count + 1, sizeof(int32_t)) != 0:
                return -1
            g.sensors[g.sensor_count] = p
            g.sensor_count += 1
    return 0


cdef void ball_around(const float *fat, unsigned int flags, int dims, float *ball) noexcept nogil:
    """The ball a grid lookup tests an entry with first (near_four): around a sphere sensor's reach,
    or a box sensor's whole fat box, in float32 and a little larger. Its radius grows by 2^-20 of the
    magnitudes, which holds every rounding of the float32 test (a few 2^-24 of them per axis), so
    that each box within reach passes; those that pass are then tested exactly (within_reach)."""
    cdef double centre[3]
    cdef double radius = 0.0, magnitude = 0.0, squared
    cdef int i
    centre[0] = centre[1] = centre[2] = 0.0
    if not ((flags & PROXY_SENSOR_SPHERE) and reach_ball(fat, dims, centre, &radius)):
        radius = 0.0
        for i in range(dims):
            centre[i] = 0.5 * (<double>fat[i] + <double>fat[i + 3])
            radius += 0.25 * (<double>fat[i + 3] - <double>fat[i]) * (<double>fat[i + 3] - <double>fat[i])
        radius = sqrt(radius)
    for i in range(3):
        magnitude = max(magnitude, abs(centre[i]))
        ball[i] = <float>centre[i]
    radius += (magnitude + radius) * 9.5367431640625e-07     # 2^-20
    squared = radius * radius * (1.0 + 9.5367431640625e-07)
    ball[3] = <float>squared if squared < 3.0e38 else INFINITY
    if <double>ball[3] < squared:
        ball[3] = nextafterf(ball[3], INFINITY)
    if not (isfinite(radius) and isfinite(magnitude)):
        ball[0] = ball[1] = ball[2] = 0.0
        ball[3] = INFINITY


cdef int grid_build(SensorGrid *g, const TreeCore *t, double cell) noexcept nogil:
    """Cut the listed sensors' fat boxes into cells of side `cell`, or (0) as wide as their average side."""
    cdef double extent = 0.0
    cdef int64_t buckets = 16, count = 0, padded = 0, end, s, b, x, y, z
    cdef int64_t low[3]
    cdef int64_t high[3]
    cdef int32_t sensor, keep
    cdef const float *fat
    cdef float ball[4]
    cdef int i
    g.cell = 0.0
    g.wide_count = 0
    if g.sensor_count == 0:
        return 0
    if cell == 0.0:
        for s in range(g.sensor_count):
            fat = t.proxies[g.sensors[s]].fat
            for i in range(t.dims):
                extent += (<double>fat[i + 3] - <double>fat[i]) / t.dims
        cell = extent / g.sensor_count
        if not (cell > 0.0 and isfinite(cell) and isfinite(1.0 / cell)):
            cell = 1.0
    g.cell = cell
    g.per_cell = 1.0 / cell
    # The sensors over too many cells go first in the list (tested by every lookup); count the rest's cells.
    for s in range(g.sensor_count):
        sensor = g.sensors[s]
        if cells_of(g, t.proxies[sensor].fat, t.dims, low, high):
            count += (high[0] - low[0] + 1) * (high[1] - low[1] + 1) * (high[2] - low[2] + 1)
        else:
            keep = g.sensors[g.wide_count]
            g.sensors[g.wide_count] = sensor
            g.sensors[s] = keep
            g.wide_count += 1
    while buckets < 2 * count:
        buckets *= 2
    if grow_array(<void **>&g.starts, &g.start_capacity, buckets + 1, sizeof(int32_t)) != 0:
        g.cell = 0.0
        return -1
    g.mask = buckets - 1
    memset(g.starts, 0, (buckets + 1) * sizeof(int32_t))
    # A counting sort by bucket, each bucket padded to whole blocks of four entries: count, sum the
    # padded counts up to each bucket's end, fill each bucket backwards from its end, then move each
    # start back over its padding (which no box passes: its r*r is -1).
    for s in range(g.wide_count, g.sensor_count):
        cells_of(g, t.proxies[g.sensors[s]].fat, t.dims, low, high)
        for x in range(low[0], high[0] + 1):
            for y in range(low[1], high[1] + 1):
                for z in range(low[2], high[2] + 1):
                    g.starts[bucket_of(g, x, y, z)] += 1
    for b in range(buckets):
        padded += (g.starts[b] + 3) & ~3
        g.starts[b] = padded
    g.starts[buckets] = padded
    if (grow_array(<void **>&g.owners, &g.owner_capacity, padded, sizeof(int32_t)) != 0
            or grow_array(<void **>&g.balls, &g.ball_capacity, padded, 4 * sizeof(float)) != 0):
        g.cell = 0.0
        return -1
    memset(g.owners, 0xFF, padded * sizeof(int32_t))
    memset(g.balls, 0, padded * 4 * sizeof(float))
    for b in range(3 * 4, padded * 4, 4 * 4):
        for i in range(4):
            g.balls[b + i] = -1.0
    for s in range(g.wide_count, g.sensor_count):
        sensor = g.sensors[s]
        cells_of(g, t.proxies[sensor].fat, t.dims, low, high)
        ball_around(t.proxies[sensor].fat, t.proxies[sensor].flags, t.dims, ball)
        for x in range(low[0], high[0] + 1):
            for y in range(low[1], high[1] + 1):
                for z in range(low[2], high[2] + 1):
                    b = bucket_of(g, x, y, z)
                    g.starts[b] -= 1
                    g.owners[g.starts[b]] = sensor
                    for i in range(4):
                        g.balls[4 * (g.starts[b] & ~3) + 4 * i + (g.starts[b] & 3)] = ball[i]
    end = padded
    b = buckets - 1
    while b >= 0:
        g.starts[b] = end - ((end - g.starts[b] + 3) & ~3)
        end = g.starts[b]
        b -= 1
    return 0


cdef int find_in_entries(const SensorGrid *g, const TreeCore *t, const float *box, int32_t first, int32_t end,
                         Hits *hits) noexcept nogil:
    """grid_find's tests of entries [first, end), whole blocks of four and at most CANDIDATES, in two
    stages. Whether a box may meet an entry's ball is a coin toss to the branch predictor: those that
    may are gathered without a branch, then tested exactly on their sensors' fat boxes now."""
    cdef int32_t passed[CANDIDATES]
    cdef int32_t k, n = 0, sensor
    cdef int near, lane
    for k in range(first, end, 4):
        near = near_four(&g.balls[4 * k], box)
        for lane in range(4):
            passed[n] = k + lane
            n += (near >> lane) & 1
    for k in range(n):
        sensor = g.owners[passed[k]]
        if (within_reach(t.proxies[sensor].fat, t.proxies[sensor].flags, box, t.dims)
                and hits_push(hits, sensor, 0.0) != 0):
            return -1
    return 0


cdef int grid_find(const SensorGrid *g, const TreeCore *t, const float *box, Hits *hits) noexcept nogil:
    """Append to `hits` every sensor that a proxy with fat box `box` is within reach of and whose entry
    is current (some perhaps more than once: a sensor is listed in each of its cells). Returns 1, with
    nothing appended, when `box` spans too many cells: then walk the sensors' subtree instead."""
    cdef int64_t low[3]
    cdef int64_t high[3]
    cdef int64_t x, y, z, b, k
    cdef int32_t first, sensor
    if g.cell == 0.0:
        return 0
    if not cells_of(g, box, t.dims, low, high):
        return 1
    for x in range(low[0], high[0] + 1):
        for y in range(low[1], high[1] + 1):
            for z in range(low[2], high[2] + 1):
                b = bucket_of(g, x, y, z)
                first = g.starts[b]
                while first < g.starts[b + 1]:
                    if find_in_entries(g, t, box, first, min(first + CANDIDATES, g.starts[b + 1]), hits) != 0:
                        return -1
                    first += CANDIDATES
    for k in range(g.wide_count):
        sensor = g.sensors[k]
        if (within_reach(t.proxies[sensor].fat, t.proxies[sensor].flags, box, t.dims)
                and hits_push(hits, sensor, 0.0) != 0):
            return -1
    return 0


cdef void index_init(SensorIndex *x) noexcept nogil:
    grid_init(&x.settled)
    grid_init(&x.recent)
    x.recent_stale = x.settled_stale = False


cdef void index_free(SensorIndex *x) noexcept nogil:
    grid_free(&x.settled)
    grid_free(&x.recent)
    x.recent_stale = x.settled_stale = False


cdef inline int64_t grid_bytes(const SensorGrid *g) noexcept nogil:
    return ((g.start_capacity + g.sensor_capacity) * <int64_t>sizeof(int32_t)
            + g.owner_capacity * <int64_t>sizeof(int32_t) + g.ball_capacity * 4 * <int64_t>sizeof(float))


cdef int64_t index_bytes(const SensorIndex *x) noexcept nogil:
    return grid_bytes(&x.settled) + grid_bytes(&x.recent)


cdef int index_note_room(SensorIndex *x, int64_t n) noexcept nogil:
    """Room to note `n` more sensors, so that index_note cannot fail."""
    n = min(n, max(x.settled.sensor_count - x.recent.sensor_count, 0))
    return grow_array(<void **>&x.recent.sensors, &x.recent.sensor_capacity, x.recent.sensor_count + n, sizeof(int32_t))


cdef void index_note(SensorIndex *x, int32_t sensor) noexcept nogil:
    """A sensor's fat box changed: the next index_update puts it in the recent grid, or, once as many
    have been noted as there are sensors, rebuilds both (the list stays that short)."""
    x.recent_stale = True
    if x.recent.sensor_count >= x.settled.sensor_count:
        x.settled_stale = True
        return
    x.recent.sensors[x.recent.sensor_count] = sensor
    x.recent.sensor_count += 1


cdef int index_update(SensorIndex *x, const TreeCore *t, bint sensors_changed) noexcept nogil:
    """Make the grids answer for the sensors' fat boxes now, before partner refreshes: both afresh when
    sensors came or went (`sensors_changed`) or many changed, else the recent one with those noted
    since. After a failure, the next call must have `sensors_changed`."""
    if not (sensors_changed or x.recent_stale):
        return 0
    sensors_changed |= x.settled_stale
    x.recent_stale = x.settled_stale = False
    sort_int32(x.recent.sensors, x.recent.sensor_count)
    x.recent.sensor_count = drop_repeats(x.recent.sensors, x.recent.sensor_count)
    if sensors_changed or RECENT_SHARE * x.recent.sensor_count > x.settled.sensor_count:
        x.recent.sensor_count = 0
        if grid_list_sensors(&x.settled, t) != 0 or grid_build(&x.settled, t, 0.0) != 0:
            return -1
    return grid_build(&x.recent, t, x.settled.cell)


cdef int index_find(const SensorIndex *x, const TreeCore *t, const float *box, Hits *hits) noexcept nogil:
    """Append to `hits` every sensor that a proxy with fat box `box` is within reach of (some perhaps
    more than once: in several cells, or in both grids). Returns 1, with nothing appended, when `box`
    spans too many cells: then walk the sensors' subtree instead."""
    cdef int found = grid_find(&x.settled, t, box, hits)
    if found != 0:
        return found
    return grid_find(&x.recent, t, box, hits)
