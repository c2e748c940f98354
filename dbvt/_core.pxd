# The dbvt core's header: the C structs, and the nogil tree functions `_batch`, `_tree` and
# `_broadphase` build on.
#
# Exception contract: functions returning `int` return 0 on success and -1 when memory ran out (the
# caller raises MemoryError after leaving nogil); `void` functions cannot fail. No function here
# touches Python objects.
from libc.float cimport FLT_MAX
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport realloc
from libc.string cimport memcpy

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    /* GCC counts a prefetch as no side effect: a helper that only fetches ahead is then "pure", and
       its call, whose result nobody uses, is deleted before it could be inlined. The empty volatile
       asm is a side effect that costs no instruction and constrains no memory access. */
    #define DBVT_PREFETCH(address) do { __builtin_prefetch(address); __asm__ __volatile__(""); } while (0)
    /* Into the level-2 cache only (x86: prefetcht1). */
    #define DBVT_PREFETCH_L2(address) do { __builtin_prefetch(address, 0, 2); __asm__ __volatile__(""); } while (0)
    #else
    #define DBVT_PREFETCH(address) ((void)0)
    #define DBVT_PREFETCH_L2(address) ((void)0)
    #endif
    """
    void prefetch "DBVT_PREFETCH"(const void *address) noexcept nogil
    void prefetch_l2 "DBVT_PREFETCH_L2"(const void *address) noexcept nogil

cdef extern from *:
    """
    /* Whether two closed boxes overlap (meet), or the first holds the second (holds), without a
       branch: down a walk, or over a grid cell's many near misses, that is a coin toss to the branch
       predictor (a dense scene's partner walks spent a fifth of their time on missed guesses). With SSE the six
       comparisons are two: the 16 bytes from a box's max corner include one float past the box,
       which stays inside the record that holds the box (a Node's children, a Proxy's tight box or
       id, a Query's box and what follows it) and whose lane is ignored. */
    #if defined(__SSE__) || defined(_M_X64)
    #include <xmmintrin.h>
    static inline int dbvt_meet(const float *a, const float *b) {
        __m128 alo = _mm_loadu_ps(a), ahi = _mm_loadu_ps(a + 3);
        __m128 blo = _mm_loadu_ps(b), bhi = _mm_loadu_ps(b + 3);
        return (_mm_movemask_ps(_mm_and_ps(_mm_cmple_ps(alo, bhi), _mm_cmple_ps(blo, ahi))) & 7) == 7;
    }
    static inline int dbvt_holds(const float *outer, const float *inner) {
        __m128 olo = _mm_loadu_ps(outer), ohi = _mm_loadu_ps(outer + 3);
        __m128 ilo = _mm_loadu_ps(inner), ihi = _mm_loadu_ps(inner + 3);
        return (_mm_movemask_ps(_mm_and_ps(_mm_cmple_ps(olo, ilo), _mm_cmple_ps(ihi, ohi))) & 7) == 7;
    }
    #else
    static inline int dbvt_meet(const float *a, const float *b) {
        return (a[0] <= b[3]) & (b[0] <= a[3]) & (a[1] <= b[4]) & (b[1] <= a[4]) & (a[2] <= b[5]) & (b[2] <= a[5]);
    }
    static inline int dbvt_holds(const float *outer, const float *inner) {
        return (outer[0] <= inner[0]) & (outer[1] <= inner[1]) & (outer[2] <= inner[2])
            & (inner[3] <= outer[3]) & (inner[4] <= outer[4]) & (inner[5] <= outer[5]);
    }
    #endif
    """
    bint meet "dbvt_meet"(const float *a, const float *b) noexcept nogil
    bint holds "dbvt_holds"(const float *outer, const float *inner) noexcept nogil

cdef extern from *:
    """
    /* Up to eight fat-box queries walked together (a packet, QUERY_FAT_PACKET): per axis, the
       lanes' lower bounds in a row and their upper bounds in another, so that one node's box is
       tested against four lanes with the six comparisons `meet` makes for one. A walk masks out
       the lanes its query does not use (Query.lanes), whatever they hold. */
    typedef struct { float lo[3][8]; float hi[3][8]; } dbvt_packet;
    #if defined(__SSE__) || defined(_M_X64)
    #include <xmmintrin.h>
    static inline unsigned dbvt_packet_four(const dbvt_packet *p, int first, const float *box) {
        __m128 in = _mm_and_ps(_mm_cmple_ps(_mm_loadu_ps(p->lo[0] + first), _mm_set1_ps(box[3])),
                               _mm_cmple_ps(_mm_set1_ps(box[0]), _mm_loadu_ps(p->hi[0] + first)));
        in = _mm_and_ps(in, _mm_and_ps(_mm_cmple_ps(_mm_loadu_ps(p->lo[1] + first), _mm_set1_ps(box[4])),
                                       _mm_cmple_ps(_mm_set1_ps(box[1]), _mm_loadu_ps(p->hi[1] + first))));
        in = _mm_and_ps(in, _mm_and_ps(_mm_cmple_ps(_mm_loadu_ps(p->lo[2] + first), _mm_set1_ps(box[5])),
                                       _mm_cmple_ps(_mm_set1_ps(box[2]), _mm_loadu_ps(p->hi[2] + first))));
        return (unsigned)_mm_movemask_ps(in);
    }
    static inline unsigned dbvt_packet_meet(const dbvt_packet *p, const float *box) {
        return dbvt_packet_four(p, 0, box) | dbvt_packet_four(p, 4, box) << 4;
    }
    #else
    static inline unsigned dbvt_packet_meet(const dbvt_packet *p, const float *box) {
        unsigned lanes = 0;
        for (int k = 0; k < 8; k++) {
            lanes |= (unsigned)((p->lo[0][k] <= box[3]) & (box[0] <= p->hi[0][k]) & (p->lo[1][k] <= box[4])
                                & (box[1] <= p->hi[1][k]) & (p->lo[2][k] <= box[5]) & (box[2] <= p->hi[2][k])) << k;
        }
        return lanes;
    }
    #endif
    #if defined(__GNUC__) || defined(__clang__)
    #define DBVT_LOWEST_LANE(lanes) __builtin_ctz(lanes)
    #else
    static inline int DBVT_LOWEST_LANE(unsigned lanes) { int k = 0; while (!(lanes & 1)) { lanes >>= 1; k++; } return k; }
    #endif
    """
    ctypedef struct Packet "dbvt_packet":
        float lo[3][8]
        float hi[3][8]
    # The lanes (bit k for lane k) whose box meets `box`, closed, as `meet` decides it.
    uint32_t packet_meet "dbvt_packet_meet"(const Packet *p, const float *box) noexcept nogil
    int lowest_lane "DBVT_LOWEST_LANE"(uint32_t lanes) noexcept nogil

cdef enum:
    PACKET_LANES = 8                # the most queries a packet walks together


cdef extern from *:
    """
    /* x > y ? x : y, and x < y ? x : y, without a branch: compilers keep these as branches when
       they may not reorder floating point, and in a tree walk, or over a sensor's partners (which
       side of its centre each lies on), their outcome is a coin toss. */
    #if defined(__SSE2__) || defined(_M_X64)
    #include <emmintrin.h>
    static inline double dbvt_above(double x, double y) {
        return _mm_cvtsd_f64(_mm_max_sd(_mm_set_sd(x), _mm_set_sd(y)));
    }
    static inline double dbvt_below(double x, double y) {
        return _mm_cvtsd_f64(_mm_min_sd(_mm_set_sd(x), _mm_set_sd(y)));
    }
    #else
    static inline double dbvt_above(double x, double y) { return x > y ? x : y; }
    static inline double dbvt_below(double x, double y) { return x < y ? x : y; }
    #endif
    """
    double above "dbvt_above"(double x, double y) noexcept nogil
    double below "dbvt_below"(double x, double y) noexcept nogil


cdef inline double ball_gap_sq(const double *centre, const float *box, int dims) noexcept nogil:
    """The squared distance from `centre` to the closest point of `box`, over `dims` axes: the one
    computation of it that a sphere sensor's partners are decided with, so that a walk and a lookup
    agree bit for bit."""
    cdef double gap, distance_sq = 0.0
    cdef int i
    for i in range(dims):
        gap = above(above(<double>box[i] - centre[i], centre[i] - <double>box[i + 3]), 0.0)
        distance_sq += gap * gap
    return distance_sq

# A flag that threads share (a C11 atomic int; plain reads and writes of it are sequentially
# consistent): the wide view's, which one query batch may rebuild while another reads it.
cdef extern from *:
    """
    #include <stdatomic.h>
    typedef atomic_int dbvt_flag;
    static inline int dbvt_flag_claim(dbvt_flag *flag) { return atomic_exchange(flag, 1) == 0; }
    """
    ctypedef int dbvt_flag
    bint flag_claim "dbvt_flag_claim"(dbvt_flag *flag) noexcept nogil

cdef enum:
    NULL_REF = -2147483647 - 1     # no node; leaves are ~proxy (< 0), so the null must lie outside
    MAX_PLANES = 32
    PREFETCH_AHEAD = 8              # rows a batch working through random memory fetches ahead, per stage
    HIT_LIMIT = 2                   # a status: a batch of queries stopped at its Batch.max_hits

# A reinserted leaf's new fat box also covers this many more moves of the same displacement (Box2D's
# aabbMultiplier), so steadily moving objects are reinserted every few moves instead of every move.
# On W1 (10% of proxies move per step, |v| <= 0.5) 3 cuts reinsertions from 52% to 32% of moves and the
# broadphase step by about 40%, for about 30% more fat-box partners.
cdef enum:
    PREDICTION_STEPS = 3

# Proxy.flags bits
cdef enum:
    PROXY_LIVE = 1                  # slot holds a proxy (else it is on the free list)
    PROXY_MOVED = 2                 # created or moved since the broadphase's last update()
    PROXY_STATIC = 4                # never paired with another static proxy
    PROXY_SEEN = 8                  # scratch: already named earlier in the current batch; in update(), re-tested
    PROXY_REFAT = 16                # got a new fat box since the broadphase's last update()
    PROXY_SENSOR_BOX = 32           # a broadphase sensor whose shape is its tight box...
    PROXY_SENSOR_SPHERE = 64        # ...or the largest ball inside its tight box
    PROXY_SENSOR = 96               # either sensor bit
    PROXY_FLAGS = 127               # every bit above

# A tree reference is an int32: >= 0 names an internal node, < 0 a leaf (~proxy index).

# The pools come from malloc, which aligns to 16 bytes (glibc starts a large block 16 bytes into a
# page), so a node or a proxy may span two cache lines. Pools aligned to 64 bytes were measured and
# left out: the plain W1 step gained about 1.5 %, a step with sensors did not, and the ratio of the
# two, which issue 15 bounds, rose 4 % (docs/benchmarks.md, Sensors).
ctypedef struct Node:               # an internal node as walks see it: 32 bytes
    float box[6]                    # 24 B  bounds of everything below: min x y z, max x y z
    int32_t child[2]                # 8 B   tree references to the two children

ctypedef struct Proxy:              # a leaf: 64 bytes
    float fat[6]                    # 24 B  the box the tree holds: the tight box grown when (re)inserted
    float tight[6]                  # 24 B  the user's box as given (2-D: z is 0); queries test this box
    uint64_t id                     # 8 B   the user's id
    int32_t parent                  # 4 B   internal node above, NULL_REF at the root; next free proxy when free
    uint32_t flags                  # 4 B   PROXY_* bits

ctypedef struct StackEntry:         # 8 bytes
    int32_t ref                     # tree reference still to visit
    uint32_t pending                # tests still to make below it: 0 = wholly inside the query volume

ctypedef struct Stack:              # the one explicit stack of a walk; grows, never drops nodes
    StackEntry *entries
    int64_t count
    int64_t capacity

ctypedef struct Hits:               # what one query found: proxy indices, and entry fractions for rays
    int32_t *proxies
    double *fractions
    int64_t count
    int64_t capacity

cdef enum QueryKind:
    QUERY_BOX
    QUERY_SPHERE
    QUERY_RAY
    QUERY_FRUSTUM
    QUERY_FAT_BOX                   # a box against the leaves' fat boxes
    QUERY_FAT_BALL                  # a sphere sensor's reach: leaves' fat boxes that meet the box and
                                    # touch the ball (center, radius_sq) inside it
    QUERY_FAT_PACKET                # QUERY_FAT_BOX for each lane of a packet at once

ctypedef struct Query:
    QueryKind kind
    float box[6]                    # QUERY_BOX, QUERY_FAT_BOX, QUERY_FAT_BALL: the query box
    double center[3]                # QUERY_SPHERE, QUERY_FAT_BALL (0 on the axes a world lacks)
    double radius_sq
    double origin[3]                # QUERY_RAY: the segment is origin + t * delta, t in [0, 1]
    double delta[3]
    double inv_delta[3]             # 1 / delta where delta != 0
    double best_fraction            # QUERY_RAY with first_hit: nodes entered after this are skipped
    bint first_hit
    double planes[MAX_PLANES][4]    # QUERY_FRUSTUM: (nx, ny, nz, d), inside when n.p + d >= 0
    int32_t plane_count
    uint32_t mask                   # proxies whose group has no bit of mask are skipped...
    const uint32_t *groups          # ...when groups (indexed by proxy) is not NULL
    uint32_t skip_flags             # leaves with any of these Proxy.flags are skipped (sensors)
    const Packet *packet            # QUERY_FAT_PACKET: the lanes' boxes...
    uint32_t lanes                  # ...and which lanes hold one (bit k for lane k)

ctypedef struct Quad:               # four children side by side, tested in one SIMD step: 128 B, two cache lines
    float lo[3][4]                  # 48 B  min x, y, z of children 0-3 (an axis' four in one register)
    float hi[3][4]                  # 48 B  max x, y, z of children 0-3
    int32_t child[4]                # 16 B  >= 0 a quad; < 0 ~leaf, an index into Wide.ids; NULL_REF unused
    int32_t count                   # 4 B   children in use, from child 0
    int32_t unused[3]               # 12 B  pads the quad to whole cache lines

ctypedef struct Wide:               # the tree's 4-wide query view (dbvt._wide): boxes and segments walk it
    Quad *quads                     # 64-byte aligned within `block`; a quad's first child quad follows it
    void *block                     # the allocation `quads` lies in
    int32_t quad_capacity
    int32_t quad_count
    uint64_t *ids                   # per leaf, in the view's depth-first order: its proxy's id...
    int32_t *proxies                # ...and its proxy (for the broadphase's groups)
    int32_t leaf_capacity
    int32_t rest                    # the quad over every leaf but the sensors', NULL_REF when none
    int32_t sensors                 # the quad over the sensors' leaves, NULL_REF when none
    dbvt_flag fresh                 # built since the tree last changed: every function that changes a
                                    # tight box or the tree's shape clears it
    dbvt_flag building              # a batch is rebuilding it: another walks the tree meanwhile

ctypedef struct TreeCore:
    Node *nodes                     # pool of internal nodes; WARNING: moves when the pool grows
    int32_t *parents                # per node: the node above, NULL_REF at the root; next free node when
                                    # free. Kept apart with heights: only edits need them, walks don't
    int32_t *heights                # per node: 1 + the taller child's height (leaves are 0); -1 when free
    float *costs                    # per node: box_cost() of its box, which every insertion's descent
                                    # weighs at each level; kept with the box (not serialised)
    int32_t node_capacity
    int32_t node_count              # nodes in use
    int32_t free_node               # head of the free list through Node.parent
    Proxy *proxies                  # pool of leaves; WARNING: moves when the pool grows
    int32_t proxy_capacity
    int32_t proxy_count             # live proxies
    int32_t free_proxy              # head of the free list through Proxy.parent
    int32_t *slots                  # open-addressing id -> proxy index table, -1 = empty
    int64_t slot_mask               # table size - 1 (a power of two)
    int32_t root                    # tree reference, NULL_REF when empty
    int32_t sensor_root             # the subtree of the sensors' leaves (see subtree_root), NULL_REF if none
    int32_t dims                    # 2 or 3; 2-D boxes are stored with z = [0, 0]
    float margin                    # fat boxes are the tight box grown by this on every side
    Wide wide                       # the query view, rebuilt from the tree when a batch needs it


ctypedef struct RayHit:             # a ray hit while sorting: 16 bytes
    double fraction
    uint64_t id

ctypedef struct IdPair:             # a pair of user ids, a < b: 16 bytes
    uint64_t a
    uint64_t b

ctypedef struct PairBuffer:
    IdPair *pairs
    int64_t count
    int64_t capacity

ctypedef struct Batch:              # the working memory and growing CSR output of a batch of queries
    Stack stack
    Hits hits
    uint64_t *ids                   # every query's hits, one after another
    double *fractions               # ray queries: each hit's entry fraction
    int64_t count
    int64_t capacity
    RayHit *ray_hits                # scratch for sorting one ray's hits
    int64_t ray_capacity
    int64_t max_hits                # past this many hits the batch stops (HIT_LIMIT); -1: no limit


cdef inline void wide_stale(TreeCore *t) noexcept nogil:
    """Mark the wide view stale. Its flag is read first: a store to an atomic costs a fence, and a
    step's moves come by the thousand, all but the first finding it stale already."""
    if t.wide.fresh:
        t.wide.fresh = False


cdef int core_init(TreeCore *t, int32_t dims, float margin) noexcept nogil
cdef void core_free(TreeCore *t) noexcept nogil
cdef int core_reserve(TreeCore *t, int64_t extra_proxies, int threads) noexcept nogil
cdef int rehash(TreeCore *t, int64_t size, int64_t scan, int threads) noexcept nogil
cdef int32_t core_find(const TreeCore *t, uint64_t id) noexcept nogil
cdef void core_prefetch_find(const TreeCore *t, uint64_t id, bint proxy) noexcept nogil
cdef void core_prefetch_move(const TreeCore *t, int32_t proxy, bint parent) noexcept nogil
cdef int32_t core_add(TreeCore *t, uint64_t id, const float *tight) noexcept nogil
cdef void core_remove(TreeCore *t, int32_t proxy) noexcept nogil
cdef bint core_move(TreeCore *t, int32_t proxy, const float *tight, float prediction) noexcept nogil
cdef void core_place(TreeCore *t, int32_t proxy, const float *tight, const float *fat) noexcept nogil
cdef enum:
    NEWLY_MOVED = 2                 # core_move_split's mark: the proxy had no PROXY_MOVED before
cdef int core_move_split(TreeCore *t, const int32_t *proxies, const int64_t *order, const float *rows,
                         float *before, uint8_t *refat, bint mark_moved, int64_t n, float prediction,
                         int threads) noexcept nogil
cdef void fill_slots(TreeCore *t, int64_t scan, const uint64_t *ids, const int32_t *row_proxies,
                     int threads) noexcept nogil
cdef int grow_nodes(TreeCore *t, int64_t capacity, int threads) noexcept nogil
cdef void insert_leaf(TreeCore *t, int32_t proxy, int32_t start) noexcept nogil
cdef void core_set_sensor(TreeCore *t, int32_t proxy, uint32_t flag) noexcept nogil
cdef int core_split_sensors(TreeCore *t) noexcept nogil
cdef void load_box(const float *row, int32_t dims, float *out) noexcept nogil
cdef void cache_costs(TreeCore *t) noexcept nogil

cdef inline int stack_push(Stack *stack, int32_t ref, uint32_t pending) noexcept nogil:
    """Push a reference (and, for frusta, the planes it may still cross); the walkers' one stack."""
    cdef StackEntry *entries
    cdef int64_t capacity
    if stack.count == stack.capacity:
        capacity = 2 * stack.capacity if stack.capacity else 64
        entries = <StackEntry *>realloc(stack.entries, capacity * sizeof(StackEntry))
        if entries == NULL:
            return -1
        stack.entries = entries
        stack.capacity = capacity
    stack.entries[stack.count].ref = ref
    stack.entries[stack.count].pending = pending
    stack.count += 1
    return 0


# Morton codes: a cell number's bits spread out, to interleave with the other axes'.
cdef inline uint64_t spread_by_two(uint64_t x) noexcept nogil:
    """The low 21 bits of x, two zero bits after each: one axis of a 3-D Morton code."""
    x &= 0x1FFFFF
    x = (x | x << 32) & <uint64_t>0x1F00000000FFFFULL
    x = (x | x << 16) & <uint64_t>0x1F0000FF0000FFULL
    x = (x | x << 8) & <uint64_t>0x100F00F00F00F00FULL
    x = (x | x << 4) & <uint64_t>0x10C30C30C30C30C3ULL
    return (x | x << 2) & <uint64_t>0x1249249249249249ULL


cdef inline uint64_t spread_by_one(uint64_t x) noexcept nogil:
    """The low 32 bits of x, a zero bit after each: one axis of a 2-D Morton code."""
    x &= <uint64_t>0xFFFFFFFFULL
    x = (x | x << 16) & <uint64_t>0x0000FFFF0000FFFFULL
    x = (x | x << 8) & <uint64_t>0x00FF00FF00FF00FFULL
    x = (x | x << 4) & <uint64_t>0x0F0F0F0F0F0F0F0FULL
    x = (x | x << 2) & <uint64_t>0x3333333333333333ULL
    return (x | x << 1) & <uint64_t>0x5555555555555555ULL


cdef int walk(const TreeCore *t, Query *q, Stack *stack, Hits *hits) noexcept nogil
cdef void stack_free(Stack *stack) noexcept nogil
cdef int grow_array(void **items, int64_t *capacity, int64_t need, size_t size) noexcept nogil
cdef int hits_push(Hits *hits, int32_t proxy, double fraction) noexcept nogil
cdef void hits_free(Hits *hits) noexcept nogil


cdef inline bint listed_allowed(const TreeCore *t, const uint32_t *groups, const uint32_t *masks,
                                int32_t a, int32_t b) noexcept nogil:
    """The broadphase's filter of pairs and sensor pairs alike: never two static proxies, never two
    sensors, and each group must meet the other's mask."""
    if t.proxies[a].flags & t.proxies[b].flags & PROXY_STATIC:
        return False
    if (t.proxies[a].flags & PROXY_SENSOR) and (t.proxies[b].flags & PROXY_SENSOR):
        return False
    return (groups[a] & masks[b]) != 0 and (groups[b] & masks[a]) != 0


cdef inline bint pair_allowed(const TreeCore *t, const uint32_t *groups, const uint32_t *masks,
                              int32_t a, int32_t b) noexcept nogil:
    """The filter of pairs: as listed_allowed, and no sensor (a sensor's pairs are its own kind)."""
    if (t.proxies[a].flags | t.proxies[b].flags) & PROXY_SENSOR:
        return False
    return listed_allowed(t, groups, masks, a, b)


# ---------------------------------------------------------------------------------------------
# Boxes: float[6] = min x y z, max x y z; 2-D boxes have z = [0, 0]. Only min/max and monotone
# arithmetic touch stored bounds, so a parent always contains its children.

cdef inline double box_cost(const float *b, bint planar) noexcept nogil:
    """Half the surface area (3-D) or half the perimeter (2-D): the SAH's measure of a box. In 3-D a
    vanishing share of the squared edge sum keeps flat and point-like boxes (zero area) apart.
    Single precision, which is what insertion spends its time on; a box too large for float32's
    range costs FLT_MAX, so sums and differences of costs stay finite."""
    cdef float dx = b[3] - b[0]
    cdef float dy = b[4] - b[1]
    cdef float dz = b[5] - b[2]
    cdef float s = dx + dy + dz
    cdef float cost
    if planar:
        cost = dx + dy
    else:
        cost = dx * dy + dy * dz + dz * dx + <float>1e-6 * s * s
    return cost if cost < FLT_MAX else FLT_MAX


cdef inline void union_box(float *out, const float *a, const float *b) noexcept nogil:
    cdef int i
    for i in range(3):
        out[i] = a[i] if a[i] < b[i] else b[i]
        out[i + 3] = a[i + 3] if a[i + 3] > b[i + 3] else b[i + 3]


cdef inline double union_cost(const float *a, const float *b, bint planar) noexcept nogil:
    cdef float u[6]
    union_box(u, a, b)
    return box_cost(u, planar)


cdef inline bint box_contains(const float *outer, const float *inner) noexcept nogil:
    return (outer[0] <= inner[0] and outer[1] <= inner[1] and outer[2] <= inner[2]
            and inner[3] <= outer[3] and inner[4] <= outer[4] and inner[5] <= outer[5])


cdef inline bint boxes_overlap(const float *a, const float *b) noexcept nogil:
    return (a[0] <= b[3] and b[0] <= a[3] and a[1] <= b[4] and b[1] <= a[4]
            and a[2] <= b[5] and b[2] <= a[5])


# Tree references: internal node (>= 0) or leaf (~proxy).
#
# Sensors' leaves live in a subtree of their own: a sensor's fat box holds its reach, far larger than
# a proxy's, and mixed with the rest it would widen the nodes above most leaves, which every walk
# would then have to open. With both kinds present the root joins the two subtrees, the rest's as
# child 0 and the sensors' (`sensor_root`) as child 1, and never rotates.

cdef inline int32_t subtree_root(const TreeCore *t, bint sensors) noexcept nogil:
    """The root of the sensors' subtree, or of everything else's; NULL_REF when it is empty."""
    if t.sensor_root == NULL_REF:
        return NULL_REF if sensors else t.root
    if t.root == t.sensor_root:
        return t.sensor_root if sensors else NULL_REF
    return t.sensor_root if sensors else t.nodes[t.root].child[0]


cdef inline int32_t ref_parent(const TreeCore *t, int32_t ref) noexcept nogil:
    return t.parents[ref] if ref >= 0 else t.proxies[~ref].parent


cdef inline float *ref_box(const TreeCore *t, int32_t ref) noexcept nogil:
    if ref >= 0:
        return t.nodes[ref].box
    return t.proxies[~ref].fat


cdef inline int32_t ref_height(const TreeCore *t, int32_t ref) noexcept nogil:
    return t.heights[ref] if ref >= 0 else 0


# Shared with the bulk build (dbvt._build): the fat box of a tight one, the parent link of a
# reference, and the id table's hash.

cdef inline float clamp_finite(float x) noexcept nogil:
    """Bounds stay finite (a huge margin could round them to infinity, and centres to NaN)."""
    if x > FLT_MAX:
        return FLT_MAX
    if x < -FLT_MAX:
        return -FLT_MAX
    return x


cdef inline void fatten(const TreeCore *t, const float *tight, float *fat) noexcept nogil:
    cdef int i
    cdef int axes = t.dims
    memcpy(fat, tight, 6 * sizeof(float))
    for i in range(axes):
        fat[i] = clamp_finite(tight[i] - t.margin)
        fat[i + 3] = clamp_finite(tight[i + 3] + t.margin)


cdef inline void set_parent(TreeCore *t, int32_t ref, int32_t parent) noexcept nogil:
    if ref >= 0:
        t.parents[ref] = parent
    else:
        t.proxies[~ref].parent = parent


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    """splitmix64's finaliser: user ids are often sequential, and linear probing needs them spread."""
    x ^= x >> 30
    x *= <uint64_t>0xbf58476d1ce4e5b9ULL
    x ^= x >> 27
    x *= <uint64_t>0x94d049bb133111ebULL
    x ^= x >> 31
    return x


cdef inline void prefetch_move(const TreeCore *t, const int32_t *proxies, const int64_t *order,
                               Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """Before move i of a batch taken in `order`: fetch a later move's proxy, and an earlier-fetched
    one's parent node (where a move that leaves its fat box starts)."""
    if i + 2 * PREFETCH_AHEAD < n:
        core_prefetch_move(t, proxies[order[i + 2 * PREFETCH_AHEAD]], False)
    if i + PREFETCH_AHEAD < n:
        core_prefetch_move(t, proxies[order[i + PREFETCH_AHEAD]], True)
