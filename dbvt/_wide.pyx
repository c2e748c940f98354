# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The tree's 4-wide query view: box and segment queries walk quads that hold four children's boxes
side by side, and test all four in one SIMD step (Jolt's BroadPhaseQuadTree, Embree's BVH4).

The binary tree stays what insertion, removal and the broadphase work on. The view is derived from it
by collapsing: a quad over a subtree opens the costliest node among its pieces until it has four, and
each piece that is a node gets a quad of its own, depth first, so a quad's first child quad follows
it in memory. Its boxes bound the leaves' tight boxes, which is what queries test, not the fat boxes
the tree is built on: they are smaller, and a leaf's box in its parent quad is the leaf's own tight
box, so the walk decides a leaf without reading its proxy. Leaves are numbered depth first too, and
their ids kept in that order beside the quads, so a query's hits are read from a few cache lines.

Any change to a tight box or to the tree's shape marks the view stale (Wide.fresh); a batch large
enough to pay for it (wide_worth) rebuilds it before its walks start, and smaller batches walk the
binary tree. The view is kept between batches, so a tick's rebuild reuses its memory. Both walks
give the same hits: every decision on a leaf is the same comparison of the same values (a box test
in float32; the segment's slab test in float64 with the same operations in the same order, the SIMD
min and max chosen to keep the scalar code's outcome on ties and NaNs), and a quad's box contains
its leaves' boxes, so no hit is lost above them.
"""
from libc.math cimport INFINITY
from libc.stdint cimport INT32_MAX, int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

from dbvt._core cimport (
    NULL_REF, PREFETCH_AHEAD, PROXY_SENSOR, QUERY_BOX, QUERY_RAY, Hits, Quad, Query, Stack, TreeCore, Wide,
    flag_claim, hits_push, prefetch, stack_push, subtree_root,
)

cdef extern from *:
    """
    #include <math.h>
    #if defined(__GNUC__) || defined(__clang__)
    #define DBVT_LOWEST_BIT(bits) __builtin_ctz(bits)
    #else
    static inline int DBVT_LOWEST_BIT(int bits) { int i = 0; while (!(bits & 1)) { bits >>= 1; i++; } return i; }
    #endif

    /* Which of a quad's four boxes (lo, hi: an axis' four values in a row) meet the closed query box
       [min x y z, max x y z]: bit i for child i, the same six comparisons as boxes_overlap(). */
    #if defined(__SSE2__) || defined(_M_X64)
    #include <emmintrin.h>
    static inline int dbvt_quad_boxes(const float *lo, const float *hi, const float *box) {
        __m128 in = _mm_and_ps(_mm_cmple_ps(_mm_set1_ps(box[0]), _mm_load_ps(hi)),
                               _mm_cmple_ps(_mm_load_ps(lo), _mm_set1_ps(box[3])));
        in = _mm_and_ps(in, _mm_and_ps(_mm_cmple_ps(_mm_set1_ps(box[1]), _mm_load_ps(hi + 4)),
                                       _mm_cmple_ps(_mm_load_ps(lo + 4), _mm_set1_ps(box[4]))));
        in = _mm_and_ps(in, _mm_and_ps(_mm_cmple_ps(_mm_set1_ps(box[2]), _mm_load_ps(hi + 8)),
                                       _mm_cmple_ps(_mm_load_ps(lo + 8), _mm_set1_ps(box[5]))));
        return _mm_movemask_ps(in);
    }

    /* segment_hits() of _core for four boxes at once, two float64 lanes a register: bit i when the
       closed segment origin + t delta, t in [0, 1], meets box i, and entry[i] its entry fraction.
       _mm_min_pd(a, b) is a < b ? a : b and _mm_max_pd(a, b) is a > b ? a : b, exactly the scalar
       code's swaps and updates, ties and NaNs included. */
    static inline void dbvt_axis(__m128d lo, __m128d hi, __m128d o, __m128d inv, __m128d *tmin, __m128d *tmax) {
        __m128d t1 = _mm_mul_pd(_mm_sub_pd(lo, o), inv);
        __m128d t2 = _mm_mul_pd(_mm_sub_pd(hi, o), inv);
        *tmin = _mm_max_pd(_mm_min_pd(t2, t1), *tmin);
        *tmax = _mm_min_pd(_mm_max_pd(t1, t2), *tmax);
    }
    static inline int dbvt_quad_segment(const float *lo, const float *hi, const double *origin,
                                        const double *delta, const double *inv, double *entry) {
        __m128d tmin0 = _mm_set1_pd(-INFINITY), tmin1 = tmin0, tmax0 = _mm_set1_pd(INFINITY), tmax1 = tmax0;
        __m128d out0 = _mm_setzero_pd(), out1 = out0, zero = _mm_setzero_pd(), one = _mm_set1_pd(1.0);
        int i;
        for (i = 0; i < 3; i++) {
            __m128 l = _mm_load_ps(lo + 4 * i), h = _mm_load_ps(hi + 4 * i);
            __m128d l0 = _mm_cvtps_pd(l), l1 = _mm_cvtps_pd(_mm_movehl_ps(l, l));
            __m128d h0 = _mm_cvtps_pd(h), h1 = _mm_cvtps_pd(_mm_movehl_ps(h, h));
            __m128d o = _mm_set1_pd(origin[i]);
            if (delta[i] == 0.0) {
                out0 = _mm_or_pd(out0, _mm_or_pd(_mm_cmplt_pd(o, l0), _mm_cmpgt_pd(o, h0)));
                out1 = _mm_or_pd(out1, _mm_or_pd(_mm_cmplt_pd(o, l1), _mm_cmpgt_pd(o, h1)));
            } else {
                __m128d v = _mm_set1_pd(inv[i]);
                dbvt_axis(l0, h0, o, v, &tmin0, &tmax0);
                dbvt_axis(l1, h1, o, v, &tmin1, &tmax1);
            }
        }
        out0 = _mm_or_pd(out0, _mm_or_pd(_mm_cmpgt_pd(tmin0, tmax0),
                                         _mm_or_pd(_mm_cmplt_pd(tmax0, zero), _mm_cmpgt_pd(tmin0, one))));
        out1 = _mm_or_pd(out1, _mm_or_pd(_mm_cmpgt_pd(tmin1, tmax1),
                                         _mm_or_pd(_mm_cmplt_pd(tmax1, zero), _mm_cmpgt_pd(tmin1, one))));
        _mm_storeu_pd(entry, _mm_max_pd(tmin0, zero));
        _mm_storeu_pd(entry + 2, _mm_max_pd(tmin1, zero));
        return ~(_mm_movemask_pd(out0) | (_mm_movemask_pd(out1) << 2)) & 15;
    }
    #else
    static inline int dbvt_quad_boxes(const float *lo, const float *hi, const float *box) {
        int bits = 0, i;
        for (i = 0; i < 4; i++)
            bits |= ((box[0] <= hi[i]) & (lo[i] <= box[3]) & (box[1] <= hi[4 + i]) & (lo[4 + i] <= box[4])
                     & (box[2] <= hi[8 + i]) & (lo[8 + i] <= box[5])) << i;
        return bits;
    }
    static inline int dbvt_quad_segment(const float *lo, const float *hi, const double *origin,
                                        const double *delta, const double *inv, double *entry) {
        int bits = 0, i, k, in;
        double tmin, tmax, t1, t2, swap, l, h;
        for (k = 0; k < 4; k++) {
            tmin = -INFINITY;
            tmax = INFINITY;
            in = 1;
            for (i = 0; i < 3; i++) {
                l = lo[4 * i + k];
                h = hi[4 * i + k];
                if (delta[i] == 0.0) {
                    in &= !(origin[i] < l || origin[i] > h);
                } else {
                    t1 = (l - origin[i]) * inv[i];
                    t2 = (h - origin[i]) * inv[i];
                    if (t1 > t2) { swap = t1; t1 = t2; t2 = swap; }
                    if (t1 > tmin) tmin = t1;
                    if (t2 < tmax) tmax = t2;
                }
            }
            bits |= (in && !(tmin > tmax) && !(tmax < 0.0) && !(tmin > 1.0)) << k;
            entry[k] = tmin > 0.0 ? tmin : 0.0;
        }
        return bits;
    }
    #endif
    """
    int lowest_bit "DBVT_LOWEST_BIT"(int bits) noexcept nogil
    int quad_boxes "dbvt_quad_boxes"(const float *lo, const float *hi, const float *box) noexcept nogil
    int quad_segment "dbvt_quad_segment"(const float *lo, const float *hi, const double *origin,
                                         const double *delta, const double *inv, double *entry) noexcept nogil

cdef enum:
    QUAD_ALIGN = 64                 # a quad starts a cache line, so it spans exactly two
    # A stale view is rebuilt for a batch of at least proxies / WIDE_PAYS_PER queries. On W1 at 100k a
    # rebuild costs about 45 ns a proxy and a query on the view saves about 1.2 us: it pays from a
    # batch of proxies / 27; at proxies / 16 it saves at least 1.7 times what it costs.
    WIDE_PAYS_PER = 16


# ---------------------------------------------------------------------------------------------
# Building the view.

cdef int grow_quads(Wide *w, int64_t need) noexcept nogil:
    """Room for `need` quads, at least half as many again as now; the quads keep their indices."""
    cdef int64_t capacity = max(need, w.quad_capacity + w.quad_capacity // 2, 64)
    cdef void *block
    cdef Quad *quads
    if capacity > INT32_MAX:
        return -1
    block = malloc(capacity * sizeof(Quad) + QUAD_ALIGN - 1)
    if block == NULL:
        return -1
    quads = <Quad *>((<uintptr_t>block + QUAD_ALIGN - 1) & ~<uintptr_t>(QUAD_ALIGN - 1))
    if w.quad_count:
        memcpy(quads, w.quads, w.quad_count * sizeof(Quad))
    free(w.block)
    w.block = block
    w.quads = quads
    w.quad_capacity = <int32_t>capacity
    return 0


cdef int grow_leaves(Wide *w, int64_t need) noexcept nogil:
    cdef void *grown
    if need <= w.leaf_capacity:
        return 0
    grown = realloc(w.ids, need * sizeof(w.ids[0]))
    if grown == NULL:
        return -1
    w.ids = <uint64_t *>grown
    grown = realloc(w.proxies, need * sizeof(w.proxies[0]))
    if grown == NULL:
        return -1
    w.proxies = <int32_t *>grown
    w.leaf_capacity = <int32_t>need
    return 0


# The quads are as few as the tree allows: bottom up, fewest[k - 1] of a node is the fewest quads below
# it when its subtree gives its parent's quad k pieces (k = 1: the node itself, which then has a quad
# of its own), and plan[node] records the cuts that reach them; top down, each quad takes its node's
# cheapest cut. (Opening the costliest piece first, as a greedy collapse does, left half the quads
# with two children: 0.50 quads a proxy on W1, against 0.38 with this; fuller quads are both smaller
# and quicker to walk.) plan[node]: bits 0-1 and 2-3 the pieces child 0 gives in a cut of the node in
# three and in four, bits 4-6 the pieces of the node's own quad.
cdef enum:
    NO_CUT = 0x3FFFFFFF             # a leaf cannot be cut in pieces


cdef void count_quads(const TreeCore *t, int32_t node, uint8_t *plan, int32_t *fewest) noexcept nogil:
    """Fill `plan` below and at `node`, and `fewest` (4 values) for the node."""
    cdef int32_t c0 = t.nodes[node].child[0], c1 = t.nodes[node].child[1], here
    cdef int32_t below[2][4]
    cdef int k, i, side, best
    cdef uint32_t choice = 0
    for side in range(2):
        if t.nodes[node].child[side] >= 0:
            count_quads(t, t.nodes[node].child[side], plan, below[side])
        else:
            below[side][0] = 0
            below[side][1] = below[side][2] = below[side][3] = NO_CUT
    for k in range(2, 5):
        fewest[k - 1] = NO_CUT
        best = 1
        for i in range(1, k):
            here = below[0][i - 1] + below[1][k - i - 1]
            if here < fewest[k - 1]:
                fewest[k - 1] = here
                best = i
        if k > 2:
            choice |= <uint32_t>best << (2 * (k - 3))
    best = 2
    for k in range(3, 5):                   # on a tie, the quad with more children
        if fewest[k - 1] <= fewest[best - 1]:
            best = k
    fewest[0] = 1 + fewest[best - 1]
    plan[node] = <uint8_t>(choice | (<uint32_t>best << 4))


cdef void cut(const TreeCore *t, const uint8_t *plan, int32_t ref, int k, int32_t *parts, int *count) noexcept nogil:
    """Append to `parts` the k pieces of the cheapest cut of the subtree at `ref`."""
    cdef int i
    if k == 1:
        parts[count[0]] = ref
        count[0] += 1
        return
    i = 1 if k == 2 else (plan[ref] >> (2 * (k - 3))) & 3
    cut(t, plan, t.nodes[ref].child[0], i, parts, count)
    cut(t, plan, t.nodes[ref].child[1], k - i, parts, count)


cdef int collapse(const TreeCore *t, Wide *w, const uint8_t *plan, int32_t ref, int32_t *index,
                  int32_t *leaves) noexcept nogil:
    """Make the quad over the subtree at `ref` (its index into `index`) and its own quads after it, depth
    first, with their children and leaves but not yet their boxes (fill_boxes). 0, or -1 when memory
    ran out."""
    cdef int32_t part[4]
    cdef int32_t child
    cdef int count = 0, i
    if w.quad_count == w.quad_capacity and grow_quads(w, <int64_t>w.quad_count + 1) != 0:
        return -1
    index[0] = w.quad_count
    w.quad_count += 1
    cut(t, plan, ref, plan[ref] >> 4 if ref >= 0 else 1, part, &count)
    w.quads[index[0]].count = count
    for i in range(4):
        if i >= count:
            child = NULL_REF
        elif part[i] < 0:
            child = ~leaves[0]
            w.proxies[leaves[0]] = ~part[i]
            leaves[0] += 1
        elif collapse(t, w, plan, part[i], &child, leaves) != 0:
            return -1
        w.quads[index[0]].child[i] = child      # after the recursion, which may have moved the quads
    return 0


cdef void fill_boxes(const TreeCore *t, Wide *w) noexcept nogil:
    """The quads' boxes and the leaves' ids, last quad first so that a quad's child quads are done
    before it. A leaf's box is its proxy's tight box, a quad's the union of its children's: proxies
    are read in no useful order, so each quad fetches those of a quad PREFETCH_AHEAD before it."""
    cdef int32_t q, child, proxy
    cdef int i, j, k
    cdef Quad *quad
    cdef const Quad *ahead
    cdef const Quad *below
    cdef const float *tight
    cdef float lo, hi
    for q in range(w.quad_count - 1, -1, -1):
        if q >= PREFETCH_AHEAD:
            ahead = &w.quads[q - PREFETCH_AHEAD]
            for i in range(ahead.count):
                if ahead.child[i] < 0:
                    prefetch(&t.proxies[w.proxies[~ahead.child[i]]])
        quad = &w.quads[q]
        for i in range(4):
            child = quad.child[i]
            if child == NULL_REF:
                for k in range(3):
                    quad.lo[k][i] = INFINITY
                    quad.hi[k][i] = -INFINITY
            elif child < 0:
                proxy = w.proxies[~child]
                w.ids[~child] = t.proxies[proxy].id
                tight = t.proxies[proxy].tight
                for k in range(3):
                    quad.lo[k][i] = tight[k]
                    quad.hi[k][i] = tight[k + 3]
            else:
                below = &w.quads[child]
                for k in range(3):
                    lo = below.lo[k][0]
                    hi = below.hi[k][0]
                    for j in range(1, 4):           # unused lanes hold an empty box: +inf..-inf
                        lo = below.lo[k][j] if below.lo[k][j] < lo else lo
                        hi = below.hi[k][j] if below.hi[k][j] > hi else hi
                    quad.lo[k][i] = lo
                    quad.hi[k][i] = hi


cdef bint wide_worth(const TreeCore *t, int64_t queries) noexcept nogil:
    """Whether a batch of this many box or segment queries should walk the view: it is fresh, or
    rebuilding it costs less than the batch saves."""
    return t.wide.fresh or queries * WIDE_PAYS_PER >= t.proxy_count


cdef int wide_refresh(TreeCore *t) noexcept nogil:
    """Rebuild the view when the tree changed since it was built: 0, or -1 when memory ran out (the
    view is left stale). Without the GIL: reads may run beside it (no change may), and a batch that
    finds another rebuilding walks the tree meanwhile; the view is marked fresh once it is whole."""
    cdef Wide *w = &t.wide
    cdef int32_t rest = subtree_root(t, False)
    cdef int32_t sensors = subtree_root(t, True)
    cdef int32_t leaves = 0
    cdef int32_t fewest[4]
    cdef uint8_t *plan
    cdef int status = 0
    if w.fresh or not flag_claim(&w.building):
        return 0
    plan = <uint8_t *>malloc(<int64_t>t.node_capacity + 1)
    # W1 needs 0.38 quads a proxy: room for a little more at once, rather than growing step by step.
    if (plan == NULL or grow_leaves(w, t.proxy_count) != 0
            or (w.quad_capacity < t.proxy_count * 2 // 5 and grow_quads(w, t.proxy_count * 2 // 5) != 0)):
        free(plan)
        w.building = False
        return -1
    w.quad_count = 0
    w.rest = w.sensors = NULL_REF
    if rest >= 0:
        count_quads(t, rest, plan, fewest)
    if sensors >= 0:
        count_quads(t, sensors, plan, fewest)
    if rest != NULL_REF:
        status = collapse(t, w, plan, rest, &w.rest, &leaves)
    if status == 0 and sensors != NULL_REF:
        status = collapse(t, w, plan, sensors, &w.sensors, &leaves)
    free(plan)
    if status == 0:
        fill_boxes(t, w)
    w.fresh = status == 0
    w.building = False
    return status


# ---------------------------------------------------------------------------------------------
# Walking it: one explicit stack of quads; a quad's four children are tested at once, and the leaves
# among those that pass are hits (or, for a first-hit segment, hits unless a nearer one was found).

ctypedef struct BoxKind:
    char unused
ctypedef struct RayKind:
    char unused

ctypedef fused Kind:
    BoxKind
    RayKind


cdef bint wide_serves(const TreeCore *t, const Query *q) noexcept nogil:
    """Whether the view answers this query: it is fresh, the query a box or a segment, and it skips
    no leaves but (perhaps) the sensors, whose subtree has a quad of its own."""
    return (t.wide.fresh and (q.kind == QUERY_BOX or q.kind == QUERY_RAY)
            and (q.skip_flags & ~(<uint32_t>PROXY_SENSOR)) == 0)


cdef inline int add_hit(Hits *hits, int32_t leaf, double fraction, bint with_fraction) noexcept nogil:
    """hits_push() of _core, inlined for the common case of room left; a box's hits need no fraction."""
    if hits.count == hits.capacity:
        return hits_push(hits, leaf, fraction)
    hits.proxies[hits.count] = leaf
    if with_fraction:
        hits.fractions[hits.count] = fraction
    hits.count += 1
    return 0


cdef int walk_kind(const Kind *kind, const TreeCore *t, Query *q, Stack *stack, Hits *hits) noexcept nogil:
    cdef const Wide *w = &t.wide
    cdef const Quad *quad
    cdef int32_t child
    cdef int bits, i
    cdef double entry[4]
    stack.count = 0
    if w.rest != NULL_REF and stack_push(stack, w.rest, 0) != 0:
        return -1
    if w.sensors != NULL_REF and not (q.skip_flags & PROXY_SENSOR) and stack_push(stack, w.sensors, 0) != 0:
        return -1
    while stack.count:
        stack.count -= 1
        quad = &w.quads[stack.entries[stack.count].ref]
        if Kind is BoxKind:
            bits = quad_boxes(&quad.lo[0][0], &quad.hi[0][0], q.box)
        else:
            bits = quad_segment(&quad.lo[0][0], &quad.hi[0][0], q.origin, q.delta, q.inv_delta, entry)
        bits &= (1 << quad.count) - 1
        while bits:
            i = lowest_bit(bits)
            bits &= bits - 1
            if Kind is RayKind:
                if q.first_hit and entry[i] > q.best_fraction:
                    continue
            child = quad.child[i]
            if child >= 0:
                prefetch(&w.quads[child])
                prefetch(&w.quads[child].hi[1][0])     # the quad's second cache line
                if stack_push(stack, child, 0) != 0:
                    return -1
                continue
            if q.groups != NULL and (q.groups[w.proxies[~child]] & q.mask) == 0:
                continue
            if Kind is BoxKind:
                if add_hit(hits, ~child, 0.0, False) != 0:
                    return -1
            else:
                if add_hit(hits, ~child, entry[i], True) != 0:
                    return -1
                if q.first_hit and entry[i] < q.best_fraction:
                    q.best_fraction = entry[i]
    return 0


cdef int wide_walk(const TreeCore *t, Query *q, Stack *stack, Hits *hits) noexcept nogil:
    """Append to `hits` the leaves (indices into t.wide.ids) of every proxy whose tight box the query
    touches and whose group passes the mask: the hits walk() finds, in another order."""
    if q.kind == QUERY_BOX:
        return walk_kind(<BoxKind *>NULL, t, q, stack, hits)
    return walk_kind(<RayKind *>NULL, t, q, stack, hits)
