# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The queries that do not fit the walker of _core: the k nearest proxies, box and ball casts, and the
overlap of two trees.

_core's walker keeps every hit its predicates accept, in any order; these need another shape of walk:
nearest keeps the k best leaves so far and skips every subtree that cannot beat them; a cast sweeps a
shape along a displacement and records when it first touches each box, and with first_hit skips what
it would touch later; an overlap descends two trees at once.

Exactness, as in _core: every decision on a leaf is made on its tight box in float64, with the same
recipe as dbvt.reference, so the two agree bit for bit; float32 inputs convert to float64 exactly, and
the few roundings left (a difference, a quotient, a square root) happen in the same order in both.
Node tests use the same formulas on boxes that contain the tight boxes, and rounding is monotone, so a
node test never rejects a subtree that holds a hit.
"""
from libc.math cimport INFINITY, sqrt
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free

from dbvt._batch cimport append_by_fraction, batch_reserve, sort_pairs
from dbvt._core cimport (
    HIT_LIMIT, NULL_REF, Batch, IdPair, PairBuffer, Stack, StackEntry, TreeCore, above, below, grow_array,
    hits_push, meet, prefetch, ref_box,
)


cdef inline int push_ref(Stack *stack, int32_t ref) noexcept nogil:
    if stack.count == stack.capacity and grow_array(<void **>&stack.entries, &stack.capacity, stack.count + 1,
                                              sizeof(StackEntry)) != 0:
        return -1
    stack.entries[stack.count].ref = ref
    stack.count += 1
    return 0


# ---------------------------------------------------------------------------------------------
# The k nearest: depth first, nearer child first, keeping the k best leaves so far in a max-heap; a
# subtree whose box is farther than the k-th best (or than max_distance) is skipped. Ties: at equal
# distance the smaller id wins, so a box exactly as far as the k-th best is still opened.
# Measured on W1 at 100k, k = 8: a best-first walk (one heap of nodes and leaves, the leaves coming off
# in order) opened fewer nodes but took 6.0 us a point against 3.7 for this one; eight walks taking
# turns, each prefetching the children of the node it opens next, took 4.5 against 4.0. The walk waits
# on its branches more than on memory: with the distance test free of them it takes 2.5.

ctypedef struct Pending:            # a subtree still to visit: 16 bytes
    double gap                      # squared distance from the point to its box
    int32_t ref

ctypedef struct Found:              # one of the best leaves so far: 16 bytes
    double gap                      # squared distance from the point to its tight box
    uint64_t id

ctypedef struct Nearest:            # one point's walk; the arrays are reused from point to point
    Pending *stack
    int64_t stack_count
    int64_t stack_capacity
    Found *best                     # a max-heap by (gap, id): the worst of the best on top
    int64_t best_count
    int64_t best_capacity
    int64_t k
    double bound                    # the squared distance past which nothing can enter the best


cdef inline bint after(const Found *x, const Found *y) noexcept nogil:
    return x.gap > y.gap or (x.gap == y.gap and x.id > y.id)


cdef void sift_down(Found *heap, int64_t count, Found item) noexcept nogil:
    """Put `item` at the top of the max-heap and let it sink to its place."""
    cdef int64_t i = 0, child
    while True:
        child = 2 * i + 1
        if child >= count:
            break
        if child + 1 < count and after(&heap[child + 1], &heap[child]):
            child += 1
        if not after(&heap[child], &item):
            break
        heap[i] = heap[child]
        i = child
    heap[i] = item


cdef inline int keep(Nearest *w, double gap, uint64_t id) noexcept nogil:
    """Offer a leaf within the bound to the best k."""
    cdef Found item
    cdef int64_t i, parent
    item.gap = gap
    item.id = id
    if w.best_count < w.k:
        if w.best_count == w.best_capacity and grow_array(<void **>&w.best, &w.best_capacity, w.best_count + 1,
                                                    sizeof(Found)) != 0:
            return -1
        i = w.best_count
        w.best_count += 1
        while i > 0:
            parent = (i - 1) >> 1
            if not after(&item, &w.best[parent]):
                break
            w.best[i] = w.best[parent]
            i = parent
        w.best[i] = item
    elif after(&w.best[0], &item):
        sift_down(w.best, w.best_count, item)
    else:
        return 0
    if w.best_count == w.k:
        w.bound = w.best[0].gap
    return 0


cdef inline double point_gap(const double *p, const float *box, int32_t dims) noexcept nogil:
    """Squared distance from the point to the box's closest point, axes summed in order. Per axis at
    most one of the two terms is not 0, so the sum is the gap itself, as dbvt.reference computes it."""
    cdef double gap = 0.0, d
    cdef int i
    for i in range(dims):
        d = above(box[i] - p[i], 0.0) + above(p[i] - box[i + 3], 0.0)
        gap += d * d
    return gap


cdef inline int visit(const TreeCore *t, Nearest *w, int32_t ref, const double *p, uint32_t mask,
                      const uint32_t *groups, uint32_t skip, Pending *out) noexcept nogil:
    """A leaf goes to the best k at once; a node within the bound is returned in `out` (ref NULL_REF
    when there is none)."""
    cdef int32_t proxy
    out.ref = NULL_REF
    if ref >= 0:
        out.gap = point_gap(p, t.nodes[ref].box, t.dims)
        if out.gap <= w.bound:
            out.ref = ref
        return 0
    proxy = ~ref
    if (t.proxies[proxy].flags & skip) or (groups != NULL and (groups[proxy] & mask) == 0):
        return 0
    out.gap = point_gap(p, t.proxies[proxy].tight, t.dims)
    return keep(w, out.gap, t.proxies[proxy].id) if out.gap <= w.bound else 0


cdef inline int push_pending(Nearest *w, const Pending *item) noexcept nogil:
    if item.ref == NULL_REF:
        return 0
    if w.stack_count == w.stack_capacity and grow_array(<void **>&w.stack, &w.stack_capacity, w.stack_count + 1,
                                                  sizeof(Pending)) != 0:
        return -1
    w.stack[w.stack_count] = item[0]
    w.stack_count += 1
    return 0


cdef int nearest_one(const TreeCore *t, Nearest *w, const double *p, double reach, uint32_t mask,
                     const uint32_t *groups, uint32_t skip, Batch *b) noexcept nogil:
    """Append the (up to) k nearest proxies within `reach` (squared) of p, with their distances."""
    cdef Pending top, near, far
    cdef int64_t n, i
    cdef Found last
    w.stack_count = 0
    w.best_count = 0
    w.bound = reach
    if t.root == NULL_REF or w.k == 0:
        return 0
    if visit(t, w, t.root, p, mask, groups, skip, &top) != 0 or push_pending(w, &top) != 0:
        return -1
    while w.stack_count:
        w.stack_count -= 1
        top = w.stack[w.stack_count]
        if top.gap > w.bound:
            continue
        if (visit(t, w, t.nodes[top.ref].child[0], p, mask, groups, skip, &near) != 0
                or visit(t, w, t.nodes[top.ref].child[1], p, mask, groups, skip, &far) != 0):
            return -1
        if far.ref != NULL_REF and (near.ref == NULL_REF or far.gap < near.gap):
            near, far = far, near
        if push_pending(w, &far) != 0 or push_pending(w, &near) != 0:
            return -1
    # Take the heap apart, worst first, filling the output from its end.
    n = w.best_count
    if batch_reserve(b, n) != 0:
        return -1
    for i in range(n - 1, -1, -1):
        b.ids[b.count + i] = w.best[0].id
        b.fractions[b.count + i] = sqrt(w.best[0].gap)
        last = w.best[i]
        sift_down(w.best, i, last)
    b.count += n
    return 0


cdef int run_nearest(const TreeCore *t, const float *points, int64_t n, int64_t k, double max_distance,
                     uint32_t mask, const uint32_t *groups, uint32_t skip, int64_t *offsets, Batch *b) noexcept nogil:
    """For each point, its k nearest proxies no farther than max_distance, by distance then id; the
    distances go to b.fractions. Distances are compared squared, in float64 (as dbvt.reference)."""
    cdef Nearest w
    cdef double p[3]
    cdef double reach = max_distance * max_distance
    cdef int64_t i
    cdef int j, status = 0
    w.stack = NULL
    w.best = NULL
    w.stack_capacity = w.best_capacity = 0
    w.k = k
    for i in range(n):
        offsets[i] = b.count
        for j in range(t.dims):
            p[j] = points[t.dims * i + j]
        if nearest_one(t, &w, p, reach, mask, groups, skip, b) != 0:
            status = -1
            break
        if 0 <= b.max_hits < b.count:
            status = HIT_LIMIT
            break
    offsets[n] = b.count
    free(w.stack)
    free(w.best)
    return status


# ---------------------------------------------------------------------------------------------
# Casts. A box moved by t * delta, t in [0, 1], touches a box T exactly when the segment from 0 to
# delta meets T grown by the moving box (the Minkowski sum): the slab test, on the bounds
# T.min - box.max and T.max - box.min. A ball of radius r touches T when its centre is within r of T,
# that is inside T's rounded box (T Minkowski-summed with the ball); that box grown by r on every side
# holds the rounded box, so the same slab test (moving "box" = the centre, grown by r) bounds when the
# ball can touch T, and ball_touch() finds the first t inside that bound.

ctypedef struct Sweep:              # one cast
    double lower[3]                 # the moving shape at t = 0: a box's min corner, a ball's centre...
    double upper[3]                 # ...a box's max corner, a ball's centre again
    double radius                   # a ball's radius, 0 for a box (subtracting 0 changes no bound)
    double radius_sq
    double delta[3]                 # the displacement
    double best                     # first_hit: the earliest touch so far; anything later is skipped
    int32_t dims
    bint ball
    bint first_hit
    uint32_t mask                   # proxies whose group has no bit of mask are skipped...
    const uint32_t *groups          # ...when groups (indexed by proxy) is not NULL
    uint32_t skip_flags             # leaves with any of these Proxy.flags are skipped (sensors)


cdef inline bint sweep_slab(const Sweep *s, const float *box, double *enter, double *leave) noexcept nogil:
    """[enter, leave] within [0, 1]: when the shape's box (a ball's: its centre grown by r) overlaps
    `box`, closed; False when never. The bounds are quotients of float64 differences: division, not
    a product with 1 / delta, so that a touch at exactly t = 1 is not lost to a rounded reciprocal."""
    cdef double tmin = -INFINITY
    cdef double tmax = INFINITY
    cdef double lo, hi, d, t1, t2
    cdef int i
    for i in range(s.dims):
        lo = (box[i] - s.upper[i]) - s.radius
        hi = (box[i + 3] - s.lower[i]) + s.radius
        d = s.delta[i]
        if d == 0.0:
            if lo > 0.0 or hi < 0.0:
                return False
        else:
            t1 = lo / d
            t2 = hi / d
            tmin = above(below(t1, t2), tmin)
            tmax = below(above(t1, t2), tmax)
    if tmin > tmax or tmax < 0.0 or tmin > 1.0:
        return False
    enter[0] = tmin if tmin > 0.0 else 0.0
    leave[0] = tmax if tmax < 1.0 else 1.0
    return True


cdef inline double ball_gap(const Sweep *s, const float *box, double t) noexcept nogil:
    """Squared distance from the ball's centre at time t to the box, axes summed in order."""
    cdef double gap = 0.0, p, d
    cdef int i
    for i in range(s.dims):
        p = s.lower[i] + t * s.delta[i]
        d = above(box[i] - p, 0.0) + above(p - box[i + 3], 0.0)
        gap += d * d
    return gap


cdef inline bint piece_touch(const Sweep *s, const float *box, double a, double b, double *t) noexcept nogil:
    """The first t in [a, b] where the ball touches the box, on a piece of the path along which each
    axis stays below, inside or above the box (its state at the midpoint): there the squared distance
    is one quadratic A t^2 + B t + C (minus r^2), and the answer is its smaller root."""
    cdef double m = 0.5 * (a + b)
    cdef double qa = 0.0, qb = 0.0, qc = 0.0
    cdef double p, alpha, beta, disc, root, small, large
    cdef int i
    for i in range(s.dims):
        p = s.lower[i] + m * s.delta[i]
        if p < box[i]:
            alpha = box[i] - s.lower[i]
            beta = -s.delta[i]
        elif p > box[i + 3]:
            alpha = s.lower[i] - box[i + 3]
            beta = s.delta[i]
        else:
            continue
        qa += beta * beta
        qb += alpha * beta
        qc += alpha * alpha
    qb = 2.0 * qb
    qc = qc - s.radius_sq
    if qa == 0.0:                   # the distance is constant along the piece
        t[0] = a
        return qc <= 0.0
    disc = qb * qb - 4.0 * qa * qc
    if disc < 0.0:
        return False
    root = sqrt(disc)
    # The two roots without cancellation: whichever of -B -+ sqrt(D) adds magnitudes goes on top.
    if qb <= 0.0:
        large = (root - qb) / (2.0 * qa)
        small = (2.0 * qc) / (root - qb) if root - qb > 0.0 else 0.0
    else:
        small = (-qb - root) / (2.0 * qa)
        large = (2.0 * qc) / (-qb - root)
    if small > b or large < a:
        return False
    t[0] = small if small > a else a
    return True


cdef bint ball_touch(const Sweep *s, const float *box, double enter, double leave, double *t) noexcept nogil:
    """The first t in [enter, leave] (the slab bound) at which the ball touches the box.

    Along the path the squared distance to the box is convex and piecewise quadratic, with a new piece
    wherever the centre crosses one of the box's planes: at most two per axis. So the first touch is at
    `enter` when the ball touches there, else in the first piece whose quadratic reaches r^2: the face,
    the edge's cylinder or the corner's sphere, whichever the path meets first, in one recipe."""
    cdef double cuts[6]
    cdef double x, bound, prev
    cdef int count = 0, i, j, side
    if ball_gap(s, box, enter) <= s.radius_sq:
        t[0] = enter
        return True
    for i in range(s.dims):
        if s.delta[i] == 0.0:
            continue
        for side in range(2):
            bound = box[i + 3 * side]
            x = (bound - s.lower[i]) / s.delta[i]
            if enter < x < leave:
                j = count               # insertion sort: at most six
                while j > 0 and cuts[j - 1] > x:
                    cuts[j] = cuts[j - 1]
                    j -= 1
                cuts[j] = x
                count += 1
    prev = enter
    for i in range(count + 1):
        x = cuts[i] if i < count else leave
        if prev < x and piece_touch(s, box, prev, x, t):
            return True
        prev = x
    return False


cdef int sweep(const TreeCore *t, Sweep *s, Stack *stack, Batch *b) noexcept nogil:
    """Append to b.hits every proxy the moving shape touches, with the first t it does."""
    cdef int32_t ref, proxy
    cdef const float *tight
    cdef double enter, leave
    stack.count = 0
    b.hits.count = 0
    if t.root == NULL_REF:
        return 0
    if push_ref(stack, t.root) != 0:
        return -1
    while stack.count:
        stack.count -= 1
        ref = stack.entries[stack.count].ref
        if ref >= 0:
            if not sweep_slab(s, t.nodes[ref].box, &enter, &leave) or (s.first_hit and enter > s.best):
                continue
            if push_ref(stack, t.nodes[ref].child[1]) != 0 or push_ref(stack, t.nodes[ref].child[0]) != 0:
                return -1
            continue
        proxy = ~ref
        if (t.proxies[proxy].flags & s.skip_flags) or (s.groups != NULL and (s.groups[proxy] & s.mask) == 0):
            continue
        tight = t.proxies[proxy].tight
        if not sweep_slab(s, tight, &enter, &leave) or (s.first_hit and enter > s.best):
            continue
        if s.ball and (not ball_touch(s, tight, enter, leave, &enter) or (s.first_hit and enter > s.best)):
            continue
        if hits_push(&b.hits, proxy, enter) != 0:
            return -1
        if enter < s.best:
            s.best = enter
    return 0


cdef int run_sweeps(const TreeCore *t, Sweep *s, const float *shapes, const float *radii,
                    const float *displacements, int64_t n, int64_t *offsets, Batch *b) noexcept nogil:
    """One sweep per row: `shapes` holds boxes (radii NULL) or centres, hits ordered by t then id."""
    cdef int64_t i
    cdef int j, dims = t.dims
    cdef int width = dims if s.ball else 2 * dims
    cdef const float *row
    for i in range(n):
        offsets[i] = b.count
        row = shapes + width * i
        for j in range(dims):
            s.lower[j] = row[j]
            s.upper[j] = row[j] if s.ball else row[dims + j]
            s.delta[j] = displacements[dims * i + j]
        if s.ball:
            s.radius = radii[i]
            s.radius_sq = s.radius * s.radius
        s.best = INFINITY
        if sweep(t, s, &b.stack, b) != 0 or append_by_fraction(t, b, s.first_hit, False) != 0:
            return -1
        if 0 <= b.max_hits < b.count:
            return HIT_LIMIT
    offsets[n] = b.count
    return 0


cdef inline void start_sweep(Sweep *s, const TreeCore *t, bint ball, bint first_hit, uint32_t mask,
                             const uint32_t *groups, uint32_t skip) noexcept nogil:
    s.dims = t.dims
    s.ball = ball
    s.first_hit = first_hit
    s.radius = 0.0
    s.radius_sq = 0.0
    s.mask = mask
    s.groups = groups
    s.skip_flags = skip


cdef int run_box_casts(const TreeCore *t, const float *boxes, const float *displacements, int64_t n,
                       bint first_hit, uint32_t mask, const uint32_t *groups, uint32_t skip, int64_t *offsets,
                       Batch *b) noexcept nogil:
    cdef Sweep s
    start_sweep(&s, t, False, first_hit, mask, groups, skip)
    return run_sweeps(t, &s, boxes, NULL, displacements, n, offsets, b)


cdef int run_ball_casts(const TreeCore *t, const float *centers, const float *radii, const float *displacements,
                        int64_t n, bint first_hit, uint32_t mask, const uint32_t *groups, uint32_t skip,
                        int64_t *offsets, Batch *b) noexcept nogil:
    cdef Sweep s
    start_sweep(&s, t, True, first_hit, mask, groups, skip)
    return run_sweeps(t, &s, centers, radii, displacements, n, offsets, b)


# ---------------------------------------------------------------------------------------------
# Two trees at once (Bullet's collideTT): one explicit stack of pairs of references whose boxes
# overlap. A pair opens both sides (a leaf stays itself), which sends fewer pairs through the stack
# than opening only the larger side: 0.77 M pops instead of 1.38 M for two W1 trees of 100k.

ctypedef struct RefPair:            # 8 bytes
    int32_t a
    int32_t b

ctypedef struct PairStack:
    RefPair *items
    int64_t count
    int64_t capacity


cdef inline int push_ids(PairBuffer *out, uint64_t a, uint64_t b) noexcept nogil:
    """Append [a, b] as given: the first id is from the first tree (pairs_push orders them)."""
    if out.count == out.capacity and grow_array(<void **>&out.pairs, &out.capacity, out.count + 1, sizeof(IdPair)) != 0:
        return -1
    out.pairs[out.count].a = a
    out.pairs[out.count].b = b
    out.count += 1
    return 0


cdef int trees_overlap(const TreeCore *a, const TreeCore *b, uint32_t mask_a, const uint32_t *groups_a,
                       uint32_t mask_b, const uint32_t *groups_b, uint32_t skip, int64_t max_pairs,
                       PairBuffer *out) noexcept nogil:
    """Every [id in a, id in b] whose tight boxes overlap (and whose groups pass the masks), sorted."""
    cdef PairStack stack
    cdef RefPair top
    cdef int32_t pa, pb
    cdef int32_t side_b[2]
    cdef const float *box_a[2]
    cdef const float *box_b[2]
    cdef int i, j, status = 0
    stack.items = NULL
    stack.count = stack.capacity = 0
    if a.root == NULL_REF or b.root == NULL_REF or not meet(ref_box(a, a.root), ref_box(b, b.root)):
        return 0
    if grow_array(<void **>&stack.items, &stack.capacity, 64, sizeof(RefPair)) != 0:
        return -1
    stack.items[0].a = a.root
    stack.items[0].b = b.root
    stack.count = 1
    while stack.count:
        stack.count -= 1
        top = stack.items[stack.count]
        if top.a < 0 and top.b < 0:
            pa = ~top.a
            pb = ~top.b
            if ((groups_a == NULL or (groups_a[pa] & mask_a) != 0) and (groups_b == NULL or (groups_b[pb] & mask_b) != 0)
                    and not (a.proxies[pa].flags & skip) and not (b.proxies[pb].flags & skip)
                    and meet(a.proxies[pa].tight, b.proxies[pb].tight)):
                if push_ids(out, a.proxies[pa].id, b.proxies[pb].id) != 0:
                    status = -1
                    break
                if 0 <= max_pairs < out.count:
                    status = HIT_LIMIT
                    break
            continue
        if stack.count + 4 > stack.capacity and grow_array(<void **>&stack.items, &stack.capacity, stack.count + 4,
                                                     sizeof(RefPair)) != 0:
            status = -1
            break
        # Every candidate pair is written, and the count passes only those whose boxes meet: no branch.
        # The first children go last, so that they come off the stack first and the walk reads a
        # built tree's pools forwards. (One loop over either side's one or two references, instead of
        # these three cases, made the overlap 15% slower.)
        if top.a >= 0 and top.b >= 0:
            for j in range(2):
                side_b[j] = b.nodes[top.b].child[1 - j]
                box_b[j] = ref_box(b, side_b[j])
            for i in range(2):
                pa = a.nodes[top.a].child[1 - i]
                box_a[0] = ref_box(a, pa)
                for j in range(2):
                    stack.items[stack.count].a = pa
                    stack.items[stack.count].b = side_b[j]
                    stack.count += meet(box_a[0], box_b[j])
        elif top.a >= 0:
            box_b[0] = ref_box(b, top.b)
            for i in range(2):
                pa = a.nodes[top.a].child[1 - i]
                stack.items[stack.count].a = pa
                stack.items[stack.count].b = top.b
                stack.count += meet(ref_box(a, pa), box_b[0])
        else:
            box_a[0] = ref_box(a, top.a)
            for j in range(2):
                pb = b.nodes[top.b].child[1 - j]
                stack.items[stack.count].a = top.a
                stack.items[stack.count].b = pb
                stack.count += meet(box_a[0], ref_box(b, pb))
    free(stack.items)
    if status == 0:
        sort_pairs(out.pairs, out.count)
    return status
