# An update's two stages: the partners of proxies whose fat boxes changed (stage 1, find_all, which
# finds those of neighbours together, in packets) and the pairs of moved proxies whose touching bit
# flips (stage 2, retest_all), on threads or on one. Finding only reads the world, so threads may take
# different proxies at once. In a world without sensors the threads make the changes too
# (refresh_all, flip_all), each list written by one thread only: its owner's, or the one that holds
# its range of proxy slots; with sensors, or on one thread, the broadphase makes them in the
# proxies' order (_broadphase.pyx).
# Functions returning `int` return 0, or -1 when memory ran out.
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.string cimport memcpy

from dbvt._batch cimport drop_repeats, sort_few_int32
from dbvt._core cimport (
    PACKET_LANES, PROXY_SENSOR, PROXY_SENSOR_SPHERE, QUERY_FAT_BALL, QUERY_FAT_BOX, Hits, PairBuffer, Query, Stack,
    TreeCore, listed_allowed, walk,
)
from dbvt._parallel cimport Runs
from dbvt._partners cimport Partners
from dbvt._sensors cimport SensorIndex, index_find, reach_ball, within_reach

cdef enum:
    FIND_CHUNK = 64                 # proxies a thread takes at a time
    FIND_ON_THREADS_FROM = 512      # for fewer proxies than this, the calling thread finds alone
    UNCHANGED = -1                  # Found.count of a proxy whose list holds its partners already...
    NOT_FOUND = -2                  # ...and of one whose partners were not found: the threads stopped
    FAT_LIMIT = 2                   # a status: update(max_fat_pairs=...) stopped at its limit
    PACK_FROM_SHARE = 8             # proxies walk in packets when at least 1 in this many refresh


ctypedef struct Finder:             # what finding partners reads, and nothing writes meanwhile
    const TreeCore *t
    const uint32_t *groups          # per proxy slot
    const uint32_t *masks
    const SensorIndex *sensor_index # the sensors by cell; read only when `sensors`
    bint sensors                    # the world has sensors

ctypedef struct Found:              # the partners find_all found, a Hits a thread
    Hits *hits                      # one a thread
    int64_t *first                  # per proxy: where its partners start in its thread's hits...
    int32_t *count                  # ...how many they are (UNCHANGED: as its list holds them; NOT_FOUND)...
    int32_t *worker                 # ...and which thread's hits hold them
    int workers


cdef inline bint reach_allows(const TreeCore *t, int32_t a, int32_t b) noexcept nogil:
    """Whether two proxies whose fat boxes overlap are partners: not when one is a sphere sensor
    whose reach, a ball, the other's fat box misses (see _sensors.pxd)."""
    if t.proxies[a].flags & PROXY_SENSOR_SPHERE:
        return within_reach(t.proxies[a].fat, t.proxies[a].flags, t.proxies[b].fat, t.dims)
    if t.proxies[b].flags & PROXY_SENSOR_SPHERE:
        return within_reach(t.proxies[b].fat, t.proxies[b].flags, t.proxies[a].fat, t.dims)
    return True


cdef inline void fat_query(const Finder *f, int32_t proxy, Query *q) noexcept nogil:
    """The walk that finds `proxy`'s partners' candidates: its fat box against the leaves' fat boxes."""
    cdef const TreeCore *t = f.t
    cdef double radius
    q.kind = QUERY_FAT_BOX
    q.groups = NULL
    # The walk leaves out the sensors' subtree: a sensor never pairs with one, and the grid finds
    # them for the rest, unless the box is too large for its cells.
    q.skip_flags = PROXY_SENSOR if f.sensors else 0
    q.first_hit = False
    memcpy(q.box, t.proxies[proxy].fat, sizeof(q.box))
    # A sphere sensor's reach is the ball in its fat box (see _sensors.pxd): the walk opens only the
    # nodes that ball touches, and its leaves are the partners' candidates with nothing left to test.
    q.center[2] = 0.0
    if ((t.proxies[proxy].flags & PROXY_SENSOR_SPHERE) != 0
            and reach_ball(t.proxies[proxy].fat, t.dims, q.center, &radius)):
        q.kind = QUERY_FAT_BALL
        q.radius_sq = radius * radius


cdef inline int settle_partners(const Finder *f, int32_t proxy, Query *q, Stack *stack, Hits *hits,
                                int64_t start) noexcept nogil:
    """After the walk of fat_query(proxy) appended its candidates to `hits` from `start`: the sensors
    within reach added (a proxy in a world with sensors), then the candidates that may pair with
    `proxy` kept, sorted, each once."""
    cdef const TreeCore *t = f.t
    cdef bint reach = False, grid = False
    cdef int64_t h, kept = start
    cdef int32_t other
    cdef int found
    if f.sensors and not (t.proxies[proxy].flags & PROXY_SENSOR):
        found = index_find(f.sensor_index, t, q.box, hits)     # only sensors within reach
        if found == 1:
            q.skip_flags = 0
            hits.count = start
            found = walk(t, q, stack, hits)
            reach = True
        if found != 0:
            return -1
        grid = True
    for h in range(start, hits.count):
        other = hits.proxies[h]
        if (other != proxy and listed_allowed(t, f.groups, f.masks, proxy, other)
                and (not reach or reach_allows(t, proxy, other))):
            hits.proxies[kept] = other
            kept += 1
    sort_few_int32(hits.proxies + start, kept - start, grid)
    if grid:
        # A sensor the grids list in several cells is found once per cell.
        kept = start + drop_repeats(hits.proxies + start, kept - start)
    hits.count = kept
    return 0


cdef inline int find_partners(const Finder *f, int32_t proxy, Stack *stack, Hits *hits) noexcept nogil:
    """Append to `hits` the partners of `proxy`'s fat box: the proxies whose fat boxes it overlaps
    (within reach, when either is a sphere sensor) and that may pair with it, sorted, each once."""
    cdef Query q
    cdef int64_t start = hits.count
    fat_query(f, proxy, &q)
    if walk(f.t, &q, stack, hits) != 0:
        return -1
    return settle_partners(f, proxy, &q, stack, hits, start)


ctypedef struct Packets:            # a thread's walks of up to PACKET_LANES proxies at once (next_packet)
    Hits lanes[PACKET_LANES]        # each walked proxy's partners, a lane each
    int64_t at[PACKET_LANES]        # where in the job's proxies each lane's proxy is
    int count                       # lanes the last walk filled
    Stack stack


cdef int packet_order(const TreeCore *t, const int32_t *proxies, int64_t n, const Runs *runs, int64_t **order,
                      bint *together) noexcept nogil
cdef int next_packet(const Finder *f, const int32_t *proxies, const int64_t *order, int64_t *position,
                     int64_t end, bint together, Packets *p) noexcept nogil
cdef void packets_free(Packets *p) noexcept nogil


cdef int find_all(const Finder *f, const Partners *partners, const int32_t *proxies, int64_t n, int threads,
                  int64_t room, Found *out) noexcept nogil
cdef void found_free(Found *found) noexcept nogil


cdef enum:
    PICK_ON_THREADS_FROM = 32768    # moved proxies from which pick_moved cuts its pass over the threads

ctypedef struct Picked:             # the moved proxies each stage takes (pick_moved), each once
    int32_t *refat                  # stage 1's: live, with new fat boxes; no sensors, then sensors...
    int64_t refat_plain             # ...(this many no sensors)...
    int64_t refat_count
    int32_t *retest                 # ...stage 2's on threads: live and moved, no sensors; or NULL...
    int64_t retest_count
    int32_t *sensors                # ...and the moved sensors, whose passes stage 2 makes first
    int64_t sensor_count


cdef int pick_moved(const TreeCore *t, const int32_t *moved, int64_t n, int parts, bint retests,
                    Picked *out) noexcept nogil
cdef void picked_free(Picked *picked) noexcept nogil


ctypedef struct Refreshed:          # what refresh_all changed beside the lists
    PairBuffer ended                # the touching pairs whose fat boxes parted
    int64_t listed                  # the change in the entries of all lists
    int64_t touching                # the change in the touching pairs


cdef int refresh_all(TreeCore *t, const Finder *f, Partners *partners, const int32_t *refat, int64_t n,
                     int threads, int64_t room, Refreshed *out) noexcept nogil


ctypedef struct Retest:             # a change stage 2 found: 16 bytes
    int32_t proxy                   # 4: a moved proxy...
    int32_t entry                   # 4: ...the entry of its list...
    int32_t other                   # 4: ...for this partner, whose pair...
    int32_t visit                   # 4: ...flips (0), or is a sensor's that one thread re-tests (1)

ctypedef struct Retests:            # what retest_all found: each chunk's changes, in one thread's buffer
    Retest **found                  # a buffer a thread...
    int64_t *found_count            # ...and how many changes it holds
    int64_t *chunk_first            # per chunk of FIND_CHUNK moved proxies: its first change...
    int64_t *chunk_count            # ...how many...
    int32_t *chunk_worker           # ...and whose buffer holds them
    int64_t chunks
    PairBuffer *begun               # a thread, with `flip`: the pairs of its flips, as they begin...
    PairBuffer *ended               # ...and end
    int workers


cdef int retest_all(const TreeCore *t, Partners *partners, const int32_t *moved, int64_t n, int threads,
                    bint flip, Retests *out) noexcept nogil
cdef void flip_all(TreeCore *t, Partners *partners, const Retests *found, const int32_t *moved,
                   int64_t n) noexcept nogil
cdef void retests_free(Retests *retests) noexcept nogil
