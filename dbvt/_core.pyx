# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The dynamic AABB tree: pooled nodes, SAH insertion with rotations, binned-SAH rebuild, one walker.

Leaves are not nodes: a tree reference >= 0 is an internal node, < 0 is ~proxy, and a proxy record
holds both the fat box the tree is built on and the tight box that queries test. Every query walks the
tree once with an explicit stack that grows; the query kinds differ only in two small predicates,
`classify_node` and `test_leaf`.
"""
from libc.float cimport FLT_MAX
from libc.math cimport INFINITY
from libc.stdint cimport INT32_MAX, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, llabs, malloc, realloc
from libc.string cimport memcpy, memmove, memset

from dbvt._parallel cimport counter_get, counter_set, counter_take, dbvt_counter, run_parts

cdef extern from *:
    """
    #ifndef DBVT_DEBUG_CHECKS
    #define DBVT_DEBUG_CHECKS 0
    #endif
    """
    bint DBVT_DEBUG_CHECKS

cdef enum:
    MIN_SLOTS = 16
    # A moved leaf whose new fat box fits in an ancestor at most this many levels up stays in place
    # and the nodes below that ancestor grow. On W1 (100k, 100 steps) that makes Tree.update 20%
    # faster than reinserting below the ancestor, for a 1% higher SAH cost that does not creep up.
    ENLARGE_LEVELS = 3
    # Pools grown by at least this many slots are set up on the caller's threads.
    PARALLEL_FILL_FROM = 65536


# ---------------------------------------------------------------------------------------------
# Boxes (the primitives every module shares are in _core.pxd).

cdef void load_box(const float *row, int32_t dims, float *out) noexcept nogil:
    """A user row [min..., max...] of `dims` axes as a 3-D box."""
    if dims == 3:
        memcpy(out, row, 6 * sizeof(float))
    else:
        out[0] = row[0]; out[1] = row[1]; out[2] = 0.0
        out[3] = row[2]; out[4] = row[3]; out[5] = 0.0


cdef void cache_costs(TreeCore *t) noexcept nogil:
    """Fill `costs` for every node in use (after loading a serialised tree, which leaves them out)."""
    cdef int32_t i
    for i in range(t.node_capacity):
        if t.heights[i] > 0:
            t.costs[i] = box_cost(t.nodes[i].box, t.dims == 2)


cdef inline void store_box(const float *box, int32_t dims, float *row) noexcept nogil:
    if dims == 3:
        memcpy(row, box, 6 * sizeof(float))
    else:
        row[0] = box[0]; row[1] = box[1]; row[2] = box[3]; row[3] = box[4]


# ---------------------------------------------------------------------------------------------
# Tree references: internal node (>= 0) or leaf (~proxy).

cdef inline void replace_child(TreeCore *t, int32_t parent, int32_t old, int32_t new) noexcept nogil:
    if parent == NULL_REF:
        t.root = new
    elif t.nodes[parent].child[0] == old:
        t.nodes[parent].child[0] = new
    else:
        t.nodes[parent].child[1] = new
    set_parent(t, new, parent)


cdef inline bint refit(TreeCore *t, int32_t index) noexcept nogil:
    """Recompute a node's box and height from its children; False when nothing changed."""
    cdef Node *node = &t.nodes[index]
    cdef float box[6]
    cdef int32_t h0 = ref_height(t, node.child[0])
    cdef int32_t h1 = ref_height(t, node.child[1])
    cdef int32_t height = 1 + (h0 if h0 > h1 else h1)
    union_box(box, ref_box(t, node.child[0]), ref_box(t, node.child[1]))
    if height == t.heights[index] and box_contains(node.box, box) and box_contains(box, node.box):
        return False
    memcpy(node.box, box, sizeof(box))
    t.costs[index] = box_cost(box, t.dims == 2)
    t.heights[index] = height
    return True


# ---------------------------------------------------------------------------------------------
# Pools and the id table. Growth can move `nodes`, `proxies` and `slots`: no pointer into them may
# be held across core_reserve(); batch code reserves first, then works with nothing moving.

cdef int core_init(TreeCore *t, int32_t dims, float margin) noexcept nogil:
    t.nodes = NULL
    t.parents = NULL
    t.heights = NULL
    t.costs = NULL
    t.node_capacity = 0
    t.node_count = 0
    t.free_node = NULL_REF
    t.proxies = NULL
    t.proxy_capacity = 0
    t.proxy_count = 0
    t.free_proxy = NULL_REF
    t.slots = NULL
    t.slot_mask = -1
    t.root = NULL_REF
    t.sensor_root = NULL_REF
    t.dims = dims
    t.margin = margin
    memset(&t.wide, 0, sizeof(Wide))
    t.wide.rest = t.wide.sensors = NULL_REF
    return 0


cdef void wide_release(Wide *w) noexcept nogil:
    free(w.block)
    free(w.ids)
    free(w.proxies)
    memset(w, 0, sizeof(Wide))
    w.rest = w.sensors = NULL_REF


cdef void core_free(TreeCore *t) noexcept nogil:
    free(t.nodes)
    free(t.parents)
    free(t.heights)
    free(t.costs)
    free(t.proxies)
    free(t.slots)
    wide_release(&t.wide)
    t.nodes = NULL
    t.parents = NULL
    t.heights = NULL
    t.costs = NULL
    t.proxies = NULL
    t.slots = NULL
    t.node_capacity = t.proxy_capacity = 0


# Growing the pools. New slots are zeroed, so that a tree's bytes (to_bytes copies whole pools) depend
# on its history alone, and go on the free list lowest index first, so fresh trees are laid out in
# order. A pool grown from nothing comes from calloc: fresh pages are zero already, and are first
# touched by the threads that link them (a 1M-proxy pool is some 27,000 pages, whose faults were a
# tenth of a threaded bulk build when one thread took them all).
ctypedef enum PoolKind:
    POOL_PROXIES
    POOL_NODES
    POOL_SLOTS

ctypedef struct PoolFill:           # one growth of a pool: its new slots [start, end), set up on threads
    TreeCore *t
    PoolKind kind
    int64_t start
    int64_t end
    int32_t next_free               # where the last new slot's free link points: the old list head
    bint zeroed                     # the new slots came from calloc
    int parts


cdef void fill_part(void *context, int part) noexcept nogil:
    cdef const PoolFill *f = <PoolFill *>context
    cdef TreeCore *t = f.t
    cdef int64_t span = f.end - f.start
    cdef int64_t first = f.start + span * part // f.parts, last = f.start + span * (part + 1) // f.parts
    cdef int64_t i
    if first == last:
        return
    if f.kind == POOL_SLOTS:
        memset(&t.slots[first], 0xFF, (last - first) * sizeof(int32_t))      # every slot -1: empty
    elif f.kind == POOL_PROXIES:
        if not f.zeroed:
            memset(&t.proxies[first], 0, (last - first) * sizeof(Proxy))
        for i in range(first, last):
            t.proxies[i].parent = <int32_t>(i + 1)
        if last == f.end:
            t.proxies[last - 1].parent = f.next_free
    else:
        if not f.zeroed:
            memset(&t.nodes[first], 0, (last - first) * sizeof(Node))
            memset(&t.costs[first], 0, (last - first) * sizeof(float))
        for i in range(first, last):
            t.heights[i] = -1
            t.parents[i] = <int32_t>(i + 1)
        if last == f.end:
            t.parents[last - 1] = f.next_free


cdef void fill_pool(TreeCore *t, PoolKind kind, int64_t start, int64_t end, int32_t next_free, bint zeroed,
                    int threads) noexcept nogil:
    cdef PoolFill f
    f.t, f.kind, f.start, f.end, f.next_free, f.zeroed = t, kind, start, end, next_free, zeroed
    f.parts = threads if end - start >= PARALLEL_FILL_FROM else 1
    run_parts(fill_part, &f, f.parts)


cdef void *grow_pool(void *pool, int64_t count, size_t size, bint *zeroed) noexcept nogil:
    """The pool grown to `count` items (NULL when memory ran out: the old one stays valid)."""
    zeroed[0] = pool == NULL
    return calloc(count, size) if pool == NULL else realloc(pool, count * size)


cdef int grow_nodes(TreeCore *t, int64_t capacity, int threads) noexcept nogil:
    cdef void *grown
    cdef bint zeroed, unused
    if capacity <= t.node_capacity:
        return 0
    if capacity >= INT32_MAX:
        return -1
    grown = grow_pool(t.nodes, capacity, sizeof(Node), &zeroed)
    if grown == NULL:
        return -1
    t.nodes = <Node *>grown
    grown = grow_pool(t.parents, capacity, sizeof(int32_t), &unused)
    if grown == NULL:
        return -1
    t.parents = <int32_t *>grown
    grown = grow_pool(t.heights, capacity, sizeof(int32_t), &unused)
    if grown == NULL:
        return -1
    t.heights = <int32_t *>grown
    grown = grow_pool(t.costs, capacity, sizeof(float), &unused)
    if grown == NULL:
        return -1
    t.costs = <float *>grown
    fill_pool(t, POOL_NODES, t.node_capacity, capacity, t.free_node, zeroed, threads)
    t.free_node = t.node_capacity
    t.node_capacity = <int32_t>capacity
    return 0


cdef int grow_proxies(TreeCore *t, int64_t capacity, int threads) noexcept nogil:
    cdef void *grown
    cdef bint zeroed
    if capacity <= t.proxy_capacity:
        return 0
    if capacity >= INT32_MAX:
        return -1
    grown = grow_pool(t.proxies, capacity, sizeof(Proxy), &zeroed)
    if grown == NULL:
        return -1
    t.proxies = <Proxy *>grown
    fill_pool(t, POOL_PROXIES, t.proxy_capacity, capacity, t.free_proxy, zeroed, threads)
    t.free_proxy = t.proxy_capacity
    t.proxy_capacity = <int32_t>capacity
    return 0


cdef void slot_insert(TreeCore *t, int32_t proxy) noexcept nogil:
    cdef int64_t i = mix64(t.proxies[proxy].id) & t.slot_mask
    while t.slots[i] >= 0:
        i = (i + 1) & t.slot_mask
    t.slots[i] = proxy


# Filling an empty id table with many proxies at once (a bulk build, a load, a table that grew). One
# proxy after another, each insert missed the cache somewhere in a table of megabytes, on one thread:
# 20 ms of a 1M bulk build that the threads could not share. Instead the proxies are dealt by their
# home slot into regions of the table, which the threads take in turn; each probes only inside its
# region, so its writes stay in 256 KB, and a probe that would run past the region's end is left to a
# last pass on the caller. Linear probing admits any order of insertion, and this order depends on
# the proxies alone: the table comes out the same whatever the threads.
cdef enum:
    REGION_SHIFT = 16               # 65,536 slots a region
    DEALT_FROM = 65536              # proxies; fewer go in one by one
    NOT_DEALT = -1                  # a dead proxy's key (its home slot would be beyond any table)

ctypedef struct SlotFill:
    TreeCore *t
    int64_t scan                    # proxies 0..scan-1, or with `ids`, rows 0..scan-1
    const uint64_t *ids             # NULL, or a bulk build's rows: row i is ids[i] in proxy row_proxies[i]
    const int32_t *row_proxies
    int parts                       # the proxies (rows) cut into this many runs, one a thread
    int64_t regions
    int64_t *counts                 # [part * regions + region]: keys of a run in a region, then where they go
    bint dealing                    # deal_part's second pass: put the keys, not only count them
    int64_t *starts                 # [region]: its first key in `dealt`; [regions]: all the keys
    uint64_t *dealt                 # home << 32 | proxy, by region, in proxy (row) order inside each
    int64_t *spilled                # [region]: its keys left for the last pass (kept at its front)
    dbvt_counter next


cdef inline uint64_t slot_key(const SlotFill *f, int64_t i) noexcept nogil:
    """home << 32 | proxy for proxy (row) i, or NOT_DEALT for a proxy not live."""
    cdef uint64_t home
    if f.ids != NULL:
        home = mix64(f.ids[i]) & <uint64_t>f.t.slot_mask
        return home << 32 | <uint32_t>f.row_proxies[i]
    if not (f.t.proxies[i].flags & PROXY_LIVE):
        return <uint64_t>NOT_DEALT
    home = mix64(f.t.proxies[i].id) & <uint64_t>f.t.slot_mask
    return home << 32 | <uint64_t>i


cdef void deal_part(void *context, int part) noexcept nogil:
    """A run's keys by region: counted (the first pass), then, with `dealing`, each put where the
    counts say (a hash costs less than storing the keys and reading them back)."""
    cdef SlotFill *f = <SlotFill *>context
    cdef int64_t first = f.scan * part // f.parts, last = f.scan * (part + 1) // f.parts, i
    cdef int64_t *at = f.counts + part * f.regions
    cdef uint64_t key
    for i in range(first, last):
        key = slot_key(f, i)
        if key != <uint64_t>NOT_DEALT:
            if f.dealing:
                f.dealt[at[key >> (32 + REGION_SHIFT)]] = key
            at[key >> (32 + REGION_SHIFT)] += 1


cdef void region_part(void *context, int part) noexcept nogil:
    cdef SlotFill *f = <SlotFill *>context
    cdef int32_t *slots = f.t.slots
    cdef int64_t region, end, e, kept, i
    cdef uint64_t key
    region = counter_take(&f.next)
    while region < f.regions:
        end = min((region + 1) << REGION_SHIFT, f.t.slot_mask + 1)
        kept = f.starts[region]
        for e in range(f.starts[region], f.starts[region + 1]):
            key = f.dealt[e]
            i = <int64_t>(key >> 32)
            while i < end and slots[i] >= 0:
                i += 1
            if i < end:
                slots[i] = <int32_t><uint32_t>key
            else:
                f.dealt[kept] = key
                kept += 1
        f.spilled[region] = kept - f.starts[region]
        region = counter_take(&f.next)


cdef int deal_slots(TreeCore *t, int64_t scan, const uint64_t *ids, const int32_t *row_proxies,
                    int threads) noexcept nogil:
    """Put the live proxies among the first `scan` (or `ids`' rows) into the empty table, by regions."""
    cdef SlotFill f
    cdef int64_t region, part, e, total = 0, count
    f.t, f.scan, f.ids, f.row_proxies, f.parts = t, scan, ids, row_proxies, threads
    f.regions = (t.slot_mask >> REGION_SHIFT) + 1
    f.counts = <int64_t *>calloc(threads * f.regions, sizeof(int64_t))
    f.starts = <int64_t *>malloc((f.regions + 1) * sizeof(int64_t))
    f.spilled = <int64_t *>malloc(f.regions * sizeof(int64_t))
    f.dealt = <uint64_t *>malloc(scan * sizeof(uint64_t))
    if f.counts == NULL or f.starts == NULL or f.spilled == NULL or f.dealt == NULL:
        free(f.counts); free(f.starts); free(f.spilled); free(f.dealt)
        return -1
    # Stage 1: how many keys each run has in each region.
    f.dealing = False
    run_parts(deal_part, &f, f.parts)
    # Stage 2: where each run's keys of each region go (regions in order, runs in order inside
    # them), and there they go.
    for region in range(f.regions):
        f.starts[region] = total
        for part in range(f.parts):
            count = f.counts[part * f.regions + region]
            f.counts[part * f.regions + region] = total
            total += count
    f.starts[f.regions] = total
    f.dealing = True
    run_parts(deal_part, &f, f.parts)
    # Stage 3: the regions, taken in turn; then what ran past a region's end, in region order.
    counter_set(&f.next, 0)
    run_parts(region_part, &f, <int>min(<int64_t>threads, f.regions))
    for region in range(f.regions):
        for e in range(f.starts[region], f.starts[region] + f.spilled[region]):
            slot_insert(t, <int32_t><uint32_t>f.dealt[e])
    free(f.counts); free(f.starts); free(f.spilled); free(f.dealt)
    return 0


cdef void fill_slots(TreeCore *t, int64_t scan, const uint64_t *ids, const int32_t *row_proxies,
                     int threads) noexcept nogil:
    """Put the live proxies among the pool's first `scan` into the empty table; or, with `ids`, the
    proxies row_proxies[i] of ids[i] for rows i < scan (a bulk build's, all live)."""
    cdef int64_t i
    if scan >= DEALT_FROM and deal_slots(t, scan, ids, row_proxies, threads) == 0:
        return
    for i in range(scan):
        if ids != NULL:
            slot_insert(t, row_proxies[i])
        elif t.proxies[i].flags & PROXY_LIVE:
            slot_insert(t, <int32_t>i)


cdef int rehash(TreeCore *t, int64_t size, int64_t scan, int threads) noexcept nogil:
    """A table of `size` slots, holding the live proxies among the pool's first `scan` (beyond them,
    a pool just grown: not read, so not faulted in)."""
    cdef int32_t *slots = <int32_t *>malloc(size * sizeof(int32_t))
    if slots == NULL:
        return -1
    free(t.slots)
    t.slots = slots
    t.slot_mask = size - 1
    fill_pool(t, POOL_SLOTS, 0, size, NULL_REF, False, threads)
    fill_slots(t, scan, NULL, NULL, threads)
    return 0


cdef void slot_delete(TreeCore *t, int32_t proxy) noexcept nogil:
    cdef int64_t i = mix64(t.proxies[proxy].id) & t.slot_mask
    cdef int64_t j, home
    cdef int32_t other
    cdef bint reachable
    while t.slots[i] != proxy:
        i = (i + 1) & t.slot_mask
    # Backward-shift deletion: later entries of the probe run move into the hole when their home
    # slot allows it, so lookups never need tombstones.
    j = i
    while True:
        j = (j + 1) & t.slot_mask
        other = t.slots[j]
        if other < 0:
            break
        home = mix64(t.proxies[other].id) & t.slot_mask
        if i <= j:
            reachable = i < home <= j
        else:
            reachable = home > i or home <= j
        if not reachable:
            t.slots[i] = other
            i = j
    t.slots[i] = -1


cdef int32_t core_find(const TreeCore *t, uint64_t id) noexcept nogil:
    cdef int64_t i
    cdef int32_t proxy
    if t.slots == NULL:
        return -1
    i = mix64(id) & t.slot_mask
    while True:
        proxy = t.slots[i]
        if proxy < 0 or t.proxies[proxy].id == id:
            return proxy
        i = (i + 1) & t.slot_mask


cdef void core_prefetch_find(const TreeCore *t, uint64_t id, bint proxy) noexcept nogil:
    """Start fetching what core_find(id) reads: its first slot, or, with `proxy` (once that slot is
    cached), the proxy it names. A batch of lookups calls this rows ahead: ids are random, so every
    lookup would otherwise wait for two cache misses in turn."""
    cdef int64_t i
    if t.slots == NULL:
        return
    i = mix64(id) & t.slot_mask
    if not proxy:
        prefetch(&t.slots[i])
    elif t.slots[i] >= 0:
        prefetch(&t.proxies[t.slots[i]])


cdef void core_prefetch_move(const TreeCore *t, int32_t proxy, bint parent) noexcept nogil:
    """Start fetching what core_move(proxy) reads: the proxy, or, with `parent` (once the proxy is
    cached), the node above it."""
    if not parent:
        prefetch(&t.proxies[proxy])
    elif t.proxies[proxy].parent >= 0:
        prefetch(&t.nodes[t.proxies[proxy].parent])


cdef inline int64_t grown(int64_t have, int64_t need) noexcept nogil:
    cdef int64_t more = have + have // 2
    return need if need > more else more


cdef int core_reserve(TreeCore *t, int64_t extra, int threads) noexcept nogil:
    """Make room for `extra` more proxies, so that nothing allocates (or moves) until they are in;
    large pools are set up on `threads` threads."""
    cdef int64_t live = t.proxy_count + extra
    cdef int64_t size = MIN_SLOTS
    cdef int32_t old_capacity = t.proxy_capacity
    while size < 2 * live:       # load factor <= 1/2 keeps linear probes short
        size *= 2
    # The table holds the live proxies, which are all among the pool's slots from before it grows.
    if live > t.proxy_capacity and grow_proxies(t, grown(t.proxy_capacity, live), threads) != 0:
        return -1
    if live - 1 > t.node_capacity and grow_nodes(t, grown(t.node_capacity, live - 1), threads) != 0:
        return -1
    if size > t.slot_mask + 1 and rehash(t, size, old_capacity, threads) != 0:
        return -1
    return 0


cdef inline int32_t alloc_node(TreeCore *t) noexcept nogil:
    cdef int32_t index = t.free_node
    t.free_node = t.parents[index]
    t.node_count += 1
    return index


cdef inline void free_node(TreeCore *t, int32_t index) noexcept nogil:
    t.heights[index] = -1
    t.parents[index] = t.free_node
    t.free_node = index
    t.node_count -= 1


# ---------------------------------------------------------------------------------------------
# Insertion (Box2D v3's one greedy SAH descent, then refit and rotate on the way up) and removal.

cdef int32_t find_best_sibling(const TreeCore *t, const float *box, int32_t start) noexcept nogil:
    """The reference under `start` whose pairing with `box` under a new parent costs least, by
    branch and bound along a single path: `inherited` is what the ancestors' growth costs, the
    lower bounds are what a subtree could cost at best."""
    cdef bint planar = t.dims == 2
    cdef double area = box_cost(box, planar)
    cdef int32_t index = start
    cdef double area_base = t.costs[index] if index >= 0 else box_cost(ref_box(t, index), planar)
    cdef double direct = union_cost(ref_box(t, index), box, planar)
    cdef double inherited = 0.0
    cdef int32_t best = index
    cdef double best_cost = direct
    cdef int32_t child[2]
    cdef float *child_box[2]
    cdef double child_direct[2]
    cdef double child_area[2]
    cdef double lower[2]
    cdef double cost, d
    cdef int i, k
    while index >= 0:
        cost = direct + inherited
        if cost <= best_cost:       # on a tie the deeper candidate keeps piles of equal boxes shallow
            best = index
            best_cost = cost
        inherited += direct - area_base
        for k in range(2):
            # A leaf child is a candidate itself; a node child gets a lower bound on any
            # candidate below it.
            child[k] = t.nodes[index].child[k]
            child_box[k] = ref_box(t, child[k])
            if child[k] >= 0:
                # The next level reads one of these four boxes: start fetching them all now.
                prefetch(ref_box(t, t.nodes[child[k]].child[0]))
                prefetch(ref_box(t, t.nodes[child[k]].child[1]))
            child_direct[k] = union_cost(child_box[k], box, planar)
            child_area[k] = 0.0
            lower[k] = INFINITY
            if child[k] < 0:
                if child_direct[k] + inherited < best_cost:
                    best = child[k]
                    best_cost = child_direct[k] + inherited
            else:
                child_area[k] = t.costs[child[k]]
                lower[k] = inherited + child_direct[k] + min(area - child_area[k], 0.0)

        if child[0] < 0 and child[1] < 0:
            break
        if best_cost < lower[0] and best_cost < lower[1]:
            break
        if lower[0] == lower[1] and child[0] >= 0 and child[1] >= 0:
            # Both children contain the box: the nearer centre breaks the tie, then the shorter
            # subtree, so that equal and identical boxes spread out instead of building a chain.
            for k in range(2):
                lower[k] = 0.0
                for i in range(3):
                    d = (<double>child_box[k][i] + child_box[k][i + 3]) - (<double>box[i] + box[i + 3])
                    lower[k] += d * d
            if lower[0] == lower[1]:
                lower[0] = t.heights[child[0]]
                lower[1] = t.heights[child[1]]
        k = 0 if lower[0] < lower[1] and child[0] >= 0 else 1
        index = child[k]
        area_base = child_area[k]
        direct = child_direct[k]
    return best


cdef void rotate(TreeCore *t, int32_t a) noexcept nogil:
    """Swap a child of `a` with a grandchild on the other side when that shrinks the SAH cost
    (only the changed child's area changes) and does not make `a` taller."""
    cdef bint planar = t.dims == 2
    cdef int32_t b = t.nodes[a].child[0]
    cdef int32_t c = t.nodes[a].child[1]
    cdef int32_t best_up = NULL_REF, best_down = NULL_REF, best_mid = NULL_REF
    cdef double best_gain = 0.0, worst_gain = 0.0
    cdef int side, k, slack
    cdef int32_t down, mid, up, keep, height
    cdef double gain
    if t.heights[a] < 2:
        return
    # side 0: b goes down into c, swapping with a child of c; side 1: the mirror image.
    for side in range(2):
        down = b if side == 0 else c
        mid = c if side == 0 else b
        if mid < 0:
            continue
        for k in range(2):
            up = t.nodes[mid].child[k]
            keep = t.nodes[mid].child[1 - k]
            height = 1 + max(ref_height(t, up),
                             1 + max(ref_height(t, down), ref_height(t, keep)))
            if height > t.heights[a]:
                continue
            gain = t.costs[mid] - union_cost(ref_box(t, down), ref_box(t, keep), planar)
            worst_gain = min(worst_gain, gain)
            if gain > best_gain:
                best_gain = gain
                best_up = up
                best_down = down
                best_mid = mid
    if best_mid == NULL_REF:
        # No cheaper shape. When the costs could not tell the shapes apart (equal or point-like
        # boxes), balance as AVL does, lifting the taller grandchild once one side is two levels
        # deeper; otherwise trust the SAH and only undo gross imbalance.
        slack = 2 if worst_gain == 0.0 else 8
        if ref_height(t, b) >= ref_height(t, c) + slack:
            best_mid, best_down = b, c
        elif ref_height(t, c) >= ref_height(t, b) + slack:
            best_mid, best_down = c, b
        else:
            return
        k = 0 if t.heights[best_mid] == 1 + ref_height(t, t.nodes[best_mid].child[0]) else 1
        best_up = t.nodes[best_mid].child[k]
    if t.nodes[a].child[0] == best_down:
        t.nodes[a].child[0] = best_up
    else:
        t.nodes[a].child[1] = best_up
    if t.nodes[best_mid].child[0] == best_up:
        t.nodes[best_mid].child[0] = best_down
    else:
        t.nodes[best_mid].child[1] = best_down
    set_parent(t, best_up, a)
    set_parent(t, best_down, best_mid)
    refit(t, best_mid)
    refit(t, a)


cdef inline bint is_join(const TreeCore *t, int32_t index) noexcept nogil:
    return index == t.root and t.sensor_root != NULL_REF and t.sensor_root != t.root


cdef void join_subtree(TreeCore *t, int32_t leaf, bint sensor) noexcept nogil:
    """Make `leaf` the first of its kind (sensor or not): the root, or joined with the other kind's."""
    cdef int32_t join
    if t.root == NULL_REF:
        t.root = leaf
        set_parent(t, leaf, NULL_REF)
    else:
        join = alloc_node(t)
        t.nodes[join].child[0] = t.root if sensor else leaf
        t.nodes[join].child[1] = leaf if sensor else t.root
        set_parent(t, t.root, join)
        set_parent(t, leaf, join)
        t.parents[join] = NULL_REF
        t.root = join
        refit(t, join)
    if sensor:
        t.sensor_root = leaf


cdef void insert_leaf(TreeCore *t, int32_t proxy, int32_t start) noexcept nogil:
    """Insert a leaf below `start` (the root, or a node of its kind's subtree whose box already holds
    the leaf's)."""
    cdef bint sensor = (t.proxies[proxy].flags & PROXY_SENSOR) != 0
    cdef int32_t top = subtree_root(t, sensor)
    wide_stale(t)
    if top == NULL_REF:
        join_subtree(t, ~proxy, sensor)
        return
    attach_leaf(t, proxy, top if start == t.root else start, alloc_node(t), NULL)


cdef void attach_leaf(TreeCore *t, int32_t proxy, int32_t start, int32_t parent,
                      const uint8_t *ceilings) noexcept nogil:
    """Insert a leaf below `start`, a node whose box holds the leaf's, with `parent` (a free node) as
    its new parent. Refits and rotations climb no higher than the first node `ceilings` marks (with
    NULL, up to the root)."""
    cdef int32_t leaf = ~proxy
    cdef int32_t sibling, old_parent, index
    cdef float *fat = t.proxies[proxy].fat
    # Stage 1: where the new leaf costs least.
    sibling = find_best_sibling(t, fat, start)
    # Stage 2: the new parent joins the sibling and the leaf.
    old_parent = ref_parent(t, sibling)
    union_box(t.nodes[parent].box, fat, ref_box(t, sibling))
    t.costs[parent] = box_cost(t.nodes[parent].box, t.dims == 2)
    t.nodes[parent].child[0] = sibling
    t.nodes[parent].child[1] = leaf
    t.heights[parent] = 1 + ref_height(t, sibling)
    replace_child(t, old_parent, sibling, parent)
    set_parent(t, sibling, parent)
    set_parent(t, leaf, parent)
    if sibling == t.sensor_root:
        t.sensor_root = parent
    # Stage 3: refit the ancestors and let rotations undo what greedy insertion got wrong. Above
    # the first ancestor that already held the leaf (and kept its height) nothing changed.
    rotate(t, parent)
    index = t.parents[parent]
    while index != NULL_REF and refit(t, index):
        if not is_join(t, index):
            rotate(t, index)
        if ceilings != NULL and ceilings[index]:
            break
        index = t.parents[index]


cdef void remove_leaf(TreeCore *t, int32_t proxy) noexcept nogil:
    cdef int32_t parent = detach_leaf(t, proxy, NULL)
    if parent != NULL_REF:
        free_node(t, parent)


cdef int32_t detach_leaf(TreeCore *t, int32_t proxy, const uint8_t *ceilings) noexcept nogil:
    """Take a leaf out of the tree; returns its parent node, now unused (the caller frees or reuses
    it), or NULL_REF when the leaf was the root. Refits climb no higher than the first node
    `ceilings` marks (with NULL, up to the root)."""
    cdef int32_t leaf = ~proxy
    cdef int32_t parent = t.proxies[proxy].parent
    cdef int32_t grand, sibling, index
    wide_stale(t)
    t.proxies[proxy].parent = NULL_REF
    if parent == NULL_REF:
        t.root = NULL_REF
        if t.sensor_root == leaf:
            t.sensor_root = NULL_REF
        return NULL_REF
    grand = t.parents[parent]
    sibling = t.nodes[parent].child[0] if t.nodes[parent].child[1] == leaf else t.nodes[parent].child[1]
    replace_child(t, grand, parent, sibling)
    if t.sensor_root == parent:
        t.sensor_root = sibling
    elif t.sensor_root == leaf:
        t.sensor_root = NULL_REF        # the last sensor: the join above it went with it
    # Ancestors only shrink; once one is unchanged, so is everything above it.
    index = grand
    while index != NULL_REF and refit(t, index):
        if ceilings != NULL and ceilings[index]:
            break
        index = t.parents[index]
    return parent


cdef int32_t core_add(TreeCore *t, uint64_t id, const float *tight) noexcept nogil:
    """Insert a proxy for `id` into the tree (core_reserve() first) and return its index."""
    cdef int32_t proxy = t.free_proxy
    cdef Proxy *p = &t.proxies[proxy]
    t.free_proxy = p.parent
    memcpy(p.tight, tight, 6 * sizeof(float))
    fatten(t, tight, p.fat)
    p.id = id
    p.flags = PROXY_LIVE
    p.parent = NULL_REF
    t.proxy_count += 1
    slot_insert(t, proxy)
    insert_leaf(t, proxy, t.root)
    return proxy


cdef void core_remove(TreeCore *t, int32_t proxy) noexcept nogil:
    remove_leaf(t, proxy)
    slot_delete(t, proxy)
    t.proxies[proxy].flags = 0
    t.proxies[proxy].parent = t.free_proxy
    t.free_proxy = proxy
    t.proxy_count -= 1


cdef bint core_move(TreeCore *t, int32_t proxy, const float *tight, float prediction) noexcept nogil:
    """Give a proxy a new tight box; True when it left its fat box and got a new one (kept in place
    when a near ancestor holds that, else reinserted), covering `prediction` more such moves."""
    cdef float fat[6]
    wide_stale(t)
    if box_contains(t.proxies[proxy].fat, tight):
        memcpy(t.proxies[proxy].tight, tight, 6 * sizeof(float))
        return False
    moved_fat(t, proxy, tight, prediction, fat)
    core_place(t, proxy, tight, fat)
    return True


cdef void moved_fat(const TreeCore *t, int32_t proxy, const float *tight, float prediction,
                    float *fat) noexcept nogil:
    """The fat box of a proxy that left its own for `tight`: the tight box grown by the margin and
    by `prediction` more moves like this one."""
    cdef const Proxy *p = &t.proxies[proxy]
    cdef float step, shift, limit
    cdef int i
    fatten(t, tight, fat)
    for i in range(t.dims):
        # Predict the next move from this one, but never by more than the box's own size and the
        # margin: a fast box must not leave a huge fat box behind. A step that even so capped a box
        # could not hold again (a teleport, a box moving faster than its size) is not predicted:
        # the box leaves its fat box at the next move anyway, and the growth would only add fat pairs.
        step = tight[i] - p.tight[i]
        shift = prediction * step
        limit = tight[i + 3] - tight[i] + t.margin
        if step > limit + t.margin or step < -(limit + t.margin):
            shift = 0
        elif shift > limit:
            shift = limit
        elif shift < -limit:
            shift = -limit
        if shift < 0:
            fat[i] = clamp_finite(fat[i] + shift)
        else:
            fat[i + 3] = clamp_finite(fat[i + 3] + shift)


cdef void core_place(TreeCore *t, int32_t proxy, const float *tight, const float *fat) noexcept nogil:
    """Give a proxy a new tight box and a new fat box that holds it."""
    cdef Proxy *p = &t.proxies[proxy]
    cdef int32_t start, levels
    wide_stale(t)
    # The lowest ancestor that holds the new box (moves are mostly short)...
    start = p.parent
    levels = 1
    while start != NULL_REF and not box_contains(t.nodes[start].box, fat):
        start = t.parents[start]
        levels += 1
    if start != NULL_REF and levels <= ENLARGE_LEVELS:
        # ...is close: the leaf keeps its place and the few nodes below that ancestor grow.
        memcpy(p.tight, tight, 6 * sizeof(float))
        memcpy(p.fat, fat, 6 * sizeof(float))
        start = p.parent
        while start != NULL_REF and refit(t, start):
            start = t.parents[start]
        return
    # ...is far (so not the parent, which the removal frees): reinsert below it, or below the root,
    # leaving the tree above it untouched.
    remove_leaf(t, proxy)
    p = &t.proxies[proxy]
    memcpy(p.tight, tight, 6 * sizeof(float))
    memcpy(p.fat, fat, 6 * sizeof(float))
    insert_leaf(t, proxy, start if start != NULL_REF else t.root)


# ---------------------------------------------------------------------------------------------
# A large batch of moves on threads. The tree is cut at its nodes SPLIT_DEPTH levels down (up to 32
# subtrees). A move whose edit stays inside its leaf's subtree (the lowest ancestor that holds the
# new fat box lies inside it; refits and rotations stop at the subtree's root) is made with the other
# moves of that subtree, in the batch's order, while other threads edit other subtrees. The nodes
# above the subtrees are refitted after, and the moves that need more are made last, one by one, in
# the batch's order. A subtree's edits read and write nothing outside it, and a move's freed node
# goes straight back to its own reinsertion (as the free list would have given it back), so the tree
# comes out the same whatever the threads; one thread takes the rows in the batch's order, each kept
# inside its subtree, which makes the same tree without sorting the rows by subtree first.
cdef enum:
    SPLIT_DEPTH = 5
    MAX_SPLITS = 1 << SPLIT_DEPTH
    NO_SPLIT = 255                  # a row whose leaf is not below a subtree's root; a node above them
    LABEL_GROUP = 16
    LATER = 1                       # deferred: a row visited once, whose edit waits for the last pass
    # When at least one proxy in this many moves, the subtrees are labelled from the top down (every
    # leaf once, the nodes in about the order they lie in memory) rather than by climbing from each
    # moved leaf (a cache miss on its proxy, then on each parent not yet in cache).
    LABEL_DOWN_SHARE = 4
    UNVISITED = 2                   # deferred: a row the threads left alone (its leaf is above the subtrees)

ctypedef struct SplitMoves:
    TreeCore *t
    const int32_t *proxies          # per row
    const int64_t *order            # the rows in the batch's order
    const float *rows               # per row, the new tight box as a user row (2 * dims floats)
    float *before                   # NULL, or per row the tight box it had, as a user row
    uint8_t *refat                  # per row: 1 if it left its fat box, | NEWLY_MOVED (with mark_moved)
    bint mark_moved                 # a broadphase's: set PROXY_MOVED and PROXY_REFAT on the proxies
    uint8_t *deferred               # per row: 0, or LATER or UNVISITED for the last pass
    float prediction
    int64_t n
    int parts
    int splits
    uint8_t *marks                  # per node: 1 + the index of the subtree it is the root of, NO_SPLIT
                                    # for a node above the subtrees, else 0
    uint8_t *labels                 # per position in `order`: its row's subtree, or NO_SPLIT
    int64_t *counts                 # [part * MAX_SPLITS + split]: positions, then where they go
    int64_t starts[MAX_SPLITS + 1]
    int64_t *dealt                  # rows by subtree, in the batch's order inside each
    int32_t roots[MAX_SPLITS]       # the subtrees' roots
    uint8_t *leaf_split             # NULL, or per proxy slot: the subtree its leaf is in, or NO_SPLIT
    dbvt_counter next
    dbvt_counter failed


cdef bint place_below(TreeCore *t, int32_t proxy, const float *tight, const float *fat,
                      const uint8_t *marks) noexcept nogil:
    """core_place() touching nothing above the root of the leaf's subtree (the first node `marks`
    names a subtree's on the way up); False, with nothing changed, when the edit would reach above
    it, or the leaf hangs from a node above the subtrees."""
    cdef Proxy *p = &t.proxies[proxy]
    cdef int32_t start = p.parent, levels = 1, freed
    if start == NULL_REF:
        return False
    while True:
        if marks[start] == NO_SPLIT:
            return False
        if box_contains(t.nodes[start].box, fat):
            break
        if marks[start]:
            return False
        start = t.parents[start]
        levels += 1
    if levels <= ENLARGE_LEVELS:
        memcpy(p.tight, tight, 6 * sizeof(float))
        memcpy(p.fat, fat, 6 * sizeof(float))
        start = p.parent
        while refit(t, start) and not marks[start]:
            start = t.parents[start]
        return True
    if marks[start]:
        return False                # the leaf could be paired with the subtree's root itself, above it
    freed = detach_leaf(t, proxy, marks)
    memcpy(p.tight, tight, 6 * sizeof(float))
    memcpy(p.fat, fat, 6 * sizeof(float))
    attach_leaf(t, proxy, start, freed, marks)
    return True


cdef void leaf_split_part(void *context, int part) noexcept nogil:
    """Label the leaves of a run of subtrees a part, from their roots down (leaf_split). Each node is a
    cache miss that one walk could only wait for in turn; the order of the labels does not matter,
    so LABEL_GROUP references come off the stack together and their nodes are fetched side by side."""
    cdef SplitMoves *m = <SplitMoves *>context
    cdef const TreeCore *t = m.t
    cdef int split, count, j
    cdef int32_t refs[LABEL_GROUP]
    cdef Stack stack
    memset(&stack, 0, sizeof(Stack))
    for split in range(m.splits * part // m.parts, m.splits * (part + 1) // m.parts):
        stack.count = 0
        if stack_push(&stack, m.roots[split], 0) != 0:
            counter_set(&m.failed, 1)
            break
        while stack.count:
            count = <int>min(stack.count, <int64_t>LABEL_GROUP)
            stack.count -= count
            for j in range(count):
                refs[j] = stack.entries[stack.count + j].ref
                if refs[j] >= 0:
                    prefetch(&t.nodes[refs[j]])
            for j in range(count):
                if refs[j] < 0:
                    m.leaf_split[~refs[j]] = <uint8_t>split
                elif (stack_push(&stack, t.nodes[refs[j]].child[1], 0) != 0
                        or stack_push(&stack, t.nodes[refs[j]].child[0], 0) != 0):
                    counter_set(&m.failed, 1)
                    stack_free(&stack)
                    return
    stack_free(&stack)


cdef void label_part(void *context, int part) noexcept nogil:
    """Each position's subtree (the first marked node above its leaf), counted a run of positions a
    part: read from leaf_split when it was labelled from the top down, else climbed to. The climbs'
    steps are cache misses, one after another in each, so LABEL_GROUP positions climb side by side,
    a level a round, each fetching its next node while the others take their turn."""
    cdef SplitMoves *m = <SplitMoves *>context
    cdef const TreeCore *t = m.t
    cdef int64_t base = m.n * part // m.parts, last = m.n * (part + 1) // m.parts, i
    cdef int32_t at[LABEL_GROUP]
    cdef uint8_t mark[LABEL_GROUP]
    cdef int count, j, climbing
    cdef uint8_t label
    if m.leaf_split != NULL:
        for i in range(base, last):
            label = m.leaf_split[m.proxies[m.order[i]]]
            if label != NO_SPLIT:
                m.counts[part * MAX_SPLITS + label] += 1
            m.labels[i] = label
        return
    while base < last:
        count = <int>min(<int64_t>LABEL_GROUP, last - base)
        for j in range(count):
            if base + LABEL_GROUP + j < last:
                prefetch(&t.proxies[m.proxies[m.order[base + LABEL_GROUP + j]]])
            at[j] = t.proxies[m.proxies[m.order[base + j]]].parent
            mark[j] = 0
            if at[j] != NULL_REF:
                prefetch(&m.marks[at[j]])
                prefetch(&t.parents[at[j]])
        climbing = count
        while climbing:
            climbing = 0
            for j in range(count):
                if at[j] == NULL_REF:
                    continue
                mark[j] = m.marks[at[j]]
                if mark[j]:
                    at[j] = NULL_REF
                    continue
                at[j] = t.parents[at[j]]
                if at[j] != NULL_REF:
                    prefetch(&m.marks[at[j]])
                    prefetch(&t.parents[at[j]])
                    climbing += 1
        for j in range(count):
            label = NO_SPLIT if mark[j] == 0 or mark[j] == NO_SPLIT else mark[j] - 1
            if label != NO_SPLIT:
                m.counts[part * MAX_SPLITS + label] += 1
            m.labels[base + j] = label
        base += count


cdef void deal_moves_part(void *context, int part) noexcept nogil:
    cdef SplitMoves *m = <SplitMoves *>context
    cdef int64_t i, first = m.n * part // m.parts, last = m.n * (part + 1) // m.parts
    cdef int64_t *at = m.counts + part * MAX_SPLITS
    for i in range(first, last):
        if m.labels[i] != NO_SPLIT:
            m.dealt[at[m.labels[i]]] = m.order[i]
            at[m.labels[i]] += 1


cdef bint move_row(SplitMoves *m, int64_t row, bint below, bint first) noexcept nogil:
    """One row's move: inside its subtree (False when it must wait for the last pass), or anywhere.
    On its `first` visit it keeps the row's old tight box and, for a broadphase, marks the proxy."""
    cdef TreeCore *t = m.t
    cdef int32_t proxy = m.proxies[row], dims = t.dims
    cdef Proxy *p = &t.proxies[proxy]
    cdef float tight[6]
    cdef float fat[6]
    cdef bint refat
    load_box(m.rows + 2 * dims * row, dims, tight)
    refat = not box_contains(p.fat, tight)
    if first:
        if m.before != NULL:
            store_box(p.tight, dims, m.before + 2 * dims * row)
        m.refat[row] = refat
        if m.mark_moved:
            m.refat[row] |= 0 if p.flags & PROXY_MOVED else NEWLY_MOVED
            p.flags |= PROXY_MOVED | (PROXY_REFAT if refat else 0)
    if not refat:
        memcpy(p.tight, tight, 6 * sizeof(float))
        return True
    moved_fat(t, proxy, tight, m.prediction, fat)
    if not below:
        core_place(t, proxy, tight, fat)
        return True
    return place_below(t, proxy, tight, fat, m.marks)


cdef void move_split_part(void *context, int part) noexcept nogil:
    cdef SplitMoves *m = <SplitMoves *>context
    cdef int split = counter_take(&m.next)
    cdef int64_t e, count
    cdef const int64_t *rows
    while split < m.splits:
        rows = m.dealt + m.starts[split]
        count = m.starts[split + 1] - m.starts[split]
        for e in range(count):
            prefetch_move(m.t, m.proxies, rows, e, count)
            m.deferred[rows[e]] = 0 if move_row(m, rows[e], True, True) else LATER
        split = counter_take(&m.next)


cdef int core_move_split(TreeCore *t, const int32_t *proxies, const int64_t *order, const float *rows,
                         float *before, uint8_t *refat, bint mark_moved, int64_t n, float prediction,
                         int threads) noexcept nogil:
    """Move n proxies (none of them sensors) as above; refat[row] & 1 tells which left their fat box.
    With `mark_moved`, the proxies get PROXY_MOVED (and PROXY_REFAT when they left their fat box),
    and refat[row] & NEWLY_MOVED tells which had no PROXY_MOVED before. Returns -1, with nothing
    changed, when memory for the bookkeeping ran out."""
    cdef SplitMoves m
    cdef int32_t level[2 * MAX_SPLITS]
    cdef int32_t tops[MAX_SPLITS]
    cdef int32_t node
    cdef int count = 1, next_count, top_count = 0, depth, k, split, part
    cdef int64_t i, total = 0, c
    m.t, m.proxies, m.order, m.rows, m.before = t, proxies, order, rows, before
    m.refat, m.mark_moved = refat, mark_moved
    m.prediction, m.n, m.parts, m.splits = prediction, n, threads, 0
    m.marks = <uint8_t *>calloc(t.node_capacity, sizeof(uint8_t))
    m.labels = <uint8_t *>malloc(n * sizeof(uint8_t))
    m.deferred = <uint8_t *>calloc(n, sizeof(uint8_t))
    m.counts = <int64_t *>calloc(threads * MAX_SPLITS, sizeof(int64_t))
    m.dealt = <int64_t *>malloc(n * sizeof(int64_t))
    if m.marks == NULL or m.labels == NULL or m.deferred == NULL or m.counts == NULL or m.dealt == NULL:
        free(m.marks); free(m.labels); free(m.deferred); free(m.counts); free(m.dealt)
        return -1
    wide_stale(t)
    # Stage 1: the subtrees' roots, the internal nodes SPLIT_DEPTH levels down; the nodes above them.
    level[0] = subtree_root(t, False)
    for depth in range(SPLIT_DEPTH):
        next_count = 0
        for k in range(count):
            node = level[k]
            if node >= 0:
                tops[top_count] = node
                top_count += 1
                level[MAX_SPLITS + next_count] = t.nodes[node].child[0]
                level[MAX_SPLITS + next_count + 1] = t.nodes[node].child[1]
                next_count += 2
        memcpy(level, level + MAX_SPLITS, next_count * sizeof(int32_t))
        count = next_count
    for k in range(top_count):
        m.marks[tops[k]] = NO_SPLIT
    for k in range(count):
        if level[k] >= 0:
            m.marks[level[k]] = <uint8_t>(1 + m.splits)
            m.roots[m.splits] = level[k]
            m.splits += 1
    if threads == 1:
        # Stage 2, on one thread: the rows in the batch's order, each kept inside its subtree. Edits
        # in different subtrees touch different nodes, so this makes the tree the threads make.
        for i in range(n):
            prefetch_move(t, proxies, order, i, n)
            m.deferred[order[i]] = 0 if move_row(&m, order[i], True, True) else LATER
    else:
        # Stage 2: each row's subtree, and the rows dealt by subtree, keeping the batch's order.
        m.leaf_split = NULL
        if n * LABEL_DOWN_SHARE >= t.proxy_count:
            m.leaf_split = <uint8_t *>malloc(max(t.proxy_capacity, 1) * sizeof(uint8_t))
            counter_set(&m.failed, 0 if m.leaf_split != NULL else 1)
            if m.leaf_split != NULL:
                memset(m.leaf_split, NO_SPLIT, t.proxy_capacity * sizeof(uint8_t))
                run_parts(leaf_split_part, &m, m.parts)
            if counter_get(&m.failed):
                free(m.leaf_split); free(m.marks); free(m.labels); free(m.deferred); free(m.counts); free(m.dealt)
                return -1
        run_parts(label_part, &m, m.parts)
        free(m.leaf_split)
        for split in range(m.splits):
            m.starts[split] = total
            for part in range(m.parts):
                c = m.counts[part * MAX_SPLITS + split]
                m.counts[part * MAX_SPLITS + split] = total
                total += c
        m.starts[m.splits] = total
        run_parts(deal_moves_part, &m, m.parts)
        # Stage 3: the subtrees' moves, the threads taking subtrees in turn. A row whose leaf hangs
        # above the subtrees waits for the last pass, as one thread's would.
        counter_set(&m.next, 0)
        run_parts(move_split_part, &m, min(threads, max(m.splits, 1)))
        for i in range(n):
            if m.labels[i] == NO_SPLIT:
                m.deferred[order[i]] = UNVISITED
    # Stage 4: the nodes above the subtrees, children before parents; then the rest, in order.
    k = top_count - 1
    while k >= 0:
        refit(t, tops[k])
        k -= 1
    for i in range(n):
        if m.deferred[order[i]]:
            move_row(&m, order[i], False, m.deferred[order[i]] == UNVISITED)
    free(m.marks); free(m.labels); free(m.deferred); free(m.counts); free(m.dealt)
    return 0




# ---------------------------------------------------------------------------------------------
# Sensors in a subtree of their own.

cdef void core_set_sensor(TreeCore *t, int32_t proxy, uint32_t flag) noexcept nogil:
    """Make a proxy a sensor (`flag`: PROXY_SENSOR_BOX or PROXY_SENSOR_SPHERE): its leaf moves to
    the sensors' subtree."""
    remove_leaf(t, proxy)
    t.proxies[proxy].flags |= flag
    insert_leaf(t, proxy, t.root)


cdef int core_split_sensors(TreeCore *t) noexcept nogil:
    """After loading a checked tree, find its sensors' subtree: the root's child 1 (or the root) when
    it holds every sensor and nothing else; otherwise (data saved before sensors had a subtree of
    their own) make it, moving each sensor's leaf there."""
    cdef int64_t sensors = 0, rest = 0, found = 0, top = 0
    cdef int32_t p, ref, candidate = NULL_REF
    cdef int32_t *stack
    for p in range(t.proxy_capacity):
        if t.proxies[p].flags & PROXY_LIVE:
            if t.proxies[p].flags & PROXY_SENSOR:
                sensors += 1
            else:
                rest += 1
    t.sensor_root = NULL_REF
    if sensors == 0:
        return 0
    if rest == 0:
        candidate = t.root
    elif t.root >= 0:
        candidate = t.nodes[t.root].child[1]
    stack = <int32_t *>malloc((t.node_count + 1) * sizeof(int32_t))
    if stack == NULL:
        return -1
    stack[0] = candidate
    top = 1
    while top and candidate != NULL_REF:
        top -= 1
        ref = stack[top]
        if ref < 0:
            found += 1 if t.proxies[~ref].flags & PROXY_SENSOR else sensors + 1
        else:
            stack[top] = t.nodes[ref].child[0]
            stack[top + 1] = t.nodes[ref].child[1]
            top += 2
    free(stack)
    if found == sensors:
        t.sensor_root = candidate
        return 0
    for p in range(t.proxy_capacity):
        if (t.proxies[p].flags & (PROXY_LIVE | PROXY_SENSOR)) > PROXY_LIVE:
            remove_leaf(t, p)
    for p in range(t.proxy_capacity):
        if (t.proxies[p].flags & (PROXY_LIVE | PROXY_SENSOR)) > PROXY_LIVE:
            insert_leaf(t, p, t.root)
    return 0


# ---------------------------------------------------------------------------------------------
# The walker. Exactness: leaves are tested on their tight boxes with the same float64 arithmetic
# as dbvt.reference; node tests use the same formulas on boxes that contain those tight boxes, and
# rounding is monotone, so a node test never rejects a subtree holding a hit, and a node found
# wholly inside the query volume only holds hits.

cdef inline bint segment_hits(const Query *q, const float *b, double *entry) noexcept nogil:
    """Slab test of the closed segment against a closed box; the entry fraction is clamped to 0."""
    cdef double tmin = -INFINITY
    cdef double tmax = INFINITY
    cdef double t1, t2
    cdef int i
    for i in range(3):
        if q.delta[i] == 0.0:
            if q.origin[i] < b[i] or q.origin[i] > b[i + 3]:
                return False
        else:
            t1 = (b[i] - q.origin[i]) * q.inv_delta[i]
            t2 = (b[i + 3] - q.origin[i]) * q.inv_delta[i]
            if t1 > t2:
                t1, t2 = t2, t1
            if t1 > tmin:
                tmin = t1
            if t2 < tmax:
                tmax = t2
    if tmin > tmax or tmax < 0.0 or tmin > 1.0:
        return False
    entry[0] = tmin if tmin > 0.0 else 0.0
    return True


cdef inline double plane_max(const double *plane, const float *b) noexcept nogil:
    """n.p + d at the box's p-vertex (the corner furthest along n), summed in a fixed order."""
    return ((plane[0] * (b[3] if plane[0] >= 0.0 else b[0])
             + plane[1] * (b[4] if plane[1] >= 0.0 else b[1]))
            + plane[2] * (b[5] if plane[2] >= 0.0 else b[2])) + plane[3]


cdef inline double plane_min(const double *plane, const float *b) noexcept nogil:
    return ((plane[0] * (b[0] if plane[0] >= 0.0 else b[3])
             + plane[1] * (b[1] if plane[1] >= 0.0 else b[4]))
            + plane[2] * (b[2] if plane[2] >= 0.0 else b[5])) + plane[3]


cdef inline double sphere_gap(const Query *q, const float *b) noexcept nogil:
    """Squared distance from the centre to the box's closest point."""
    cdef double gap = 0.0, c, d
    cdef int i
    for i in range(3):
        c = q.center[i]
        if c < b[i]:
            d = b[i] - c
        elif c > b[i + 3]:
            d = c - b[i + 3]
        else:
            d = 0.0
        gap += d * d
    return gap


cdef inline double sphere_reach(const Query *q, const float *b) noexcept nogil:
    """Squared distance from the centre to the box's furthest corner."""
    cdef double reach = 0.0, lo, hi
    cdef int i
    for i in range(3):
        lo = q.center[i] - b[i]
        hi = b[i + 3] - q.center[i]
        lo = lo if lo > hi else hi
        reach += lo * lo
    return reach


cdef inline double ball_far_sq(const double *centre, const float *b) noexcept nogil:
    """Squared distance from `centre` to the box's furthest corner, rounded as ball_gap_sq rounds: no
    point of the box, nor of a box inside it, is farther by ball_gap_sq."""
    cdef double far = 0.0, gap
    cdef int i
    for i in range(3):
        gap = above(<double>b[i + 3] - centre[i], centre[i] - <double>b[i])
        far += gap * gap
    return far


# The kind of a query is a type, so each walk is compiled once per kind with its predicates inlined
# and no per-node dispatch.
ctypedef struct BoxKind:
    char unused
ctypedef struct SphereKind:
    char unused
ctypedef struct RayKind:
    char unused
ctypedef struct FrustumKind:
    char unused
ctypedef struct FatBoxKind:         # a box against the leaves' fat boxes: the broadphase's candidates
    char unused
ctypedef struct FatBallKind:        # a sphere sensor's candidates: its reach's ball, not its whole box
    char unused
ctypedef struct PacketKind:         # up to eight fat boxes at once, a lane each (see Packet)
    char unused

ctypedef fused Kind:
    BoxKind
    SphereKind
    RayKind
    FrustumKind
    FatBoxKind
    FatBallKind
    PacketKind


cdef inline bint classify_node(const Kind *kind, const Query *q, const float *box, uint32_t *pending) noexcept nogil:
    """False when the node can hold no hit; clears `pending` when all it holds are hits."""
    cdef double entry
    cdef uint32_t bits
    cdef int j
    if Kind is PacketKind:
        # `pending` holds the lanes still walking: those whose box meets this node's.
        pending[0] &= packet_meet(q.packet, box)
        return pending[0] != 0
    elif Kind is BoxKind or Kind is FatBoxKind:
        if not meet(q.box, box):
            return False
        if holds(q.box, box):
            pending[0] = 0
        return True
    elif Kind is FatBallKind:
        # Pruned by the same gap its leaves are tested with: a leaf's gap is no less than its node's.
        if not meet(q.box, box) or ball_gap_sq(q.center, box, 3) > q.radius_sq:
            return False
        if holds(q.box, box) and ball_far_sq(q.center, box) <= q.radius_sq:
            pending[0] = 0
        return True
    elif Kind is SphereKind:
        if sphere_gap(q, box) > q.radius_sq:
            return False
        if sphere_reach(q, box) <= q.radius_sq:
            pending[0] = 0
        return True
    elif Kind is RayKind:
        if not segment_hits(q, box, &entry):
            return False
        return not (q.first_hit and entry > q.best_fraction)
    else:
        bits = pending[0]
        for j in range(q.plane_count):
            if bits & (<uint32_t>1 << j):
                if plane_max(q.planes[j], box) < 0.0:
                    return False
                if plane_min(q.planes[j], box) >= 0.0:
                    bits &= ~(<uint32_t>1 << j)
        pending[0] = bits
        return True


cdef inline bint test_leaf(const Kind *kind, const Query *q, const Proxy *leaf, uint32_t pending,
                           double *fraction) noexcept nogil:
    cdef int j
    cdef const float *tight = leaf.tight
    if Kind is FatBoxKind:
        return meet(q.box, leaf.fat)
    elif Kind is FatBallKind:
        return meet(q.box, leaf.fat) and ball_gap_sq(q.center, leaf.fat, 3) <= q.radius_sq
    elif Kind is BoxKind:
        return meet(q.box, tight)
    elif Kind is SphereKind:
        return sphere_gap(q, tight) <= q.radius_sq
    elif Kind is RayKind:
        return segment_hits(q, tight, fraction) and not (q.first_hit and fraction[0] > q.best_fraction)
    else:
        for j in range(q.plane_count):
            if (pending & (<uint32_t>1 << j)) and plane_max(q.planes[j], tight) < 0.0:
                return False
        return True


cdef int grow_array(void **items, int64_t *capacity, int64_t need, size_t size) noexcept nogil:
    """Room for `need` items of `size` bytes in a realloc'd array, at least doubling it (from 64)."""
    cdef int64_t more
    cdef void *grown
    if need <= capacity[0]:
        return 0
    more = max(need, 2 * capacity[0], 64)
    grown = realloc(items[0], more * size)
    if grown == NULL:
        return -1
    items[0] = grown
    capacity[0] = more
    return 0


cdef int hits_push(Hits *hits, int32_t proxy, double fraction) noexcept nogil:
    cdef int64_t capacity
    cdef int32_t *proxies
    cdef double *fractions
    if hits.count == hits.capacity:
        capacity = 2 * hits.capacity if hits.capacity else 64
        proxies = <int32_t *>realloc(hits.proxies, capacity * sizeof(int32_t))
        if proxies == NULL:
            return -1
        hits.proxies = proxies
        fractions = <double *>realloc(hits.fractions, capacity * sizeof(double))
        if fractions == NULL:
            return -1
        hits.fractions = fractions
        hits.capacity = capacity
    hits.proxies[hits.count] = proxy
    hits.fractions[hits.count] = fraction
    hits.count += 1
    return 0


cdef void stack_free(Stack *stack) noexcept nogil:
    free(stack.entries)
    stack.entries = NULL
    stack.count = stack.capacity = 0


cdef void hits_free(Hits *hits) noexcept nogil:
    free(hits.proxies)
    free(hits.fractions)
    hits.proxies = NULL
    hits.fractions = NULL
    hits.count = hits.capacity = 0


cdef int walk_kind(const Kind *kind, const TreeCore *t, Query *q, Stack *stack, Hits *hits) noexcept nogil:
    cdef StackEntry entry
    cdef int32_t proxy
    cdef uint32_t pending = 1
    cdef double fraction
    cdef int32_t root = subtree_root(t, False) if q.skip_flags & PROXY_SENSOR else t.root
    if Kind is FrustumKind:
        pending = <uint32_t>0xFFFFFFFF if q.plane_count == 32 else (<uint32_t>1 << q.plane_count) - 1
    elif Kind is PacketKind:
        pending = q.lanes
    stack.count = 0
    if root == NULL_REF:
        return 0
    if stack_push(stack, root, pending) != 0:
        return -1
    while stack.count:
        stack.count -= 1
        entry = stack.entries[stack.count]
        if entry.ref < 0:
            proxy = ~entry.ref
            if (t.proxies[proxy].flags & q.skip_flags) or (q.groups != NULL and (q.groups[proxy] & q.mask) == 0):
                continue
            if Kind is PacketKind:
                # A lane's hits go to its own list: `hits` holds one a lane.
                pending = packet_meet(q.packet, t.proxies[proxy].fat) & entry.pending
                while pending:
                    if hits_push(&hits[lowest_lane(pending)], proxy, 0.0) != 0:
                        return -1
                    pending &= pending - 1
                continue
            fraction = 0.0
            if entry.pending == 0 or test_leaf(kind, q, &t.proxies[proxy], entry.pending, &fraction):
                if hits_push(hits, proxy, fraction) != 0:
                    return -1
                if Kind is RayKind:
                    if q.first_hit and fraction < q.best_fraction:
                        q.best_fraction = fraction
            continue
        pending = entry.pending
        if pending and not classify_node(kind, q, t.nodes[entry.ref].box, &pending):
            continue
        if (stack_push(stack, t.nodes[entry.ref].child[1], pending) != 0
                or stack_push(stack, t.nodes[entry.ref].child[0], pending) != 0):
            return -1
    return 0


cdef int walk(const TreeCore *t, Query *q, Stack *stack, Hits *hits) noexcept nogil:
    """Append to `hits` every proxy whose tight box the query touches (and whose group passes the
    mask); for the broadphase's kinds, whose fat box. One walker serves every query kind.
    QUERY_FAT_PACKET walks its lanes together, each node tested once for all: neighbours' walks go
    down mostly the same paths (in a dense scene eight visit a third of the nodes they would one by
    one), and `hits` holds a list a lane, each getting what a QUERY_FAT_BOX walk of its box gets."""
    if q.kind == QUERY_BOX:
        return walk_kind(<BoxKind *>NULL, t, q, stack, hits)
    if q.kind == QUERY_SPHERE:
        return walk_kind(<SphereKind *>NULL, t, q, stack, hits)
    if q.kind == QUERY_RAY:
        return walk_kind(<RayKind *>NULL, t, q, stack, hits)
    if q.kind == QUERY_FAT_BOX:
        return walk_kind(<FatBoxKind *>NULL, t, q, stack, hits)
    if q.kind == QUERY_FAT_BALL:
        return walk_kind(<FatBallKind *>NULL, t, q, stack, hits)
    if q.kind == QUERY_FAT_PACKET:
        return walk_kind(<PacketKind *>NULL, t, q, stack, hits)
    return walk_kind(<FrustumKind *>NULL, t, q, stack, hits)
