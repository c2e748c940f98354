# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The tree's invariants and its measures of quality and size, for validate() and stats(), apart from
the structure's own code in _core; and the broadphase's partner lists' invariants.

core_check also runs on data from from_bytes(), so every index is range-checked before use.
"""
from libc.float cimport FLT_MAX
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from dbvt._batch cimport each_overlap
from dbvt._core cimport (
    NULL_REF, PROXY_LIVE, PROXY_SENSOR, PROXY_SENSOR_SPHERE, QUERY_FAT_BOX, Node, Proxy, Quad, TreeCore, box_contains,
    box_cost, boxes_overlap, core_find, listed_allowed, ref_box, ref_height, ref_parent, union_box,
)
from dbvt._finding cimport reach_allows
from dbvt._partners cimport INLINE_PARTNERS, TOUCHING, Partners, budgets_of, items_of, partners_find, tight_overlap
from dbvt._sensors cimport Shape, ball_holds, grow_outward, shape_of, shape_touches


cdef const char *core_check(const TreeCore *t, bint sensors_apart) noexcept nogil:
    """The first broken invariant, or NULL; with `sensors_apart`, also that the sensors' leaves are
    alone in their subtree (on data just loaded, core_split_sensors() finds or makes it after)."""
    cdef int64_t live = 0, free_count = 0, leaves = 0, internal = 0, visited = 0, sensors = 0
    cdef int64_t used_slots = 0, limit
    cdef int32_t i, ref, child, k
    cdef int32_t *stack
    cdef int64_t top = 0
    cdef Node *node
    cdef const char *problem = NULL
    cdef float box[6]
    for i in range(t.proxy_capacity):
        if t.proxies[i].flags & PROXY_LIVE:
            live += 1
            sensors += (t.proxies[i].flags & PROXY_SENSOR) != 0
            for k in range(3):
                if not (t.proxies[i].tight[k] <= t.proxies[i].tight[k + 3]):
                    return b"a tight box has min > max"
                if not (-FLT_MAX <= t.proxies[i].fat[k] and t.proxies[i].fat[k + 3] <= FLT_MAX):
                    return b"a box is not finite"
            if not box_contains(t.proxies[i].fat, t.proxies[i].tight):
                return b"a fat box does not contain its tight box"
            if t.dims == 2 and not (t.proxies[i].tight[2] == t.proxies[i].tight[5] == t.proxies[i].fat[2]
                                    == t.proxies[i].fat[5] == 0.0):
                return b"a box of a 2-D tree has a z extent"
            if core_find(t, t.proxies[i].id) != i:
                return b"the id table does not find a live proxy"
    if live != t.proxy_count:
        return b"the proxy count disagrees with the live proxies"
    if t.slots != NULL:
        for limit in range(t.slot_mask + 1):
            if t.slots[limit] >= 0:
                used_slots += 1
                if t.slots[limit] >= t.proxy_capacity or not (t.proxies[t.slots[limit]].flags & PROXY_LIVE):
                    return b"the id table names a free proxy"
    if used_slots != live:
        return b"the id table holds a different number of proxies"
    ref = t.free_proxy
    while ref != NULL_REF:
        if ref < 0 or ref >= t.proxy_capacity or t.proxies[ref].flags != 0 or free_count > t.proxy_capacity:
            return b"the proxy free list is broken"
        free_count += 1
        ref = t.proxies[ref].parent
    if free_count + live != t.proxy_capacity:
        return b"the proxy free list misses free proxies"
    free_count = 0
    ref = t.free_node
    while ref != NULL_REF:
        if ref < 0 or ref >= t.node_capacity or t.heights[ref] != -1 or free_count > t.node_capacity:
            return b"the node free list is broken"
        free_count += 1
        ref = t.parents[ref]
    if free_count + t.node_count != t.node_capacity:
        return b"the node free list misses free nodes"
    if t.root == NULL_REF:
        if live or t.node_count:
            return b"an empty tree holds proxies or nodes"
        return NULL

    limit = <int64_t>t.node_capacity + t.proxy_capacity + 1
    stack = <int32_t *>malloc(limit * sizeof(int32_t))
    if stack == NULL:
        return b"out of memory while validating"
    stack[0] = t.root
    top = 1
    if not ((t.root >= 0 and t.root < t.node_capacity and t.parents[t.root] == NULL_REF)
            or (t.root < 0 and ~t.root < t.proxy_capacity and t.proxies[~t.root].parent == NULL_REF)):
        problem = b"the root is out of range or has a parent"
    while top and problem == NULL:
        top -= 1
        ref = stack[top]
        visited += 1
        if visited > limit:
            problem = b"the tree has a cycle"
            break
        if ref < 0:
            if not (t.proxies[~ref].flags & PROXY_LIVE):
                problem = b"a leaf names a free proxy"
            leaves += 1
            continue
        node = &t.nodes[ref]
        internal += 1
        if t.heights[ref] < 1:
            problem = b"an internal node is free or has height < 1"
            break
        for k in range(2):
            child = node.child[k]
            if child >= t.node_capacity or (child < 0 and ~child >= t.proxy_capacity):
                problem = b"a child reference is out of range"
                break
            if ref_parent(t, child) != ref:
                problem = b"a child does not point back to its parent"
                break
            if not box_contains(node.box, ref_box(t, child)):
                problem = b"a node box does not contain its child's box"
                break
            if top >= limit:
                problem = b"the tree has a cycle"
                break
            stack[top] = child
            top += 1
        if problem == NULL:
            union_box(box, ref_box(t, node.child[0]), ref_box(t, node.child[1]))
            if not box_contains(box, node.box):
                problem = b"a node box is larger than its children's"
        if problem == NULL and t.heights[ref] != 1 + max(ref_height(t, node.child[0]), ref_height(t, node.child[1])):
            problem = b"a node height is wrong"
        if problem == NULL and t.costs[ref] != box_cost(node.box, t.dims == 2):
            problem = b"a node's cached SAH cost is stale"
    if sensors_apart and problem == NULL and t.sensor_root != NULL_REF:
        if t.sensor_root != t.root and not (t.root >= 0 and t.nodes[t.root].child[1] == t.sensor_root):
            problem = b"the sensors' subtree is not the root or its second child"
        stack[0] = t.sensor_root
        top = 1
        while top and problem == NULL:
            top -= 1
            ref = stack[top]
            if ref >= 0:
                stack[top] = t.nodes[ref].child[0]
                stack[top + 1] = t.nodes[ref].child[1]
                top += 2
            elif t.proxies[~ref].flags & PROXY_SENSOR:
                sensors -= 1
            else:
                problem = b"a proxy that is not a sensor is in the sensors' subtree"
    free(stack)
    if problem != NULL:
        return problem
    if sensors_apart and sensors:
        return b"a sensor is outside the sensors' subtree"
    if leaves != live:
        return b"the tree does not hold every live proxy exactly once"
    if internal != t.node_count:
        return b"the tree does not use every allocated node"
    return NULL


cdef double core_area_ratio(const TreeCore *t) noexcept nogil:
    cdef double total = 0.0, root
    cdef int32_t i
    cdef bint planar = t.dims == 2
    if t.root == NULL_REF:
        return 0.0
    root = box_cost(ref_box(t, t.root), planar)
    for i in range(t.node_capacity):
        if t.heights[i] > 0:
            total += box_cost(t.nodes[i].box, planar)
    return total / root if root > 0.0 else 0.0


cdef int32_t core_height(const TreeCore *t) noexcept nogil:
    return ref_height(t, t.root) if t.root != NULL_REF else 0


cdef int64_t core_memory(const TreeCore *t) noexcept nogil:
    return (<int64_t>t.node_capacity * (sizeof(Node) + 2 * sizeof(int32_t) + sizeof(float))
            + <int64_t>t.proxy_capacity * sizeof(Proxy)
            + (t.slot_mask + 1) * sizeof(int32_t)
            + <int64_t>t.wide.quad_capacity * sizeof(Quad)
            + <int64_t>t.wide.leaf_capacity * (sizeof(uint64_t) + sizeof(int32_t)))


# ---------------------------------------------------------------------------------------------
# The broadphase's partner lists (Broadphase.validate, which compares the counts with its own).

cdef const char *partners_check(const TreeCore *t, const Partners *partners, int32_t slots, const uint32_t *groups,
                                const uint32_t *masks, const double *drift, double sensor_margin, bint settled,
                                ListCounts *counts) noexcept nogil:
    """The first broken invariant of the lists, or NULL: sorted, symmetric with the same touching bit,
    between live proxies that may pair; a sensor's reach holding its grown shape; each sensor pair
    that a re-test would pass over (its budget not yet reached) decided as a test would decide it;
    when `settled` (nothing pending), every bit as a test would set it and every pair within reach."""
    cdef int32_t proxy, other, k, entry
    cdef const int32_t *theirs
    cdef const int32_t *items
    cdef const double *budgets
    cdef const Partners *mine
    cdef bint sensor, touches
    cdef int holds
    cdef float reach[6]
    cdef Shape shape
    memset(counts, 0, sizeof(ListCounts))
    for proxy in range(slots):
        mine = &partners[proxy]
        if not (t.proxies[proxy].flags & PROXY_LIVE):
            if mine.count:
                return b"a free proxy has partners"
            continue
        sensor = (t.proxies[proxy].flags & PROXY_SENSOR) != 0
        budgets = NULL
        if sensor:
            counts.sensors += 1
            grow_outward(t.proxies[proxy].tight, reach, sensor_margin, t.dims)
            holds = ball_holds(t.proxies[proxy].fat, t.proxies[proxy].tight, t.dims, sensor_margin)
            if not (t.proxies[proxy].flags & PROXY_SENSOR_SPHERE):
                holds = -1
            if holds == 0 or (holds == -1 and not box_contains(t.proxies[proxy].fat, reach)):
                return b"a sensor's reach does not hold its grown shape"
            shape_of(&shape, t.proxies[proxy].tight, t.proxies[proxy].flags, t.dims, sensor_margin)
            budgets = budgets_of(mine)
        if mine.capacity < INLINE_PARTNERS or mine.count > mine.capacity:
            return b"a partner list holds more than its capacity"
        items = items_of(mine)
        for k in range(mine.count):
            entry = items[k]
            other = entry >> 1
            if other < 0 or other >= slots or not (t.proxies[other].flags & PROXY_LIVE):
                return b"a partner is not a live proxy"
            if k and (items[k - 1] >> 1) >= other:
                return b"a partner list is not sorted"
            if not listed_allowed(t, groups, masks, proxy, other):
                return b"a pair the filter forbids"
            theirs = partners_find(&partners[other], proxy)
            if theirs == NULL or (theirs[0] & TOUCHING) != (entry & TOUCHING):
                return b"a pair is listed differently on its two sides"
            if sensor:
                counts.sensor_entries += 1
                counts.inside += entry & TOUCHING
                touches = shape_touches(&shape, t.proxies[other].tight, entry & TOUCHING, NULL)
                if settled and (entry & TOUCHING) != touches:
                    return b"a sensor pair is inside where it must not be"
                if budgets != NULL and drift[proxy] + drift[other] < budgets[k] and (entry & TOUCHING) != touches:
                    return b"a sensor pair's budget outlasts its decision"
            elif t.proxies[other].flags & PROXY_SENSOR:
                counts.sensor_entries += 1
            elif settled and (entry & TOUCHING) != tight_overlap(t, proxy, other):
                return b"a touching bit disagrees with the tight boxes"
            if settled and not (boxes_overlap(t.proxies[proxy].fat, t.proxies[other].fat)
                                and reach_allows(t, proxy, other)):
                return b"listed partners are not within reach"
            counts.listed += 1
            if not (sensor or (t.proxies[other].flags & PROXY_SENSOR)):
                counts.touching += entry & TOUCHING
    return NULL


ctypedef struct FatPairs:           # fat_pairs_count's visit: the filter, and the count
    const TreeCore *t
    const uint32_t *groups
    const uint32_t *masks
    int64_t count


cdef int count_listed(void *context, int32_t a, int32_t b) noexcept nogil:
    cdef FatPairs *f = <FatPairs *>context
    f.count += listed_allowed(f.t, f.groups, f.masks, a, b) and reach_allows(f.t, a, b)
    return 0


cdef int64_t fat_pairs_count(const TreeCore *t, const uint32_t *groups, const uint32_t *masks) noexcept nogil:
    """The pairs of live proxies whose fat boxes overlap within reach and may pair, by a walk for
    each: what the lists hold when nothing is pending. -1 when memory ran out."""
    cdef FatPairs f
    f.t, f.groups, f.masks, f.count = t, groups, masks, 0
    if each_overlap(t, QUERY_FAT_BOX, count_listed, &f) != 0:
        return -1
    return f.count
