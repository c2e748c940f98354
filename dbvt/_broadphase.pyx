# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""`dbvt.Broadphase`: a Tree that remembers which proxies overlap and reports what changed.

As in Box2D, each proxy keeps a sorted list of the proxies whose *fat* boxes overlap its own, each
marked with whether the *tight* boxes touch. Fat boxes only change when a tight box leaves its own,
so an update() queries the tree only for those proxies; every other moved proxy just re-tests its
few listed partners' tight boxes. A destroy touches only that proxy's list.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset

import math
import struct

import numpy as np

from dbvt import validation

from dbvt._batch cimport pairs_free, pairs_push, self_pairs, sort_int32, sort_pairs
from dbvt._core cimport (
    PREFETCH_AHEAD, PROXY_LIVE, PROXY_MOVED, PROXY_REFAT, PROXY_STATIC, QUERY_FAT_BOX, Hits, IdPair, PairBuffer, Query,
    Stack, TreeCore, boxes_overlap, core_move, core_remove, core_reserve, hits_free, load_box, pair_allowed, prefetch,
    stack_free, walk,
)
from dbvt._tree cimport TreeBase, pair_array, prefetch_move

# pair tracking on, moved count, pending ended count, partner total
_STATE = struct.Struct("<qqqq")


cdef enum:
    TOUCHING = 1                    # the tight boxes overlap: the pair exists for the user
    INLINE_PARTNERS = 2
    FAT_LIMIT = 2                   # a status: update(max_fat_pairs=...) stopped at its limit


class FatPairLimit(Exception):
    """update(max_fat_pairs=...) stopped: the fat boxes' pairs passed the limit."""


# A proxy's partners are entries (partner proxy << 1) | TOUCHING, ascending by partner. Most proxies
# have at most two (W1: 90%), so up to INLINE_PARTNERS entries live in the list's header itself,
# where a heap list's pointer would be: no allocation, and one cache miss fewer per list read.
ctypedef union PartnerEntries:      # 8 bytes
    int32_t *heap                   # capacity > INLINE_PARTNERS: the entries, malloc'd
    int32_t local[INLINE_PARTNERS]  # capacity == INLINE_PARTNERS: the entries themselves

ctypedef struct Partners:           # one proxy's fat-box partners: 16 bytes
    PartnerEntries entries          # 8
    int32_t count                   # 4
    int32_t capacity                # 4: INLINE_PARTNERS while the entries are in `entries.local`


cdef inline int32_t *items_of(const Partners *p) noexcept nogil:
    """A list's entries. Inline ones are inside the Partners array: this pointer is stale once that
    array grows (_reserve) or the list outgrows its header (partners_reserve)."""
    if p.capacity == INLINE_PARTNERS:
        return <int32_t *>p.entries.local
    return p.entries.heap


cdef inline bint tight_overlap(const TreeCore *t, int32_t a, int32_t b) noexcept nogil:
    return boxes_overlap(t.proxies[a].tight, t.proxies[b].tight)


cdef inline int32_t *partners_find(const Partners *p, int32_t other) noexcept nogil:
    """The entry for `other` (binary search), or NULL."""
    cdef int32_t *items = items_of(p)
    cdef int32_t lo = 0, hi = p.count, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if (items[mid] >> 1) < other:
            lo = mid + 1
        else:
            hi = mid
    if lo < p.count and (items[lo] >> 1) == other:
        return &items[lo]
    return NULL


cdef int partners_reserve(Partners *p, int32_t capacity) noexcept nogil:
    cdef int32_t *items
    if capacity <= p.capacity:
        return 0
    if capacity < 2 * INLINE_PARTNERS:
        capacity = 2 * INLINE_PARTNERS
    if p.capacity == INLINE_PARTNERS:
        items = <int32_t *>malloc(capacity * sizeof(int32_t))
        if items == NULL:
            return -1
        memcpy(items, p.entries.local, p.count * sizeof(int32_t))
    else:
        items = <int32_t *>realloc(p.entries.heap, capacity * sizeof(int32_t))
        if items == NULL:
            return -1
    p.entries.heap = items
    p.capacity = capacity
    return 0


cdef int partners_insert(Partners *p, int32_t other) noexcept nogil:
    """Add `other`, not touching, keeping the list sorted."""
    cdef int32_t i
    cdef int32_t *items
    if p.count == p.capacity and partners_reserve(p, 2 * p.capacity) != 0:
        return -1
    items = items_of(p)
    i = p.count
    while i > 0 and (items[i - 1] >> 1) > other:
        items[i] = items[i - 1]
        i -= 1
    items[i] = other << 1
    p.count += 1
    return 0


cdef void partners_erase(Partners *p, int32_t other) noexcept nogil:
    cdef int32_t *items = items_of(p)
    cdef int32_t *entry = partners_find(p, other)
    cdef int32_t i
    if entry == NULL:
        return
    i = <int32_t>(entry - items)
    p.count -= 1
    while i < p.count:
        items[i] = items[i + 1]
        i += 1


cdef inline void prefetch_partners(const TreeCore *t, const Partners *partners, const int32_t *moved,
                                   int64_t m, int64_t count) noexcept nogil:
    """Before re-testing moved[m]: fetch, for moves further on, a partner list's header, then a heap
    list's entries, then the partners' proxies (misses in a row, each waiting for the one before)."""
    cdef const Partners *p
    cdef const int32_t *items
    cdef int32_t k
    if m + 3 * PREFETCH_AHEAD < count:
        prefetch(&partners[moved[m + 3 * PREFETCH_AHEAD]])
    if m + 2 * PREFETCH_AHEAD < count:
        p = &partners[moved[m + 2 * PREFETCH_AHEAD]]
        if p.capacity != INLINE_PARTNERS:
            prefetch(p.entries.heap)
    if m + PREFETCH_AHEAD < count:
        p = &partners[moved[m + PREFETCH_AHEAD]]
        items = items_of(p)
        for k in range(min(p.count, 4)):
            prefetch(&t.proxies[items[k] >> 1])


cdef int cancel_common(PairBuffer *begun, PairBuffer *ended) noexcept nogil:
    """Drop pairs reported both begun and ended (a proxy destroyed and re-created under the same id
    meets the same partner): across the update, that pair did not change."""
    cdef int64_t i = 0, j = 0, kb = 0, ke = 0
    sort_pairs(begun.pairs, begun.count)
    sort_pairs(ended.pairs, ended.count)
    while i < begun.count or j < ended.count:
        if j == ended.count or (i < begun.count and (
                begun.pairs[i].a < ended.pairs[j].a
                or (begun.pairs[i].a == ended.pairs[j].a and begun.pairs[i].b < ended.pairs[j].b))):
            begun.pairs[kb] = begun.pairs[i]
            kb += 1
            i += 1
        elif i == begun.count or (ended.pairs[j].a < begun.pairs[i].a
                or (ended.pairs[j].a == begun.pairs[i].a and ended.pairs[j].b < begun.pairs[i].b)):
            ended.pairs[ke] = ended.pairs[j]
            ke += 1
            j += 1
        else:
            i += 1
            j += 1
    begun.count = kb
    ended.count = ke
    return 0


cdef class Broadphase(TreeBase):
    """Proxies (static or dynamic, with collision group and mask) whose overlapping pairs are
    tracked: `update()` reports the pairs that began and ended since the previous call.

    A pair exists when the tight boxes overlap (closed intervals), `a.group & b.mask` and
    `b.group & a.mask` are both non-zero, and not both proxies are static.

    With `track_pairs=False` nothing is tracked: moves cost only the tree's work, `update()` reports
    no changes and `pairs()` is computed on demand. For worlds that are only ever queried.
    """
    cdef uint32_t *groups           # per proxy slot; all three arrays follow core.proxy_capacity
    cdef uint32_t *masks
    cdef Partners *partners
    cdef int32_t slot_capacity
    cdef int32_t *moved             # proxies flagged PROXY_MOVED since the last update()
    cdef int64_t moved_count
    cdef int64_t moved_capacity
    cdef PairBuffer ended           # pairs of destroyed proxies, reported by the next update()
    cdef readonly bint track_pairs
    cdef int64_t touching           # pairs whose tight boxes overlap now, kept as bits flip
    cdef int64_t listed             # entries of all partner lists: twice the pairs of fat boxes
    cdef int64_t listed_limit       # during update(max_fat_pairs=...): past it the update stops

    def __cinit__(self, *args, **kwargs):
        self.groups = NULL
        self.masks = NULL
        self.partners = NULL
        self.slot_capacity = 0
        self.moved = NULL
        self.moved_count = self.moved_capacity = 0
        memset(&self.ended, 0, sizeof(PairBuffer))
        self.touching = self.listed = 0
        self.listed_limit = -1

    def __init__(self, int dims=3, margin=0.05, track_pairs=True):
        self.core.dims = validation.check_dims(dims)
        self.core.margin = validation.check_margin(margin)
        self.track_pairs = bool(track_pairs)

    def __dealloc__(self):
        cdef int32_t i
        if self.partners != NULL:
            for i in range(self.slot_capacity):
                if self.partners[i].capacity != INLINE_PARTNERS:
                    free(self.partners[i].entries.heap)
        free(self.partners)
        free(self.groups)
        free(self.masks)
        free(self.moved)
        pairs_free(&self.ended)

    def __repr__(self):
        tracking = "" if self.track_pairs else ", track_pairs=False"
        return (f"dbvt.Broadphase(dims={self.core.dims}, margin={self.core.margin!r}{tracking})"
                f" with {len(self)} proxies")

    def __reduce__(self):
        return (type(self).from_bytes, (self.to_bytes(),))

    cdef int _reserve(self, int64_t extra_proxies, int64_t extra_moved) except -1:
        """Grow every pool a batch may touch before it starts, so a batch never fails half done."""
        cdef int32_t capacity, i
        cdef int64_t need = self.moved_count + extra_moved
        cdef int32_t *moved
        cdef void *grown
        if core_reserve(&self.core, extra_proxies) != 0:
            raise MemoryError()
        capacity = self.core.proxy_capacity
        if capacity > self.slot_capacity:
            grown = realloc(self.groups, capacity * sizeof(uint32_t))
            if grown == NULL:
                raise MemoryError()
            self.groups = <uint32_t *>grown
            grown = realloc(self.masks, capacity * sizeof(uint32_t))
            if grown == NULL:
                raise MemoryError()
            self.masks = <uint32_t *>grown
            grown = realloc(self.partners, capacity * sizeof(Partners))
            if grown == NULL:
                raise MemoryError()
            self.partners = <Partners *>grown      # inline entries moved with it
            for i in range(self.slot_capacity, capacity):
                self.groups[i] = self.masks[i] = 0
                self.partners[i].count = 0
                self.partners[i].capacity = INLINE_PARTNERS
            self.slot_capacity = capacity
        if need > self.moved_capacity:
            need = max(need, 2 * self.moved_capacity)
            moved = <int32_t *>realloc(self.moved, need * sizeof(int32_t))
            if moved == NULL:
                raise MemoryError()
            self.moved = moved
            self.moved_capacity = need
        return 0

    cdef inline void _mark_moved(self, int32_t proxy, bint refat) noexcept nogil:
        if not self.track_pairs:
            return
        if refat:
            self.core.proxies[proxy].flags |= PROXY_REFAT
        if not (self.core.proxies[proxy].flags & PROXY_MOVED):
            self.core.proxies[proxy].flags |= PROXY_MOVED
            self.moved[self.moved_count] = proxy
            self.moved_count += 1

    def create(self, ids, boxes, static=False, group=1, mask=0xFFFFFFFF):
        """Add proxies; their pairs begin at the next update(). `static`, `group` and `mask` are
        scalars or per-row arrays."""
        id_arr = validation.as_ids(ids)
        n = len(id_arr)
        box_arr = validation.as_boxes(boxes, self.core.dims, n)
        cdef const unsigned char[::1] statics = validation.as_flags(static, n, "static")
        cdef const uint32_t[::1] group_view = validation.as_uint32(group, n, "group")
        cdef const uint32_t[::1] mask_view = validation.as_uint32(mask, n, "mask")
        self._check_new(id_arr)
        self._reserve(n, n)
        cdef int32_t[::1] proxies = self._add(id_arr, box_arr)
        cdef Py_ssize_t i
        cdef int32_t proxy
        with nogil:
            for i in range(n):
                proxy = proxies[i]
                self.groups[proxy] = group_view[i]
                self.masks[proxy] = mask_view[i]
                if statics[i]:
                    self.core.proxies[proxy].flags |= PROXY_STATIC
                self._mark_moved(proxy, True)
        self._after_change()

    def move(self, ids, boxes, previous=None):
        """Give proxies new tight boxes; returns how many left their fat box (and got a new one).

        `previous`, a float32 array shaped as `boxes`, receives the tight boxes they had, for
        undoing the move (at no cost beyond the copy: the proxies are in hand anyway)."""
        id_arr = validation.as_ids(ids)
        cdef const float[:, ::1] rows = validation.as_boxes(boxes, self.core.dims, len(id_arr))
        proxy_arr = self._existing(id_arr)
        cdef int32_t[::1] proxies = proxy_arr
        # In proxy order, which follows the tree's after a build: neighbouring edits share paths.
        cdef int64_t[::1] order = np.argsort(proxy_arr)
        cdef Py_ssize_t n = proxies.shape[0], i, row, k
        cdef int64_t refattened = 0
        cdef bint refat
        cdef float box[6]
        cdef int32_t dims = self.core.dims
        cdef float[:, ::1] before = None
        cdef bint keep = previous is not None
        if keep:
            before = previous
            if before.shape[0] != n or before.shape[1] != 2 * dims:
                raise ValueError(f"previous must be ({n}, {2 * dims}) float32, got {np.shape(previous)}")
        self._reserve(0, n)
        with nogil:
            for i in range(n):
                prefetch_move(&self.core, &proxies[0], &order[0], i, n)
                row = order[i]
                if keep:
                    for k in range(dims):
                        before[row, k] = self.core.proxies[proxies[row]].tight[k]
                        before[row, dims + k] = self.core.proxies[proxies[row]].tight[3 + k]
                load_box(&rows[row, 0], self.core.dims, box)
                refat = core_move(&self.core, proxies[row], box)
                refattened += refat
                self._mark_moved(proxies[row], refat)
        self._after_change()
        return refattened

    def destroy(self, ids):
        """Remove proxies; their pairs are reported ended by the next update()."""
        cdef int32_t[::1] proxies = self._existing(validation.as_ids(ids))
        cdef Py_ssize_t n = proxies.shape[0], i
        cdef int32_t proxy, other, k
        cdef int32_t *items
        cdef int64_t total = 0
        cdef IdPair *grown
        for i in range(n):
            total += self.partners[proxies[i]].count    # an upper bound on the touching ones
        if self.ended.count + total > self.ended.capacity:
            grown = <IdPair *>realloc(self.ended.pairs, (self.ended.count + total) * sizeof(IdPair))
            if grown == NULL:
                raise MemoryError()
            self.ended.pairs = grown
            self.ended.capacity = self.ended.count + total
        with nogil:
            for i in range(n):
                proxy = proxies[i]
                items = items_of(&self.partners[proxy])
                for k in range(self.partners[proxy].count):
                    other = items[k] >> 1
                    partners_erase(&self.partners[other], proxy)
                    if items[k] & TOUCHING:
                        pairs_push(&self.ended, self.core.proxies[proxy].id, self.core.proxies[other].id)
                        self.touching -= 1
                self.listed -= 2 * self.partners[proxy].count
                self.partners[proxy].count = 0
                self.groups[proxy] = self.masks[proxy] = 0
                core_remove(&self.core, proxy)
        self._after_change()

    def settings(self, ids):
        """`(static, group, mask)` of `ids`: uint8, uint32 and uint32 arrays, as create() takes them."""
        cdef int32_t[::1] proxies = self._existing(validation.as_ids(ids))
        cdef Py_ssize_t n = proxies.shape[0], i
        static = np.empty(n, np.uint8)
        group = np.empty(n, np.uint32)
        mask = np.empty(n, np.uint32)
        for i in range(n):
            static[i] = (self.core.proxies[proxies[i]].flags & PROXY_STATIC) != 0
            group[i] = self.groups[proxies[i]]
            mask[i] = self.masks[proxies[i]]
        return static, group, mask

    @property
    def pair_count(self):
        """The pairs whose tight boxes overlap now (after the last update()); 0 without track_pairs."""
        return self.touching

    def update(self, max_fat_pairs=None):
        """`(begun, ended)`: `(m, 2)` uint64 pairs (rows a < b, sorted) that started and stopped
        overlapping since the previous update().

        With `max_fat_pairs`, the update stops as soon as the pairs of fat boxes (which the partner
        lists hold, and which bound the pairs that can begin) pass it, and raises FatPairLimit. A
        batch of boxes all on one spot would otherwise fill the memory before its first pair is
        counted. The broadphase is then part-way through the update, consistent but with changes
        still pending: undo the batch (move back, destroy the created, create the destroyed) and
        update() again to return to where it was."""
        cdef PairBuffer begun
        cdef PairBuffer ended = self.ended
        cdef int status
        self.listed_limit = -1 if max_fat_pairs is None else 2 * int(max_fat_pairs)
        memset(&begun, 0, sizeof(PairBuffer))
        memset(&self.ended, 0, sizeof(PairBuffer))
        with nogil:
            status = self._track(&begun, &ended)
            if status == 0:
                cancel_common(&begun, &ended)
        self.listed_limit = -1
        if status != 0:
            pairs_free(&begun)
            pairs_free(&ended)
            if status == FAT_LIMIT:
                raise FatPairLimit(f"more than {max_fat_pairs} pairs of fat boxes")
            raise MemoryError()
        self._after_change()
        return pair_array(&begun), pair_array(&ended)

    cdef int _track(self, PairBuffer *begun, PairBuffer *ended) noexcept nogil:
        """Stage 1 refreshes the fat partners of proxies with new fat boxes, stage 2 re-tests the tight
        boxes of every moved proxy against its partners; the flips are the events."""
        cdef int64_t m
        cdef int status = 0
        cdef Stack stack
        cdef Hits hits
        memset(&stack, 0, sizeof(Stack))
        memset(&hits, 0, sizeof(Hits))
        # Proxy numbers follow the tree's order after a build, so taking the moved proxies in
        # that order keeps consecutive queries on the same, cache-warm paths.
        sort_int32(self.moved, self.moved_count)
        for m in range(self.moved_count):
            if status == 0 and self.core.proxies[self.moved[m]].flags & PROXY_REFAT:
                status = self._refresh_partners(self.moved[m], &stack, &hits, ended)
        stack_free(&stack)
        hits_free(&hits)
        for m in range(self.moved_count):
            prefetch_partners(&self.core, self.partners, self.moved, m, self.moved_count)
            if status == 0:
                status = self._retest(self.moved[m], begun, ended)
        if status == 0:
            self.moved_count = 0
        return status

    cdef int _refresh_partners(self, int32_t proxy, Stack *stack, Hits *hits, PairBuffer *ended) noexcept nogil:
        """Replace the partner list of a proxy with a new fat box by the proxies that box overlaps."""
        cdef TreeCore *t = &self.core
        cdef Partners *mine = &self.partners[proxy]
        cdef int32_t *items = items_of(mine)
        cdef Query q
        cdef int64_t h, kept = 0
        cdef int32_t i = 0, j = 0, other, entry
        cdef int status = 0
        if (t.proxies[proxy].flags & PROXY_LIVE) == 0:
            return 0
        t.proxies[proxy].flags &= ~PROXY_REFAT
        q.kind = QUERY_FAT_BOX
        q.groups = NULL
        q.first_hit = False
        memcpy(q.box, t.proxies[proxy].fat, sizeof(q.box))
        hits.count = 0
        if walk(t, &q, stack, hits) != 0:
            return -1
        for h in range(hits.count):
            other = hits.proxies[h]
            if other != proxy and pair_allowed(t, self.groups, self.masks, proxy, other):
                hits.proxies[kept] = other
                kept += 1
        sort_int32(hits.proxies, kept)
        # Merge old and new lists: the old entries keep their touching bit; partners that left
        # end their pair if it was touching; new ones start untouched (stage 2 decides).
        while status == 0 and (i < mine.count or j < kept):
            if j == kept or (i < mine.count and (items[i] >> 1) < hits.proxies[j]):
                entry = items[i]
                partners_erase(&self.partners[entry >> 1], proxy)
                self.listed -= 1
                if entry & TOUCHING:
                    status = pairs_push(ended, t.proxies[proxy].id, t.proxies[entry >> 1].id)
                    self.touching -= 1
                i += 1
            elif i == mine.count or hits.proxies[j] < (items[i] >> 1):
                other = hits.proxies[j]
                status = partners_insert(&self.partners[other], proxy)
                self.listed += 1
                hits.proxies[j] = other << 1
                j += 1
            else:
                hits.proxies[j] = items[i]
                i += 1
                j += 1
        if status != 0 or partners_reserve(mine, <int32_t>kept) != 0:
            return -1
        if kept:
            memcpy(items_of(mine), hits.proxies, kept * sizeof(int32_t))
        self.listed += kept - mine.count
        mine.count = <int32_t>kept
        if 0 <= self.listed_limit < self.listed:
            return FAT_LIMIT
        return 0

    cdef int _retest(self, int32_t proxy, PairBuffer *begun, PairBuffer *ended) noexcept nogil:
        """Compare a moved proxy's tight box with each partner's; flip the bit on both sides."""
        cdef TreeCore *t = &self.core
        cdef Partners *mine = &self.partners[proxy]
        cdef int32_t *items = items_of(mine)
        cdef int32_t k, other
        cdef int32_t *theirs
        cdef bint now
        if (t.proxies[proxy].flags & (PROXY_LIVE | PROXY_MOVED)) != (PROXY_LIVE | PROXY_MOVED):
            return 0        # destroyed since, or listed twice
        t.proxies[proxy].flags &= ~PROXY_MOVED
        for k in range(mine.count):
            other = items[k] >> 1
            now = tight_overlap(t, proxy, other)
            if now == (items[k] & TOUCHING):
                continue
            items[k] ^= TOUCHING
            theirs = partners_find(&self.partners[other], proxy)
            theirs[0] ^= TOUCHING
            self.touching += 1 if now else -1
            if pairs_push(begun if now else ended, t.proxies[proxy].id, t.proxies[other].id) != 0:
                return -1
        return 0

    def pairs(self):
        """All current pairs, `(m, 2)` uint64 rows a < b, sorted. Exact even with moves pending."""
        cdef PairBuffer buffer
        cdef int status
        memset(&buffer, 0, sizeof(PairBuffer))
        with nogil:
            status = self._current_pairs(&buffer)
        if status != 0:
            pairs_free(&buffer)
            raise MemoryError()
        return pair_array(&buffer)

    cdef int _current_pairs(self, PairBuffer *out) noexcept nogil:
        cdef TreeCore *t = &self.core
        cdef int32_t proxy, other, k
        cdef int32_t *items
        if self.track_pairs and self.moved_count == 0 and self.ended.count == 0:
            # Nothing changed since update(): the touching partners are the answer.
            for proxy in range(t.proxy_capacity):
                if t.proxies[proxy].flags & PROXY_LIVE:
                    items = items_of(&self.partners[proxy])
                    for k in range(self.partners[proxy].count):
                        other = items[k] >> 1
                        if (items[k] & TOUCHING and other > proxy
                                and pairs_push(out, t.proxies[proxy].id, t.proxies[other].id) != 0):
                            return -1
            sort_pairs(out.pairs, out.count)
            return 0
        return self_pairs(t, out, self.groups, self.masks)

    def query_aabb(self, boxes, mask=None):
        """CSR `(offsets, hits)` over static and dynamic proxies; `mask` keeps proxies whose group
        shares a bit with it."""
        if mask is None:
            return self._query_aabb(boxes, 0xFFFFFFFF, NULL)
        return self._query_aabb(boxes, validation.as_mask(mask), self.groups)

    def query_sphere(self, centers, radii, mask=None):
        if mask is None:
            return self._query_sphere(centers, radii, 0xFFFFFFFF, NULL)
        return self._query_sphere(centers, radii, validation.as_mask(mask), self.groups)

    def raycast(self, segments, first_hit=False, mask=None):
        if mask is None:
            return self._raycast(segments, bool(first_hit), 0xFFFFFFFF, NULL)
        return self._raycast(segments, bool(first_hit), validation.as_mask(mask), self.groups)

    def query_frustum(self, planes, mask=None):
        if mask is None:
            return self._query_frustum(planes, 0xFFFFFFFF, NULL)
        return self._query_frustum(planes, validation.as_mask(mask), self.groups)

    def query_nearest(self, points, k, max_distance=math.inf, mask=None):
        if mask is None:
            return self._query_nearest(points, k, max_distance, 0xFFFFFFFF, NULL)
        return self._query_nearest(points, k, max_distance, validation.as_mask(mask), self.groups)

    def cast_box(self, boxes, displacements, first_hit=False, mask=None):
        if mask is None:
            return self._cast_box(boxes, displacements, bool(first_hit), 0xFFFFFFFF, NULL)
        return self._cast_box(boxes, displacements, bool(first_hit), validation.as_mask(mask), self.groups)

    def cast_sphere(self, centers, radii, displacements, first_hit=False, mask=None):
        if mask is None:
            return self._cast_sphere(centers, radii, displacements, bool(first_hit), 0xFFFFFFFF, NULL)
        return self._cast_sphere(centers, radii, displacements, bool(first_hit), validation.as_mask(mask),
                                 self.groups)

    cdef const uint32_t *_groups(self) noexcept:
        return self.groups

    def stats(self):
        info = TreeBase.stats(self)
        cdef int64_t touching = 0, listed = 0, partner_bytes = 0
        cdef int32_t i, k
        for i in range(self.slot_capacity):
            listed += self.partners[i].count
            if self.partners[i].capacity != INLINE_PARTNERS:
                partner_bytes += self.partners[i].capacity * sizeof(int32_t)
            for k in range(self.partners[i].count):
                touching += items_of(&self.partners[i])[k] & TOUCHING
        info["pairs"] = touching // 2
        info["fat_pairs"] = listed // 2
        info["pending_moves"] = self.moved_count
        info["track_pairs"] = self.track_pairs
        info["memory_bytes"] += (self.slot_capacity * (2 * sizeof(uint32_t) + sizeof(Partners))
                                 + partner_bytes + self.moved_capacity * sizeof(int32_t)
                                 + self.ended.capacity * sizeof(IdPair))
        return info

    def validate(self):
        """Tree invariants, then the partner lists: sorted, symmetric with the same touching bit,
        between live proxies that may pair; with nothing pending, exactly the pairs of overlapping
        fat boxes, marked touching exactly where the tight boxes overlap."""
        TreeBase.validate(self)
        cdef TreeCore *t = &self.core
        cdef int32_t proxy, other, k, entry
        cdef int32_t *theirs
        cdef int32_t *items
        cdef Partners *mine
        cdef int64_t listed = 0, touching = 0
        cdef bint settled = self.track_pairs and self.moved_count == 0 and self.ended.count == 0
        for proxy in range(self.slot_capacity):
            mine = &self.partners[proxy]
            if not (t.proxies[proxy].flags & PROXY_LIVE):
                if mine.count:
                    raise RuntimeError("dbvt invariant broken: a free proxy has partners")
                continue
            if mine.capacity < INLINE_PARTNERS or mine.count > mine.capacity:
                raise RuntimeError("dbvt invariant broken: a partner list holds more than its capacity")
            items = items_of(mine)
            for k in range(mine.count):
                entry = items[k]
                other = entry >> 1
                if other < 0 or other >= self.slot_capacity or not (t.proxies[other].flags & PROXY_LIVE):
                    raise RuntimeError("dbvt invariant broken: a partner is not a live proxy")
                if k and (items[k - 1] >> 1) >= other:
                    raise RuntimeError("dbvt invariant broken: a partner list is not sorted")
                if not pair_allowed(t, self.groups, self.masks, proxy, other):
                    raise RuntimeError("dbvt invariant broken: a pair the filter forbids")
                theirs = partners_find(&self.partners[other], proxy)
                if theirs == NULL or (theirs[0] & TOUCHING) != (entry & TOUCHING):
                    raise RuntimeError("dbvt invariant broken: a pair is listed differently on its two sides")
                if settled and (entry & TOUCHING) != tight_overlap(t, proxy, other):
                    raise RuntimeError("dbvt invariant broken: a touching bit disagrees with the tight boxes")
                if settled and not boxes_overlap(t.proxies[proxy].fat, t.proxies[other].fat):
                    raise RuntimeError("dbvt invariant broken: listed partners' fat boxes do not overlap")
                listed += 1
                touching += entry & TOUCHING
        if settled and listed // 2 != self._count_fat_pairs():
            raise RuntimeError("dbvt invariant broken: pairs of overlapping fat boxes are missing")
        if listed != self.listed or touching != 2 * self.touching:
            raise RuntimeError("dbvt invariant broken: the counts of listed and touching pairs drifted")

    cdef int64_t _count_fat_pairs(self) except -1:
        cdef TreeCore *t = &self.core
        cdef Query q
        cdef Stack stack
        cdef Hits hits
        cdef int32_t proxy
        cdef int64_t h, count = 0
        memset(&stack, 0, sizeof(Stack))
        memset(&hits, 0, sizeof(Hits))
        q.kind = QUERY_FAT_BOX
        q.groups = NULL
        q.first_hit = False
        try:
            for proxy in range(t.proxy_capacity):
                if not (t.proxies[proxy].flags & PROXY_LIVE):
                    continue
                memcpy(q.box, t.proxies[proxy].fat, sizeof(q.box))
                hits.count = 0
                if walk(t, &q, &stack, &hits) != 0:
                    raise MemoryError()
                for h in range(hits.count):
                    if hits.proxies[h] > proxy and pair_allowed(t, self.groups, self.masks, proxy, hits.proxies[h]):
                        count += 1
        finally:
            stack_free(&stack)
            hits_free(&hits)
        return count

    def to_bytes(self):
        """The tree, then per-proxy groups and masks, the partner lists, pending moves and ends.

        A world's snapshot is taken on its own thread while it waits, so the copying runs in C.
        """
        cdef int32_t i, k
        cdef int64_t total = 0, at = 0
        for i in range(self.slot_capacity):
            total += self.partners[i].count
        capacity = self.core.proxy_capacity
        groups = np.zeros(capacity, np.uint32)
        masks = np.zeros(capacity, np.uint32)
        counts = np.zeros(capacity, np.int32)
        items = np.empty(total, np.int32)
        moved = np.empty(self.moved_count, np.int32)
        ended = np.empty((self.ended.count, 2), np.uint64)
        cdef uint32_t[::1] group_view = groups, mask_view = masks
        cdef int32_t[::1] count_view = counts, item_view = items, moved_view = moved
        cdef uint64_t[:, ::1] ended_view = ended
        cdef const int32_t *entries
        with nogil:
            for i in range(self.slot_capacity):
                group_view[i] = self.groups[i]
                mask_view[i] = self.masks[i]
                count_view[i] = self.partners[i].count
                entries = items_of(&self.partners[i])
                for k in range(self.partners[i].count):
                    item_view[at] = entries[k]
                    at += 1
            for k in range(self.moved_count):
                moved_view[k] = self.moved[k]
            for k in range(self.ended.count):
                ended_view[k, 0] = self.ended.pairs[k].a
                ended_view[k, 1] = self.ended.pairs[k].b
        state = _STATE.pack(self.track_pairs, self.moved_count, self.ended.count, total)
        return b"".join([self._tree_bytes(), state, groups.data, masks.data, counts.data, items.data,
                         moved.data, ended.data])

    @classmethod
    def from_bytes(cls, data):
        cdef Broadphase bp = cls()
        view = memoryview(data).cast("B")
        at = bp._load_tree(view)
        if len(view) < at + _STATE.size:
            raise ValueError("data is too short for a dbvt broadphase")
        track_pairs, moved_count, ended_count, total = _STATE.unpack(bytes(view[at:at + _STATE.size]))
        bp.track_pairs = bool(track_pairs)
        at += _STATE.size
        capacity = bp.core.proxy_capacity
        sizes = [4 * capacity, 4 * capacity, 4 * capacity, 4 * total, 4 * moved_count, 16 * ended_count]
        if min(sizes) < 0 or len(view) != at + sum(sizes):
            raise ValueError("corrupt dbvt broadphase data: wrong length")
        arrays = []
        for size, dtype in zip(sizes, [np.uint32, np.uint32, np.int32, np.int32, np.int32, np.uint64]):
            arrays.append(np.frombuffer(view[at:at + size], dtype))
            at += size
        groups, masks, counts, items, moved, ended = arrays
        if (counts < 0).any() or counts.sum() != total or ((items < 0) | ((items >> 1) >= capacity)).any():
            raise ValueError("corrupt dbvt broadphase data: partner lists out of range")
        if ((moved < 0) | (moved >= capacity)).any():
            raise ValueError("corrupt dbvt broadphase data: moved proxies out of range")
        bp._reserve(0, moved_count)
        cdef const uint32_t[::1] group_view = groups, mask_view = masks
        cdef const int32_t[::1] count_view = counts, item_view = items, moved_view = moved
        cdef const uint64_t[::1] ended_view = ended
        cdef int32_t i, k, slots = capacity
        cdef int64_t offset = 0, e, moves = moved_count, ends = ended_count
        cdef int failed = 0
        cdef int32_t *entries
        with nogil:
            for i in range(slots):
                bp.groups[i] = group_view[i]
                bp.masks[i] = mask_view[i]
                if count_view[i] and partners_reserve(&bp.partners[i], count_view[i]) != 0:
                    failed = 1
                    break
                entries = items_of(&bp.partners[i])
                for k in range(count_view[i]):
                    entries[k] = item_view[offset + k]
                bp.partners[i].count = count_view[i]
                offset += count_view[i]
            for e in range(moves):
                bp.moved[e] = moved_view[e]
            for e in range(ends):
                if not failed and pairs_push(&bp.ended, ended_view[2 * e], ended_view[2 * e + 1]) != 0:
                    failed = 1
        if failed:
            raise MemoryError()
        bp.moved_count = moved_count
        bp.listed = total
        bp.touching = int(np.count_nonzero(items & TOUCHING)) // 2
        try:
            bp.validate()
        except RuntimeError as exc:
            raise ValueError(f"corrupt dbvt broadphase data: {exc}") from None
        return bp
