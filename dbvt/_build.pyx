# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The bulk build: core_bulk_insert fills an empty tree, core_rebuild builds a tree afresh. Apart
from the core (dbvt._core) because it is its own algorithm, and the core's other paths never call it.
"""
from libc.math cimport INFINITY
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, llabs, malloc
from libc.string cimport memcpy, memmove, memset

from dbvt._core cimport (
    NULL_REF, PREFETCH_AHEAD, PROXY_LIVE, PROXY_SENSOR, Proxy, TreeCore, box_cost, fatten, grow_nodes, insert_leaf,
    fill_slots, load_box, prefetch, ref_height, set_parent, spread_by_two, union_box, wide_stale,
)
from dbvt._parallel cimport counter_set, counter_take, dbvt_counter, run_parts

cdef enum:
    BIN_COUNT = 16              # binned SAH: enough bins to find good splits, few enough to stay in L1
    SMALL_SPLIT = 16            # ranges this small get an exact SAH sweep instead of bins
    CLUSTER_SIZE = SMALL_SPLIT  # the bulk build's Morton clusters: small enough for the exact sweep
    MORTON_BITS = 10            # per axis: the bulk build clusters leaves in 1024^3 Morton cells
    MORTON_CELLS = 1 << MORTON_BITS
    # A build with threads splits the top of the tree into this many subtrees a thread (at most
    # MAX_SUBTREES), so that a thread slowed by other work takes fewer; below PARALLEL_BUILD_FROM
    # leaves it builds alone.
    SUBTREES_PER_THREAD = 4
    MAX_SUBTREES = 64
    PARALLEL_BUILD_FROM = 4096


# ---------------------------------------------------------------------------------------------
# Rebuild: top-down binned SAH over every live proxy (also the bulk path of an insert into an
# empty tree). Nodes come out in depth-first order, so a walk reads the pool mostly forwards.
#
# The binning passes, one over every item per level, are what a plain build spends its time on. So
# a Morton sort first groups the leaves into spatially compact clusters of at most CLUSTER_SIZE, the
# binned SAH splits the clusters (one item each), and once it reaches a single cluster, the exact SAH
# sweep that ranges this small always get splits its leaves. Leaves whose centres share one Morton
# cell are not clustered (their grouping would be arbitrary): each enters the binned SAH alone.

ctypedef struct BuildItem:          # a leaf while building, packed so every pass reads memory in order
    float box[6]                    # 24 B  the leaf's fat box
    float center[3]                 # 12 B
    int32_t ref                     # 4 B   ~proxy

ctypedef struct Bounds:             # what a range of items covers
    float box[6]                    # union of their boxes
    float cmin[3]                   # bounds of their centres
    float cmax[3]

ctypedef struct Cluster:            # leaves[start:start + count], neighbours in Morton order
    int64_t start
    int64_t count

ctypedef struct BuildTask:
    int64_t start                   # the task's items are items[start:start + count]...
    int64_t count
    int32_t parent                  # node that receives the subtree, NULL_REF for the root
    int32_t slot                    # which child of parent
    bint in_cluster                 # ...of the leaves of one cluster, else of the cluster items
    Bounds bounds

ctypedef struct Bin:
    int64_t count
    Bounds bounds


cdef inline void bounds_add(Bounds *b, const BuildItem *item, bint first) noexcept nogil:
    cdef int k
    if first:
        memcpy(b.box, item.box, sizeof(b.box))
        memcpy(b.cmin, item.center, sizeof(b.cmin))
        memcpy(b.cmax, item.center, sizeof(b.cmax))
        return
    union_box(b.box, b.box, item.box)
    # Conditional moves, not branches: which centre extends the bounds is a coin toss.
    for k in range(3):
        b.cmin[k] = item.center[k] if item.center[k] < b.cmin[k] else b.cmin[k]
        b.cmax[k] = item.center[k] if item.center[k] > b.cmax[k] else b.cmax[k]


cdef inline void bounds_merge(Bounds *b, const Bounds *other) noexcept nogil:
    cdef int k
    union_box(b.box, b.box, other.box)
    for k in range(3):
        b.cmin[k] = other.cmin[k] if other.cmin[k] < b.cmin[k] else b.cmin[k]
        b.cmax[k] = other.cmax[k] if other.cmax[k] > b.cmax[k] else b.cmax[k]


cdef inline float min_of(float a, float b) noexcept nogil:
    return a if a < b else b


cdef inline float max_of(float a, float b) noexcept nogil:
    return a if a > b else b


cdef void bound_range(const BuildItem *items, int64_t start, int64_t count, Bounds *out) noexcept nogil:
    """(count >= 1) The bounds gather in locals, not through `out`: the compiler could not keep
    them in registers behind a pointer that the items' loads might alias, and stored all twelve on
    every item (this loop is a fifth of a bulk build). Ties keep what union_box and bounds_add keep."""
    cdef const BuildItem *item = &items[start]
    cdef float lo0 = item.box[0], lo1 = item.box[1], lo2 = item.box[2]
    cdef float hi0 = item.box[3], hi1 = item.box[4], hi2 = item.box[5]
    cdef float cl0 = item.center[0], cl1 = item.center[1], cl2 = item.center[2]
    cdef float ch0 = cl0, ch1 = cl1, ch2 = cl2
    cdef int64_t i
    for i in range(start + 1, start + count):
        item = &items[i]
        lo0 = min_of(lo0, item.box[0]); lo1 = min_of(lo1, item.box[1]); lo2 = min_of(lo2, item.box[2])
        hi0 = max_of(hi0, item.box[3]); hi1 = max_of(hi1, item.box[4]); hi2 = max_of(hi2, item.box[5])
        cl0 = min_of(item.center[0], cl0); cl1 = min_of(item.center[1], cl1); cl2 = min_of(item.center[2], cl2)
        ch0 = max_of(item.center[0], ch0); ch1 = max_of(item.center[1], ch1); ch2 = max_of(item.center[2], ch2)
    out.box[0], out.box[1], out.box[2], out.box[3], out.box[4], out.box[5] = lo0, lo1, lo2, hi0, hi1, hi2
    out.cmin[0], out.cmin[1], out.cmin[2] = cl0, cl1, cl2
    out.cmax[0], out.cmax[1], out.cmax[2] = ch0, ch1, ch2


ctypedef struct PartBounds:         # bound_range over n items cut into parts, each part's bounds apart
    const BuildItem *items
    int64_t n
    int parts
    Bounds *out


cdef void bounds_part(void *context, int part) noexcept nogil:
    cdef PartBounds *p = <PartBounds *>context
    cdef int64_t start = p.n * part // p.parts, end = p.n * (part + 1) // p.parts
    bound_range(p.items, start, end - start, &p.out[part])


cdef void bound_all(const BuildItem *items, int64_t n, Bounds *out, int threads) noexcept nogil:
    """bound_range over all n items (n >= 1), on threads: the parts' bounds merged in order give
    what one pass would, ties included."""
    cdef PartBounds p
    cdef int part
    p.items, p.n = items, n
    p.parts = threads if n >= PARALLEL_BUILD_FROM else 1
    p.out = <Bounds *>malloc(p.parts * sizeof(Bounds))
    if p.out == NULL:
        bound_range(items, 0, n, out)
        return
    run_parts(bounds_part, &p, p.parts)
    out[0] = p.out[0]
    for part in range(1, p.parts):
        bounds_merge(out, &p.out[part])
    free(p.out)


cdef inline int bin_of(float center, float low, double scale) noexcept nogil:
    cdef double x = (<double>center - low) * scale
    if x < 0.0:
        return 0
    if x >= BIN_COUNT:
        return BIN_COUNT - 1
    return <int>x


cdef int64_t split_small(BuildItem *items, int64_t start, int64_t count, int axis,
                         Bounds *left, Bounds *right, bint planar) noexcept nogil:
    """Exact SAH for a few items: sort them along the axis and try every position. Cheaper than
    binning, whose fixed cost dominates the many small ranges near the leaves."""
    cdef double suffix[SMALL_SPLIT]
    cdef float acc[6]
    cdef BuildItem tmp
    cdef int64_t i, j, best = count // 2
    cdef double cost, best_cost = INFINITY
    for i in range(start + 1, start + count):
        tmp = items[i]
        j = i - 1
        while j >= start and items[j].center[axis] > tmp.center[axis]:
            items[j + 1] = items[j]
            j -= 1
        items[j + 1] = tmp
    memcpy(acc, items[start + count - 1].box, sizeof(acc))
    for i in range(count - 1, 0, -1):
        union_box(acc, acc, items[start + i].box)
        suffix[i] = box_cost(acc, planar) * (count - i)
    memcpy(acc, items[start].box, sizeof(acc))
    for i in range(1, count):
        union_box(acc, acc, items[start + i - 1].box)
        cost = box_cost(acc, planar) * i + suffix[i]
        if cost < best_cost or (cost == best_cost and llabs(2 * i - count) < llabs(2 * best - count)):
            best_cost = cost
            best = i
    bound_range(items, start, best, left)
    bound_range(items, start + best, count - best, right)
    return best


cdef int64_t split_range(BuildItem *items, int64_t start, int64_t count, const Bounds *all,
                         Bounds *left, Bounds *right, bint planar) noexcept nogil:
    """Partition items[start:start+count] at the cheapest binned-SAH plane; returns how many go
    left and fills in both sides' bounds. Equal centres fall back to halving, which keeps piles
    of identical boxes balanced."""
    cdef Bin bins[BIN_COUNT]
    cdef double left_cost[BIN_COUNT]
    cdef int64_t left_count[BIN_COUNT]
    cdef Bounds acc
    cdef double extent, scale, cost, best_cost
    cdef int64_t i, n_left, n_right, pos, best_balance = 0
    cdef int axis, k, b, best_split
    cdef bint goes_left
    cdef BuildItem tmp
    axis = 0
    for k in range(1, 3):
        if all.cmax[k] - all.cmin[k] > all.cmax[axis] - all.cmin[axis]:
            axis = k
    extent = <double>all.cmax[axis] - all.cmin[axis]
    if count <= SMALL_SPLIT and extent > 0.0:
        return split_small(items, start, count, axis, left, right, planar)
    best_split = -1
    if count > 2 and extent > 0.0:
        # Stage 1: drop every centre into one of BIN_COUNT slabs along the widest axis.
        scale = BIN_COUNT / extent
        for b in range(BIN_COUNT):
            bins[b].count = 0
        for i in range(start, start + count):
            b = bin_of(items[i].center[axis], all.cmin[axis], scale)
            bounds_add(&bins[b].bounds, &items[i], bins[b].count == 0)
            bins[b].count += 1
        # Stage 2: sweep from the left, then from the right, costing each plane between bins.
        n_left = 0
        for b in range(BIN_COUNT - 1):
            if bins[b].count:
                if n_left == 0:
                    acc = bins[b].bounds
                else:
                    bounds_merge(&acc, &bins[b].bounds)
                n_left += bins[b].count
            left_cost[b] = box_cost(acc.box, planar) * n_left if n_left else 0.0
            left_count[b] = n_left
        best_cost = INFINITY
        n_right = 0
        for b in range(BIN_COUNT - 1, 0, -1):
            if bins[b].count:
                if n_right == 0:
                    acc = bins[b].bounds
                else:
                    bounds_merge(&acc, &bins[b].bounds)
                n_right += bins[b].count
            if n_right == 0 or n_right == count:
                continue
            cost = left_cost[b - 1] + box_cost(acc.box, planar) * n_right
            # Equal costs (flat or point-like boxes) go to the more even split.
            if cost < best_cost or (cost == best_cost and llabs(left_count[b - 1] - n_right) < best_balance):
                best_cost = cost
                best_split = b
                best_balance = llabs(left_count[b - 1] - n_right)
                right[0] = acc
    if best_split < 0:
        n_left = count // 2
        bound_range(items, start, n_left, left)
        bound_range(items, start + n_left, count - n_left, right)
        return n_left
    # Stage 3: the left side's bounds from its bins, then partition in place.
    n_left = 0
    for b in range(best_split):
        if bins[b].count:
            if n_left == 0:
                left[0] = bins[b].bounds
            else:
                bounds_merge(left, &bins[b].bounds)
            n_left += bins[b].count
    # Branch-free: which side an item goes is a coin toss to the branch predictor, so every item is
    # swapped with the first right-side one and the boundary advances only for left-side items.
    pos = start
    for i in range(start, start + count):
        goes_left = bin_of(items[i].center[axis], all.cmin[axis], scale) < best_split
        tmp = items[i]
        items[i] = items[pos]
        items[pos] = tmp
        pos += goes_left
    return n_left


ctypedef struct Spread:             # one loop of a build, cut into a range a thread
    TreeCore *t
    const BuildItem *items
    BuildItem *out
    const uint64_t *order
    const Cluster *clusters
    const uint64_t *ids
    const float *rows
    const int32_t *proxy_rows
    int32_t *row_proxies
    uint64_t *keys
    const Bounds *bounds
    double scale
    void (*body)(const Spread *s, int64_t start, int64_t end) noexcept nogil
    int64_t n
    int parts


cdef void spread_part(void *context, int part) noexcept nogil:
    cdef const Spread *s = <Spread *>context
    s.body(s, s.n * part // s.parts, s.n * (part + 1) // s.parts)


cdef void spread(Spread *s, void (*body)(const Spread *s, int64_t start, int64_t end) noexcept nogil,
                 int64_t n, int threads) noexcept nogil:
    """body over 0..n-1, in equal ranges on `threads` threads (one below PARALLEL_BUILD_FROM items)."""
    s.body, s.n = body, n
    s.parts = threads if n >= PARALLEL_BUILD_FROM else 1
    run_parts(spread_part, s, s.parts)


cdef void morton_keys(const Spread *s, int64_t start, int64_t end) noexcept nogil:
    """(code << 32 | index) of items start..end-1."""
    cdef double x
    cdef int64_t i
    cdef uint32_t q[3]
    cdef int k
    for i in range(start, end):
        for k in range(3):
            x = (<double>s.items[i].center[k] - s.bounds.cmin[k]) * s.scale
            q[k] = <uint32_t>x if x < MORTON_CELLS - 1 else MORTON_CELLS - 1
        s.keys[i] = (spread_by_two(q[0]) << 2 | spread_by_two(q[1]) << 1 | spread_by_two(q[2])) << 32 | <uint64_t>i


ctypedef struct Radix:              # one pass of radix_sort, each thread on a range of the keys
    const uint64_t *source
    uint64_t *target
    int64_t *counts                 # parts x 2^bits: a range's digit counts, then where it writes each
    int64_t n
    int parts
    int shift
    int bits
    bint scatter


cdef void radix_part(void *context, int part) noexcept nogil:
    """A range's digits counted or, once the counts are offsets, its keys written in order: the ranges
    are taken in order for every digit, so the sort is the serial one (stable)."""
    cdef Radix *r = <Radix *>context
    cdef int64_t digits = (<int64_t>1) << r.bits
    cdef int64_t *mine = r.counts + part * digits
    cdef int64_t i, end = r.n * (part + 1) // r.parts
    cdef int64_t d
    if not r.scatter:
        memset(mine, 0, digits * sizeof(int64_t))
        for i in range(r.n * part // r.parts, end):
            mine[(r.source[i] >> r.shift) & (digits - 1)] += 1
        return
    for i in range(r.n * part // r.parts, end):
        d = (r.source[i] >> r.shift) & (digits - 1)
        r.target[mine[d]] = r.source[i]
        mine[d] += 1


cdef uint64_t *radix_sort(uint64_t *keys, uint64_t *scratch, int64_t n, int shift, int passes, int bits,
                          int parts) noexcept nogil:
    """keys[:n] sorted, stably, by `passes` digits of `bits` bits (at most MAX_DIGIT_BITS) from bit
    `shift` up, least significant first; each pass counts and writes a range of keys a part, on its
    own thread. Returns whichever of the two buffers holds the result. Without memory for the parts'
    counts, one thread sorts."""
    cdef int64_t counts[1 << MAX_DIGIT_BITS]
    cdef int64_t digits = (<int64_t>1) << bits, total, c, d
    cdef int pass_, k
    cdef uint64_t *swap
    cdef Radix radix
    radix.parts = parts
    radix.counts = <int64_t *>malloc(parts * digits * sizeof(int64_t)) if parts > 1 else counts
    if radix.counts == NULL:
        radix.parts, radix.counts = 1, counts
    radix.n = n
    radix.bits = bits
    for pass_ in range(passes):
        radix.shift = shift + pass_ * bits
        radix.source, radix.target = keys, scratch
        radix.scatter = False
        run_parts(radix_part, &radix, radix.parts)
        total = 0
        for d in range(digits):
            for k in range(radix.parts):
                c = radix.counts[k * digits + d]
                radix.counts[k * digits + d] = total
                total += c
        radix.scatter = True
        run_parts(radix_part, &radix, radix.parts)
        swap = keys
        keys = scratch
        scratch = swap
    if radix.counts != counts:
        free(radix.counts)
    return keys


cdef uint64_t *morton_sort(const BuildItem *items, int64_t n, const Bounds *all, uint64_t *keys,
                           uint64_t *scratch, int threads) noexcept nogil:
    """Item indices sorted by the Morton code of their centres: (code << 32 | index) keys, in
    whichever of the two buffers the radix passes ended in. The cells are cubes (one scale for every
    axis), so a long, flat world is cut along its long side first."""
    cdef double extent = 0.0
    cdef int k
    cdef Spread loop
    for k in range(3):
        extent = max(extent, <double>all.cmax[k] - all.cmin[k])
    # Stage 1: the keys, on the threads.
    loop.items, loop.keys, loop.bounds = items, keys, all
    loop.scale = MORTON_CELLS / extent if extent > 0.0 else 0.0
    spread(&loop, morton_keys, n, threads)
    # Stage 2: least significant digit first, one Morton cell's worth of bits per pass.
    return radix_sort(keys, scratch, n, 32, 3, MORTON_BITS, loop.parts)


cdef int64_t code_split(const uint64_t *keys, int64_t s, int64_t e) noexcept nogil:
    """Where [s, e) splits at the highest code bit that differs (a linear BVH's split): the first
    key with that bit set; -1 when the range is a cluster already (small, or all one code)."""
    cdef uint64_t first = keys[s] >> 32, last = keys[e - 1] >> 32, bit
    cdef int64_t lo = s + 1, hi = e - 1, mid
    if e - s <= CLUSTER_SIZE or first == last:
        return -1
    bit = first ^ last
    while bit & (bit - 1):
        bit &= bit - 1
    while lo < hi:                  # the first key with `bit` set lies in (s, e - 1]
        mid = (lo + hi) >> 1
        if (keys[mid] >> 32) & bit:
            hi = mid
        else:
            lo = mid + 1
    return lo


cdef int64_t clusters_of(const uint64_t *keys, int64_t start, int64_t end, Cluster *clusters) noexcept nogil:
    """Cut the Morton-sorted leaves [start, end) into clusters of at most CLUSTER_SIZE, splitting top
    down by code_split(); returns how many. A larger run of one code becomes single-leaf clusters:
    grouping inside one cell would be arbitrary."""
    cdef int64_t starts[64]         # each split lengthens the shared code prefix, so depth <= 30
    cdef int64_t ends[64]
    cdef int64_t depth = 1, count = 0, s, e, lo, i
    starts[0] = start
    ends[0] = end
    while depth:
        depth -= 1
        s = starts[depth]
        e = ends[depth]
        lo = code_split(keys, s, e)
        if lo < 0 and e - s <= CLUSTER_SIZE:
            clusters[count].start = s
            clusters[count].count = e - s
            count += 1
            continue
        if lo < 0:
            for i in range(s, e):
                clusters[count].start = i
                clusters[count].count = 1
                count += 1
            continue
        starts[depth] = lo
        ends[depth] = e
        starts[depth + 1] = s
        ends[depth + 1] = lo
        depth += 2
    return count


ctypedef struct ClusterRuns:        # the leaves cut at the top splits into runs the threads take in turn
    const uint64_t *keys
    Cluster *clusters
    int64_t starts[MAX_SUBTREES + 1]
    int64_t counts[MAX_SUBTREES]    # each run's clusters, written from clusters[its start] on
    int runs
    dbvt_counter next


cdef void clusters_part(void *context, int part) noexcept nogil:
    cdef ClusterRuns *c = <ClusterRuns *>context
    cdef int run = counter_take(&c.next)
    while run < c.runs:
        c.counts[run] = clusters_of(c.keys, c.starts[run], c.starts[run + 1], c.clusters + c.starts[run])
        run = counter_take(&c.next)


cdef int64_t form_clusters(const uint64_t *keys, int64_t n, Cluster *clusters, int threads) noexcept nogil:
    """clusters_of() all n leaves, on threads: the top splits cut them into runs whose clusters,
    put one after another in order, are the clusters of one walk. A run has no more clusters than
    leaves, so each writes from its own start, and the runs close up after."""
    cdef ClusterRuns c
    cdef int64_t total = 0, split, widest
    cdef int run, wanted = min(SUBTREES_PER_THREAD * threads, MAX_SUBTREES), i
    if threads <= 1 or n < PARALLEL_BUILD_FROM:
        return clusters_of(keys, 0, n, clusters)
    c.keys, c.clusters, c.runs = keys, clusters, 1
    c.starts[0], c.starts[1] = 0, n
    # Stage 1: split the widest run that splits, until there are enough.
    while c.runs < wanted:
        widest, split = -1, -1
        for run in range(c.runs):
            if widest < 0 or c.starts[run + 1] - c.starts[run] > c.starts[widest + 1] - c.starts[widest]:
                if code_split(keys, c.starts[run], c.starts[run + 1]) >= 0:
                    widest = run
        if widest < 0:
            break
        split = code_split(keys, c.starts[widest], c.starts[widest + 1])
        for i in range(c.runs, widest, -1):
            c.starts[i + 1] = c.starts[i]
        c.starts[widest + 1] = split
        c.runs += 1
    # Stage 2: the runs on the threads; then their clusters closed up, in order.
    counter_set(&c.next, 0)
    run_parts(clusters_part, &c, min(threads, c.runs))
    for run in range(c.runs):
        if total != c.starts[run]:
            memmove(clusters + total, clusters + c.starts[run], c.counts[run] * sizeof(Cluster))
        total += c.counts[run]
    return total


cdef void free_nodes_from(TreeCore *t, int32_t first) noexcept nogil:
    """Put nodes first.. of the pool on the free list, lowest first: the rest are in use."""
    cdef int32_t i = t.node_capacity - 1
    t.node_count = first
    t.free_node = NULL_REF
    while i >= first:
        t.heights[i] = -1
        t.parents[i] = t.free_node
        t.free_node = i
        i -= 1


ctypedef struct Subtree:            # a task of the build, with the numbers its nodes and leaves take
    BuildTask task
    int32_t first_node              # its root's node number, when an internal node
    int64_t first_leaf              # its leaves' place in the depth-first order (new proxies' numbers)
    int64_t leaves

ctypedef struct Build:              # what the threads of one build share; each subtree is one thread's
    TreeCore *t
    BuildItem *tops
    const BuildItem *leaves
    const Cluster *clusters
    BuildTask *stacks               # subtree i's stack starts at i + its first_leaf: room for its leaves
    Subtree subtrees[MAX_SUBTREES]
    int count
    int32_t split_nodes[MAX_SUBTREES]   # the nodes the splits into subtrees made, in the order made
    int split_count
    bint new_leaves
    int32_t *proxy_refs
    dbvt_counter next


cdef void build_subtree(const Build *b, const Subtree *s, BuildTask *tasks) noexcept nogil:
    """Build one subtree depth first, its nodes numbered from s.first_node and its new proxies from
    s.first_leaf: the numbers the whole build, done alone, would give them."""
    cdef TreeCore *t = b.t
    cdef bint planar = t.dims == 2
    cdef BuildTask task
    cdef Bounds left, right
    cdef BuildItem *items
    cdef const Cluster *cluster
    cdef Proxy *leaf
    cdef int64_t n_tasks = 1, n_left
    cdef int32_t node, next_node = s.first_node, next_proxy = <int32_t>s.first_leaf
    tasks[0] = s.task
    while n_tasks:
        n_tasks -= 1
        task = tasks[n_tasks]
        if not task.in_cluster and task.count == 1:
            # The binned SAH reached one cluster: go on inside it.
            cluster = &b.clusters[b.tops[task.start].ref]
            task.in_cluster = True
            task.start = cluster.start
            task.count = cluster.count
            if task.count > 1:
                bound_range(b.leaves, task.start, task.count, &task.bounds)
        items = <BuildItem *>b.leaves if task.in_cluster else b.tops
        if task.count == 1 and not b.new_leaves:
            node = items[task.start].ref
        elif task.count == 1:
            leaf = &t.proxies[next_proxy]
            memcpy(leaf.fat, items[task.start].box, sizeof(leaf.fat))
            leaf.flags = PROXY_LIVE
            b.proxy_refs[next_proxy] = items[task.start].ref
            node = ~next_proxy
            next_proxy += 1
        else:
            node = next_node            # the pool is empty: nodes are taken in index order
            next_node += 1
            memcpy(t.nodes[node].box, task.bounds.box, 6 * sizeof(float))
            n_left = split_range(items, task.start, task.count, &task.bounds, &left, &right, planar)
            tasks[n_tasks] = task
            tasks[n_tasks].start = task.start + n_left
            tasks[n_tasks].count = task.count - n_left
            tasks[n_tasks].parent = node
            tasks[n_tasks].slot = 1
            tasks[n_tasks].bounds = right
            tasks[n_tasks + 1] = tasks[n_tasks]
            tasks[n_tasks + 1].start = task.start
            tasks[n_tasks + 1].count = n_left
            tasks[n_tasks + 1].slot = 0
            tasks[n_tasks + 1].bounds = left
            n_tasks += 2
        set_parent(t, node, task.parent)
        if task.parent == NULL_REF:
            t.root = node
        else:
            t.nodes[task.parent].child[task.slot] = node


cdef int64_t leaves_of(const Build *b, const BuildTask *task) noexcept nogil:
    cdef int64_t i, count = 0
    if task.in_cluster:
        return task.count
    for i in range(task.start, task.start + task.count):
        count += b.clusters[b.tops[i].ref].count
    return count


cdef void split_subtrees(Build *b, int wanted) noexcept nogil:
    """Split the largest subtree, top down, until there are `wanted` (or none splits): each split makes
    the node the depth-first build would make there, and its two halves take the numbers after it."""
    cdef Subtree *s
    cdef Subtree halves[2]
    cdef Bounds left, right
    cdef BuildItem *items
    cdef int i, largest
    cdef int64_t n_left
    while b.count < wanted:
        largest = -1
        for i in range(b.count):
            s = &b.subtrees[i]
            if s.task.count > 1 and (largest < 0 or s.leaves > b.subtrees[largest].leaves):
                largest = i
        if largest < 0:
            return
        s = &b.subtrees[largest]
        b.split_nodes[b.split_count] = s.first_node
        b.split_count += 1
        items = <BuildItem *>b.leaves if s.task.in_cluster else b.tops
        memcpy(b.t.nodes[s.first_node].box, s.task.bounds.box, 6 * sizeof(float))
        set_parent(b.t, s.first_node, s.task.parent)
        if s.task.parent == NULL_REF:
            b.t.root = s.first_node
        else:
            b.t.nodes[s.task.parent].child[s.task.slot] = s.first_node
        n_left = split_range(items, s.task.start, s.task.count, &s.task.bounds, &left, &right, b.t.dims == 2)
        for i in range(2):
            halves[i].task = s.task
            halves[i].task.parent = s.first_node
            halves[i].task.slot = i
            halves[i].task.start = s.task.start if i == 0 else s.task.start + n_left
            halves[i].task.count = n_left if i == 0 else s.task.count - n_left
            halves[i].task.bounds = left if i == 0 else right
            halves[i].leaves = leaves_of(b, &halves[i].task)
        halves[0].first_node = s.first_node + 1
        halves[0].first_leaf = s.first_leaf
        halves[1].first_node = s.first_node + <int32_t>halves[0].leaves
        halves[1].first_leaf = s.first_leaf + halves[0].leaves
        memmove(&b.subtrees[largest + 2], &b.subtrees[largest + 1], (b.count - largest - 1) * sizeof(Subtree))
        b.subtrees[largest] = halves[0]
        b.subtrees[largest + 1] = halves[1]
        b.count += 1


cdef inline void node_measures(TreeCore *t, int32_t node) noexcept nogil:
    """A node's height and SAH cost, from its children's (which must have theirs)."""
    t.heights[node] = 1 + max(ref_height(t, t.nodes[node].child[0]), ref_height(t, t.nodes[node].child[1]))
    t.costs[node] = box_cost(t.nodes[node].box, t.dims == 2)


cdef void build_part(void *context, int part) noexcept nogil:
    """Subtrees, taken in turn, each built then measured: its nodes, numbered after their parents,
    are measured last first."""
    cdef Build *b = <Build *>context
    cdef int i = counter_take(&b.next)
    cdef int32_t node
    while i < b.count:
        build_subtree(b, &b.subtrees[i], b.stacks + i + b.subtrees[i].first_leaf)
        node = b.subtrees[i].first_node + <int32_t>b.subtrees[i].leaves - 2
        while node >= b.subtrees[i].first_node:
            node_measures(b.t, node)
            node -= 1
        i = counter_take(&b.next)


cdef void build_tree(TreeCore *t, BuildItem *tops, const BuildItem *leaves, const Cluster *clusters,
                     int64_t k, int64_t n, BuildTask *stacks, bint new_leaves, int32_t *proxy_refs,
                     int threads) noexcept nogil:
    """Build the whole tree top down: binned SAH over the k cluster items `tops`, then inside each
    cluster over its `leaves` (n in all). The node pool must hold one node less than there are
    leaves; `stacks` room for n + MAX_SUBTREES tasks.

    Without `new_leaves`, a leaf item's ref is an existing leaf. With it (a bulk insert into an empty
    tree), each leaf gets the next free proxy as the build reaches it, with the fat box and the live
    flag, and proxy_refs[proxy] = the item's ref: proxies are numbered in the tree's depth-first
    order, so leaves near each other in the tree are near each other in memory, and walks miss the
    cache far less.

    With threads, the top of the tree is split first into a few subtrees per thread, which the
    threads then take in turn; every node and proxy gets the number the depth-first build gives it
    alone, so the tree is the same whatever the threads."""
    cdef Build b
    cdef int64_t i
    b.t, b.tops, b.leaves, b.clusters, b.stacks = t, tops, leaves, clusters, stacks
    b.new_leaves, b.proxy_refs, b.count, b.split_count = new_leaves, proxy_refs, 1, 0
    b.subtrees[0].task.start = 0
    b.subtrees[0].task.count = k
    b.subtrees[0].task.parent = NULL_REF
    b.subtrees[0].task.slot = 0
    b.subtrees[0].task.in_cluster = False
    bound_range(tops, 0, k, &b.subtrees[0].task.bounds)
    b.subtrees[0].first_node = 0
    b.subtrees[0].first_leaf = 0
    b.subtrees[0].leaves = n
    # Stage 1: the subtrees, built on the threads (or the one on this thread).
    if threads > 1 and n >= PARALLEL_BUILD_FROM:
        split_subtrees(&b, min(SUBTREES_PER_THREAD * threads, MAX_SUBTREES))
    counter_set(&b.next, 0)
    run_parts(build_part, &b, min(threads, b.count))
    t.node_count = <int32_t>(n - 1)

    # Stage 2: the nodes of the splits measured, children before parents (they were made after
    # them), and the unused rest of the pool on the free list, lowest first.
    i = b.split_count - 1
    while i >= 0:
        node_measures(t, b.split_nodes[i])
        i -= 1
    free_nodes_from(t, t.node_count)


cdef void fattened_items(const Spread *s, int64_t start, int64_t end) noexcept nogil:
    cdef float tight[6]
    cdef int64_t i
    cdef int k
    for i in range(start, end):
        load_box(s.rows + 2 * s.t.dims * i, s.t.dims, tight)
        fatten(s.t, tight, s.out[i].box)
        for k in range(3):
            s.out[i].center[k] = 0.5 * s.out[i].box[k] + 0.5 * s.out[i].box[k + 3]
        s.out[i].ref = <int32_t>i


cdef void gathered_leaves(const Spread *s, int64_t start, int64_t end) noexcept nogil:
    cdef int64_t i
    for i in range(start, end):
        if i + PREFETCH_AHEAD < end:
            prefetch(&s.items[<uint32_t>s.order[i + PREFETCH_AHEAD]])
        s.out[i] = s.items[<uint32_t>s.order[i]]


cdef void cluster_items(const Spread *s, int64_t start, int64_t end) noexcept nogil:
    """One item per cluster for the binned SAH: its box, centred where the box is."""
    cdef Bounds bounds
    cdef int64_t i
    cdef int j
    for i in range(start, end):
        bound_range(s.items, s.clusters[i].start, s.clusters[i].count, &bounds)
        memcpy(s.out[i].box, bounds.box, sizeof(bounds.box))
        for j in range(3):
            s.out[i].center[j] = 0.5 * bounds.box[j] + 0.5 * bounds.box[j + 3]
        s.out[i].ref = <int32_t>i


cdef void filled_proxies(const Spread *s, int64_t start, int64_t end) noexcept nogil:
    """New proxies' tight boxes and ids, in proxy order, fetched ahead: their rows are random."""
    cdef int64_t i, row
    for i in range(start, end):
        if i + PREFETCH_AHEAD < end:
            prefetch(s.rows + 2 * s.t.dims * s.proxy_rows[i + PREFETCH_AHEAD])
            prefetch(&s.ids[s.proxy_rows[i + PREFETCH_AHEAD]])
        row = s.proxy_rows[i]
        load_box(s.rows + 2 * s.t.dims * row, s.t.dims, s.t.proxies[i].tight)
        s.t.proxies[i].id = s.ids[row]
        s.row_proxies[row] = <int32_t>i


cdef int build_from_items(TreeCore *t, const BuildItem *items, int64_t n, const uint64_t *ids,
                          const float *rows, int32_t *row_proxies, int threads) noexcept nogil:
    """Cluster `items` (n >= 1) and build the tree over them; see build_tree(). With `ids`, an
    item's ref is a row of `ids`/`rows`, which becomes a new proxy; row_proxies[row] gets it.
    Returns -1, with the tree untouched, when memory runs out."""
    cdef uint64_t *keys = <uint64_t *>malloc(n * sizeof(uint64_t))
    cdef uint64_t *scratch = <uint64_t *>malloc(n * sizeof(uint64_t))
    cdef uint64_t *order
    cdef int32_t *proxy_rows
    cdef BuildItem *leaves = <BuildItem *>malloc(n * sizeof(BuildItem))
    cdef BuildItem *tops = <BuildItem *>malloc(n * sizeof(BuildItem))
    cdef Cluster *clusters = <Cluster *>malloc(n * sizeof(Cluster))
    cdef BuildTask *tasks = <BuildTask *>malloc((n + MAX_SUBTREES) * sizeof(BuildTask))
    cdef Bounds all
    cdef Spread loop
    cdef int64_t k
    cdef int status = -1
    loop.t, loop.ids, loop.rows, loop.row_proxies = t, ids, rows, row_proxies
    if keys != NULL and scratch != NULL and leaves != NULL and tops != NULL and clusters != NULL and tasks != NULL:
        status = 0
        # Stage 1: the leaves in Morton order, cut into clusters.
        bound_all(items, n, &all, threads)
        order = morton_sort(items, n, &all, keys, scratch, threads)
        loop.items, loop.order, loop.out = items, order, leaves
        spread(&loop, gathered_leaves, n, threads)
        k = form_clusters(order, n, clusters, threads)
        # Stage 2: one item per cluster for the binned SAH.
        loop.items, loop.clusters, loop.out = leaves, clusters, tops
        spread(&loop, cluster_items, k, threads)
        # Stage 3: the tree. New proxies learn their rows (into the keys' buffer, free again), and
        # their tight boxes and ids come after.
        proxy_rows = <int32_t *>keys
        build_tree(t, tops, leaves, clusters, k, n, tasks, ids != NULL, proxy_rows, threads)
        if ids != NULL:
            loop.proxy_rows = proxy_rows
            spread(&loop, filled_proxies, n, threads)
    free(keys)
    free(scratch)
    free(leaves)
    free(tops)
    free(clusters)
    free(tasks)
    return status


cdef int core_rebuild(TreeCore *t, int threads) noexcept nogil:
    """Build the tree afresh: every proxy but the sensors in one build, the sensors inserted after it
    into their own subtree."""
    cdef int64_t n = t.proxy_count, k = 0
    cdef BuildItem *items
    cdef int32_t p, i
    cdef int status = 0
    cdef float *fat
    wide_stale(t)
    t.root = t.sensor_root = NULL_REF
    if n == 0:
        return 0
    if n - 1 > t.node_capacity and grow_nodes(t, n - 1, threads) != 0:
        return -1
    items = <BuildItem *>malloc(n * sizeof(BuildItem))
    if items == NULL:
        return -1
    for p in range(t.proxy_capacity):
        if (t.proxies[p].flags & (PROXY_LIVE | PROXY_SENSOR)) == PROXY_LIVE:
            fat = t.proxies[p].fat
            memcpy(items[k].box, fat, 6 * sizeof(float))
            for i in range(3):
                items[k].center[i] = 0.5 * fat[i] + 0.5 * fat[i + 3]
            items[k].ref = ~p
            k += 1
    if k:
        status = build_from_items(t, items, k, NULL, NULL, NULL, threads)
    else:
        free_nodes_from(t, 0)
    free(items)
    for p in range(t.proxy_capacity):
        if status == 0 and (t.proxies[p].flags & (PROXY_LIVE | PROXY_SENSOR)) > PROXY_LIVE:
            insert_leaf(t, p, t.root)
    return status


cdef int core_bulk_insert(TreeCore *t, const uint64_t *ids, const float *rows, int64_t n,
                          int32_t *row_proxies, int threads) noexcept nogil:
    """Fill an empty tree (core_reserve(n) first) with one binned-SAH build; row_proxies[i] gets
    row i's proxy. Fails only for memory, before anything changed."""
    cdef BuildItem *items
    cdef Spread loop
    cdef int64_t i
    wide_stale(t)
    items = <BuildItem *>malloc(n * sizeof(BuildItem))
    if items == NULL:
        return -1
    loop.t, loop.rows, loop.out = t, rows, items
    spread(&loop, fattened_items, n, threads)
    if build_from_items(t, items, n, ids, rows, row_proxies, threads) != 0:
        free(items)
        return -1
    free(items)
    # The build used proxies 0..n-1; the rest of the pool is free, lowest first.
    t.free_proxy = NULL_REF
    i = t.proxy_capacity - 1
    while i >= n:
        t.proxies[i].flags = 0
        t.proxies[i].parent = t.free_proxy
        t.free_proxy = <int32_t>i
        i -= 1
    t.proxy_count = <int32_t>n
    fill_slots(t, n, ids, row_proxies, threads)
    return 0
